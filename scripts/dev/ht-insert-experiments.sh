#!/usr/bin/env bash
# Development: A/B runs of ht_insert variants on the GPU host. Each argument is one variant: kernel
# switches go through HYPERMNF_HT_DEFINES (compiled at run time by NVRTC, so no rebuild is needed
# there), and words of the form NAME=VALUE are set in the environment (the development knobs of
# src/hashtable/gpu.rs, e.g. HYPERMNF_HT_MIN_BLOCKS=4).
#   bash scripts/dev/ht-insert-experiments.sh "" "-DHT_DIAG_NO_STAMP" "HYPERMNF_HT_MIN_BLOCKS=4" ...
#   ("" = the kernels as built)
B=.gpu/bin/hypermnf
A="bench hashtable --capacities 28 --loads 0.8 --no-linear --no-variants --no-sweep --reps 1"
[ $# -gt 0 ] || set -- ""
for v in "$@"; do
  defs=()
  envs=()
  for w in $v; do
    case "$w" in
      -D*) defs+=("$w") ;;
      *=*) envs+=("$w") ;;
    esac
  done
  for rep in 1 2; do
    echo "== variant '$v' (run $rep)"
    env "${envs[@]}" HYPERMNF_HT_DEFINES="${defs[*]}" $B $A --no-ceilings 2>&1 |
      grep -E "0\.80 (insert|find-hit100|find-hit0|churn)|correctness"
  done
done

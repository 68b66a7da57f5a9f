#!/usr/bin/env bash
# Development: A/B runs of ht_insert variants on the GPU host (kernel switches through
# HYPERMNF_HT_DEFINES, compiled at run time by NVRTC, so no rebuild is needed there).
#   bash scripts/dev/ht-insert-experiments.sh "" "-DHT_DIAG_NO_STAMP" ...   ("" = the kernels as built)
B=.gpu/bin/hypermnf
A="bench hashtable --capacities 28 --loads 0.8 --no-linear --no-variants --no-sweep --reps 1"
[ $# -gt 0 ] || set -- ""
for v in "$@"; do
  for rep in 1 2; do
    echo "== defines '$v' (run $rep)"
    HYPERMNF_HT_DEFINES="$v" $B $A --no-ceilings 2>&1 | grep -E "0\.80 (insert|find-hit100|find-hit0|churn)|correctness"
  done
done

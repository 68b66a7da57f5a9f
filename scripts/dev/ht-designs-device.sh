#!/usr/bin/env bash
# Issue 19 on the GPU host, after ../shared/tools/gpu-pack (carry .gpu): the GPU tests of the hash
# tables (the job cache's and the published designs it is compared with), compute-sanitizer over
# the designs' tests, and the comparison benchmark. Logs go to $OUT.
#   bash scripts/dev/ht-designs-device.sh [tests] [sanitize] [bench] [bench-small]   (default: tests bench sanitize; each step under a timeout)
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp}
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(tests bench sanitize)
export RUST_BACKTRACE=1
status=0
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for step in "${steps[@]}"; do
  case $step in
  tests)
    echo "== GPU tests: gpu_ht_designs gpu_hashtable"
    timeout 180 .gpu/bin/test-gpu --include-ignored --test-threads=1 gpu_ht_designs gpu_hashtable 2>&1 | tee "$out/tests.txt" || status=1
    ;;
  sanitize)
    # racecheck is left out: it checks shared memory, which these kernels do not use.
    for tool in memcheck synccheck; do
      echo "== compute-sanitizer --tool $tool over the small gpu_ht_designs tests"
      timeout 75 compute-sanitizer --tool "$tool" --error-exitcode 99 --print-limit 20 \
        .gpu/bin/test-gpu --include-ignored --test-threads=1 designs::hopscotch_tiny designs::slab_tiny designs::hopscotch_concurrent \
        designs::slab_concurrent designs::hopscotch_keys_piled designs::slab_pool >"$out/sanitizer-$tool.txt" 2>&1
      rc=$?
      grep -E "ERROR SUMMARY|test result|panicked" "$out/sanitizer-$tool.txt" | head -20
      [ $rc -eq 0 ] || { echo "compute-sanitizer $tool: exit $rc"; tail -n 30 "$out/sanitizer-$tool.txt"; status=1; }
    done
    ;;
  bench)
    echo "== hypermnf bench hashtable --capacities 24,28 --loads 0.5,0.8,0.9 --no-variants --no-sweep"
    timeout 240 .gpu/bin/hypermnf bench hashtable --capacities 24,28 --loads 0.5,0.8,0.9 --no-variants --no-sweep \
      --json "$out/bench.json" 2>&1 | tee "$out/bench.txt" || status=1
    ;;
  bench-small)
    echo "== hypermnf bench hashtable --capacities 16 --loads 0.5,0.8,0.9 --no-variants --no-sweep --no-ceilings"
    timeout 60 .gpu/bin/hypermnf bench hashtable --capacities 16 --loads 0.5,0.8,0.9 --no-variants --no-sweep --no-ceilings \
      2>&1 | tee "$out/bench-small.txt" || status=1
    ;;
  *) echo "unknown step $step"; status=2 ;;
  esac
done
echo "ht-designs-device: exit $status"
exit $status

#!/usr/bin/env bash
# compute-sanitizer memcheck and racecheck over the small GPU test case (tests/gpu.rs:
# sanitizer_small_case), run on the GPU host after `bash .gpu/run`. Exit 1 on any reported error.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp}
status=0
for tool in memcheck racecheck; do
  echo "== compute-sanitizer --tool $tool"
  compute-sanitizer --tool "$tool" --error-exitcode 99 --print-limit 20 \
    .gpu/bin/test-gpu --include-ignored --test-threads=1 sanitizer_small_case \
    >"$out/sanitizer-$tool.txt" 2>&1
  rc=$?
  tail -n 5 "$out/sanitizer-$tool.txt"
  grep -E "ERROR SUMMARY|test result" "$out/sanitizer-$tool.txt" || true
  [ $rc -eq 0 ] || { echo "compute-sanitizer $tool: exit $rc"; status=1; }
done
exit $status

#!/usr/bin/env bash
# compute-sanitizer over the packed GPU test binaries, on the GPU host after `gpu-pack` (run from the
# repository root, after or instead of `bash .gpu/run`):
#
#   scripts/gpu-sanitize.sh                      memcheck, racecheck, synccheck over every packed test binary
#   SANITIZE_TOOLS="memcheck" SANITIZE_TESTS="test-gpu" scripts/gpu-sanitize.sh
#   SANITIZE_FILTER=sanitizer_small_case         only the tests whose name contains this (several: space-separated)
#   SANITIZE_TIMEOUT=300                         seconds per (tool, binary) before it counts as unfinished
#
# memcheck and synccheck run every test (on the H100: 64 s and 32 s for the 41 tests that
# tests/gpu.rs held before its suites got files of their own: gpu, gpu_split, gpu_cache,
# gpu_hashtable, gpu_ht_designs). racecheck runs the small cases that go through every kernel and
# route (sanitizer_small_case: 196 s; the hash tables' *_tiny_case: seconds): it instruments each
# shared-memory access, and on the full-size covariance tests it did not finish the first test in
# 125 s. SANITIZE_FILTER applies to all tools when set. Exit 1 when a tool
# reports an error or a hazard, when a test fails under it, or when a run does not finish in time; the
# summary line of each run is printed, the whole output goes to $OUT/sanitizer-<tool>-<binary>.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp}
tools=${SANITIZE_TOOLS:-memcheck racecheck synccheck}
tests=${SANITIZE_TESTS:-}
if [ -z "$tests" ]; then
  for t in .gpu/bin/test-*; do
    [ -x "$t" ] && tests="$tests $(basename "$t")"
  done
fi
limit=${SANITIZE_TIMEOUT:-300}
filter_all=${SANITIZE_FILTER-}
racecheck_filter=${SANITIZE_FILTER-sanitizer_small_case tiny_case}
status=0
for bin in $tests; do
  for tool in $tools; do
    filter=$filter_all
    [ "$tool" = racecheck ] && filter=$racecheck_filter
    log="$out/sanitizer-$tool-$bin.txt"
    echo "== compute-sanitizer --tool $tool .gpu/bin/$bin ${filter:+(tests matching $filter)}"
    start=$(date +%s)
    # shellcheck disable=SC2086
    timeout "$limit" compute-sanitizer --tool "$tool" --error-exitcode 99 --print-limit 20 \
      ".gpu/bin/$bin" --include-ignored --test-threads=1 $filter >"$log" 2>&1
    rc=$?
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" "$log" | tail -n 3
    echo "   exit $rc after $(( $(date +%s) - start )) s"
    case $rc in
      0) ;;
      124) echo "   UNFINISHED within $limit s"; status=1 ;;
      *) tail -n 20 "$log"; status=1 ;;
    esac
  done
done
exit $status

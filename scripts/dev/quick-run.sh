#!/usr/bin/env bash
# Development run on the GPU host after gpu-pack: kernel compile check, every GPU test, the 1x / 16x GPU
# bench, a per-chunk timing run and the hash-table bench at 2^28 cells. Logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp}
bin=.gpu/bin
bash scripts/dev/nvrtc-check.sh 2>&1 | grep -E "error|nvrtc-check" | head -20
$bin/test-gpu --include-ignored --test-threads=1 >"$out/tests.txt" 2>&1
grep -E "^test |test result|panicked|assert" "$out/tests.txt" | head -60
$bin/hypermnf bench gpu --scales ${SCALES:-1,16} --runs 10 --no-cpu >"$out/bench-gpu.txt" 2>&1
grep -E "wall phases|^\| " "$out/bench-gpu.txt"
RUST_LOG=hypermnf::timing=debug $bin/hypermnf bench gpu --scales 1 --runs 3 --no-cpu >"$out/timing.txt" 2>&1
$bin/hypermnf bench hashtable --capacities 28 --loads ${LOADS:-0.8} --no-sweep >"$out/ht.txt" 2>&1
tail -40 "$out/ht.txt"

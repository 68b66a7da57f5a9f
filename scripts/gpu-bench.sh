#!/usr/bin/env bash
# The GPU benchmark, run by `bash .gpu/run` on the GPU host (PATH holds the packed hypermnf binary):
# `hypermnf bench gpu` (custom kernels, cuBLAS route, CPU backend, PCIe floor) and, in the same run,
# the PyTorch reference (scripts/reference_mnf.py) on the same cube shapes; then `hypermnf bench
# flightline` on a 6000-line AVIRIS-NG-shaped ENVI file.
#   HYPERMNF_BENCH_SCALES (default 1,4,16), HYPERMNF_BENCH_RUNS (default 10), HYPERMNF_BENCH_CPU_RUNS (3)
set -uo pipefail
cd "$(dirname "$0")/.."
[ -x .gpu/bin/hypermnf ] && export PATH="$PWD/.gpu/bin:$PATH"
out=${OUT:-/tmp}
scales=${HYPERMNF_BENCH_SCALES:-1,4,16}
runs=${HYPERMNF_BENCH_RUNS:-10}
cpu_runs=${HYPERMNF_BENCH_CPU_RUNS:-3}
status=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true
echo "== hypermnf bench gpu --scales $scales --runs $runs"
hypermnf bench gpu --scales "$scales" --runs "$runs" --cpu-runs "$cpu_runs" --json "$out/bench-gpu.json" \
  2>&1 | tee "$out/bench-gpu.txt" || status=1
echo "== scripts/reference_mnf.py --scales $scales --runs $runs"
PYTHONUNBUFFERED=1 python3 scripts/reference_mnf.py --scales "$scales" --runs "$runs" \
  2>&1 | tee "$out/bench-torch.txt" || status=1
# A 6.1 GB float32 BIL flight line (issue 29) through the CLI, the pipeline and the service against
# its read and PCIe floors; the file goes to the system's temporary directory (not $out), and what a
# timed-out run leaves there is removed.
echo "== hypermnf bench flightline --lines 6000 --backend cuda"
timeout 300 hypermnf bench flightline --lines 6000 --backend cuda --json "$out/bench-flightline.json" \
  2>&1 | tee "$out/bench-flightline.txt" || status=1
rm -rf "${TMPDIR:-/tmp}"/hypermnf-bench-flightline-*
exit $status

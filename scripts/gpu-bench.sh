#!/usr/bin/env bash
# The GPU benchmark, run by `bash .gpu/run` on the GPU host (PATH holds the packed hypermnf binary):
# `hypermnf bench gpu` (custom kernels, cuBLAS route, CPU backend, PCIe floor) and, in the same run,
# the PyTorch reference (scripts/reference_mnf.py) on the same cube shapes.
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
exit $status

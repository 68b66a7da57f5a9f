#!/usr/bin/env bash
# Compiles kernels/*.cu concatenated as src/backend/cuda/compile.rs hands them to NVRTC (one
# translation unit: a macro in one file can clash with a name in another). Needs nvcc (GPU host).
set -euo pipefail
cd "$(dirname "$0")/../.."
{ cat kernels/common.cuh; for f in noise covariance transform; do sed '/#include "common.cuh"/d' "kernels/$f.cu"; done; } >/tmp/hypermnf-all.cu
nvcc -ptx -std=c++17 -arch=compute_90 /tmp/hypermnf-all.cu -o /tmp/hypermnf-all.ptx
echo "nvrtc-check: kernels compile as one unit"
nvcc -ptx -std=c++17 -arch=compute_90 kernels/hashtable.cu -o /tmp/hypermnf-ht.ptx
echo "nvrtc-check: hashtable.cu compiles"

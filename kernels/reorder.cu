// Reordering a block of lines read in the file's own layout into the BIP order the other kernels
// read (element (line, sample, band) at ((line * samples) + sample) * bands + band).
//
// A BIL line is a bands x samples matrix and a block of BSQ lines is a bands x (lines * samples)
// matrix: both become BIP by transposing `groups` matrices of `rows` (bands) x `cols` (samples, or
// pixels) elements. Raw samples are moved as they are (any data type, either byte order: conversion
// and byte swapping stay with the kernels that widen them), so the result is the bytes a BIP file of
// the same cube would hold, bit for bit. Tiled through shared memory so that both the reads (along
// cols) and the writes (along rows) are coalesced.
#include "common.cuh"

#define REORDER_TILE 32
#define REORDER_ROWS 8

template <typename T>
__device__ __forceinline__ void reorder_body(const T* __restrict__ src, T* __restrict__ dst, i64 groups, int rows, i64 cols)
{
    __shared__ T tile[REORDER_TILE][REORDER_TILE + 1];
    const i64 per_group = (i64)rows * cols;
    // Loop bounds depend on blockIdx only, so every thread of a block reaches each __syncthreads().
    for (i64 g = blockIdx.z; g < groups; g += gridDim.z) {
        const T* s = src + g * per_group;
        T* d = dst + g * per_group;
        for (int r0 = blockIdx.y * REORDER_TILE; r0 < rows; r0 += gridDim.y * REORDER_TILE) {
            for (i64 c0 = (i64)blockIdx.x * REORDER_TILE; c0 < cols; c0 += (i64)gridDim.x * REORDER_TILE) {
                for (int j = threadIdx.y; j < REORDER_TILE; j += REORDER_ROWS) {
                    const int r = r0 + j;
                    const i64 c = c0 + threadIdx.x;
                    if (r < rows && c < cols) tile[j][threadIdx.x] = s[(i64)r * cols + c];
                }
                __syncthreads();
                for (int j = threadIdx.y; j < REORDER_TILE; j += REORDER_ROWS) {
                    const i64 c = c0 + j;
                    const int r = r0 + threadIdx.x;
                    if (r < rows && c < cols) d[c * rows + r] = tile[threadIdx.x][j];
                }
                __syncthreads();
            }
        }
    }
}

#define REORDER(NAME, T)                                                                                   \
    extern "C" __global__ void __launch_bounds__(REORDER_TILE * REORDER_ROWS) NAME(                        \
        const T* __restrict__ src, T* __restrict__ dst, i64 groups, int rows, i64 cols)                     \
    {                                                                                                      \
        reorder_body<T>(src, dst, groups, rows, cols);                                                     \
    }

REORDER(reorder_to_bip1, u8)
REORDER(reorder_to_bip2, u16)
REORDER(reorder_to_bip4, u32)
REORDER(reorder_to_bip8, u64)

// Shared by noise.cu, covariance.cu and transform.cu: reading raw samples of any file data type and
// byte order, and the per-pixel no-data mask.
//
// The host concatenates this file in front of the others before NVRTC compiles them (NVRTC gets no
// include path), so the `#include "common.cuh"` lines in the .cu files are removed by the host and only
// serve readers and editors.
#pragma once

// Data type codes; the host (src/backend/cuda/kernels.rs) uses the same numbers.
#define DT_U8 0
#define DT_I16 1
#define DT_U16 2
#define DT_I32 3
#define DT_U32 4
#define DT_F32 5
#define DT_F64 6

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

__device__ __forceinline__ u16 bswap16(u16 v) { return (u16)((v >> 8) | (v << 8)); }
__device__ __forceinline__ u32 bswap32(u32 v) { return __byte_perm(v, 0, 0x0123); }
__device__ __forceinline__ u64 bswap64(u64 v) {
    return ((u64)bswap32((u32)v) << 32) | (u64)bswap32((u32)(v >> 32));
}

// Sample number `i` of a raw buffer, widened to double. Every supported type converts exactly to
// double, so the no-data comparison is exact and the later subtraction of a shift rounds once.
// `dtype` is uniform across a launch, so the switch does not diverge.
__device__ __forceinline__ double sample_f64(const u8* __restrict__ raw, i64 i, int dtype, int swap) {
    switch (dtype) {
    case DT_U8:
        return (double)raw[i];
    case DT_I16: {
        u16 v = ((const u16*)raw)[i];
        if (swap) v = bswap16(v);
        return (double)(short)v;
    }
    case DT_U16: {
        u16 v = ((const u16*)raw)[i];
        if (swap) v = bswap16(v);
        return (double)v;
    }
    case DT_I32: {
        u32 v = ((const u32*)raw)[i];
        if (swap) v = bswap32(v);
        return (double)(int)v;
    }
    case DT_U32: {
        u32 v = ((const u32*)raw)[i];
        if (swap) v = bswap32(v);
        return (double)v;
    }
    case DT_F32: {
        u32 v = ((const u32*)raw)[i];
        if (swap) v = bswap32(v);
        return (double)__uint_as_float(v);
    }
    default: {
        u64 v = ((const u64*)raw)[i];
        if (swap) v = bswap64(v);
        return __longlong_as_double((long long)v);
    }
    }
}

// Per-pixel validity of `npix` pixels starting at `raw` (BIP): valid[p] = 0 when any band listed in
// mask_bands holds exactly `ignore`, or a value that is not finite (NaN, +-Inf: the no-data of float
// products; the host passes ignore = NaN, which equals nothing, for a float cube without a no-data
// value), else 1 -- the rule of mnf::stats::is_masked. One warp per pixel; the lanes split the mask
// bands.
// `valid_count` (may be null) gets the number of valid pixels added.
extern "C" __global__ void __launch_bounds__(256) pixel_mask(
    const u8* __restrict__ raw, i64 npix, int bands, int dtype, int swap,
    const int* __restrict__ mask_bands, int n_mask, double ignore,
    u8* __restrict__ valid, u64* __restrict__ valid_count)
{
    const int lane = threadIdx.x & 31;
    const i64 warp = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const i64 n_warps = ((i64)gridDim.x * blockDim.x) >> 5;
    u64 local = 0;
    for (i64 p = warp; p < npix; p += n_warps) {
        int hit = 0;
        for (int m = lane; m < n_mask; m += 32) {
            const double x = sample_f64(raw, p * bands + mask_bands[m], dtype, swap);
            // NaN fails the comparison, so !(|x| <= DBL_MAX) holds exactly for NaN and +-Inf.
            hit |= (x == ignore) | !(fabs(x) <= 1.7976931348623157e308);
        }
        const int any_hit = __any_sync(0xffffffffu, hit);
        if (lane == 0) {
            valid[p] = any_hit ? 0 : 1;
            local += any_hit ? 0 : 1;
        }
    }
    if (lane == 0 && valid_count != 0 && local != 0) atomicAdd(valid_count, local);
}

// Eight consecutive 2-byte integer samples (one 16-byte load, little-endian words) as ints: sample
// 2i is the low half of word i. `swap` byte-swaps each sample (big-endian files). Used by the fast
// paths for int16 / uint16 cubes whose pixel rows are 16-byte aligned (bands % 8 == 0).
template <bool SIGNED>
__device__ __forceinline__ void unpack8_w16(uint4 w, int swap, int (&v)[8]) {
    const u32 q[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const u32 x = swap ? __byte_perm(q[i], 0, 0x2301) : q[i];
        if (SIGNED) {
            v[2 * i] = (int)(short)(x & 0xffffu);
            v[2 * i + 1] = (int)(short)(x >> 16);
        } else {
            v[2 * i] = (int)(x & 0xffffu);
            v[2 * i + 1] = (int)(x >> 16);
        }
    }
}

// The projection Z = T_kᵀ (x − μ) and the inverse MNF (denoising), read straight from the raw cube.
#include "common.cuh"

#define PROJ_PIX 32                      // pixels per block (one per lane)
#define PROJ_LANES 8                     // warps per block, each a set of components
#define PROJ_COMP (PROJ_LANES * 8)       // components per pass (8 accumulators per thread)
#define PROJ_BANDS 32                    // used bands staged per step
#define MAX_CONST_T 16320                // floats of T in constant memory (64 KB minus a margin)

// T (n_used x k, row-major) for project_const: the published "v3" keeps T_k in constant memory, where
// the 32 lanes of a warp, all on one component, read the same word: a broadcast.
__constant__ float c_transform[MAX_CONST_T];

// Each block takes PROJ_PIX pixels at a time and stages their used bands, converted and centred, in
// shared memory (the published B x blockDim.x slice of X, here PROJ_BANDS bands at a time so that
// 425-band cubes fit); warp w accumulates components w, w + 8, ... for its 32 pixels. The outputs go
// through shared memory so that the block writes its 32 x k outputs as one contiguous run.
//   out[p * out_stride + col(c)] = add_mean[c] + Σ_r T[r, c] (x[p, used[r]] − means[r]),
// col(c) = out_col ? out_col[c] : c; NaN at invalid pixels.
template <bool CONST_T>
__device__ __forceinline__ void project_body(
    const u8* __restrict__ raw, const u8* __restrict__ valid, i64 npix, int bands, int dtype, int swap,
    const int* __restrict__ used, int n_used, const double* __restrict__ means,
    const float* __restrict__ t_global, int k,
    float* __restrict__ out, int out_stride, const int* __restrict__ out_col, const double* __restrict__ add_mean)
{
    __shared__ float xs[PROJ_BANDS][PROJ_PIX + 1];
    __shared__ float zs[PROJ_PIX][PROJ_COMP + 1];
    __shared__ u8 ok[PROJ_PIX];
    const int px = threadIdx.x & 31;
    const int lane_c = threadIdx.x >> 5;
    const float nan = __int_as_float(0x7fc00000);

    for (i64 p0 = (i64)blockIdx.x * PROJ_PIX; p0 < npix; p0 += (i64)gridDim.x * PROJ_PIX) {
        if (threadIdx.x < PROJ_PIX) {
            const i64 p = p0 + threadIdx.x;
            ok[threadIdx.x] = p < npix && (valid == 0 || valid[p]);
        }
        __syncthreads();
        for (int c0 = 0; c0 < k; c0 += PROJ_COMP) {
            const int kp = min(PROJ_COMP, k - c0);
            float acc[8];
#pragma unroll
            for (int m = 0; m < 8; ++m) acc[m] = 0.f;
            for (int r0 = 0; r0 < n_used; r0 += PROJ_BANDS) {
                const int rn = min(PROJ_BANDS, n_used - r0);
                for (int e = threadIdx.x; e < PROJ_BANDS * PROJ_PIX; e += 256) {
                    const int rl = e & 31, q = e >> 5;
                    float v = 0.f;
                    if (rl < rn && ok[q]) {
                        v = (float)(sample_f64(raw, (p0 + q) * bands + used[r0 + rl], dtype, swap) - means[r0 + rl]);
                    }
                    xs[rl][q] = v;
                }
                __syncthreads();
                for (int rl = 0; rl < rn; ++rl) {
                    const float xv = xs[rl][px];
                    const int row = (r0 + rl) * k + c0;
#pragma unroll
                    for (int m = 0; m < 8; ++m) {
                        const int c = lane_c + PROJ_LANES * m;
                        if (c < kp) {
                            const float tv = CONST_T ? c_transform[row + c] : t_global[row + c];
                            acc[m] = fmaf(tv, xv, acc[m]);
                        }
                    }
                }
                __syncthreads();
            }
#pragma unroll
            for (int m = 0; m < 8; ++m) {
                const int c = lane_c + PROJ_LANES * m;
                if (c < kp) zs[px][c] = acc[m];
            }
            __syncthreads();
            for (int e = threadIdx.x; e < PROJ_PIX * kp; e += 256) {
                const int q = e / kp, c = e - (e / kp) * kp;
                const i64 p = p0 + q;
                if (p < npix) {
                    float z = zs[q][c];
                    if (add_mean != 0) z += (float)add_mean[c0 + c];
                    out[p * out_stride + (out_col != 0 ? out_col[c0 + c] : c0 + c)] = ok[q] ? z : nan;
                }
            }
            __syncthreads();
        }
    }
}

// The fallback when n_used x k floats exceed constant memory (e.g. 425 bands with a large k, and the
// inverse, whose matrix is n_used x n_used): T in global memory, read through the L1 cache. (The
// constant-memory instance of project_body was replaced by project_px below, which is faster for the
// usual small k.)
extern "C" __global__ void __launch_bounds__(256) project_global(
    const u8* __restrict__ raw, const u8* __restrict__ valid, i64 npix, int bands, int dtype, int swap,
    const int* __restrict__ used, int n_used, const double* __restrict__ means,
    const float* __restrict__ t_global, int k,
    float* __restrict__ out, int out_stride, const int* __restrict__ out_col, const double* __restrict__ add_mean)
{
    project_body<false>(raw, valid, npix, bands, dtype, swap, used, n_used, means, t_global, k, out, out_stride,
                        out_col, add_mean);
}

// The projection for small k (the usual case, k <= 16 per pass): one thread per pixel holding all the
// pass's components in registers, so that every lane does useful work (the kernel above spreads the
// components over warps, which wastes most lanes when k is 10). T is padded with zero columns to kpad
// (a multiple of KP) and every thread of the block reads the same T entry (a broadcast). The block
// stages 32 used bands × 256 pixels, converted and centred, in shared memory (rows padded to 257 floats
// so the staging writes do not collide on one bank).
// Where T lives: project_px{KP} reads it from constant memory (the published v3). On an H100 that
// kernel stalls about half its cycles on immediate-constant-cache misses (ncu): T (224 x 12 floats =
// 10.5 KB) is larger than that cache and every warp walks it at its own pace. project_pxs{KP} copies T
// once per block into shared memory (dynamic, u x kpad floats) and reads it from there, 4 floats at
// a time; the host uses it wherever T fits.
#define PX_BLOCK 256
#define PX_BANDS 32
template <int KP, bool SMEM_T>
__device__ __forceinline__ void project_px_body(
    const u8* __restrict__ raw, const u8* __restrict__ valid, i64 npix, int bands, int dtype, int swap,
    const int* __restrict__ used, int n_used, const double* __restrict__ means, int kpad, int k,
    float* __restrict__ out, const float* __restrict__ t_pad)
{
    __shared__ float xs[PX_BANDS][PX_BLOCK + 1];
    __shared__ u8 okp[PX_BLOCK];
    extern __shared__ __align__(16) float ts[];
    const int tid = threadIdx.x;
    const float nan = __int_as_float(0x7fc00000);
    if (SMEM_T) {
        for (int e = tid; e < n_used * kpad; e += PX_BLOCK) ts[e] = t_pad[e];
        // (the barrier at the top of the pixel loop orders these writes before any read)
    }
    for (i64 p0 = (i64)blockIdx.x * PX_BLOCK; p0 < npix; p0 += (i64)gridDim.x * PX_BLOCK) {
        const i64 p = p0 + tid;
        okp[tid] = p < npix && (valid == 0 || valid[p]);
        __syncthreads();
        for (int c0 = 0; c0 < kpad; c0 += KP) {
            float acc[KP];
#pragma unroll
            for (int c = 0; c < KP; ++c) acc[c] = 0.f;
            for (int r0 = 0; r0 < n_used; r0 += PX_BANDS) {
                const int rn = min(PX_BANDS, n_used - r0);
                // A warp reads 32 consecutive used bands of one pixel.
                for (int e = tid; e < PX_BANDS * PX_BLOCK; e += PX_BLOCK) {
                    const int rl = e & 31, q = e >> 5;
                    float v = 0.f;
                    if (rl < rn && okp[q]) {
                        v = (float)(sample_f64(raw, (p0 + q) * bands + used[r0 + rl], dtype, swap) - means[r0 + rl]);
                    }
                    xs[rl][q] = v;
                }
                __syncthreads();
                for (int rl = 0; rl < rn; ++rl) {
                    const float xv = xs[rl][tid];
                    const int row = (r0 + rl) * kpad + c0;
                    if (SMEM_T && KP % 4 == 0) {
#pragma unroll
                        for (int c = 0; c < KP; c += 4) {
                            const float4 t4 = *reinterpret_cast<const float4*>(&ts[row + c]);
                            acc[c] = fmaf(t4.x, xv, acc[c]);
                            acc[c + 1] = fmaf(t4.y, xv, acc[c + 1]);
                            acc[c + 2] = fmaf(t4.z, xv, acc[c + 2]);
                            acc[c + 3] = fmaf(t4.w, xv, acc[c + 3]);
                        }
                    } else {
#pragma unroll
                        for (int c = 0; c < KP; ++c) acc[c] = fmaf(SMEM_T ? ts[row + c] : c_transform[row + c], xv, acc[c]);
                    }
                }
                __syncthreads();
            }
            if (p < npix) {
                float* o = out + p * k;
#pragma unroll
                for (int c = 0; c < KP; ++c) {
                    if (c0 + c < k) o[c0 + c] = okp[tid] ? acc[c] : nan;
                }
            }
        }
        __syncthreads();
    }
}

#define PROJECT_PX(KP)                                                                                        \
    extern "C" __global__ void __launch_bounds__(256) project_px##KP(                                        \
        const u8* __restrict__ raw, const u8* __restrict__ valid, i64 npix, int bands, int dtype, int swap,  \
        const int* __restrict__ used, int n_used, const double* __restrict__ means, int kpad, int k,         \
        float* __restrict__ out, const float* __restrict__ t_pad)                                            \
    {                                                                                                         \
        project_px_body<KP, false>(raw, valid, npix, bands, dtype, swap, used, n_used, means, kpad, k, out,   \
                                   t_pad);                                                                    \
    }                                                                                                         \
    extern "C" __global__ void __launch_bounds__(256) project_pxs##KP(                                       \
        const u8* __restrict__ raw, const u8* __restrict__ valid, i64 npix, int bands, int dtype, int swap,  \
        const int* __restrict__ used, int n_used, const double* __restrict__ means, int kpad, int k,         \
        float* __restrict__ out, const float* __restrict__ t_pad)                                            \
    {                                                                                                         \
        project_px_body<KP, true>(raw, valid, npix, bands, dtype, swap, used, n_used, means, kpad, k, out,    \
                                  t_pad);                                                                     \
    }
PROJECT_PX(1)
PROJECT_PX(2)
PROJECT_PX(4)
PROJECT_PX(8)
PROJECT_PX(12)
PROJECT_PX(16)

// Bands that the inverse does not touch pass through as float32(x); NaN at invalid pixels.
extern "C" __global__ void __launch_bounds__(256) pass_through(
    const u8* __restrict__ raw, const u8* __restrict__ valid, i64 npix, int bands, int dtype, int swap,
    const int* __restrict__ cols, int n_cols, float* __restrict__ out)
{
    const i64 n = npix * n_cols;
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (i64)gridDim.x * blockDim.x) {
        const i64 p = e / n_cols;
        const int b = cols[(int)(e - p * n_cols)];
        const bool v = valid == 0 || valid[p];
        out[p * bands + b] = v ? (float)sample_f64(raw, p * bands + b, dtype, swap) : __int_as_float(0x7fc00000);
    }
}

// The cuBLAS route's projection input: X_u − μ as float32 (npix x n_used), NaN rows at invalid pixels
// (the GEMM carries the NaN into every component of the pixel).
extern "C" __global__ void __launch_bounds__(256) convert_centred_used(
    const u8* __restrict__ raw, const u8* __restrict__ valid, i64 npix, int bands, int dtype, int swap,
    const int* __restrict__ used, int n_used, const double* __restrict__ means, float* __restrict__ out)
{
    const i64 n = npix * n_used;
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (i64)gridDim.x * blockDim.x) {
        const i64 p = e / n_used;
        const int r = (int)(e - p * n_used);
        float v = __int_as_float(0x7fc00000);
        if (valid == 0 || valid[p]) v = (float)(sample_f64(raw, p * bands + used[r], dtype, swap) - means[r]);
        out[e] = v;
    }
}

// ------------------------------------------------------------------------------------------------
// The projection for 2-byte integer cubes (int16 / uint16, either byte order) whose pixel rows are
// 16-byte aligned (bands % 8 == 0), k <= 16. ncu measured project_pxs12 at ~1.2 ms for the 299 MB cube on
// the H100, about ten times what its reads and arithmetic need: per sample it paid a generic conversion,
// a double-precision centring, a `used` indirection and a shared-memory round trip. Here each thread
// projects one pixel straight from its row, 8 samples per 16-byte load, and centres exactly in integers:
//   Σ_r T[r,c] (x_r − μ_r) = Σ_b T'[b,c] (x_b − m_b) − corr_c,
// with T' = T with its rows scattered to the used bands' positions and zero rows for the other bands,
// m_b = round(μ_b) (an integer, so x_b − m_b is exact in float32) and corr_c = Σ_r T[r,c] (μ_r − m_r)
// computed by the host in float64. T' and m live in shared memory (dynamic: bands · KP floats, then bands
// ints) and every lane reads the same entry at the same time (a broadcast). Output as project_px:
// out[p · k + c], NaN at invalid pixels.
template <int KP, bool SIGNED>
__device__ __forceinline__ void project_w16_body(
    const u8* __restrict__ raw, const u8* __restrict__ valid, i64 npix, int bands, int swap,
    const float* __restrict__ t_full, const int* __restrict__ centre, const float* __restrict__ corr, int k,
    float* __restrict__ out)
{
    extern __shared__ __align__(16) float tw[];
    int* cw = reinterpret_cast<int*>(tw + bands * KP);
    for (int e = threadIdx.x; e < bands * KP; e += blockDim.x) tw[e] = t_full[e];
    for (int e = threadIdx.x; e < bands; e += blockDim.x) cw[e] = centre[e];
    __syncthreads();
    float cr[KP];
#pragma unroll
    for (int c = 0; c < KP; ++c) cr[c] = corr[c];
    const int groups = bands >> 3;
    const uint4* r4 = reinterpret_cast<const uint4*>(raw);
    const float nan = __int_as_float(0x7fc00000);
    for (i64 p = (i64)blockIdx.x * blockDim.x + threadIdx.x; p < npix; p += (i64)gridDim.x * blockDim.x) {
        float acc[KP];
#pragma unroll
        for (int c = 0; c < KP; ++c) acc[c] = 0.f;
        const bool ok = valid == 0 || valid[p];
        if (ok) {
            const uint4* px = r4 + p * groups;
#pragma unroll 2
            for (int j = 0; j < groups; ++j) {
                int v[8];
                unpack8_w16<SIGNED>(__ldg(px + j), swap, v);
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    const int b = 8 * j + i;
                    const float x = (float)(v[i] - cw[b]);
                    const float4* t4 = reinterpret_cast<const float4*>(tw + b * KP);
#pragma unroll
                    for (int q = 0; q < KP / 4; ++q) {
                        const float4 tv = t4[q];
                        acc[4 * q] = fmaf(tv.x, x, acc[4 * q]);
                        acc[4 * q + 1] = fmaf(tv.y, x, acc[4 * q + 1]);
                        acc[4 * q + 2] = fmaf(tv.z, x, acc[4 * q + 2]);
                        acc[4 * q + 3] = fmaf(tv.w, x, acc[4 * q + 3]);
                    }
                }
            }
        }
        float* o = out + p * k;
#pragma unroll
        for (int c = 0; c < KP; ++c) {
            if (c < k) o[c] = ok ? acc[c] - cr[c] : nan;
        }
    }
}

#define PROJECT_W16(KP)                                                                                       \
    extern "C" __global__ void __launch_bounds__(256) project_w16s##KP(                                      \
        const u8* __restrict__ raw, const u8* __restrict__ valid, i64 npix, int bands, int swap,             \
        const float* __restrict__ t_full, const int* __restrict__ centre, const float* __restrict__ corr,    \
        int k, float* __restrict__ out)                                                                       \
    {                                                                                                         \
        project_w16_body<KP, true>(raw, valid, npix, bands, swap, t_full, centre, corr, k, out);             \
    }                                                                                                         \
    extern "C" __global__ void __launch_bounds__(256) project_w16u##KP(                                      \
        const u8* __restrict__ raw, const u8* __restrict__ valid, i64 npix, int bands, int swap,             \
        const float* __restrict__ t_full, const int* __restrict__ centre, const float* __restrict__ corr,    \
        int k, float* __restrict__ out)                                                                       \
    {                                                                                                         \
        project_w16_body<KP, false>(raw, valid, npix, bands, swap, t_full, centre, corr, k, out);            \
    }
PROJECT_W16(4)
PROJECT_W16(8)
PROJECT_W16(12)
PROJECT_W16(16)

// Sums for the covariances: the float32 matrix D (npix x bands, one row per pixel, already shifted by
// the host's per-band shift; rows of excluded pixels are zero) gives Σ d (col_sums) and the lower
// triangle of Σ d dᵀ (cov_lower, or cuBLAS DSYRK on widen_f64), both accumulated into float64 so that 10^7 pixels keep their digits.
#include "common.cuh"

#define CT 64             // edge of the tile of C one block computes
#define CP 16             // pixels staged per step

// D = raw - shift as float32 (the input of both covariance routes), zero rows at excluded pixels.
// One thread per element, grid-stride.
extern "C" __global__ void __launch_bounds__(256) convert_shifted(
    const u8* __restrict__ raw, const u8* __restrict__ valid, i64 npix, int bands, int dtype, int swap,
    const double* __restrict__ shift, float* __restrict__ out)
{
    const i64 n = npix * bands;
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (i64)gridDim.x * blockDim.x) {
        const i64 p = e / bands;
        const int b = (int)(e - p * bands);
        float v = 0.f;
        if (valid == 0 || valid[p]) v = (float)(sample_f64(raw, e, dtype, swap) - shift[b]);
        out[e] = v;
    }
}

// sums[b] += Σ_p d[p, b] over the pixels of this block (pix_per_block of them), in float64.
extern "C" __global__ void __launch_bounds__(256) col_sums(
    const float* __restrict__ d, i64 npix, int bands, i64 pix_per_block, double* __restrict__ sums)
{
    const i64 p0 = (i64)blockIdx.x * pix_per_block;
    const i64 p1 = min(npix, p0 + pix_per_block);
    for (int b = threadIdx.x; b < bands; b += blockDim.x) {
        double s = 0.0;
        for (i64 p = p0; p < p1; ++p) s += (double)d[p * bands + b];
        if (p1 > p0) atomicAdd(&sums[b], s);
    }
}

// Tile pair t (0 .. n_tiles (n_tiles + 1) / 2) of the lower triangle: ti >= tj.
__device__ __forceinline__ void tile_pair(int t, int* ti_out, int* tj_out) {
    int ti = (int)((sqrt(8.0 * t + 1.0) - 1.0) * 0.5);
    while ((ti + 1) * (ti + 2) / 2 <= t) ++ti;
    while (ti * (ti + 1) / 2 > t) --ti;
    *ti_out = ti;
    *tj_out = t - ti * (ti + 1) / 2;
}

// Partial sums of Σ_p d[p, i] d[p, j] (j <= i: the lower triangle only; the host mirrors it) and of
// Σ_p d[p, i].
//
// The published "scheme 1" maps blocks to rows of the symmetric matrix, computes the lower triangle
// only, stages the operands in shared memory as thx x thx tiles slid along the pixel axis, and stores
// the right-hand tile transposed so that the inner product reads rows, free of bank conflicts. Here a
// block owns one 64 x 64 tile of the lower triangle (blockIdx.x enumerates the tile pairs ti >= tj) and
// each thread a 4 x 4 register tile of it, which a current GPU needs to keep its arithmetic units busy.
// The cube is BIP, so a staged tile is [pixel][band] — already the transposed layout — and both tiles
// are read as rows of 16-byte vectors (a warp reads 2 distinct rows of the left tile, 16 of the right).
// The next step's tiles are fetched into registers while the current one is multiplied.
//
// Accuracy: the generalized eigenproblem amplifies covariance errors by 10^3 and more on real cubes (a
// relative perturbation of 1e-7 moves Salinas-A's top eigenvalues by up to 3e-4), so the products are
// accumulated in float64: values that are exact in float32 (all integer data, shifted by whole numbers
// or eighths) give exact products, and their sums stay exact far beyond 10^7 pixels.
//
// blockIdx.y splits the pixels; block (pair, split) adds its tile into its own slot of part_cross (no
// atomics: launches on one stream run one after another, and no two blocks of a launch share a slot),
// and reduce_parts adds the slots at the end of the pass. The blocks of diagonal tiles also sum their
// 64 bands into part_sum (the band sums Σ d).
extern "C" __global__ void __launch_bounds__(256) cov_lower(
    const float* __restrict__ d, i64 npix, int bands, i64 pix_per_split, int n_pairs, int n_tiles,
    double* __restrict__ part_cross, double* __restrict__ part_sum)
{
    __shared__ __align__(16) double as[CP][CT];
    __shared__ __align__(16) double bs[CP][CT];

    int ti, tj;
    tile_pair(blockIdx.x, &ti, &tj);
    const int i0 = ti * CT, j0 = tj * CT;
    const bool diagonal = ti == tj;

    const i64 p_begin = (i64)blockIdx.y * pix_per_split;
    const i64 p_end = min(npix, p_begin + pix_per_split);
    const int tid = threadIdx.x;
    const int tx = tid & 15, ty = tid >> 4;

    double acc[4][4];
#pragma unroll
    for (int m = 0; m < 4; ++m)
#pragma unroll
        for (int n = 0; n < 4; ++n) acc[m][n] = 0.0;
    double colsum = 0.0;

    // This thread's share of one step's tiles: element e = tid + m * 256 is (pixel e / CT, band e % CT).
    float ra[(CP * CT) / 256], rb[(CP * CT) / 256];
    auto fetch = [&](i64 p0) {
#pragma unroll
        for (int m = 0; m < (CP * CT) / 256; ++m) {
            const int e = tid + m * 256;
            const int pp = e / CT, cc = e % CT;
            const i64 p = p0 + pp;
            float a = 0.f, b = 0.f;
            if (p < p_end) {
                const float* row = d + p * bands;
                if (i0 + cc < bands) a = row[i0 + cc];
                if (j0 + cc < bands) b = row[j0 + cc];
            }
            ra[m] = a;
            rb[m] = b;
        }
    };
    if (p_begin < p_end) fetch(p_begin);

    for (i64 p0 = p_begin; p0 < p_end; p0 += CP) {
#pragma unroll
        for (int m = 0; m < (CP * CT) / 256; ++m) {
            const int e = tid + m * 256;
            as[e / CT][e % CT] = (double)ra[m];
            bs[e / CT][e % CT] = (double)rb[m];
        }
        __syncthreads();
        if (p0 + CP < p_end) fetch(p0 + CP);
#pragma unroll
        for (int pp = 0; pp < CP; ++pp) {
            const double2 a01 = *reinterpret_cast<const double2*>(&as[pp][ty * 4]);
            const double2 a23 = *reinterpret_cast<const double2*>(&as[pp][ty * 4 + 2]);
            const double2 b01 = *reinterpret_cast<const double2*>(&bs[pp][tx * 4]);
            const double2 b23 = *reinterpret_cast<const double2*>(&bs[pp][tx * 4 + 2]);
            const double av[4] = {a01.x, a01.y, a23.x, a23.y};
            const double bv[4] = {b01.x, b01.y, b23.x, b23.y};
#pragma unroll
            for (int m = 0; m < 4; ++m)
#pragma unroll
                for (int n = 0; n < 4; ++n) acc[m][n] = fma(av[m], bv[n], acc[m][n]);
        }
        if (diagonal && tid < CT) {
#pragma unroll
            for (int pp = 0; pp < CP; ++pp) colsum += as[pp][tid];
        }
        __syncthreads();
    }
    double* slot = part_cross + ((i64)blockIdx.y * n_pairs + blockIdx.x) * (CT * CT);
#pragma unroll
    for (int m = 0; m < 4; ++m)
#pragma unroll
        for (int n = 0; n < 4; ++n) {
            const int loc = (ty * 4 + m) * CT + tx * 4 + n;
            slot[loc] += acc[m][n];
        }
    if (diagonal && tid < CT) {
        part_sum[((i64)blockIdx.y * n_tiles + ti) * CT + tid] += colsum;
    }
}

// The same partial sums on the float64 tensor cores (DMMA, sm_80 and later): twice the float64 rate
// of cov_lower's FMAs, with the same exact products and float64 sums. Same grid, slots and results as
// cov_lower. Each warp owns 8 rows of the block's 64 x 64 tile (eight 8 x 8 accumulator tiles) and
// issues mma.m8n8k4: A = 8 bands x 4 pixels of the left tile, B = 4 pixels x 8 bands of the right.
// Shared rows are padded to 72 doubles so that the four pixel rows a warp reads fall on distinct
// halves of the banks.
#define CTP 72
extern "C" __global__ void __launch_bounds__(256) cov_lower_dmma(
    const float* __restrict__ d, i64 npix, int bands, i64 pix_per_split, int n_pairs, int n_tiles,
    double* __restrict__ part_cross, double* __restrict__ part_sum)
{
#if __CUDA_ARCH__ >= 800
    __shared__ __align__(16) double as[CP][CTP];
    __shared__ __align__(16) double bs[CP][CTP];

    int ti, tj;
    tile_pair(blockIdx.x, &ti, &tj);
    const int i0 = ti * CT, j0 = tj * CT;
    const bool diagonal = ti == tj;

    const i64 p_begin = (i64)blockIdx.y * pix_per_split;
    const i64 p_end = min(npix, p_begin + pix_per_split);
    const int tid = threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;   // groupID, threadID_in_group

    double acc[8][2];
#pragma unroll
    for (int n = 0; n < 8; ++n) acc[n][0] = acc[n][1] = 0.0;
    double colsum = 0.0;

    float ra[(CP * CT) / 256], rb[(CP * CT) / 256];
    auto fetch = [&](i64 p0) {
#pragma unroll
        for (int m = 0; m < (CP * CT) / 256; ++m) {
            const int e = tid + m * 256;
            const int pp = e / CT, cc = e % CT;
            const i64 p = p0 + pp;
            float a = 0.f, b = 0.f;
            if (p < p_end) {
                const float* row = d + p * bands;
                if (i0 + cc < bands) a = row[i0 + cc];
                if (j0 + cc < bands) b = row[j0 + cc];
            }
            ra[m] = a;
            rb[m] = b;
        }
    };
    if (p_begin < p_end) fetch(p_begin);

    for (i64 p0 = p_begin; p0 < p_end; p0 += CP) {
#pragma unroll
        for (int m = 0; m < (CP * CT) / 256; ++m) {
            const int e = tid + m * 256;
            as[e / CT][e % CT] = (double)ra[m];
            bs[e / CT][e % CT] = (double)rb[m];
        }
        __syncthreads();
        if (p0 + CP < p_end) fetch(p0 + CP);
#pragma unroll
        for (int k0 = 0; k0 < CP; k0 += 4) {
            // A[m][k] = d[p0 + k0 + k][i0 + 8 warp + m]: this lane holds A[g][t4].
            const double a = as[k0 + t4][warp * 8 + g];
#pragma unroll
            for (int n = 0; n < 8; ++n) {
                // B[k][n'] = d[p0 + k0 + k][j0 + 8 n + n']: this lane holds B[t4][g].
                const double b = bs[k0 + t4][n * 8 + g];
                asm volatile(
                    "mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};\n"
                    : "+d"(acc[n][0]), "+d"(acc[n][1])
                    : "d"(a), "d"(b));
            }
        }
        if (diagonal && tid < CT) {
#pragma unroll
            for (int pp = 0; pp < CP; ++pp) colsum += as[pp][tid];
        }
        __syncthreads();
    }
    // This lane holds C[g][2 t4 + {0, 1}] of each 8 x 8 tile n: row 8 warp + g, columns 8 n + 2 t4 + c.
    double* slot = part_cross + ((i64)blockIdx.y * n_pairs + blockIdx.x) * (CT * CT);
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            const int loc = (warp * 8 + g) * CT + n * 8 + 2 * t4 + c;
            slot[loc] += acc[n][c];
        }
    if (diagonal && tid < CT) {
        part_sum[((i64)blockIdx.y * n_tiles + ti) * CT + tid] += colsum;
    }
#endif
}

// The same partial sums on sm_90's float64 mma.m16n8k4 (PTX 7.8), the kernel the pipeline uses on
// Hopper and later: twice the tensor-core rate of m8n8k4 there (measured on an H100: 64 vs 33 TFLOP/s
// for the bare instruction, 20.7 vs 12.6 TFLOP/s for the whole kernel on the 224-band cube; see the
// probe 124019c:scripts/dev/kern-bench.cu in git). Each of 4 warps owns a 32 x 32 quadrant of the
// block's 64 x 64 tile (2 x 4 mma tiles), so per 4 pixels it loads 4 A and 4 B fragments for 8 mma
// of 512 FMAs each. Quadrants above the diagonal or wholly in the padding past the last band are
// skipped (their warps only help with staging), which keeps 224 bands from paying for 256. Steps stage
// KP = 32 pixels; the next step's floats are fetched into registers while the current one is
// multiplied. Diagonal tiles stage one operand (A = B). Rows are padded to 68 doubles so that a
// half-warp's fragment load (4 pixel rows x 4 bands) covers the 32 banks once.
// Fragments (PTX ISA, mma.m16n8k4 .f64): A rows groupID and groupID + 8, column (the pixel, mma's k)
// threadID_in_group; B row (pixel) threadID_in_group, column groupID; C rows groupID and groupID + 8,
// columns 2 threadID_in_group + {0, 1}.
// Same grid (tile pairs x pixel splits), slots, sums and results as cov_lower; 128 threads;
// pix_per_split a multiple of KP.
#define COV_KP 32
#define COV_RBP 68
extern "C" __global__ void __launch_bounds__(128) cov_lower_m16(
    const float* __restrict__ d, i64 npix, int bands, i64 pix_per_split, int n_pairs, int n_tiles,
    double* __restrict__ part_cross, double* __restrict__ part_sum)
{
#if __CUDA_ARCH__ >= 900
    __shared__ __align__(16) double as[COV_KP][COV_RBP];
    __shared__ __align__(16) double bs[COV_KP][COV_RBP];

    int ti, tj;
    tile_pair(blockIdx.x, &ti, &tj);
    const int i0 = ti * CT, j0 = tj * CT;
    const bool diagonal = ti == tj;
    double (*bsrc)[COV_RBP] = diagonal ? as : bs;

    const i64 p_begin = (i64)blockIdx.y * pix_per_split;
    const i64 p_end = min(npix, p_begin + pix_per_split);
    const int tid = threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const int wm = warp >> 1, wn = warp & 1;
    const bool idle = (diagonal && wm < wn) || i0 + wm * 32 >= bands || j0 + wn * 32 >= bands;
    const bool a_ok = i0 + (tid & 63) < bands, b_ok = j0 + (tid & 63) < bands;

    double acc[2][4][4];
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int n = 0; n < 4; ++n)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[m][n][c] = 0.0;
    double colsum = 0.0;

    // Element e = tid + r * 128 of a step's tile is (pixel e / 64, band e % 64): band tid % 64 for every r.
    constexpr int R = COV_KP * CT / 128;
    float ra[R], rb[R];
    auto fetch = [&](i64 p0) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const i64 p = p0 + (tid >> 6) + 2 * r;
            float a = 0.f, b = 0.f;
            if (p < p_end) {
                const float* row = d + p * bands;
                if (a_ok) a = row[i0 + (tid & 63)];
                if (!diagonal && b_ok) b = row[j0 + (tid & 63)];
            }
            ra[r] = a;
            rb[r] = b;
        }
    };
    if (p_begin < p_end) fetch(p_begin);

    for (i64 p0 = p_begin; p0 < p_end; p0 += COV_KP) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int pp = (tid >> 6) + 2 * r;
            as[pp][tid & 63] = (double)ra[r];
            if (!diagonal) bs[pp][tid & 63] = (double)rb[r];
        }
        __syncthreads();
        if (p0 + COV_KP < p_end) fetch(p0 + COV_KP);
        if (!idle) {
#pragma unroll
            for (int k0 = 0; k0 < COV_KP; k0 += 4) {
                double a[2][2], b[4];
#pragma unroll
                for (int m = 0; m < 2; ++m) {
                    a[m][0] = as[k0 + t4][wm * 32 + m * 16 + g];
                    a[m][1] = as[k0 + t4][wm * 32 + m * 16 + g + 8];
                }
#pragma unroll
                for (int n = 0; n < 4; ++n) b[n] = bsrc[k0 + t4][wn * 32 + n * 8 + g];
#pragma unroll
                for (int m = 0; m < 2; ++m)
#pragma unroll
                    for (int n = 0; n < 4; ++n)
                        asm volatile(
                            "mma.sync.aligned.m16n8k4.row.col.f64.f64.f64.f64 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
                            : "+d"(acc[m][n][0]), "+d"(acc[m][n][1]), "+d"(acc[m][n][2]), "+d"(acc[m][n][3])
                            : "d"(a[m][0]), "d"(a[m][1]), "d"(b[n]));
            }
        }
        if (diagonal && tid < CT) {
#pragma unroll
            for (int pp = 0; pp < COV_KP; ++pp) colsum += as[pp][tid];
        }
        __syncthreads();
    }
    double* slot = part_cross + ((i64)blockIdx.y * n_pairs + blockIdx.x) * (CT * CT);
    if (!idle) {
#pragma unroll
        for (int m = 0; m < 2; ++m)
#pragma unroll
            for (int n = 0; n < 4; ++n)
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    const int row = wm * 32 + m * 16 + g + 8 * (c >> 1);
                    const int col = wn * 32 + n * 8 + 2 * t4 + (c & 1);
                    slot[row * CT + col] += acc[m][n][c];
                }
    }
    if (diagonal && tid < CT) {
        part_sum[((i64)blockIdx.y * n_tiles + ti) * CT + tid] += colsum;
    }
#endif
}

// Adds the per-split slots of cov_lower: c[i, j] (j <= i) and sums[b] for every band.
extern "C" __global__ void __launch_bounds__(256) reduce_parts(
    const double* __restrict__ part_cross, const double* __restrict__ part_sum, int n_splits, int n_pairs,
    int n_tiles, int bands, double* __restrict__ c, double* __restrict__ sums)
{
    const i64 stride = (i64)gridDim.x * blockDim.x;
    const i64 n_cross = (i64)n_pairs * CT * CT;
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < n_cross; e += stride) {
        const int pair = (int)(e / (CT * CT)), loc = (int)(e % (CT * CT));
        int ti, tj;
        tile_pair(pair, &ti, &tj);
        const int i = ti * CT + loc / CT, j = tj * CT + loc % CT;
        if (i < bands && j <= i) {
            // Unrolled so that the loads of several slots are in flight at once (the adds stay in slot
            // order, so the sum is the same bits): this kernel sits between the last chunk's sums and
            // the host's eigen step, and a load at a time left it waiting on memory.
            double s = 0.0;
#pragma unroll 8
            for (int k = 0; k < n_splits; ++k) s += part_cross[(i64)k * n_cross + e];
            c[(i64)i * bands + j] = s;
        }
    }
    const i64 n_sum = (i64)n_tiles * CT;
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < n_sum; e += stride) {
        if (e < bands) {
            double s = 0.0;
            for (int k = 0; k < n_splits; ++k) s += part_sum[(i64)k * n_sum + e];
            sums[e] = s;
        }
    }
}

// The eigen step's inputs straight from the pass's device sums, so that the solver can start as soon as
// they are done instead of after a round trip through the host (issue 31's statistics' tail): C_N
// (scaled by 1 / noise_scale) and C_D of the bands `used` (u of them), each u × u and exactly symmetric
// (row- and column-major alike). The arithmetic is the host's, operation for operation, so the bits
// are the host's: Moments::from_shifted_lower_sums (m2 = S_ij − s_i s_j / n, S the lower triangle of
// the shifted cross sums, B × B row-major, s the shifted band sums) then Moments::covariance_of
// (m2 / (n − 1) / scale). The _rn intrinsics keep the compiler from contracting anything into an FMA.
// counters: [valid pixels, noise residuals]; the data's n is the valid count where the pass masked
// pixels, else `total`. `which`: bit 0 forms C_N, bit 1 C_D (the solver forms C_N as soon as the noise
// sums are done, to factor it while the data's are finished).
extern "C" __global__ void __launch_bounds__(256) cov_pair_from_sums(
    const double* __restrict__ n_cross, const double* __restrict__ n_sum, const double* __restrict__ d_cross,
    const double* __restrict__ d_sum, const unsigned long long* __restrict__ counters, int masked, i64 total,
    int bands, const int* __restrict__ used, int u, double noise_scale, int which, double* __restrict__ cn,
    double* __restrict__ cd)
{
    const unsigned long long nn_ = counters[1];
    const unsigned long long nd_ = masked ? counters[0] : (unsigned long long)total;
    const double nn = (double)nn_, dn = (double)(nn_ - 1ull);
    const double nd = (double)nd_, dd = (double)(nd_ - 1ull);
    const i64 count = (i64)u * u;
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < count; e += (i64)gridDim.x * blockDim.x) {
        const int a = used[e / u], b = used[e % u];
        const int hi = a > b ? a : b, lo = a > b ? b : a;
        const i64 at = (i64)hi * bands + lo;
        if (which & 1) {
            const double mn = __dsub_rn(n_cross[at], __ddiv_rn(__dmul_rn(n_sum[hi], n_sum[lo]), nn));
            cn[e] = __ddiv_rn(__ddiv_rn(mn, dn), noise_scale);
        }
        if (which & 2) {
            const double md = __dsub_rn(d_cross[at], __ddiv_rn(__dmul_rn(d_sum[hi], d_sum[lo]), nd));
            cd[e] = __ddiv_rn(md, dd);
        }
    }
}

// out = (double)in: the cuBLAS route's DSYRK input (the float32 values are exact, so is this).
extern "C" __global__ void __launch_bounds__(256) widen_f64(const float* __restrict__ in, i64 n, double* __restrict__ out)
{
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (i64)gridDim.x * blockDim.x) {
        out[e] = (double)in[e];
    }
}

// Noise residuals for the noise covariance, read straight from the raw cube (any file data type and
// byte order, converted here, never on the host).
//
// Both kernels write one residual row (B floats) per pixel of the requested lines, minus a per-band
// shift chosen by the host near the residuals' mean (so the float32 products that follow do not cancel).
// A pixel with no residual (border, outside the noise window, or a no-data pixel among the ones it
// reads) gets a row of zeros, which adds nothing to the sums; `count` gets the number of residuals.
//
// Lines are global line numbers. The raw buffer holds lines buf_l0 .. buf_l0 + buf_lines - 1 of the
// cube (the whole cube when it is resident on the device, or one streamed chunk plus its halo lines);
// `valid` (or null: all pixels valid) has one byte per pixel of the same buffer.
#include "common.cuh"

#define NT 16        // tile edge in pixels (16 x 16 pixels per block, 256 threads)
#define NH (NT + 2)  // tile edge with the one-pixel halo
#define NBG 16       // bands staged per pass (16 int16 = one 32-byte sector per pixel)

// Residual x - (sum of the 8 neighbours) / 8 at interior pixels (1 <= line <= lines-2,
// 1 <= sample <= samples-2) whose 3 x 3 window is entirely valid: the published improved mean filter,
// with the published "method 2": each block stages a 2-D tile plus a one-pixel halo in shared memory,
// so each raw value is read from global memory once instead of nine times.
// Grid: (ceil(samples / 16), ceil((out_l1 - out_l0) / 16)), 256 threads.
extern "C" __global__ void __launch_bounds__(256) noise_mean_filter(
    const u8* __restrict__ raw, const u8* __restrict__ valid, int dtype, int swap,
    int lines, int samples, int bands, int buf_l0, int buf_lines,
    int out_l0, int out_l1, int wx0, int wx1, int wy0, int wy1,
    const double* __restrict__ shift, float* __restrict__ out, u64* __restrict__ count)
{
    // [band][row][column]; the odd row length (NH + 1 = 19) keeps the 16 bands a warp reads on
    // distinct banks.
    __shared__ float tile[NBG][NH][NH + 1];
    __shared__ u8 vt[NH][NH];
    __shared__ u8 okt[NT][NT];
    __shared__ u64 block_count;

    const int s0 = blockIdx.x * NT;
    const int l0 = out_l0 + blockIdx.y * NT;
    const int tid = threadIdx.x;
    const int buf_l1 = buf_l0 + buf_lines;

    if (tid == 0) block_count = 0;
    // Validity of the tile and its halo (outside the image or the buffer: not valid).
    for (int e = tid; e < NH * NH; e += 256) {
        const int hl = l0 - 1 + e / NH, hs = s0 - 1 + e % NH;
        u8 v = 0;
        if (hl >= buf_l0 && hl < buf_l1 && hl >= 0 && hl < lines && hs >= 0 && hs < samples) {
            v = valid ? valid[(i64)(hl - buf_l0) * samples + hs] : 1;
        }
        vt[e / NH][e % NH] = v;
    }
    __syncthreads();
    {
        const int px = tid % NT, py = tid / NT;
        const int s = s0 + px, l = l0 + py;
        int ok = s < samples && l < out_l1 && l >= 1 && l <= lines - 2 && s >= 1 && s <= samples - 2 &&
                 s >= wx0 && s < wx1 && l >= wy0 && l < wy1;
        if (ok) {
#pragma unroll
            for (int dy = 0; dy < 3; ++dy)
#pragma unroll
                for (int dx = 0; dx < 3; ++dx) ok &= vt[py + dy][px + dx];
        }
        okt[py][px] = (u8)ok;
        if (ok) atomicAdd(&block_count, 1ULL);
    }
    __syncthreads();
    if (tid == 0 && block_count != 0) atomicAdd(count, block_count);

    for (int b0 = 0; b0 < bands; b0 += NBG) {
        // Stage NBG bands of the 18 x 18 tile; consecutive threads read consecutive bands of a pixel.
        for (int e = tid; e < NH * NH * NBG; e += 256) {
            const int j = e % NBG, pix = e / NBG;
            const int hy = pix / NH, hx = pix % NH;
            const int hl = l0 - 1 + hy, hs = s0 - 1 + hx, b = b0 + j;
            float v = 0.f;
            if (b < bands && hl >= buf_l0 && hl < buf_l1 && hl >= 0 && hl < lines && hs >= 0 && hs < samples) {
                v = (float)sample_f64(raw, ((i64)(hl - buf_l0) * samples + hs) * bands + b, dtype, swap);
            }
            tile[j][hy][hx] = v;
        }
        __syncthreads();
        // 256 pixels x NBG bands; 16 consecutive threads write the 16 bands of one pixel (64 bytes).
        for (int o = tid; o < NT * NT * NBG; o += 256) {
            const int j = o % NBG, pix = o / NBG;
            const int py = pix / NT, px = pix % NT;
            const int s = s0 + px, l = l0 + py, b = b0 + j;
            if (s < samples && l < out_l1 && b < bands) {
                float r = 0.f;
                if (okt[py][px]) {
                    const float* t = &tile[j][py][px];
                    // Integer inputs up to 2^21 keep this sum exact in float32; /8 is exact.
                    const float nb = t[0] + t[1] + t[2] + t[NH + 1] + t[NH + 3] + t[2 * (NH + 1)] +
                                     t[2 * (NH + 1) + 1] + t[2 * (NH + 1) + 2];
                    r = (float)((double)(t[NH + 2] - nb * 0.125f) - shift[b]);
                }
                out[((i64)(l - out_l0) * samples + s) * bands + b] = r;
            }
        }
        __syncthreads();
    }
}

// Residual x[l, s] - x[l + 1, s + 1] for l <= lines - 2, s <= samples - 2, both pixels valid (Spectral
// Python's noise_from_diffs). One thread per (pixel, band), consecutive threads on consecutive bands.
extern "C" __global__ void __launch_bounds__(256) noise_shift_difference(
    const u8* __restrict__ raw, const u8* __restrict__ valid, int dtype, int swap,
    int lines, int samples, int bands, int buf_l0, int buf_lines,
    int out_l0, int out_l1, int wx0, int wx1, int wy0, int wy1,
    const double* __restrict__ shift, float* __restrict__ out, u64* __restrict__ count)
{
    __shared__ u64 block_count;
    if (threadIdx.x == 0) block_count = 0;
    __syncthreads();
    (void)buf_lines;
    const i64 n = (i64)(out_l1 - out_l0) * samples * bands;
    u64 local = 0;
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (i64)gridDim.x * blockDim.x) {
        const i64 prel = e / bands;
        const int b = (int)(e - prel * bands);
        const int l = out_l0 + (int)(prel / samples);
        const int s = (int)(prel % samples);
        float r = 0.f;
        if (l <= lines - 2 && s <= samples - 2 && s >= wx0 && s < wx1 && l >= wy0 && l < wy1) {
            const i64 here = (i64)(l - buf_l0) * samples + s;       // pixel index in the buffer
            const i64 there = here + samples + 1;                    // (l + 1, s + 1)
            if (valid == 0 || (valid[here] && valid[there])) {
                const double a = sample_f64(raw, here * bands + b, dtype, swap);
                const double c = sample_f64(raw, there * bands + b, dtype, swap);
                r = (float)((a - c) - shift[b]);
                if (b == 0) ++local;
            }
        }
        out[e] = r;
    }
    if (local != 0) atomicAdd(&block_count, local);
    __syncthreads();
    if (threadIdx.x == 0 && block_count != 0) atomicAdd(count, block_count);
}


// ------------------------------------------------------------------------------------------------
// The mean-filter residual for 2-byte integer cubes (int16 / uint16, either byte order) whose pixel rows
// are 16-byte aligned (bands % 8 == 0; AVIRIS: 224 int16 bands). Same arguments and the same results
// bit for bit as noise_mean_filter above, which ncu measured at ~2.7 ms per 299 MB cube on the H100 (a
// sixth of HBM bandwidth: per-sample index arithmetic, 2-byte loads, two barriers per 16 bands).
// Here each thread owns 8 bands of one sample and walks down W16_LINES output lines with a 3-line window
// in registers: per line it loads the new bottom line's three neighbouring pixels (three 16-byte loads;
// the left and right ones are the neighbouring threads' centres, so they come from L1), keeps row sums
// in integers (exact), and writes its 8 residuals as two 16-byte stores. Each raw byte comes from DRAM
// once; the halo costs 2 lines in W16_LINES + 2 from L2.
// Grid: (ceil(samples · bands / 8 / 256), ceil((out_l1 − out_l0) / W16_LINES)), 256 threads.
#define W16_LINES 16

// Line l of the window: row sum rs = left + centre + right, centre c, and h = left + right of each of
// the thread's 8 bands; returns whether the line lies in the image and the buffer and its three pixels
// are valid (an outside line reads nothing and returns zeros).
template <bool SIGNED>
__device__ __forceinline__ bool w16_line(const uint4* __restrict__ raw, const u8* __restrict__ valid, int swap,
                                         int l, int lines, int samples, int groups, int buf_l0, int buf_l1,
                                         int sl, int s, int sr, int g, int (&rs)[8], int (&c)[8], int (&h)[8]) {
    if (l < 0 || l >= lines || l < buf_l0 || l >= buf_l1) {
#pragma unroll
        for (int i = 0; i < 8; ++i) rs[i] = c[i] = h[i] = 0;
        return false;
    }
    const i64 row = (i64)(l - buf_l0) * samples;
    bool ok = true;
    if (valid) ok = valid[row + sl] && valid[row + s] && valid[row + sr];
    int a[8], b[8], d[8];
    unpack8_w16<SIGNED>(__ldg(raw + (row + sl) * groups + g), swap, a);
    unpack8_w16<SIGNED>(__ldg(raw + (row + s) * groups + g), swap, b);
    unpack8_w16<SIGNED>(__ldg(raw + (row + sr) * groups + g), swap, d);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        c[i] = b[i];
        h[i] = a[i] + d[i];
        rs[i] = h[i] + b[i];
    }
    return ok;
}

template <bool SIGNED>
__device__ __forceinline__ void noise_mean_filter_w16_body(
    const u8* __restrict__ raw, const u8* __restrict__ valid, int swap,
    int lines, int samples, int bands, int buf_l0, int buf_lines,
    int out_l0, int out_l1, int wx0, int wx1, int wy0, int wy1,
    const double* __restrict__ shift, float* __restrict__ out, u64* __restrict__ count)
{
    __shared__ u64 block_count;
    if (threadIdx.x == 0) block_count = 0;
    __syncthreads();
    const int groups = bands >> 3;
    const i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    const int s = (int)(t / groups);
    const int g = (int)(t - (i64)s * groups);
    const int la = out_l0 + (int)blockIdx.y * W16_LINES;
    const int lb = min(la + W16_LINES, out_l1);
    u64 local = 0;
    if (s < samples && la < lb) {
        const uint4* r4 = reinterpret_cast<const uint4*>(raw);
        const int buf_l1 = buf_l0 + buf_lines;
        // Border samples never have a residual; their clamped neighbours are read but not used.
        const int sl = s > 0 ? s - 1 : s;
        const int sr = s < samples - 1 ? s + 1 : s;
        const bool col_ok = s >= 1 && s <= samples - 2 && s >= wx0 && s < wx1;
        int ra[8], rb[8], cb[8], hb[8], rc[8], cc[8], hc[8], unused_c[8], unused_h[8];
        bool va = w16_line<SIGNED>(r4, valid, swap, la - 1, lines, samples, groups, buf_l0, buf_l1, sl, s, sr, g,
                                   ra, unused_c, unused_h);
        bool vb = w16_line<SIGNED>(r4, valid, swap, la, lines, samples, groups, buf_l0, buf_l1, sl, s, sr, g,
                                   rb, cb, hb);
        for (int l = la; l < lb; ++l) {
            const bool vc = w16_line<SIGNED>(r4, valid, swap, l + 1, lines, samples, groups, buf_l0, buf_l1, sl, s,
                                             sr, g, rc, cc, hc);
            const bool ok = col_ok && va && vb && vc && l >= 1 && l <= lines - 2 && l >= wy0 && l < wy1;
            float r[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                // 8x − (sum of the 8 neighbours) is exact in int; /8 and the shift as in noise_mean_filter.
                const int e = 8 * cb[i] - (ra[i] + rc[i] + hb[i]);
                r[i] = ok ? (float)((double)e * 0.125 - shift[8 * g + i]) : 0.f;
            }
            float4* o = reinterpret_cast<float4*>(out + ((i64)(l - out_l0) * samples + s) * bands + 8 * g);
            o[0] = make_float4(r[0], r[1], r[2], r[3]);
            o[1] = make_float4(r[4], r[5], r[6], r[7]);
            if (ok && g == 0) ++local;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                ra[i] = rb[i];
                rb[i] = rc[i];
                cb[i] = cc[i];
                hb[i] = hc[i];
            }
            va = vb;
            vb = vc;
        }
    }
    if (local != 0) atomicAdd(&block_count, local);
    __syncthreads();
    if (threadIdx.x == 0 && block_count != 0) atomicAdd(count, block_count);
}

#define NOISE_MF_W16(NAME, SIGNED)                                                                          \
    extern "C" __global__ void __launch_bounds__(256) NAME(                                                 \
        const u8* __restrict__ raw, const u8* __restrict__ valid, int dtype, int swap,                      \
        int lines, int samples, int bands, int buf_l0, int buf_lines,                                       \
        int out_l0, int out_l1, int wx0, int wx1, int wy0, int wy1,                                         \
        const double* __restrict__ shift, float* __restrict__ out, u64* __restrict__ count)                 \
    {                                                                                                       \
        (void)dtype;                                                                                        \
        noise_mean_filter_w16_body<SIGNED>(raw, valid, swap, lines, samples, bands, buf_l0, buf_lines,      \
                                           out_l0, out_l1, wx0, wx1, wy0, wy1, shift, out, count);          \
    }
NOISE_MF_W16(noise_mean_filter_w16s, true)
NOISE_MF_W16(noise_mean_filter_w16u, false)

// The symmetric eigenproblem of the whitened n × n matrix A = Q T Qᵀ = V Λ Vᵀ in float64, in four
// kernels: the device eigen step's method up to 144 bands, where they beat cuSOLVER's syevd
// (`EigenMethod::Own`, own_eigen.rs).
//
//   1. eig_tridiagonalize: Householder reduction to tridiagonal T (LAPACK dsytd2, lower) by ONE block
//      of 1024 threads, with A's lower triangle packed in shared memory when it fits (n ≤ 238 on a
//      227 KB Hopper SM), else in a global scratch that stays in L2. One block, because each of the
//      n − 2 steps depends on the last: a grid would pay a grid-wide barrier three times a step, a
//      block pays __syncthreads.
//   2. eig_bisect: every eigenvalue of T by Sturm-count multisection, one warp per eigenvalue (32
//      points an iteration, five bits of the answer each time), in ascending order as syevd gives them.
//   3. eig_vectors: each eigenvector of T from its eigenvalue by one twisted factorization (the core of
//      MRRR's single-vector step), one thread per eigenvector: O(n) each.
//   4. eig_back_transform: V = Q Z, the reflectors applied to the eigenvectors, a warp per column.
//
// Why: syevd takes ~1.8 ms at 224 bands on an H100 for a few tens of MFLOP. One block's reduction is
// bound by one SM's latency and shared-memory traffic, so these win only on smaller problems.
//
// Packed lower storage: element (i, j), i ≥ j, at j·(2n − j + 1)/2 + (i − j).

// 1024 threads: 512 and 256 were 17 % and 75 % slower at 224 bands on an H100 (Nsight Compute: the
// kernel issues 0.56 instructions a cycle per scheduler with shared memory 63 % busy: more warps hide
// more of the index arithmetic and shared-memory latency).
#define EIG_THREADS 1024
#define EIG_WARPS (EIG_THREADS / 32)
// Rows a lane holds in registers during the update (8 cover n ≤ 257; rows past them are read from
// the vectors). More would spill: 1024 threads leave 64 registers a thread.
#define EIG_SLOTS 8

__device__ __forceinline__ long long eig_packed(int n, int i, int j) {
    return (long long)j * (2 * n - j + 1) / 2 + (i - j);
}

__device__ __forceinline__ double eig_warp_sum(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return __shfl_sync(0xffffffffu, v, 0);
}

// a: n × n column-major (lower triangle read). packed: n(n+1)/2 doubles of global scratch, used when
// the packed matrix does not fit shared memory (in_shared == 0), and always written at the end (the
// reflectors for eig_back_transform). d (n), e (n − 1), tau (n − 2) out.
//
// Each step k has three phases between barriers: the reflector (warp 0), p = tau · A22 v (a warp per
// row), and the rank-2 update A22 −= v wᵀ + w vᵀ (a warp per column). Measured on an H100 at 224
// bands, neither building the next reflector during the update (look-ahead, one barrier less) nor
// reducing a warp's rows together made the step faster: it is bound by shared-memory traffic and the
// block's latency, not by the reflector's serial chain.
extern "C" __global__ void __launch_bounds__(EIG_THREADS) eig_tridiagonalize(
    const double* __restrict__ a, int n, double* packed, int in_shared,
    double* __restrict__ d, double* __restrict__ e, double* __restrict__ tau)
{
    extern __shared__ double eig_smem[];
    double* v = eig_smem;          // n: the reflector
    double* p = v + n;             // n: tau · A22 · v
    double* scal = p + n;          // 2: tau of this step (one slot unused, for alignment)
    double* m = in_shared ? scal + 2 : packed;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const long long total = (long long)n * (n + 1) / 2;

    // Load the lower triangle, column by column (coalesced reads of each column of a).
    for (int j = warp; j < n; j += EIG_WARPS) {
        long long base = eig_packed(n, j, j);
        for (int i = j + lane; i < n; i += 32) m[base + (i - j)] = a[(long long)j * n + i];
    }
    __syncthreads();

    for (int k = 0; k < n - 2; ++k) {
        const int r0 = k + 1;            // first row of the trailing block
        const int ck = (int)eig_packed(n, r0, k);  // A[k+1, k]
        // 1. The reflector from A[k+1:n, k] (warp 0): H = I − tau v vᵀ, v[0] = 1, H x = beta e1.
        if (warp == 0) {
            const double alpha = m[ck];
            double s = 0.0;
            for (int i = r0 + 1 + lane; i < n; i += 32) { double x = m[ck + (i - r0)]; s += x * x; }
            s = eig_warp_sum(s);
            double t, beta, scale;
            if (s == 0.0) {
                t = 0.0; beta = alpha; scale = 0.0;
            } else {
                beta = -copysign(sqrt(alpha * alpha + s), alpha);
                t = (beta - alpha) / beta;
                scale = 1.0 / (alpha - beta);
            }
            for (int i = r0 + lane; i < n; i += 32) {
                double vi = (i == r0) ? 1.0 : m[ck + (i - r0)] * scale;
                v[i] = vi;
                if (i > r0) m[ck + (i - r0)] = vi;   // kept for the back-transform
            }
            __syncwarp();   // every lane has read m[ck] (alpha) before lane 0 overwrites it
            if (lane == 0) {
                m[ck] = beta;
                scal[0] = t;
                tau[k] = t;
                d[k] = m[eig_packed(n, k, k)];
                e[k] = beta;
            }
        }
        __syncthreads();
        const double t = scal[0];
        if (t == 0.0) {
            // Nothing to reflect: A22 is unchanged. The barrier keeps warp 0's next reflector from
            // overwriting scal[0] before every warp has read it.
            __syncthreads();
            continue;
        }
        // 2. p = t · A22 v: a warp per row, lanes along the row (the lower part along row i, the
        // upper along column i).
        for (int i = r0 + warp; i < n; i += EIG_WARPS) {
            double s = 0.0;
            // (i, j) sits at off(j) + i − j, and off(j + 32) − off(j) = 32n − 32j − 496: the index
            // moves by integer adds only.
            int j = r0 + lane;
            int at = (int)eig_packed(n, i, j);
            for (; j <= i; j += 32) {
                s += m[at] * v[j];
                at += 32 * n - 32 * j - 528;
            }
            const int ci = (int)eig_packed(n, i, i) - i;
            for (int jj = i + 1 + lane; jj < n; jj += 32) s += m[ci + jj] * v[jj];
            s = eig_warp_sum(s);
            if (lane == 0) p[i] = t * s;
        }
        __syncthreads();
        // 3. K = t/2 · pᵀv, computed by every warp (no barrier), then A22 −= v wᵀ + w vᵀ, w = p − K v.
        // A lane keeps the same rows i = r0 + lane + 32s for every column its warp updates, so v_i and
        // w_i stay in registers and a column's lanes touch consecutive words (no bank conflicts).
        double kk = 0.0;
        for (int i = r0 + lane; i < n; i += 32) kk += p[i] * v[i];
        kk = 0.5 * t * eig_warp_sum(kk);
        double vr[EIG_SLOTS], wr[EIG_SLOTS];
#pragma unroll
        for (int q = 0; q < EIG_SLOTS; ++q) {
            const int i = r0 + lane + 32 * q;
            vr[q] = i < n ? v[i] : 0.0;
            wr[q] = i < n ? p[i] - kk * vr[q] : 0.0;
        }
        for (int j = r0 + warp; j < n; j += EIG_WARPS) {
            const double vj = v[j], wj = p[j] - kk * vj;
            const int cj = (int)eig_packed(n, j, j) - j;   // (i, j) at cj + i
#pragma unroll
            for (int q = 0; q < EIG_SLOTS; ++q) {
                const int i = r0 + lane + 32 * q;
                if (i >= j && i < n) m[cj + i] -= vr[q] * wj + wr[q] * vj;
            }
            for (int i = r0 + lane + 32 * EIG_SLOTS; i < n; i += 32) {
                if (i >= j) m[cj + i] -= v[i] * wj + (p[i] - kk * v[i]) * vj;
            }
        }
        __syncthreads();
    }
    if (tid == 0) {
        if (n >= 2) {
            d[n - 2] = m[eig_packed(n, n - 2, n - 2)];
            e[n - 2] = m[eig_packed(n, n - 1, n - 2)];
        }
        d[n - 1] = m[eig_packed(n, n - 1, n - 1)];
    }
    if (in_shared) {
        for (long long x = tid; x < total; x += EIG_THREADS) packed[x] = m[x];
    }
}

// The number of eigenvalues of T smaller than x (Sturm sequence of the LDLᵀ of T − xI). e2 = e².
// A zero pivot is replaced by −pivmin, as LAPACK's dstebz does.
__device__ __forceinline__ int eig_sturm(const double* d, const double* e2, int n, double x, double pivmin) {
    int count = 0;
    double q = d[0] - x;
    if (fabs(q) < pivmin) q = -pivmin;
    if (q < 0.0) ++count;
    for (int i = 1; i < n; ++i) {
        q = d[i] - x - e2[i - 1] / q;
        if (fabs(q) < pivmin) q = -pivmin;
        if (q < 0.0) ++count;
    }
    return count;
}

// w[i] = the i-th smallest eigenvalue of T, one warp per eigenvalue. scratch: n − 1 doubles (e²).
// Launch with n warps in all (e.g. blocks of 128 threads), after eig_squares.
extern "C" __global__ void eig_squares(const double* __restrict__ e, int n, double* __restrict__ e2) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n - 1) e2[i] = e[i] * e[i];
}

extern "C" __global__ void eig_bisect(const double* __restrict__ d, const double* __restrict__ e,
                                      const double* __restrict__ e2, int n, double* __restrict__ w)
{
    const int lane = threadIdx.x & 31;
    const int idx = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;   // the eigenvalue of this warp
    if (idx >= n) return;
    // Gershgorin bounds of the whole spectrum, by every lane (n is small; no shared memory needed).
    double lo = 1e300, hi = -1e300, emax2 = 0.0;
    for (int i = lane; i < n; i += 32) {
        double r = (i > 0 ? fabs(e[i - 1]) : 0.0) + (i < n - 1 ? fabs(e[i]) : 0.0);
        lo = fmin(lo, d[i] - r);
        hi = fmax(hi, d[i] + r);
        if (i < n - 1) emax2 = fmax(emax2, e2[i]);
    }
    for (int o = 16; o > 0; o >>= 1) {
        lo = fmin(lo, __shfl_xor_sync(0xffffffffu, lo, o));
        hi = fmax(hi, __shfl_xor_sync(0xffffffffu, hi, o));
        emax2 = fmax(emax2, __shfl_xor_sync(0xffffffffu, emax2, o));
    }
    const double eps = 2.220446049250313e-16, safemin = 2.2250738585072014e-308;
    const double norm = fmax(fabs(lo), fabs(hi));
    const double pivmin = fmax(safemin * fmax(1.0, emax2), 1e-300);
    lo -= 2.0 * eps * norm * n + pivmin;
    hi += 2.0 * eps * norm * n + pivmin;
    // Invariant: count(lo) ≤ idx < count(hi). 33 sub-intervals per iteration.
    for (int it = 0; it < 40; ++it) {
        const double width = hi - lo;
        if (width <= 2.0 * eps * fmax(fabs(lo), fabs(hi)) + pivmin) break;
        const double x = lo + width * (double)(lane + 1) / 33.0;
        const int c = eig_sturm(d, e2, n, x, pivmin);
        // The lanes whose point has count ≤ idx move lo up; the first with count > idx sets hi.
        unsigned le = __ballot_sync(0xffffffffu, c <= idx);
        // Points increase with the lane, counts are non-decreasing: le is a run of low lanes.
        int nle = __popc(le);
        double nlo = nle > 0 ? __shfl_sync(0xffffffffu, x, nle - 1) : lo;
        double nhi = nle < 32 ? __shfl_sync(0xffffffffu, x, nle < 32 ? nle : 31) : hi;
        lo = nlo;
        hi = nhi;
    }
    if (lane == 0) w[idx] = 0.5 * (lo + hi);
}

// Column c of z (n × n, column-major) = the unit eigenvector of T for w[c], by the twisted
// factorization T − λI = N_r Δ_r N_rᵀ at the index r of the smallest |γ_r|. One thread per vector;
// lu: 2n doubles of scratch per thread (the forward and backward multipliers).
extern "C" __global__ void eig_vectors(const double* __restrict__ d, const double* __restrict__ e,
                                       const double* __restrict__ w, int n, double* __restrict__ z,
                                       double* __restrict__ lu)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= n) return;
    const double lam = w[c];
    double* L = lu + (long long)c * 2 * n;   // L[i] = e[i] / D+[i]
    double* U = L + n;                        // U[i] = e[i] / D-[i+1]
    double* col = z + (long long)c * n;
    double tnorm = 0.0;
    for (int i = 0; i < n; ++i) tnorm = fmax(tnorm, fabs(d[i]) + (i > 0 ? fabs(e[i - 1]) : 0.0) + (i < n - 1 ? fabs(e[i]) : 0.0));
    const double tiny = 2.220446049250313e-16 * fmax(tnorm, 1e-300) * 1e-3;
    // Forward: D+ into col (as scratch), multipliers into L.
    double dp = d[0] - lam;
    for (int i = 0; i < n - 1; ++i) {
        if (fabs(dp) < tiny) dp = dp < 0.0 ? -tiny : tiny;
        col[i] = dp;
        L[i] = e[i] / dp;
        dp = d[i + 1] - lam - L[i] * e[i];
    }
    if (fabs(dp) < tiny) dp = dp < 0.0 ? -tiny : tiny;
    col[n - 1] = dp;
    // Backward: D- running, γ_r = D+_r + D-_r − (d_r − λ); keep the r of the smallest |γ|.
    double dm = d[n - 1] - lam;
    if (fabs(dm) < tiny) dm = dm < 0.0 ? -tiny : tiny;
    int r = n - 1;
    double best = fabs(col[n - 1] + dm - (d[n - 1] - lam));
    for (int i = n - 2; i >= 0; --i) {
        U[i] = e[i] / dm;
        dm = d[i] - lam - U[i] * e[i];
        if (fabs(dm) < tiny) dm = dm < 0.0 ? -tiny : tiny;
        const double g = fabs(col[i] + dm - (d[i] - lam));
        if (g < best) { best = g; r = i; }
    }
    // z_r = 1, then outwards.
    col[r] = 1.0;
    double nrm = 1.0;
    for (int i = r - 1; i >= 0; --i) { double zi = -L[i] * col[i + 1]; col[i] = zi; nrm += zi * zi; }
    for (int i = r; i < n - 1; ++i) { double zi = -U[i] * col[i]; col[i + 1] = zi; nrm += zi * zi; }
    const double inv = 1.0 / sqrt(nrm);
    for (int i = 0; i < n; ++i) col[i] *= inv;
}

// V = Q Z = H_0 H_1 ⋯ H_{n−3} Z in place over z (n × n, column-major), a warp per column, the column
// in shared memory. packed holds the reflectors as eig_tridiagonalize left them (v_k[k+1] = 1,
// v_k[i] at (i, k) for i > k + 1). The block stages EIG_BT_PANEL reflectors at a time into shared
// memory with coalesced loads, so each step reads its reflector at shared-memory latency instead of
// L2's. Blocks of EIG_BT_COLS warps; shared memory (EIG_BT_COLS + EIG_BT_PANEL) · n doubles.
#define EIG_BT_COLS 8
#define EIG_BT_PANEL 8
extern "C" __global__ void __launch_bounds__(EIG_BT_COLS * 32) eig_back_transform(
    const double* __restrict__ packed, const double* __restrict__ tau, int n, double* __restrict__ z)
{
    extern __shared__ double eig_cols[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int c = blockIdx.x * EIG_BT_COLS + warp;
    double* zc = eig_cols + warp * n;
    double* panel = eig_cols + EIG_BT_COLS * n;   // panel[r * n + i]: reflector k0 − r, row i
    double* col = z + (long long)c * n;
    if (c < n)
        for (int i = lane; i < n; i += 32) zc[i] = col[i];
    for (int k0 = n - 3; k0 >= 0; k0 -= EIG_BT_PANEL) {
        const int count = min(EIG_BT_PANEL, k0 + 1);
        __syncthreads();   // the previous panel is no longer read
        for (int r = warp; r < count; r += EIG_BT_COLS) {
            const int k = k0 - r;
            const long long ck = eig_packed(n, k + 1, k);
            for (int i = k + 1 + lane; i < n; i += 32) panel[r * n + i] = (i == k + 1) ? 1.0 : packed[ck + (i - k - 1)];
        }
        __syncthreads();
        if (c < n) {
            for (int r = 0; r < count; ++r) {
                const int k = k0 - r;
                const double t = tau[k];
                if (t == 0.0) continue;
                const double* vk = panel + r * n;
                double s = 0.0;
                for (int i = k + 1 + lane; i < n; i += 32) s += vk[i] * zc[i];
                s = t * eig_warp_sum(s);
                for (int i = k + 1 + lane; i < n; i += 32) zc[i] -= s * vk[i];
                __syncwarp();
            }
        }
    }
    if (c < n)
        for (int i = lane; i < n; i += 32) col[i] = zc[i];
}

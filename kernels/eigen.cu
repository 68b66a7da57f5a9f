// The symmetric eigenproblem of the whitened n × n matrix A = Q T Qᵀ = V Λ Vᵀ in float64: the
// device eigen step's method where they beat cuSOLVER's syevd (`EigenMethod::Own` and `OwnCluster`,
// own_eigen.rs; `EigenMethod::for_bands` picks per size and device).
//
//   1. The Householder reduction to tridiagonal T (LAPACK dsytd2, lower), one of two ways:
//      - eig_tridiagonalize: ONE block of 1024 threads, with A's lower triangle packed in shared memory
//        when it fits (n ≤ 238 on a 227 KB Hopper SM), else in a global scratch that stays in L2. One
//        block, because each of the n − 2 steps depends on the last: a grid would pay a grid-wide
//        barrier three times a step, a block pays __syncthreads. Bound by one SM.
//      - eig_tridiagonalize_cluster (Hopper): a thread-block cluster of 8 or 16 blocks with the matrix
//        spread over their shared memory, one cluster barrier a step (below).
//   2. eig_bisect: every eigenvalue of T by Sturm-count multisection, one warp per eigenvalue (32
//      points an iteration, five bits of the answer each time), in ascending order as syevd gives them;
//      the count from the leading minors, without divisions on its chain.
//   3. eig_vectors: each eigenvector of T from its eigenvalue by one twisted factorization (the core of
//      MRRR's single-vector step), two threads per eigenvector: O(n) each, in shared memory.
//   4. eig_bt_gram + eig_back_transform: V = Q Z, the reflectors applied to the eigenvectors 16 at a
//      time, a warp per column.
//
// Why: syevd takes ~1.8 ms at 224 bands on an H100 for a few tens of MFLOP: its steps are bound by
// latency, not arithmetic, and so are these; they win by doing fewer, cheaper steps.
//
// At the end of the file, the steps around them in the device eigen step (solver.rs): the whitening's
// triangular inverse L⁻¹ (eig_lower_padded, eig_invert_leaves; whitening.rs joins the blocks by GEMMs)
// and the pairs put in the job's order and signs (eig_column_signs, eig_order_transpose).
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

// The sum over the warp, in every lane: a butterfly, five dependent shuffles (a reduction to lane 0 and
// a broadcast took six; ncu on an H200, 2026-11-29: the cluster tridiagonalisation 778 → 772 µs at
// 224–256 bands, the one-block kernel 2011 → 1979 µs). Every lane gets the same bits: at each stage a
// lane and its partner add the same two values, and a + b == b + a exactly.
__device__ __forceinline__ double eig_warp_sum(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// 1 / q to within an ulp or two: the hardware's approximate reciprocal and two Newton steps. A
// division is a ~10-instruction subroutine with a branch; this is the approximation and four dependent
// FMAs. (It halved the Sturm count's ratio form on an H100, before the count became division-free
// below; eig_vectors and the reflectors use it.) q must be normal (the eigenvector pivots' floor keeps
// them so); a reciprocal that would be subnormal is flushed to 0.
__device__ __forceinline__ double eig_rcp(double q) {
    double y;
    asm("rcp.approx.ftz.f64 %0, %1;" : "=d"(y) : "d"(q));
    double r = fma(-q, y, 1.0);
    y = fma(y, r, y);
    r = fma(-q, y, 1.0);
    return fma(y, r, y);
}

// The scalars of the Householder reflector H = I − t v vᵀ with H y = beta e1 of a column y whose
// first entry is alpha and whose other entries' squares sum to s (LAPACK dlarfg without its rescaling
// of tiny norms): beta = −sign(alpha) ‖y‖, t = (beta − alpha) / beta, and v = (1, y_{2..} · scale),
// scale = 1 / (alpha − beta).
__device__ __forceinline__ void eig_reflector_scalars(double alpha, double s, double& t, double& beta, double& scale) {
    if (s == 0.0) {
        t = 0.0; beta = alpha; scale = 0.0;
    } else {
        beta = -copysign(sqrt(alpha * alpha + s), alpha);
        // The two divisions by eig_rcp: this is on every step's critical path (warp 0, while the
        // block waits): the cluster tridiagonalisation 790 → 778 µs in ncu at 224–256 bands, 2007 →
        // 2000 at 425 (an H200, 2026-11-29). |beta| ≥ √s > 0 and |alpha − beta| = |alpha| + |beta|:
        // both normal.
        t = fma(-alpha, eig_rcp(beta), 1.0);   // (beta − alpha) / beta
        scale = eig_rcp(alpha - beta);
    }
}

// eig_reflector_scalars of the column y = rows r0..n−1, row i at x[at + (i − r0)], by one warp. Every
// lane gets all three.
__device__ __forceinline__ void eig_householder(const double* x, int at, int r0, int n, int lane, double& t, double& beta, double& scale) {
    const double alpha = x[at];
    double s = 0.0;
    for (int i = r0 + 1 + lane; i < n; i += 32) { double y = x[at + (i - r0)]; s += y * y; }
    eig_reflector_scalars(alpha, eig_warp_sum(s), t, beta, scale);
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
            double t, beta, scale;
            eig_householder(m, ck, r0, n, lane, t, beta, scale);
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

// eig_bisect copies T into shared memory; own_eigen.rs's MAX_BANDS is at most this.
#define EIG_MAX_N 1024
// Pivots of the scaled T (‖T‖ < 1) smaller than this in magnitude are replaced by −EIG_PIVOT_FLOOR,
// as LAPACK's dstebz replaces those under pivmin: a change of d_i by at most 2^-59 ‖T‖, far below the
// count's own rounding (~eps ‖T‖). Far larger than dstebz's pivmin, so that the determinants below
// shrink by at most 2^-60 a row, and EIG_STURM_ROWS rows between rescalings cannot underflow.
#define EIG_PIVOT_FLOOR 8.673617379884035e-19   // 2^-60
// The rows eig_sturm runs between rescalings: the most for which the minors, shrinking by at most
// 2^-60 a row from [1, 2), and the floor's threshold 2^-60 |p| below them, stay normal numbers
// (2^-960 and 2^-1020), so that every count is what rescaling every row would give. 16 rows took
// 44.6 µs at 224 bands against 47.3 for 12 and 59.5 for 8 (an H200, 2026-11-29, the same bits).
#define EIG_STURM_ROWS 16

// p scaled into [1, 2) by a power of two f, and pm by the same (exact, so every sign and ratio
// stays); returns 1 / f.
__device__ __forceinline__ double eig_rescale(double& p, double& pm) {
    int ex = (__double2hiint(p) >> 20) & 0x7ff;   // the biased exponent of |p|
    ex = min(max(ex, 1), 2045);
    p *= __hiloint2double((2046 - ex) << 20, 0);    // f = 2^(1023 − ex)
    pm *= __hiloint2double((2046 - ex) << 20, 0);
    return __hiloint2double(ex << 20, 0);           // 2^(ex − 1023)
}

// The power of two s with s·norm in [0.5, 1) (1 where norm is 0 or not finite).
__device__ __forceinline__ double eig_unit_scale(double norm) {
    return norm > 0.0 && norm < 1e300 ? ldexp(1.0, -(ilogb(norm) + 1)) : 1.0;
}

// The number of eigenvalues of T smaller than x: the sign changes of the leading principal minors
// p_i = det(T_{0..i} − xI), p_i = (d_i − x) p_{i−1} − e2_{i−1} p_{i−2} (the Sturm sequence), which is
// the pivots' form q_i = p_i / p_{i−1} of dstebz without its divisions. Just as stable: with the FMA,
// the computed p_i are the exact ones of T with d_i − x and e2_{i−1} perturbed by two roundings each
// (relatively), every row by its own, as the pivots' rounding errors are. T is scaled by a power of
// two (sd = s·d, se2 = s²·e2, x = s·x, ‖sT‖ < 1), which changes no count, and the minors are rescaled
// every EIG_STURM_ROWS rows (exactly: eig_rescale) so that they stay in range: at most 3x larger, and
// (with the pivot floor) at most 2^60 smaller, a row.
// The floor is speculated: a group of rows runs without it, one FMA a row on the dependent chain
// (its compare and select were on it too), noting whether any row needed it; only such a group runs
// again with it, from the group's start. Up to the first row that needs it the two runs have the
// same values, so the count is the floored one's bit for bit (an H200, 2026-11-29, eig_bisect with
// eig_squares folded in: 88.3 → 59.5 µs at 224 bands with 8 rows between rescalings as before, 44.6
// with 16; the same eigenvalues to the bit on every stress matrix of scripts/gpu-harness/sturm.cu).
__device__ __forceinline__ int eig_sturm(const double* sd, const double* se2, int n, double x) {
    double pm = 1.0;             // p_{i−1}
    double p = sd[0] - x;        // p_i
    if (fabs(p) < EIG_PIVOT_FLOOR) p = -EIG_PIVOT_FLOOR;
    int count = p < 0.0;
    auto row = [&](int i) {
        const double np = fma(sd[i] - x, p, -(se2[i - 1] * pm));
        const double q = fabs(np) < EIG_PIVOT_FLOOR * fabs(p) ? -EIG_PIVOT_FLOOR * p : np;
        count += (q < 0.0) != (p < 0.0);
        pm = p;
        p = q;
    };
    int i = 1;
    for (; i + EIG_STURM_ROWS <= n; i += EIG_STURM_ROWS) {
        const double p0 = p, pm0 = pm;
        const int c0 = count;
        bool floored = false;
#pragma unroll
        for (int r = 0; r < EIG_STURM_ROWS; ++r) {
            const double np = fma(sd[i + r] - x, p, -(se2[i + r - 1] * pm));
            floored |= fabs(np) < EIG_PIVOT_FLOOR * fabs(p);
            count += (np < 0.0) != (p < 0.0);
            pm = p;
            p = np;
        }
        if (floored) {
            p = p0;
            pm = pm0;
            count = c0;
#pragma unroll
            for (int r = 0; r < EIG_STURM_ROWS; ++r) row(i + r);
        }
        eig_rescale(p, pm);
    }
    for (; i < n; ++i) row(i);
    return count;
}

// w[i] = the i-th smallest eigenvalue of T, one warp per eigenvalue. Launch with n warps in all (e.g.
// blocks of 128 threads). n ≤ EIG_MAX_N.
extern "C" __global__ void eig_bisect(const double* __restrict__ d, const double* __restrict__ e, int n,
                                      double* __restrict__ w)
{
    __shared__ double sd[EIG_MAX_N], se2[EIG_MAX_N];   // s·d and s²·e² (eig_sturm)
    const int lane = threadIdx.x & 31;
    const int idx = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;   // the eigenvalue of this warp
    // Gershgorin bounds of the whole spectrum, by every lane of every warp (the same in each; n is small).
    double lo = 1e300, hi = -1e300, emax = 0.0;
    for (int i = lane; i < n; i += 32) {
        double r = (i > 0 ? fabs(e[i - 1]) : 0.0) + (i < n - 1 ? fabs(e[i]) : 0.0);
        lo = fmin(lo, d[i] - r);
        hi = fmax(hi, d[i] + r);
        if (i < n - 1) emax = fmax(emax, fabs(e[i]));
    }
    for (int o = 16; o > 0; o >>= 1) {
        lo = fmin(lo, __shfl_xor_sync(0xffffffffu, lo, o));
        hi = fmax(hi, __shfl_xor_sync(0xffffffffu, hi, o));
        emax = fmax(emax, __shfl_xor_sync(0xffffffffu, emax, o));
    }
    const double eps = 2.220446049250313e-16, safemin = 2.2250738585072014e-308;
    const double norm = fmax(fabs(lo), fabs(hi));
    // s = 2^-(⌊log2 norm⌋ + 1): every |d_i| + |e_i| + |e_{i−1}| of sT is below 1.
    const double s = eig_unit_scale(norm);
    // (s·e)² is s²·e² to the bit where e² is a normal number (s is a power of two), and more exact
    // where e² would underflow: so e² needs no scratch and no launch of its own.
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        sd[i] = d[i] * s;
        if (i < n - 1) {
            const double es = e[i] * s;
            se2[i] = es * es;
        }
    }
    __syncthreads();
    if (idx >= n) return;
    // (emax² bounded: at |e| > 1e150 it would overflow, and an infinite pivmin ends the search at once.)
    const double pivmin = fmax(safemin * fmax(1.0, fmin(emax * emax, 1e300)), 1e-300);
    lo -= 2.0 * eps * norm * n + pivmin;
    hi += 2.0 * eps * norm * n + pivmin;
    // Invariant: count(lo) ≤ idx < count(hi). 33 sub-intervals per iteration. (Two, four and eight
    // points a lane, their chains interleaved in one loop, took 8 %, 10 % and 85 % longer on an H200
    // at 224 and 425 bands: fewer iterations, but each row's work grows with the points and no longer
    // hides behind the chain's latency. Two and four warps an eigenvalue, 65 and 129 points, took 41.0
    // and 48.2 µs against 44.7 at 224 bands, 93 and 139 against 74 at 425: not kept.)
    for (int it = 0; it < 40; ++it) {
        const double width = hi - lo;
        if (width <= 2.0 * eps * fmax(fabs(lo), fabs(hi)) + pivmin) break;
        const double x = lo + width * (double)(lane + 1) / 33.0;
        const int c = eig_sturm(sd, se2, n, x * s);
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

// The pivots of T − λI from one end, with the minors' chain of eig_sturm (one FMA a row; the divisions
// off it): FWD, LDLᵀ's D+_i = P_i / P_{i−1} of the leading minors, into D[i], and L_i = e_i / D+_i into
// M[i]; else UDUᵀ's D-_i of the trailing minors, and U_i = e_i / D-_{i+1}. A pivot under tiny in
// magnitude becomes ±tiny with its sign, as the ratio form's (d_i − λ − e_{i−1}² / D_{i−1}) did. s
// (eig_unit_scale of ‖T‖) scales T so that with the floor the minors change by at most 3x up and 2^63
// down a row, and they are rescaled every eight rows. The floor is speculated as in eig_sturm: eight
// rows without it, again with it (D and M rewritten) where one of them needed it, the same bits (an
// H200, 2026-11-29: eig_vectors 49.3 → 43.3 µs at 224 bands, 91.3 → 78.7 at 425).
template <bool FWD>
__device__ __forceinline__ void eig_pivots(const double* __restrict__ d, const double* __restrict__ e, int n, double lam,
                                           double s, double tiny, double* __restrict__ D, double* __restrict__ M) {
    const double ts = tiny * s, inv_s = 1.0 / s;
    double pm = 1.0, rpm = 1.0;                 // P_{k−1} and its reciprocal (P_{−1} = 1)
    double p = (d[FWD ? 0 : n - 1] - lam) * s;  // P_k
    if (fabs(p) < ts) p = p < 0.0 ? -ts : ts;
    // Step k: the pivot of row k (FWD) or n − 1 − k, its multiplier, and P_{k+1}, unfloored; whether
    // the floor would have replaced it.
    auto step = [&](int k) {
        const double rp = eig_rcp(p);
        D[FWD ? k : n - 1 - k] = p * rpm * inv_s;
        const int ei = FWD ? k : n - 2 - k;     // the off-diagonal to the next row
        const double es = e[ei] * s;
        M[ei] = es * pm * rp;                   // e / (P_k / P_{k−1}), s cancels
        const double np = fma((d[FWD ? k + 1 : n - 2 - k] - lam) * s, p, -(es * es) * pm);
        const bool floored = fabs(np) < ts * fabs(p);
        pm = p;
        rpm = rp;
        p = np;
        return floored;
    };
    // The same step with the floor: ±tiny with the pivot's sign.
    auto floored_step = [&](int k) {
        if (step(k)) p = (p < 0.0) != (pm < 0.0) ? -ts * pm : ts * pm;
    };
    int k = 0;
    for (; k + 8 < n; k += 8) {
        const double p0 = p, pm0 = pm, rpm0 = rpm;
        bool floored = false;
#pragma unroll
        for (int u = 0; u < 8; ++u) floored |= step(k + u);
        if (floored) {
            p = p0;
            pm = pm0;
            rpm = rpm0;
#pragma unroll
            for (int u = 0; u < 8; ++u) floored_step(k + u);
        }
        rpm *= eig_rescale(p, pm);
    }
    for (; k < n - 1; ++k) floored_step(k);
    D[FWD ? n - 1 : 0] = p * rpm * inv_s;
}

// Column c of z (n × n, column-major) = the unit eigenvector of T for w[c], by the twisted
// factorization T − λI = N_r Δ_r N_rᵀ at the index r of the smallest |γ_r|. TWO threads per vector,
// adjacent in a block of EIG_VEC_THREADS: the even one runs the forward factorization (D+ and L,
// eig_pivots) and then the recurrence below r, the odd one the backward factorization (D- and U) and
// the recurrence above r; the two chains overlap only in different threads (in one thread's loop they
// ran one after the other). Each vector's D+, L, U and D- are in shared memory: the pivot search and
// the recurrences read them back one after another, and from global scratch each such read waited on
// L2 (an H200, 2026-11-29: 65 → 49 µs at 224 bands, 170 → 91 µs at 425, the same bits). The vector is
// built over D+ once the pivot is known, and written to z normalized.
// Launch 2n threads in blocks of 2, 4, 6 or EIG_VEC_THREADS, with (blockDim / 2) · eig_vec_stride(n)
// doubles of dynamic shared memory (and no static: own_eigen.rs opts every kernel into all of it).
// Small blocks spread the vectors over more SMs: blocks of 32 (16 vectors) were 18–20 % faster than 64
// on an H100 at 224 and 425 bands, and on an H200 (2026-11-29, ncu at 256 bands, global scratch)
// blocks of 16 took 96 µs and blocks of 8 (4 vectors) 92 µs against 143 for 32. (Blocks of one warp for eig_bisect instead of four, 205 µs either way, and
// back-transform blocks of 4 columns instead of 8, 226 µs against 152, did not help.)
#define EIG_VEC_THREADS 8
// A vector's shared memory: D+ (then the vector), L, U, D-, the two threads' sums of squares, its pivot
// index, one spare (so that consecutive vectors start on different banks).
__device__ __forceinline__ int eig_vec_stride(int n) { return 4 * n + 5; }
extern "C" __global__ void __launch_bounds__(EIG_VEC_THREADS) eig_vectors(
    const double* __restrict__ d, const double* __restrict__ e, const double* __restrict__ w, int n,
    double* __restrict__ z)
{
    extern __shared__ double eig_vec_smem[];   // all of it dynamic: the opt-in size is all the launch may ask
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    const int c = t >> 1, pair = threadIdx.x >> 1;
    const bool forward = (t & 1) == 0, live = c < n;
    double* Dp = eig_vec_smem + pair * eig_vec_stride(n);   // D+[i], then the unscaled vector
    double* L = Dp + n;                                      // L[i] = e[i] / D+[i]
    double* U = L + n;                                       // U[i] = e[i] / D-[i+1]
    double* Dm = U + n;                                      // D-[i]
    double* half = Dm + n;                                   // the two threads' sums of squares
    int* pivot = reinterpret_cast<int*>(half + 2);           // r
    const double lam = live ? w[c] : 0.0;
    if (live) {
        // ‖T‖ (Gershgorin) in four running maxima, not one chain of n (the same value: max is exact).
        auto row_sum = [&](int i) { return fabs(d[i]) + (i > 0 ? fabs(e[i - 1]) : 0.0) + (i < n - 1 ? fabs(e[i]) : 0.0); };
        double t0 = 0.0, t1 = 0.0, t2 = 0.0, t3 = 0.0;
        int i = 0;
        for (; i + 4 <= n; i += 4) {
            t0 = fmax(t0, row_sum(i));
            t1 = fmax(t1, row_sum(i + 1));
            t2 = fmax(t2, row_sum(i + 2));
            t3 = fmax(t3, row_sum(i + 3));
        }
        for (; i < n; ++i) t0 = fmax(t0, row_sum(i));
        double tnorm = fmax(fmax(t0, t1), fmax(t2, t3));
        // (The floor keeps every pivot a normal number, which eig_rcp needs.)
        tnorm = fmax(tnorm, 1e-280);
        const double tiny = 2.220446049250313e-16 * tnorm * 1e-3;
        if (forward) eig_pivots<true>(d, e, n, lam, eig_unit_scale(tnorm), tiny, Dp, L);
        else eig_pivots<false>(d, e, n, lam, eig_unit_scale(tnorm), tiny, Dm, U);
    }
    __syncthreads();   // both halves' factorizations are visible to the pair
    if (live && forward) {
        // γ_r = D+_r + D-_r − (d_r − λ); the r of the smallest |γ| (the highest of equal ones).
        int r = n - 1;
        double best = fabs(Dp[n - 1] + Dm[n - 1] - (d[n - 1] - lam));
#pragma unroll 8
        for (int i = n - 2; i >= 0; --i) {
            const double g = fabs(Dp[i] + Dm[i] - (d[i] - lam));
            if (g < best) { best = g; r = i; }
        }
        *pivot = r;
    }
    __syncthreads();   // the pivot is known, and D+ is read no more: the vector goes over it
    double sum = 0.0;
    if (live) {
        // z_r = 1, then outwards: below r by the even thread, above by the odd one.
        const int r = *pivot;
        double x = 1.0;
        if (forward) {
            Dp[r] = 1.0;
#pragma unroll 8
            for (int i = r - 1; i >= 0; --i) { x = -L[i] * x; Dp[i] = x; sum += x * x; }
        } else {
#pragma unroll 8
            for (int i = r; i < n - 1; ++i) { x = -U[i] * x; Dp[i + 1] = x; sum += x * x; }
        }
    }
    half[threadIdx.x & 1] = sum;
    __syncthreads();   // both halves of the vector are written
    if (live) {
        const double inv = 1.0 / sqrt(1.0 + half[0] + half[1]);
        double* col = z + (long long)c * n;
        const int mid = n / 2;
#pragma unroll 8
        for (int i = forward ? 0 : mid; i < (forward ? mid : n); ++i) col[i] = Dp[i] * inv;
    }
}

// V = Q Z = H_0 H_1 ⋯ H_{n−3} Z in place over z (n × n, column-major). packed holds the reflectors as
// the tridiagonalisation left them (v_k[k+1] = 1, v_k[i] at (i, k) for i > k + 1). The reflectors are
// applied EIG_BT_PANEL at a time (k0, k0 − 1, …, in that order), each panel at once: with the panel's
// Gram matrix G[a][b] = v_aᵀ v_b (eig_bt_gram), the coefficients of applying them one after the other
// to a column z are c_a = tau_a (v_aᵀ z − Σ_{a' < a} c_a' G[a'][a]), and then z −= Σ c_a v_a. So a
// column waits for one round of warp reductions a panel (its EIG_BT_PANEL dot products reduced
// together), not one a reflector. A warp per column, the column in shared memory; the block stages
// each panel's reflectors (zero below their support), taus and Gram matrix into shared memory.
// Blocks of EIG_BT_COLS warps. Two kernels: eig_back_transform_prefetch stages the next panel while
// the block applies this one, in a second buffer of shared memory, where that fits; eig_back_transform
// (one buffer) elsewhere. Shared memory below each.
#define EIG_BT_COLS 8
#define EIG_BT_PANEL 16
#define EIG_BT_PAIRS (EIG_BT_PANEL * (EIG_BT_PANEL - 1) / 2)

// gram[P · PANEL² + a · PANEL + b] = v_aᵀ v_b for a < b of panel P (reflectors k0 − a, k0 − b with
// k0 = n − 3 − P · PANEL). One warp per pair; launch ceil(n − 2, PANEL) · EIG_BT_PAIRS warps.
extern "C" __global__ void eig_bt_gram(const double* __restrict__ packed, int n, double* __restrict__ gram)
{
    const int lane = threadIdx.x & 31;
    const int gw = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int panel = gw / EIG_BT_PAIRS;
    int pair = gw % EIG_BT_PAIRS;
    const int k0 = n - 3 - panel * EIG_BT_PANEL;
    if (k0 < 0) return;
    int bb = 1;
    while (pair >= bb) { pair -= bb; ++bb; }   // pair → (a, b), a < b
    const int aa = pair;
    const int count = min(EIG_BT_PANEL, k0 + 1);
    double* out = gram + (long long)panel * EIG_BT_PANEL * EIG_BT_PANEL + aa * EIG_BT_PANEL + bb;
    if (bb >= count) {   // past the last reflector: 0, so the back-transform multiplies no garbage
        if (lane == 0) *out = 0.0;
        return;
    }
    const int ka = k0 - aa, kb = k0 - bb;      // ka > kb: v_a's support lies inside v_b's
    const long long ca = eig_packed(n, ka + 1, ka), cb = eig_packed(n, kb + 1, kb);
    double s = 0.0;
    for (int i = ka + 1 + lane; i < n; i += 32) {
        const double va = (i == ka + 1) ? 1.0 : packed[ca + (i - ka - 1)];
        s += va * packed[cb + (i - kb - 1)];
    }
    s = eig_warp_sum(s);
    if (lane == 0) *out = s;
}

// *dst = *src, by an asynchronous copy where the device has them (sm_80 and later; complete for the
// copying thread after eig_cp_wait, for the block after a __syncthreads behind that), else by a plain
// load and store.
__device__ __forceinline__ void eig_cp8(double* dst, const double* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned long long s;
    asm volatile("cvta.to.shared.u64 %0, %1;" : "=l"(s) : "l"(dst));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" :: "r"((unsigned)s), "l"(src) : "memory");
#else
    *dst = *src;
#endif
}
__device__ __forceinline__ void eig_cp_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
// Waits until at most PENDING of this thread's committed groups of copies are still in flight.
template <int PENDING> __device__ __forceinline__ void eig_cp_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" :: "n"(PENDING) : "memory");
#endif
}

// Panel pi's reflectors (zero outside their support), its Gram matrix (the entries a < b) and taus
// into buf (EIG_BT_PANEL · n + EIG_BT_PANEL² + EIG_BT_PANEL doubles), as one committed group of copies.
__device__ __forceinline__ void eig_bt_stage(const double* __restrict__ packed, const double* __restrict__ tau,
                                             const double* __restrict__ gram, int n, int pi, double* buf)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int k0 = n - 3 - pi * EIG_BT_PANEL;
    const int count = min(EIG_BT_PANEL, k0 + 1);
    const int base = k0 - count + 2;               // the lowest row of the panel's support
    double* panel = buf;                           // panel[r * n + i]: reflector k0 − r, row i
    double* g = panel + EIG_BT_PANEL * n;
    double* tp = g + EIG_BT_PANEL * EIG_BT_PANEL;
    for (int r = warp; r < EIG_BT_PANEL; r += EIG_BT_COLS) {
        const int k = k0 - r;
        const long long ck = r < count ? eig_packed(n, k + 1, k) : 0;
        for (int i = base + lane; i < n; i += 32) {
            double* to = panel + r * n + i;
            if (r >= count || i <= k) *to = 0.0;
            else if (i == k + 1) *to = 1.0;
            else eig_cp8(to, packed + ck + (i - k - 1));
        }
    }
    for (int x = threadIdx.x; x < EIG_BT_PANEL * EIG_BT_PANEL; x += EIG_BT_COLS * 32)
        if (x / EIG_BT_PANEL < x % EIG_BT_PANEL) eig_cp8(g + x, gram + (long long)pi * EIG_BT_PANEL * EIG_BT_PANEL + x);
    if (threadIdx.x < EIG_BT_PANEL) {
        if ((int)threadIdx.x < count) eig_cp8(tp + threadIdx.x, tau + k0 - threadIdx.x);
        else tp[threadIdx.x] = 0.0;
    }
    eig_cp_commit();
}

// The back-transform with BUFS panel buffers: with two, each panel's staging is in flight while the
// block applies the panel before it (the staging's global loads were most of a panel's time).
template <int BUFS>
__device__ __forceinline__ void eig_bt_body(const double* __restrict__ packed, const double* __restrict__ tau,
                                            const double* __restrict__ gram, int n, double* __restrict__ z)
{
    extern __shared__ double eig_cols[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int c = blockIdx.x * EIG_BT_COLS + warp;
    const int bufsize = EIG_BT_PANEL * n + EIG_BT_PANEL * EIG_BT_PANEL + EIG_BT_PANEL;
    double* zc = eig_cols + warp * n;
    double* bufs = eig_cols + EIG_BT_COLS * n;
    double* col = z + (long long)c * n;
    if (c < n)
        for (int i = lane; i < n; i += 32) zc[i] = col[i];
    const int panels = n >= 3 ? (n - 3) / EIG_BT_PANEL + 1 : 0;
    if (BUFS == 2 && panels > 0) eig_bt_stage(packed, tau, gram, n, 0, bufs);
    for (int pi = 0; pi < panels; ++pi) {
        const int k0 = n - 3 - pi * EIG_BT_PANEL;
        const int count = min(EIG_BT_PANEL, k0 + 1);
        const int base = k0 - count + 2;
        __syncthreads();   // the panel before is no longer read (with two buffers: the one staged next)
        if (BUFS == 1) {
            eig_bt_stage(packed, tau, gram, n, pi, bufs);
            eig_cp_wait<0>();
        } else if (pi + 1 < panels) {
            eig_bt_stage(packed, tau, gram, n, pi + 1, bufs + ((pi + 1) & 1) * bufsize);
            eig_cp_wait<1>();   // this panel's copies are done; the next one's may still fly
        } else {
            eig_cp_wait<0>();
        }
        __syncthreads();   // the panel is staged, by every thread
        const double* panel = bufs + (BUFS == 1 ? 0 : (pi & 1) * bufsize);
        const double* g = panel + EIG_BT_PANEL * n;
        const double* tp = g + EIG_BT_PANEL * EIG_BT_PANEL;
        if (c < n) {
            double sv[EIG_BT_PANEL];
#pragma unroll
            for (int r = 0; r < EIG_BT_PANEL; ++r) sv[r] = 0.0;
            for (int i = base + lane; i < n; i += 32) {
                const double zi = zc[i];
#pragma unroll
                for (int r = 0; r < EIG_BT_PANEL; ++r) sv[r] += panel[r * n + i] * zi;
            }
            // The panel's dot products reduced together by recursive halving: at each of the first
            // four butterfly stages a lane keeps half of its sums and trades the other half with its
            // partner (8 + 4 + 2 + 1 shuffles), the fifth joins the pair's one sum, and each sum is then
            // broadcast from a lane that holds it: 32 shuffles of a double where the full butterfly
            // on all 16 took 80. Every sum is the same tree of additions, so the same bits (an H200,
            // 2026-11-29: 68.4 → 56.1 µs a launch at 224 bands, 174.3 → 141.0 at 425; blocks of 4
            // columns took 58.9 and 145.0 alone, 60.5 and 155.2 with the halving; 2 and 16, slower).
            {
                static_assert(EIG_BT_PANEL == 16, "the halving below is written for four halvings of 16 sums");
                double h[EIG_BT_PANEL];
#pragma unroll
                for (int r = 0; r < EIG_BT_PANEL; ++r) h[r] = sv[r];
                int width = EIG_BT_PANEL;
#pragma unroll
                for (int o = 16; o >= 2; o >>= 1) {
                    const bool low = (lane & o) == 0;
                    const int half = width / 2;
#pragma unroll
                    for (int r = 0; r < EIG_BT_PANEL / 2; ++r) {
                        if (r < half) {
                            // The low lane keeps sums [0, half), the high one [half, width).
                            const double send = low ? h[half + r] : h[r];
                            const double keep = low ? h[r] : h[half + r];
                            h[r] = keep + __shfl_xor_sync(0xffffffffu, send, o);
                        }
                    }
                    width = half;
                }
                // Lane bits 4..1 name the sum it holds; lane and lane ^ 1 hold the same one.
                const double mine = h[0] + __shfl_xor_sync(0xffffffffu, h[0], 1);
#pragma unroll
                for (int r = 0; r < EIG_BT_PANEL; ++r)
                    sv[r] = __shfl_sync(0xffffffffu, mine, ((r >> 3) & 1) * 16 + ((r >> 2) & 1) * 8 + ((r >> 1) & 1) * 4 + (r & 1) * 2);
            }
            // Coefficients, in the order the reflectors apply (unused slots have tau 0).
#pragma unroll
            for (int r = 0; r < EIG_BT_PANEL; ++r) {
                double x = sv[r];
#pragma unroll
                for (int q = 0; q < r; ++q) x -= sv[q] * g[q * EIG_BT_PANEL + r];
                sv[r] = tp[r] * x;
            }
            for (int i = base + lane; i < n; i += 32) {
                double zi = zc[i];
#pragma unroll
                for (int r = 0; r < EIG_BT_PANEL; ++r) zi -= sv[r] * panel[r * n + i];
                zc[i] = zi;
            }
            __syncwarp();
        }
    }
    if (c < n)
        for (int i = lane; i < n; i += 32) col[i] = zc[i];
}

// One panel buffer: shared memory (EIG_BT_COLS + EIG_BT_PANEL) · n + EIG_BT_PANEL² + EIG_BT_PANEL doubles.
extern "C" __global__ void __launch_bounds__(EIG_BT_COLS * 32) eig_back_transform(
    const double* __restrict__ packed, const double* __restrict__ tau, const double* __restrict__ gram,
    int n, double* __restrict__ z)
{
    eig_bt_body<1>(packed, tau, gram, n, z);
}

// Two panel buffers, the next panel staged while this one is applied: shared memory
// (EIG_BT_COLS + 2 · EIG_BT_PANEL) · n + 2 · (EIG_BT_PANEL² + EIG_BT_PANEL) doubles (where it fits).
extern "C" __global__ void __launch_bounds__(EIG_BT_COLS * 32) eig_back_transform_prefetch(
    const double* __restrict__ packed, const double* __restrict__ tau, const double* __restrict__ gram,
    int n, double* __restrict__ z)
{
    eig_bt_body<2>(packed, tau, gram, n, z);
}

// ---------------------------------------------------------------------------------------------------
// eig_tridiagonalize_cluster: the same reduction (LAPACK dsytd2, lower; the same d, e, tau and the
// reflectors in the same packed places, so eig_back_transform reads them unchanged) by a thread-block
// CLUSTER of C blocks on as many SMs (Hopper, sm_90; C is the launch's cluster size, 8 or 16). One
// block is bound by its one SM's shared-memory traffic (~7 µs a step at 224 bands); here the full
// symmetric matrix is spread over the cluster's shared memory by columns, cyclically (block r holds
// the columns j ≡ r mod C, every row), so each step's work is split C ways and the blocks exchange only
// vectors, through distributed shared memory, with no barrier across the cluster inside the loop:
//   - during step k − 1 every block has WRITTEN into every block's shared memory the two vectors of
//     step k for its own columns j: p_k[j] = tau_k · (A22 v_k)[j], and A[k+1][j], the row k + 1 as it
//     holds it (updated through step k − 1), which by symmetry is column k + 1. Each is an
//     asynchronous store (st.async) that completes its 8 bytes on the receiving block's mbarrier for
//     that slot; a block starts step k when its own mbarrier has counted all 16 (n − k − 1) bytes;
//   - every block then applies step k's update to its copy of column k + 1 and builds the reflector
//     v_{k+1} from it itself (the same arithmetic in every block, so the same v everywhere): no second
//     exchange;
//   - meanwhile its other warps apply step k's update A22 −= v wᵀ + w vᵀ (w = p − (tau/2)(pᵀv) v) to
//     its own columns j ≥ k + 2, and send each column's row k + 2 (final now) into every block; then,
//     after the block's __syncthreads, every warp forms p_{k+1}[j] of the updated columns and sends it.
// The vectors are written into two alternating slots. A block writes step k + 1's into the others
// only once its own slot of step k is full, that is, once every block has sent all of step k, which
// each does after its __syncthreads of step k − 1: so every block is done reading step k − 1's slot,
// the one written. (A step's wait is for the data it needs, not for every block to arrive.)
// History, H200, 2026-11-29: pushing the vectors before a cluster barrier, rather than each block
// reading them after it, took the reads' ~0.4–1.0 µs out of every step (a step at 425 bands 4.10 →
// 3.56 µs, at 224 bands 2.90 → 2.68). The cluster barrier then held 32 % of the kernel's warp-stall
// samples at 224 bands (ncu), a third of that in its release, which waits for the block's remote
// stores to land. The stores completing on mbarriers instead, and the row k + 2 sent before the
// reflector is done: bench eigen at 224 bands 1.01 / 1.02–1.03 → 0.88 / 0.91 ms (cube / random pair),
// at 425 bands 2.44–2.49 / 2.52–2.53 → 2.16–2.18 / 2.21 ms; the stores on mbarriers alone gave 0.94–
// 0.95 / 0.97–0.99 and 2.30–2.33 / 2.36. Keeping each lane's rows in registers was 3-4 % faster where
// the register slots fit n exactly, slower elsewhere: not done.
//
// n ≥ 3 (own_eigen.rs gives smaller n to eig_tridiagonalize): an early return for them ahead of the
// cluster barriers made an nvcc build of this kernel allocate worse, every step 6-16 % slower (H200,
// 2026-11-29; the NVRTC build the service runs measured the same with or without it).
//
// Shared memory of a block: its columns (ceil(n / C) · n), the two pushed vectors in two slots (4n),
// the reflectors of this step and the next (2n), tau (2), an mbarrier a slot (2 · 8 bytes): 112 KB at
// 425 bands with 16 blocks. Launch one cluster of C blocks of EIG_CL_THREADS (cuLaunchKernelEx).
//
// Measured on an H200 (2026-11-27, before the push): 0.66 ms at 224 bands against one block's 1.54
// ms, 1.77 ms at 425 against 9.3 ms; clusters of 16 were 4–8 % faster than 8 at 224 and 425 bands. A
// step costs ~2 µs even at 64 bands: latency, not work (the exchange, three warp reductions, the
// reflector's square root and divisions, one __syncthreads).
// Blocks of 512 threads: 256 were as fast to 7 % slower, 1024 were 7–15 % slower.
#define EIG_CL_THREADS 512
#define EIG_CL_WARPS (EIG_CL_THREADS / 32)

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ unsigned eig_cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ unsigned eig_cluster_size() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(r));
    return r;
}
// The distributed-shared-memory address of `p` (this block's shared memory) in block `rank`.
__device__ __forceinline__ unsigned eig_dsmem(const void* p, unsigned rank) {
    unsigned long long s;
    asm volatile("cvta.to.shared.u64 %0, %1;" : "=l"(s) : "l"(p));
    unsigned out;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(out) : "r"((unsigned)s), "r"(rank));
    return out;
}
__device__ __forceinline__ void eig_dsmem_store(unsigned addr, double v) {
    asm volatile("st.shared::cluster.f64 [%0], %1;" :: "r"(addr), "d"(v) : "memory");
}
// Every thread of the cluster arrives (release: its writes before are visible to the cluster), then
// waits (acquire). A warp arrives and waits together.
__device__ __forceinline__ void eig_cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// The per-step exchange without the cluster barrier: each block's mbarrier per slot counts the bytes
// that the blocks' asynchronous stores (st.async, each completing its bytes on the receiver's
// mbarrier) have delivered into that slot; a block waits for its own slot to be full, not for every
// block to arrive. (One thread arrives on it once a phase, declaring the bytes the phase brings.)
__device__ __forceinline__ unsigned eig_smem_addr(const void* p) {
    return (unsigned)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void eig_store_async(unsigned addr, double v, unsigned bar) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b64 [%0], %1, [%2];"
                 :: "r"(addr), "l"(__double_as_longlong(v)), "r"(bar) : "memory");
}
__device__ __forceinline__ void eig_expect_bytes(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
}
// (ncu attributes 18 % of the kernel's warp-stall samples at 224 bands to the L1 invalidation that the
// cluster-scope acquire brings here; they are the wait itself: the same wait with the CTA-scope acquire
// took 2.20 µs a step against 2.21, an H200, 2026-11-29.)
__device__ __forceinline__ void eig_wait_phase(unsigned bar, unsigned parity) {
    unsigned done;
    do {
        asm volatile("{\n\t.reg .pred p;\n\t"
                     "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}

// One warp builds the reflector of step k from column k (`col`, rows k..n−1 valid): H = I − t v vᵀ,
// v[k+1] = 1, as eig_tridiagonalize's warp 0 does; v (rows k+1..n−1) and t into this block's shared
// memory. `out`: this block also writes d[k], e[k], tau[k] and the reflector for the back-transform.
__device__ __forceinline__ void eig_cl_reflector(const double* col, int n, int k, int lane, double* v,
                                                 double* tv, bool out, double* packed, double* d, double* e, double* tau) {
    const int r0 = k + 1;
    double t, beta, scale;
    eig_householder(col, r0, r0, n, lane, t, beta, scale);
    const long long ck = eig_packed(n, r0, k);
    for (int i = r0 + lane; i < n; i += 32) {
        double vi = (i == r0) ? 1.0 : col[i] * scale;
        v[i] = vi;
        if (out && i > r0) packed[ck + (i - r0)] = vi;
    }
    if (lane == 0) {
        tv[0] = t;
        if (out) {
            tau[k] = t;
            d[k] = col[k];
            e[k] = beta;
        }
    }
}

// Rows of column k + 1 a lane of warp 0 keeps in registers between its update and the reflector
// (8 cover 256 rows; a lane rereads its own rows past them from shared memory, no barrier needed).
#define EIG_CL_SLOTS 8
// Step k's update of column k + 1 (`cr`, rows r0 = k + 1 ..) and the reflector of step k + 1 from it,
// in one pass by warp 0: each lane keeps the rows it updates (i = r0 + lane + 32 q) and sums their
// squares below row r0 + 1 as it goes, so the norm needs no second read of the column and no
// __syncwarp. The same values as the update followed by eig_cl_reflector, up to the order of the
// norm's sum (each lane's share of it is other rows). That chain is every step's critical path: the
// tridiagonalisation went from 2.21 to 2.08 µs a step at 224 bands and 3.03 to 2.87 at 425 (harness
// tridiag.cu, nvcc, an H200, 2026-11-29; bench eigen's solver 0.625 → 0.614 ms at 224, 1.567 → 1.520
// at 425).
__device__ __forceinline__ void eig_cl_update_reflector(double* cr, const double* v, const double* p, double kk,
                                                        int n, int r0, int lane, double* vn, double* tv, bool out,
                                                        double* packed, double* d, double* e, double* tau) {
    const int r1 = r0 + 1;
    const double wj = p[r0] - kk;
    double held[EIG_CL_SLOTS];
    double s = 0.0;
#pragma unroll
    for (int q = 0; q < EIG_CL_SLOTS; ++q) {
        const int i = r0 + lane + 32 * q;
        double c = 0.0;
        if (i < n) {
            c = cr[i] - (v[i] * wj + (p[i] - kk * v[i]));
            if (i > r1) s += c * c;
        }
        held[q] = c;
    }
    for (int i = r0 + lane + 32 * EIG_CL_SLOTS; i < n; i += 32) {
        const double c = cr[i] - (v[i] * wj + (p[i] - kk * v[i]));
        cr[i] = c;   // reread by this lane below
        s += c * c;
    }
    const double diag = __shfl_sync(0xffffffffu, held[0], 0);    // row r0
    const double alpha = __shfl_sync(0xffffffffu, held[0], 1);   // row r1
    double t, beta, scale;
    eig_reflector_scalars(alpha, eig_warp_sum(s), t, beta, scale);
    const long long ck = eig_packed(n, r1, r0);
#pragma unroll
    for (int q = 0; q < EIG_CL_SLOTS; ++q) {
        const int i = r0 + lane + 32 * q;
        if (i >= r1 && i < n) {
            const double vi = (i == r1) ? 1.0 : held[q] * scale;
            vn[i] = vi;
            if (out && i > r1) packed[ck + (i - r1)] = vi;
        }
    }
    for (int i = r0 + lane + 32 * EIG_CL_SLOTS; i < n; i += 32) {
        const double vi = cr[i] * scale;
        vn[i] = vi;
        if (out) packed[ck + (i - r1)] = vi;
    }
    if (lane == 0) {
        tv[0] = t;
        if (out) {
            tau[r0] = t;
            d[r0] = diag;
            e[r0] = beta;
        }
    }
}
#endif

extern "C" __global__ void __launch_bounds__(EIG_CL_THREADS) eig_tridiagonalize_cluster(
    const double* __restrict__ a, int n, double* packed,
    double* __restrict__ d, double* __restrict__ e, double* __restrict__ tau)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ double eig_cl_smem[];
    const int C = (int)eig_cluster_size();   // 8 or 16 (own_eigen.rs launches no other)
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int rank = (int)eig_cluster_rank();
    const int ncols = (n + C - 1) / C;                 // column slots of every block
    const int mine = (n - rank + C - 1) / C;           // columns this block holds: j = lj·C + rank
    double* cols = eig_cl_smem;                         // cols[lj·n + i] = A[i][lj·C + rank]
    double* prcv = cols + (long long)ncols * n;         // 2n: p_k at (k & 1) · n, written by the holders
    double* crcv = prcv + 2 * n;                        // 2n: column k + 1 (row k + 1) at (k & 1) · n
    double* vv = crcv + 2 * n;                          // 2n: v of step k at (k & 1) · n
    double* tv = vv + 2 * n;                            // 2: tau of step k at k & 1
    unsigned long long* full = reinterpret_cast<unsigned long long*>(tv + 2);   // 2 mbarriers, a slot each

    // Lane c < C of a warp writes into block c: the addresses of its two vectors there.
    const unsigned to_p = eig_dsmem(prcv, lane < C ? lane : 0), to_c = eig_dsmem(crcv, lane < C ? lane : 0);
    const unsigned to_full = eig_dsmem(full, lane < C ? lane : 0);
    const unsigned full0 = eig_smem_addr(full);
    if (tid == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(full0) : "memory");
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(full0 + 8u) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    unsigned phases = 0;   // bit s: the parity of the phase of slot s's mbarrier this block waits for next
    // Every block has started (and set up its mbarriers) before any block writes into another's shared memory.
    eig_cluster_sync();
    // This block's columns whole, from the lower triangle (the upper by symmetry), and column 0 (in
    // step 1's p slot, which no block writes before it has passed the cluster barrier below).
    for (int lj = warp; lj < mine; lj += EIG_CL_WARPS) {
        const int j = lj * C + rank;
        for (int i = lane; i < n; i += 32)
            cols[(long long)lj * n + i] = i >= j ? a[(long long)j * n + i] : a[(long long)i * n + j];
    }
    double* col0 = prcv + n;
    for (int i = tid; i < n; i += EIG_CL_THREADS) col0[i] = a[i];
    __syncthreads();
    if (warp == 0) eig_cl_reflector(col0, n, 0, lane, vv, tv, rank == 0, packed, d, e, tau);
    __syncthreads();
    {
        // p_0 and row 1 of this block's columns j ≥ 1, into every block.
        const double t = tv[0];
        for (int lj = (rank == 0 ? 1 : 0) + warp; lj < mine; lj += EIG_CL_WARPS) {
            const double* cj = cols + (long long)lj * n;
            const int j = lj * C + rank;
            double s = 0.0;
            for (int i = 1 + lane; i < n; i += 32) s += cj[i] * vv[i];
            s = eig_warp_sum(s);
            if (lane < C) {
                eig_dsmem_store(to_p + 8u * j, t * s);
                eig_dsmem_store(to_c + 8u * j, cj[1]);
            }
        }
    }
    eig_cluster_sync();

    for (int k = 0; k < n - 2; ++k) {
        const int r0 = k + 1, r1 = k + 2;
        const int par = k & 1;
        const double* v = vv + par * n;        // v_k, rows ≥ r0
        double* vn = vv + (par ^ 1) * n;       // v_{k+1}, rows ≥ r1, built below
        const double* p = prcv + par * n;      // p_k, rows ≥ r0
        double* cr = crcv + par * n;           // column k + 1, rows ≥ r0 (updated in place below)
        const int hold = r0 & (C - 1);
        const double t = tv[par];
        // K = t/2 · pᵀv, by every warp (no barrier): w_i = p_i − K v_i.
        double kk = 0.0;
        for (int i = r0 + lane; i < n; i += 32) kk += p[i] * v[i];
        kk = 0.5 * t * eig_warp_sum(kk);
        if (r0 == n - 2) {
            // The last step: only T's last 2 × 2 block is left, in column n − 2 and A[n−1][n−1].
            if (warp == 0) {
                const double wj = p[r0] - kk;   // v[r0] = 1
                for (int i = r0 + lane; i < n; i += 32) cr[i] -= v[i] * wj + (p[i] - kk * v[i]);
                __syncwarp();
                if (lane == 0 && rank == hold) { d[n - 2] = cr[n - 2]; e[n - 2] = cr[n - 1]; }
                if (lane == 0 && rank == (n - 1) % C) {
                    const int i = n - 1;
                    const double wi = p[i] - kk * v[i];
                    d[n - 1] = cols[(long long)((n - 1) / C) * n + i] - 2.0 * v[i] * wi;
                }
            }
            break;
        }
        const int lj1 = r1 > rank ? (r1 - rank + C - 1) / C : 0;
        // Column k + 1 after step k, and v_{k+1} from it (warp 0, in every block), while the other
        // warps apply step k's update to this block's columns j ≥ k + 2 (rows ≥ k + 2; row k + 1 of
        // them is never read again: by symmetry it is column k + 1). Then p_{k+1}[j] of the updated
        // columns, by every warp. (One pass that updated and multiplied after the reflector was built
        // took 4 % longer at 224 bands and 7 % at 425 on an H200.)
        if (warp == 0) {
            eig_cl_update_reflector(cr, v, p, kk, n, r0, lane, vn, tv + (par ^ 1), rank == hold, packed, d, e, tau);
        } else {
            for (int lj = lj1 + warp - 1; lj < mine; lj += EIG_CL_WARPS - 1) {
                double* cj = cols + (long long)lj * n;
                const int j = lj * C + rank;
                const double vj = v[j], wj = p[j] - kk * vj;
                for (int i = r1 + lane; i < n; i += 32) cj[i] -= v[i] * wj + (p[i] - kk * v[i]) * vj;
                // Row k + 2 of the column is final: into every block's other slot now, while warp 0
                // still builds the reflector, rather than with p_{k+1}[j] after it.
                __syncwarp();
                const unsigned other = (unsigned)(par ^ 1);
                if (lane < C) eig_store_async(to_c + 8u * (other * n + j), cj[r1], to_full + 8u * other);
            }
        }
        __syncthreads();
        // p_{k+1}[j] of this block's columns j ≥ k + 2, into every block's other slot.
        const double tn = tv[par ^ 1];
        const unsigned slot = 8u * (unsigned)((par ^ 1) * n), bar = 8u * (unsigned)(par ^ 1);
        // The slot fills with two doubles (p and the row) of each column j ≥ k + 2, from whichever
        // block holds it.
        if (tid == 0) eig_expect_bytes(full0 + bar, 16u * (unsigned)(n - r1));
        for (int lj = lj1 + warp; lj < mine; lj += EIG_CL_WARPS) {
            const double* cj = cols + (long long)lj * n;
            const int j = lj * C + rank;
            double s = 0.0;
            for (int i = r1 + lane; i < n; i += 32) s += cj[i] * vn[i];
            s = eig_warp_sum(s);
            if (lane < C) eig_store_async(to_p + slot + 8u * j, tn * s, to_full + bar);
        }
        // Every block's values of step k + 1 are here, so every warp of every block is done reading
        // this step's slot (each block sent its p only after its __syncthreads of this step): the next
        // step may write into it.
        eig_wait_phase(full0 + bar, (phases >> (par ^ 1)) & 1u);
        phases ^= 1u << (par ^ 1);
    }
    // No block may leave while another can still write into its shared memory or read it (the last
    // writes were before the last step's barrier).
    eig_cluster_sync();
#endif
}

// ---------------------------------------------------------------------------------------------------
// The whitening's triangular inverse (whitening.rs): L⁻¹ of the Cholesky factor of C_N, so that the
// whitening A = L⁻¹ C_D L⁻ᵀ and the back-transform W = L⁻ᵀ V are three float64 GEMMs. cuBLAS's three
// triangular solves took 0.66 ms at 425 bands on an H100 (a GEMM of that size 23 µs), and cuSOLVER's
// trtri 0.38 ms: both walk the diagonal in small sequential steps. Here L is padded to p = 64 · 2^m
// with an identity (its inverse is L⁻¹ padded the same way), its 64 × 64 diagonal blocks are inverted
// by eig_invert_leaves, one block each, all at once, and whitening.rs joins them pairwise by
// log2(p / 64) levels of two strided-batched GEMMs:
//   [X 0; Y Z]⁻¹ = [X⁻¹ 0; −Z⁻¹ Y X⁻¹  Z⁻¹].
#define EIG_INV_LEAF 64

// lp (p × p, column-major) = L's lower triangle (l: n × n, column-major; its strict upper triangle is
// never read) with zeros above the diagonal and the identity on rows and columns n..p−1.
// Launch p² threads.
extern "C" __global__ void eig_lower_padded(const double* __restrict__ l, int n, int p, double* __restrict__ lp)
{
    const long long x = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (x >= (long long)p * p) return;
    const int i = (int)(x % p), j = (int)(x / p);
    double v;
    if (i < n && j < n) v = i >= j ? l[i + (long long)j * n] : 0.0;
    else v = i == j ? 1.0 : 0.0;
    lp[x] = v;
}

// Each block inverts one EIG_INV_LEAF² diagonal block of lp (p × p, column-major, lower triangular,
// zeros above the diagonal) in place. Thread j < EIG_INV_LEAF forms column j of the inverse by forward
// substitution: x_i = (δ_ij − Σ_{k<i} l_ik x_k) / l_ii, over all k (x_k = 0 for k < j), so a warp's
// threads read the same l_ik (broadcast) and their own x_kj (consecutive banks). All EIG_INV_THREADS
// threads move the block in and out, a few loads each, issued together: with one thread per column
// (64 dependent global loads each) the kernel took 38 µs, almost all of it waiting on those loads.
// (Four threads a column, each summing every fourth k, their sums joined by shuffles and a __syncwarp
// a row, took 42 µs in ncu against 33 on an H200, 2026-11-29.)
// Launch p / EIG_INV_LEAF blocks of EIG_INV_THREADS threads with EIG_INV_SMEM bytes of dynamic shared
// memory (past the static 48 KB).
#define EIG_INV_THREADS 256
#define EIG_INV_LD (EIG_INV_LEAF + 1)   // rows padded by one: row and column walks are both conflict-free
#define EIG_INV_SMEM ((2 * EIG_INV_LEAF * EIG_INV_LD + EIG_INV_LEAF) * 8)
extern "C" __global__ void __launch_bounds__(EIG_INV_THREADS) eig_invert_leaves(double* __restrict__ lp, int p)
{
    extern __shared__ double eig_inv_smem[];
    double* l = eig_inv_smem;                            // l[i · LD + k]: the leaf, row-major
    double* x = l + EIG_INV_LEAF * EIG_INV_LD;           // x[i · LD + j]: row i of column j of the inverse
    double* rdiag = x + EIG_INV_LEAF * EIG_INV_LD;
    const int t = threadIdx.x;
    const long long base = (long long)blockIdx.x * EIG_INV_LEAF;
    double* leaf = lp + base + base * p;
    constexpr int PER = EIG_INV_LEAF * EIG_INV_LEAF / EIG_INV_THREADS;
    double v[PER];
#pragma unroll
    for (int q = 0; q < PER; ++q) {   // element (i, k) = (idx % LEAF, idx / LEAF): coalesced in i
        const int idx = t + q * EIG_INV_THREADS;
        v[q] = leaf[idx % EIG_INV_LEAF + (long long)(idx / EIG_INV_LEAF) * p];
    }
#pragma unroll
    for (int q = 0; q < PER; ++q) {
        const int idx = t + q * EIG_INV_THREADS;
        l[(idx % EIG_INV_LEAF) * EIG_INV_LD + idx / EIG_INV_LEAF] = v[q];
    }
    __syncthreads();
    if (t < EIG_INV_LEAF) rdiag[t] = 1.0 / l[t * EIG_INV_LD + t];
    __syncthreads();
    if (t < EIG_INV_LEAF) {
        const int j = t;
        for (int i = 0; i < EIG_INV_LEAF; ++i) {
            const double* li = l + i * EIG_INV_LD;
            // Four partial sums: a quarter of the dependent chain of FMAs.
            double s0 = i == j ? 1.0 : 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
            int k = 0;
            for (; k + 3 < i; k += 4) {
                s0 = fma(-li[k], x[k * EIG_INV_LD + j], s0);
                s1 = fma(-li[k + 1], x[(k + 1) * EIG_INV_LD + j], s1);
                s2 = fma(-li[k + 2], x[(k + 2) * EIG_INV_LD + j], s2);
                s3 = fma(-li[k + 3], x[(k + 3) * EIG_INV_LD + j], s3);
            }
            for (; k < i; ++k) s0 = fma(-li[k], x[k * EIG_INV_LD + j], s0);
            x[i * EIG_INV_LD + j] = i < j ? 0.0 : ((s0 + s1) + (s2 + s3)) * rdiag[i];
        }
    }
    __syncthreads();
#pragma unroll
    for (int q = 0; q < PER; ++q) {
        const int idx = t + q * EIG_INV_THREADS;
        leaf[idx % EIG_INV_LEAF + (long long)(idx / EIG_INV_LEAF) * p] = x[(idx % EIG_INV_LEAF) * EIG_INV_LD + idx / EIG_INV_LEAF];
    }
}

// ---------------------------------------------------------------------------------------------------
// The pairs in the job's convention (mnf::eigen's order_and_sign), on the device: the transform
// row-major, its columns in descending order of the eigenvalue, each signed so that its largest-
// magnitude loading (the first of equal ones) is positive. W arrives column-major with the
// eigenvalues ascending, so column c of the answer is ±column n − 1 − c of W. On the host this took
// 0.30–0.34 ms of the eigen phase at 224 bands (an H100's host), after the download.

// signs[c] = the sign of column c of the answer, one warp per column. Launch n warps in all.
extern "C" __global__ void eig_column_signs(const double* __restrict__ w, int n, double* __restrict__ signs)
{
    const int lane = threadIdx.x & 31;
    const int c = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (c >= n) return;
    const double* col = w + (long long)(n - 1 - c) * n;
    // Each lane's first largest |loading| (rows ascending, a strictly larger one replaces it), then
    // the warp's: the larger, or of equal ones the lower row, as the host's scan keeps the first.
    double best = -1.0, val = 0.0;
    int at = n;
    for (int r = lane; r < n; r += 32) {
        const double v = col[r];
        if (fabs(v) > best) { best = fabs(v); at = r; val = v; }
    }
    for (int o = 16; o > 0; o >>= 1) {
        const double b2 = __shfl_xor_sync(0xffffffffu, best, o);
        const int at2 = __shfl_xor_sync(0xffffffffu, at, o);
        const double v2 = __shfl_xor_sync(0xffffffffu, val, o);
        if (b2 > best || (b2 == best && at2 < at)) { best = b2; at = at2; val = v2; }
    }
    if (lane == 0) signs[c] = val < 0.0 ? -1.0 : 1.0;
}

// out[r · n + c] = signs[c] · w[(n − 1 − c) · n + r], by 32 × 32 tiles through shared memory so that
// both the reads and the writes are coalesced. Launch (ceil(n/32), ceil(n/32)) blocks of 32 × 8.
extern "C" __global__ void eig_order_transpose(const double* __restrict__ w, const double* __restrict__ signs, int n,
                                               double* __restrict__ out)
{
    __shared__ double tile[32][33];
    const int c0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
    for (int j = threadIdx.y; j < 32; j += 8) {
        const int c = c0 + j, r = r0 + threadIdx.x;
        if (c < n && r < n) tile[j][threadIdx.x] = w[(long long)(n - 1 - c) * n + r];
    }
    __syncthreads();
    for (int i = threadIdx.y; i < 32; i += 8) {
        const int r = r0 + i, c = c0 + threadIdx.x;
        if (r < n && c < n) out[(long long)r * n + c] = signs[c] * tile[threadIdx.x][i];
    }
}

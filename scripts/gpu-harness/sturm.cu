// Checks eig_bisect and eig_vectors (kernels/eigen.cu: the Sturm count and the twisted factorization's
// pivots from the minors, division-free on their chains, rescaled every few rows, the pivot floor
// speculated; the vectors' scratch in shared memory) on tridiagonal matrices made to stress them:
// random, graded over 300 orders of magnitude, Wilkinson's W+ (pairs of eigenvalues equal to 1e-14 and
// closer), split by exact and 1e-200 off-diagonals, scaled to 1e±150 and 1e±200 (e² out of range),
// zero, constant, the 1-2-1 Toeplitz matrix whose eigenvalues are known in closed form, and a spread
// 1..1e6 spectrum like a whitened MNF matrix's.
//   - eigenvalues: against a bisection on the host in long double with dstebz's pivots' form, as
//     |λ_gpu − λ_host| / ‖T‖ (Gershgorin); bound 1e-13, and ascending;
//   - vectors: residual ‖T z − λ z‖∞ / ‖T‖ and |‖z‖ − 1|, bound 1e-12 each; |z_iᵀ z_j| where the
//     eigenvalues are 1e-3 ‖T‖ apart or more, printed; blocks of one vector give the bits of blocks of four.
// Then times both kernels at 224 and 425 rows.
// On the GPU host, from the repository root:
//   nvcc -O3 -arch=sm_90 -o /tmp/sturm scripts/gpu-harness/sturm.cu && /tmp/sturm
//   compute-sanitizer --tool memcheck /tmp/sturm quick      (and racecheck, synccheck, initcheck)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <vector>
#include <string>
#include <algorithm>
#include "../../kernels/eigen.cu"
#define CK(x) do { cudaError_t err_ = (x); if (err_ != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(err_)); exit(2); } } while (0)

typedef long double ld;

// dstebz's count in long double: pivots q_i = (d_i − x) − e2_{i−1} / q_{i−1}, tiny ones → −pivmin.
static int host_count(const std::vector<double>& d, const std::vector<double>& e, ld x, ld pivmin) {
    int c = 0;
    ld q = 1;
    for (size_t i = 0; i < d.size(); ++i) {
        ld e2 = i > 0 ? (ld)e[i - 1] * (ld)e[i - 1] : 0;
        q = ((ld)d[i] - x) - (i > 0 ? e2 / q : 0);
        if (fabsl(q) < pivmin) q = -pivmin;
        if (q < 0) ++c;
    }
    return c;
}

static std::vector<double> host_eigenvalues(const std::vector<double>& d, const std::vector<double>& e, double& norm) {
    int n = (int)d.size();
    ld lo = 1e300L, hi = -1e300L;
    for (int i = 0; i < n; ++i) {
        ld r = (i > 0 ? fabsl(e[i - 1]) : 0) + (i < n - 1 ? fabsl(e[i]) : 0);
        lo = std::min(lo, (ld)d[i] - r);
        hi = std::max(hi, (ld)d[i] + r);
    }
    norm = (double)std::max(fabsl(lo), fabsl(hi));
    ld pivmin = 1e-4900L;
    lo -= 1e-30L * norm + 1e-300L;
    hi += 1e-30L * norm + 1e-300L;
    std::vector<double> w(n);
    for (int k = 0; k < n; ++k) {
        ld a = lo, b = hi;
        for (int it = 0; it < 400 && b - a > 1e-22L * std::max(fabsl(a), fabsl(b)) + 1e-4000L; ++it) {
            ld m = 0.5L * (a + b);
            if (host_count(d, e, m, pivmin) <= k) a = m; else b = m;
        }
        w[k] = (double)(0.5L * (a + b));
    }
    return w;
}

struct Case { std::string name; std::vector<double> d, e; };

static double urand() { return (double)rand() / RAND_MAX * 2.0 - 1.0; }

static std::vector<Case> cases(bool quick) {
    std::vector<Case> out;
    srand(7);
    int sizes[] = {1, 2, 3, 17, 64, 224, 425, 1024};
    for (int n : sizes) {
        if (quick && n > 64) continue;
        Case c{"random " + std::to_string(n), std::vector<double>(n), std::vector<double>(n > 1 ? n - 1 : 0)};
        for (auto& v : c.d) v = urand();
        for (auto& v : c.e) v = urand();
        out.push_back(c);
    }
    int big = quick ? 40 : 224;
    {   // graded: d_i and e_i fall by 300 orders of magnitude along the diagonal
        Case c{"graded", std::vector<double>(big), std::vector<double>(big - 1)};
        for (int i = 0; i < big; ++i) c.d[i] = pow(10.0, -300.0 * i / big) * (1.0 + 0.5 * urand());
        for (int i = 0; i < big - 1; ++i) c.e[i] = pow(10.0, -300.0 * (i + 0.5) / big) * urand();
        out.push_back(c);
    }
    {   // Wilkinson's W+ of order 2m + 1: d = |m − i|, e = 1; its largest pairs agree to ~1e-14 and closer
        int m = quick ? 10 : 110;
        Case c{"wilkinson W+", std::vector<double>(2 * m + 1), std::vector<double>(2 * m, 1.0)};
        for (int i = 0; i <= 2 * m; ++i) c.d[i] = fabs((double)(m - i));
        out.push_back(c);
    }
    {   // split: every 7th e exactly 0, every 5th 1e-200
        Case c{"split (0 and 1e-200)", std::vector<double>(big), std::vector<double>(big - 1)};
        for (auto& v : c.d) v = urand();
        for (int i = 0; i < big - 1; ++i) c.e[i] = i % 7 == 0 ? 0.0 : i % 5 == 0 ? 1e-200 : urand();
        out.push_back(c);
    }
    // (At 1e±200, e² is out of float64's range: eig_bisect squares s·e, and bounds its pivmin.)
    for (double scale : {1e-150, 1e150, 1e-200, 1e200}) {
        char name[32];
        snprintf(name, sizeof name, "random x %.0e", scale);
        Case c{name, std::vector<double>(big), std::vector<double>(big - 1)};
        for (auto& v : c.d) v = urand() * scale;
        for (auto& v : c.e) v = urand() * scale;
        out.push_back(c);
    }
    out.push_back(Case{"zero", std::vector<double>(5, 0.0), std::vector<double>(4, 0.0)});
    out.push_back(Case{"constant 3, e = 0", std::vector<double>(9, 3.0), std::vector<double>(8, 0.0)});
    {   // 1-2-1: λ_k = 2 − 2 cos(kπ/(n+1)); the host bisection is checked against it too
        Case c{"1-2-1 toeplitz", std::vector<double>(big, 2.0), std::vector<double>(big - 1, -1.0)};
        out.push_back(c);
    }
    {   // a near-singular, widely spread spectrum as whitened MNF matrices have: SNR 1 .. 1e6
        Case c{"spread 1..1e6", std::vector<double>(big), std::vector<double>(big - 1)};
        for (int i = 0; i < big; ++i) c.d[i] = pow(10.0, 6.0 * rand() / RAND_MAX);
        for (int i = 0; i < big - 1; ++i) c.e[i] = 0.3 * sqrt(c.d[i] * c.d[i + 1]) * urand();
        out.push_back(c);
    }
    return out;
}

static size_t eig_vec_stride_host(int n) { return 4 * (size_t)n + 5; }   // eig_vec_stride

static std::vector<double> gpu_eigenvalues(const Case& c, float* ms, int repeat, std::vector<double>* z = nullptr, float* vec_ms = nullptr) {
    int n = (int)c.d.size();
    double *d, *e, *w, *dz;
    CK(cudaMalloc(&d, n * 8)); CK(cudaMalloc(&e, std::max(n - 1, 1) * 8)); CK(cudaMalloc(&w, n * 8));
    CK(cudaMalloc(&dz, (size_t)n * n * 8));
    CK(cudaMemcpy(d, c.d.data(), n * 8, cudaMemcpyHostToDevice));
    if (n > 1) CK(cudaMemcpy(e, c.e.data(), (n - 1) * 8, cudaMemcpyHostToDevice));
    eig_bisect<<<(n * 32 + 127) / 128, 128>>>(d, e, n, w);
    const int vblocks = (2 * n + EIG_VEC_THREADS - 1) / EIG_VEC_THREADS;
    const size_t vsmem = (size_t)(EIG_VEC_THREADS / 2) * eig_vec_stride_host(n) * 8;
    CK(cudaFuncSetAttribute(eig_vectors, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)vsmem));
    eig_vectors<<<vblocks, EIG_VEC_THREADS, vsmem>>>(d, e, w, n, dz);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    if (z) {
        z->resize((size_t)n * n);
        CK(cudaMemcpy(z->data(), dz, (size_t)n * n * 8, cudaMemcpyDeviceToHost));
        // Blocks of one vector (as own_eigen.rs launches where four do not fit) give the same bits.
        CK(cudaMemset(dz, 0xff, (size_t)n * n * 8));
        eig_vectors<<<n, 2, vsmem / (EIG_VEC_THREADS / 2)>>>(d, e, w, n, dz);
        CK(cudaGetLastError());
        std::vector<double> z2((size_t)n * n);
        CK(cudaMemcpy(z2.data(), dz, (size_t)n * n * 8, cudaMemcpyDeviceToHost));
        if (memcmp(z2.data(), z->data(), z2.size() * 8) != 0) { printf("  blocks of one vector != blocks of four at n=%d\n", n); (*z)[0] = NAN; }
    }
    if (vec_ms) {
        cudaEvent_t a, b;
        CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
        CK(cudaEventRecord(a));
        for (int r = 0; r < repeat; ++r) eig_vectors<<<vblocks, EIG_VEC_THREADS, vsmem>>>(d, e, w, n, dz);
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        CK(cudaEventElapsedTime(vec_ms, a, b));
        *vec_ms /= repeat;
    }
    if (ms) {
        cudaEvent_t a, b;
        CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
        CK(cudaEventRecord(a));
        for (int r = 0; r < repeat; ++r) eig_bisect<<<(n * 32 + 127) / 128, 128>>>(d, e, n, w);
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        CK(cudaEventElapsedTime(ms, a, b));
        *ms /= repeat;
    }
    std::vector<double> out(n);
    CK(cudaMemcpy(out.data(), w, n * 8, cudaMemcpyDeviceToHost));
    cudaFree(d); cudaFree(e); cudaFree(w); cudaFree(dz);
    return out;
}

int main(int argc, char** argv) {
    bool quick = argc > 1 && strcmp(argv[1], "quick") == 0;
    int bad = 0;
    for (const Case& c : cases(quick)) {
        int n = (int)c.d.size();
        double norm;
        std::vector<double> ref = host_eigenvalues(c.d, c.e, norm);
        std::vector<double> z;
        std::vector<double> got = gpu_eigenvalues(c, nullptr, 0, &z);
        double err = 0.0;
        bool ordered = true;
        for (int i = 0; i < n; ++i) {
            double diff = fabs(got[i] - ref[i]);
            err = std::max(err, norm > 0 ? diff / norm : diff);
            if (i > 0 && got[i] < got[i - 1]) ordered = false;
            if (std::isnan(got[i])) err = INFINITY;
        }
        if (c.name == "1-2-1 toeplitz") {
            double exact = 0.0;
            for (int k = 1; k <= n; ++k) exact = std::max(exact, fabs(ref[k - 1] - (2.0 - 2.0 * cos(k * M_PI / (n + 1)))) / norm);
            printf("  (host reference against the closed form: %.1e)\n", exact);
            if (exact > 1e-15) bad = 1;
        }
        // Residuals ‖T z − λ z‖∞ / ‖T‖ of the unit vectors, and the largest |z_iᵀ z_j| between vectors
        // whose eigenvalues are 1e-3 ‖T‖ apart or more (closer ones, one twisted factorization each, need
        // not be orthogonal: the product uses the top ten of well-separated MNF eigenvalues).
        double res = 0.0, orth = 0.0, unit = 0.0;
        for (int j = 0; j < n; ++j) {
            const double* zj = &z[(size_t)j * n];
            double nn = 0.0;
            for (int i = 0; i < n; ++i) {
                double tz = c.d[i] * zj[i] + (i > 0 ? c.e[i - 1] * zj[i - 1] : 0.0) + (i < n - 1 ? c.e[i] * zj[i + 1] : 0.0);
                res = std::max(res, fabs(tz - got[j] * zj[i]) / (norm > 0 ? norm : 1.0));
                nn += zj[i] * zj[i];
            }
            unit = std::max(unit, fabs(nn - 1.0));
            if (std::isnan(nn)) res = INFINITY;
        }
        for (int j = 0; j < n && n <= 425; ++j)
            for (int k = j + 1; k < n; ++k) {
                if (!(fabs(got[k] - got[j]) >= 1e-3 * norm) || norm == 0.0) continue;
                double dot = 0.0;
                for (int i = 0; i < n; ++i) dot += z[(size_t)j * n + i] * z[(size_t)k * n + i];
                orth = std::max(orth, fabs(dot));
            }
        bool ok = err <= 1e-13 && ordered && res <= 1e-12 && unit <= 1e-12;
        printf("%-24s n=%4d  max |dλ|/‖T‖ = %.1e  %s  residual %.1e  |‖z‖−1| %.1e  separated |zᵢᵀzⱼ| %.1e%s\n", c.name.c_str(), n, err,
               ordered ? "ascending" : "NOT ASCENDING", res, unit, orth, ok ? "" : "  FAIL");
        if (!ok) bad = 1;
    }
    if (!quick) {
        for (int n : {224, 425}) {
            Case c{"timed", std::vector<double>(n), std::vector<double>(n - 1)};
            srand(n);
            for (int i = 0; i < n; ++i) c.d[i] = pow(10.0, 4.0 * rand() / RAND_MAX);
            for (auto& v : c.e) v = 10.0 * urand();
            float ms = 0, vms = 0;
            gpu_eigenvalues(c, &ms, 50, nullptr, &vms);
            printf("at %d rows, a launch (mean of 50): eig_bisect %.1f us, eig_vectors %.1f us\n", n, ms * 1000.0f, vms * 1000.0f);
        }
    }
    printf(bad ? "sturm: FAILED\n" : "sturm: all cases hold\n");
    return bad;
}

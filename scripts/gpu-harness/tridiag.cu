// Checks eig_tridiagonalize_cluster (kernels/eigen.cu: the Householder tridiagonalisation by a
// thread-block cluster, its blocks exchanging each step's vectors by asynchronous stores counted on
// mbarriers) against the same reduction on the host in long double (LAPACK dsytd2, lower, dlarfg's
// signs): |d − d_host| and |e − e_host| over ‖A‖ (Frobenius), bound 1e-12, on random symmetric matrices
// of 3 to 425 rows (the cluster's first exchanges at 4 and 5; blocks holding no column below 16) and a
// graded one, in clusters of 16 and of 8 (shared memory as own_eigen.rs's cluster_shared_bytes); then
// times the kernel at 224 and 425 rows. A step that never completed would hang: the host waits for
// each launch with a deadline.
// On the GPU host, from the repository root:
//   nvcc -O3 -arch=sm_90 -o /tmp/tridiag scripts/gpu-harness/tridiag.cu && /tmp/tridiag
//   compute-sanitizer --tool memcheck /tmp/tridiag quick      (and synccheck)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <chrono>
#include <thread>
#include <vector>
#include <string>
#include <algorithm>
#include "../../kernels/eigen.cu"
#define CK(x) do { cudaError_t err_ = (x); if (err_ != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(err_)); exit(2); } } while (0)

typedef long double ld;

// dsytd2 (lower) on the column-major n × n matrix a (both triangles), in long double.
static void host_tridiag(const std::vector<double>& a0, int n, std::vector<double>& d, std::vector<double>& e) {
    std::vector<ld> a(a0.begin(), a0.end());
    auto A = [&](int i, int j) -> ld& { return a[(size_t)j * n + i]; };
    d.assign(n, 0.0);
    e.assign(n > 1 ? n - 1 : 0, 0.0);
    std::vector<ld> v(n), p(n), w(n);
    for (int k = 0; k + 1 < n; ++k) {
        ld alpha = A(k + 1, k), xnorm = 0;
        for (int i = k + 2; i < n; ++i) xnorm += A(i, k) * A(i, k);
        xnorm = sqrtl(xnorm);
        ld tau = 0;
        if (xnorm == 0) {
            e[k] = (double)alpha;
        } else {
            ld beta = -copysignl(sqrtl(alpha * alpha + xnorm * xnorm), alpha);
            tau = (beta - alpha) / beta;
            v[k + 1] = 1;
            for (int i = k + 2; i < n; ++i) v[i] = A(i, k) / (alpha - beta);
            e[k] = (double)beta;
            ld pv = 0;
            for (int i = k + 1; i < n; ++i) {
                ld s = 0;
                for (int j = k + 1; j < n; ++j) s += A(i, j) * v[j];
                p[i] = tau * s;
                pv += p[i] * v[i];
            }
            ld kk = 0.5L * tau * pv;
            for (int i = k + 1; i < n; ++i) w[i] = p[i] - kk * v[i];
            for (int j = k + 1; j < n; ++j)
                for (int i = k + 1; i < n; ++i) A(i, j) -= v[i] * w[j] + w[i] * v[j];
        }
        d[k] = (double)A(k, k);
    }
    d[n - 1] = (double)A(n - 1, n - 1);
}

static size_t smem_bytes(int n, int c) { return ((size_t)((n + c - 1) / c) * n + 6 * (size_t)n + 4) * 8; }

// Launches the kernel as one cluster of c blocks on st.
static void launch(int n, int c, const double* a, double* packed, double* d, double* e, double* tau, cudaStream_t st) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(c, 1, 1);
    cfg.blockDim = dim3(EIG_CL_THREADS, 1, 1);
    cfg.dynamicSmemBytes = smem_bytes(n, c);
    cfg.stream = st;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = c;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    CK(cudaLaunchKernelEx(&cfg, eig_tridiagonalize_cluster, a, n, packed, d, e, tau));
}

static bool wait_done(cudaStream_t st) {
    auto t0 = std::chrono::steady_clock::now();
    while (cudaStreamQuery(st) == cudaErrorNotReady) {
        if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(10)) return false;
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    CK(cudaGetLastError());
    return true;
}

int main(int argc, char** argv) {
    bool quick = argc > 1 && strcmp(argv[1], "quick") == 0;
    CK(cudaFuncSetAttribute(eig_tridiagonalize_cluster, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    int optin = 0;
    CK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    CK(cudaFuncSetAttribute(eig_tridiagonalize_cluster, cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    int bad = 0;
    srand(11);
    std::vector<int> sizes = quick ? std::vector<int>{3, 4, 5, 17, 40} : std::vector<int>{3, 4, 5, 6, 15, 16, 17, 33, 64, 224, 285, 425};
    for (int graded = 0; graded < 2; ++graded) {
        for (int n : sizes) {
            if (graded && n < 17) continue;
            std::vector<double> a((size_t)n * n);
            for (int j = 0; j < n; ++j)
                for (int i = j; i < n; ++i) {
                    double g = graded ? pow(10.0, -6.0 * (i + j) / (2.0 * n)) : 1.0;
                    a[(size_t)j * n + i] = a[(size_t)i * n + j] = g * ((double)rand() / RAND_MAX * 2.0 - 1.0);
                }
            double norm = 0.0;
            for (double x : a) norm += x * x;
            norm = sqrt(norm);
            std::vector<double> hd, he;
            host_tridiag(a, n, hd, he);
            double *da, *dp, *dd, *de, *dt;
            CK(cudaMalloc(&da, a.size() * 8)); CK(cudaMalloc(&dp, (size_t)n * (n + 1) / 2 * 8));
            CK(cudaMalloc(&dd, n * 8)); CK(cudaMalloc(&de, n * 8)); CK(cudaMalloc(&dt, n * 8));
            CK(cudaMemcpy(da, a.data(), a.size() * 8, cudaMemcpyHostToDevice));
            for (int c : {16, 8}) {
                if (smem_bytes(n, c) > (size_t)optin) continue;
                CK(cudaMemset(dd, 0xff, n * 8)); CK(cudaMemset(de, 0xff, n * 8));
                launch(n, c, da, dp, dd, de, dt, st);
                if (!wait_done(st)) { printf("n=%d cluster %d: did not finish in 10 s\n", n, c); return 3; }
                std::vector<double> gd(n), ge(n);
                CK(cudaMemcpy(gd.data(), dd, n * 8, cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(ge.data(), de, n * 8, cudaMemcpyDeviceToHost));
                double err = 0.0;
                for (int i = 0; i < n; ++i) err = std::max(err, fabs(gd[i] - hd[i]) / norm);
                for (int i = 0; i + 1 < n; ++i) err = std::max(err, fabs(ge[i] - he[i]) / norm);
                for (int i = 0; i < n; ++i) if (std::isnan(gd[i]) || (i + 1 < n && std::isnan(ge[i]))) err = INFINITY;
                bool ok = err <= 1e-12;
                printf("%-7s n=%4d cluster %2d  max |d, e − host| / ‖A‖ = %.1e%s\n", graded ? "graded" : "random", n, c, err, ok ? "" : "  FAIL");
                if (!ok) bad = 1;
            }
            if (!quick && !graded && (n == 224 || n == 425)) {
                for (int c : {16, 8}) {
                    if (smem_bytes(n, c) > (size_t)optin) continue;
                    cudaEvent_t t0, t1;
                    CK(cudaEventCreate(&t0)); CK(cudaEventCreate(&t1));
                    CK(cudaEventRecord(t0, st));
                    for (int r = 0; r < 50; ++r) launch(n, c, da, dp, dd, de, dt, st);
                    CK(cudaEventRecord(t1, st));
                    if (!wait_done(st)) { printf("timing at n=%d did not finish\n", n); return 3; }
                    float ms;
                    CK(cudaEventElapsedTime(&ms, t0, t1));
                    printf("  at %d rows, cluster of %d: %.1f us a launch (mean of 50), %.2f us a step\n", n, c, ms * 20.0f, ms * 20.0f / (n - 2));
                }
            }
            cudaFree(da); cudaFree(dp); cudaFree(dd); cudaFree(de); cudaFree(dt);
        }
    }
    printf(bad ? "tridiag: FAILED\n" : "tridiag: all cases hold\n");
    return bad;
}

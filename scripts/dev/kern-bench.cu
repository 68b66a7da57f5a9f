// Microbenchmark of the covariance kernels in kernels/covariance.cu, outside the Rust pipeline, for
// kernel development on the GPU host (nvcc, no Rust toolchain there):
//   nvcc -O3 -std=c++17 -arch=sm_90 -Ikernels scripts/dev/cov-bench.cu -o /tmp/cov-bench && /tmp/cov-bench
// Random integer-valued float32 rows (exact in float32, products exact in float64), so every kernel
// must give bit-identical sums; a sample of entries is also checked against a host float64 sum.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cmath>
#include <algorithm>
#include <cstring>
#include "covariance.cu"

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__); exit(1); } } while (0)

typedef void (*CovKernel)(const float*, i64, int, i64, int, int, double*, double*);

struct Result { double ms; std::vector<double> c, s; };

static Result run(CovKernel k, int threads, int step, const float* d, i64 npix, int bands, int splits, int chunks, int reps) {
    const int tiles = (bands + 63) / 64, pairs = tiles * (tiles + 1) / 2;
    double *pc, *ps, *c, *s;
    CK(cudaMalloc(&pc, (size_t)splits * pairs * 64 * 64 * 8));
    CK(cudaMalloc(&ps, (size_t)splits * tiles * 64 * 8));
    CK(cudaMalloc(&c, (size_t)bands * bands * 8));
    CK(cudaMalloc(&s, (size_t)bands * 8));
    cudaEvent_t a, b;
    cudaEventCreate(&a); cudaEventCreate(&b);
    float best = 1e30f;
    for (int r = 0; r < reps + 1; ++r) {
        CK(cudaMemset(pc, 0, (size_t)splits * pairs * 64 * 64 * 8));
        CK(cudaMemset(ps, 0, (size_t)splits * tiles * 64 * 8));
        cudaEventRecord(a);
        const i64 per_chunk = (npix + chunks - 1) / chunks;
        for (int ch = 0; ch < chunks; ++ch) {
            const i64 p0 = ch * per_chunk, n = std::min(npix, p0 + per_chunk) - p0;
            if (n <= 0) break;
            i64 per_split = ((n + splits - 1) / splits + step - 1) / step * step;
            k<<<dim3(pairs, splits), threads>>>(d + p0 * bands, n, bands, per_split, pairs, tiles, pc, ps);
        }
        reduce_parts<<<264, 256>>>(pc, ps, splits, pairs, tiles, bands, c, s);
        cudaEventRecord(b);
        CK(cudaEventSynchronize(b));
        CK(cudaGetLastError());
        float ms; cudaEventElapsedTime(&ms, a, b);
        if (r > 0 && ms < best) best = ms;
    }
    Result res;
    res.ms = best;
    res.c.resize((size_t)bands * bands);
    res.s.resize(bands);
    CK(cudaMemcpy(res.c.data(), c, res.c.size() * 8, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(res.s.data(), s, res.s.size() * 8, cudaMemcpyDeviceToHost));
    cudaFree(pc); cudaFree(ps); cudaFree(c); cudaFree(s);
    return res;
}

int cov_main(int argc, char** argv) {
    const i64 npix = argc > 1 ? atoll(argv[1]) : 1087LL * 614;
    const int bands = argc > 2 ? atoi(argv[2]) : 224;
    const int chunks = argc > 3 ? atoi(argv[3]) : 9;
    cudaDeviceProp prop; CK(cudaGetDeviceProperties(&prop, 0));
    const int sms = prop.multiProcessorCount;
    std::vector<float> h((size_t)npix * bands);
    unsigned long long x = 88172645463325252ULL;
    for (auto& v : h) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; v = (float)((long long)(x % 4001) - 2000); }
    // a few rows of zeros, as excluded pixels are
    for (int b = 0; b < bands; ++b) h[(size_t)5 * bands + b] = 0.f;
    float* d; CK(cudaMalloc(&d, h.size() * 4));
    CK(cudaMemcpy(d, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
    const int tiles = (bands + 63) / 64, pairs = tiles * (tiles + 1) / 2;
    const double flops = 2.0 * npix * bands * (bands + 1) / 2.0;
    printf("%s: %lld pixels x %d bands, %d chunks, %d pairs\n", prop.name, (long long)npix, bands, chunks, pairs);
    Result ref = run(cov_lower_dmma, 256, 16, d, npix, bands, std::max(1, sms * 3 / pairs), chunks, 5);
    printf("cov_lower_dmma     splits %4d: %8.3f ms  %6.2f TFLOP/s (useful)\n", std::max(1, sms * 3 / pairs), ref.ms, flops / ref.ms / 1e9);
    // host check of sampled entries
    int bad = 0;
    for (int t = 0; t < 64; ++t) {
        int i = (t * 7919) % bands, j = (t * 104729) % (i + 1);
        double s = 0; for (i64 p = 0; p < npix; ++p) s += (double)h[p * bands + i] * h[p * bands + j];
        if (s != ref.c[(size_t)i * bands + j]) { if (bad++ < 3) printf("  host mismatch c[%d,%d] %.17g vs %.17g\n", i, j, s, ref.c[(size_t)i * bands + j]); }
    }
    printf("  host check of 64 entries: %s\n", bad ? "FAILED" : "exact");
    struct K { const char* name; CovKernel k; };
    for (K kk : {K{"cov_lower_m16", cov_lower_m16}}) {
        for (int per_sm : {2, 3, 4}) {
            const int splits = std::max(1, sms * per_sm / pairs);
            Result r = run(kk.k, 128, 32, d, npix, bands, splits, chunks, 5);
            int diff = 0;
            for (int i = 0; i < bands; ++i) for (int j = 0; j <= i; ++j) diff += r.c[(size_t)i * bands + j] != ref.c[(size_t)i * bands + j];
            for (int i = 0; i < bands; ++i) diff += r.s[i] != ref.s[i];
            printf("%-18s splits %4d: %8.3f ms  %6.2f TFLOP/s (useful)  entries differing from cov_lower_dmma: %d\n", kk.name, splits, r.ms, flops / r.ms / 1e9, diff);
        }
    }
    cudaFree(d);
    return 0;
}

// ---- peak rate of each float64 mma shape (registers only) ----
template <int SHAPE>
__global__ void __launch_bounds__(128) dmma_peak(double* out, int iters) {
    double acc[8][4] = {};
    double a[8], b[4];
    for (int i = 0; i < 8; ++i) a[i] = threadIdx.x * 1e-3 + i;
    for (int i = 0; i < 4; ++i) b[i] = threadIdx.x * 2e-3 + i;
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int n = 0; n < 8; ++n) {
            if constexpr (SHAPE == 0)
                asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};\n"
                             : "+d"(acc[n][0]), "+d"(acc[n][1]) : "d"(a[0]), "d"(b[0]));
            else if constexpr (SHAPE == 1)
                asm volatile("mma.sync.aligned.m16n8k4.row.col.f64.f64.f64.f64 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
                             : "+d"(acc[n][0]), "+d"(acc[n][1]), "+d"(acc[n][2]), "+d"(acc[n][3]) : "d"(a[0]), "d"(a[1]), "d"(b[0]));
            else if constexpr (SHAPE == 2)
                asm volatile("mma.sync.aligned.m16n8k8.row.col.f64.f64.f64.f64 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                             : "+d"(acc[n][0]), "+d"(acc[n][1]), "+d"(acc[n][2]), "+d"(acc[n][3]) : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(b[0]), "d"(b[1]));
            else
                asm volatile("mma.sync.aligned.m16n8k16.row.col.f64.f64.f64.f64 {%0, %1, %2, %3}, {%4, %5, %6, %7, %8, %9, %10, %11}, {%12, %13, %14, %15}, {%0, %1, %2, %3};\n"
                             : "+d"(acc[n][0]), "+d"(acc[n][1]), "+d"(acc[n][2]), "+d"(acc[n][3]) : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(a[4]), "d"(a[5]), "d"(a[6]), "d"(a[7]), "d"(b[0]), "d"(b[1]), "d"(b[2]), "d"(b[3]));
        }
    }
    double s = 0; for (int n = 0; n < 8; ++n) for (int c = 0; c < 4; ++c) s += acc[n][c];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
template <int SHAPE> void peak(const char* name, double fma_per_mma, int sms) {
    double* o; CK(cudaMalloc(&o, sms * 8 * 128 * 8));
    const int iters = 2000;
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    dmma_peak<SHAPE><<<sms * 8, 128>>>(o, 10);
    cudaEventRecord(a);
    dmma_peak<SHAPE><<<sms * 8, 128>>>(o, iters);
    cudaEventRecord(b); CK(cudaEventSynchronize(b));
    float ms; cudaEventElapsedTime(&ms, a, b);
    const double flops = 2.0 * fma_per_mma * 8 * iters * (sms * 8 * 4);
    printf("peak %-10s %7.2f TFLOP/s\n", name, flops / ms / 1e9);
    cudaFree(o);
}

int main(int argc, char** argv) {
    cudaDeviceProp prop; CK(cudaGetDeviceProperties(&prop, 0));
    peak<0>("m8n8k4", 256, prop.multiProcessorCount);
    peak<1>("m16n8k4", 512, prop.multiProcessorCount);
    peak<2>("m16n8k8", 1024, prop.multiProcessorCount);
    peak<3>("m16n8k16", 2048, prop.multiProcessorCount);
    return cov_main(argc, argv);
}

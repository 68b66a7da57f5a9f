// Runs eig_back_transform_prefetch (two panel buffers, the next panel copied asynchronously) and
// eig_back_transform (one buffer) from kernels/eigen.cu on the same random data at 3 to 425 bands and
// checks that they give the same bits, for compute-sanitizer. racecheck could not run the product's own
// eigen path on an H200 (2026-11-29): "failed to handle a hardware exception" in the first solve, whichever
// of its kernels it instrumented, and no end in 150 s with the cluster tridiagonalisation instrumented.
// So the back-transform is checked here on its own. On the GPU host, from the repository root:
//   nvcc -O3 -arch=sm_90 -o /tmp/bt scripts/gpu-harness/back_transform.cu && /tmp/bt
//   compute-sanitizer --tool racecheck /tmp/bt      (and memcheck, synccheck, initcheck)
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cstring>
#include "../../kernels/eigen.cu"
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)
int main() {
    int sizes[] = {3, 17, 40, 100, 425};
    int bad = 0;
    for (int n : sizes) {
        long long packed_len = (long long)n * (n + 1) / 2;
        int panels = (n - 3) / EIG_BT_PANEL + 1;
        std::vector<double> packed(packed_len), tau(n), gram((size_t)panels * EIG_BT_PANEL * EIG_BT_PANEL), z((size_t)n * n);
        srand(n);
        auto u = [] { return (double)rand() / RAND_MAX - 0.5; };
        for (auto& v : packed) v = u() * 0.2;
        for (auto& v : tau) v = 1.0 + u() * 0.5;
        for (auto& v : gram) v = u() * 0.1;
        for (auto& v : z) v = u();
        double *dp, *dt, *dg, *dz1, *dz2;
        CK(cudaMalloc(&dp, packed_len * 8)); CK(cudaMalloc(&dt, n * 8)); CK(cudaMalloc(&dg, gram.size() * 8));
        CK(cudaMalloc(&dz1, z.size() * 8)); CK(cudaMalloc(&dz2, z.size() * 8));
        CK(cudaMemcpy(dp, packed.data(), packed_len * 8, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dt, tau.data(), n * 8, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dg, gram.data(), gram.size() * 8, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dz1, z.data(), z.size() * 8, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dz2, z.data(), z.size() * 8, cudaMemcpyHostToDevice));
        size_t one = (size_t)(EIG_BT_COLS * n + (EIG_BT_PANEL * n + EIG_BT_PANEL * EIG_BT_PANEL + EIG_BT_PANEL)) * 8;
        size_t two = (size_t)(EIG_BT_COLS * n + 2 * (EIG_BT_PANEL * n + EIG_BT_PANEL * EIG_BT_PANEL + EIG_BT_PANEL)) * 8;
        CK(cudaFuncSetAttribute(eig_back_transform, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)one));
        CK(cudaFuncSetAttribute(eig_back_transform_prefetch, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)two));
        int blocks = (n + EIG_BT_COLS - 1) / EIG_BT_COLS;
        eig_back_transform<<<blocks, EIG_BT_COLS * 32, one>>>(dp, dt, dg, n, dz1);
        eig_back_transform_prefetch<<<blocks, EIG_BT_COLS * 32, two>>>(dp, dt, dg, n, dz2);
        CK(cudaDeviceSynchronize());
        std::vector<double> a(z.size()), b(z.size());
        CK(cudaMemcpy(a.data(), dz1, a.size() * 8, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(b.data(), dz2, b.size() * 8, cudaMemcpyDeviceToHost));
        bool same = memcmp(a.data(), b.data(), a.size() * 8) == 0;
        bool moved = memcmp(a.data(), z.data(), a.size() * 8) != 0 || n < 3;
        printf("n=%d: prefetch %s one buffer, bit for bit; z %s\n", n, same ? "==" : "!=", moved ? "changed" : "UNCHANGED");
        if (!same || !moved) bad = 1;
        cudaFree(dp); cudaFree(dt); cudaFree(dg); cudaFree(dz1); cudaFree(dz2);
    }
    return bad;
}

// Does ordering random table accesses by address region speed them up on the H100? A question for
// the insert goal of issue #5 (ht_insert is bound by the rate of random line accesses, not bytes).
// Standalone, for the GPU host (nvcc, no Rust toolchain there):
//   nvcc -O3 -std=c++17 -arch=sm_90 -Ikernels scripts/dev/locality-probe.cu -o /tmp/lp && /tmp/lp
// Over a 4 GiB buffer of 16-byte cells (the 2^28-cell table), n operations land at random cells, but
// operation i falls in region perm(i / ops_per_region): consecutive operations share a region of
// 2^r cells, as they would after the batch was binned by region. r = 28 is the uniform case (the
// ceiling the benchmark measures). Two operations:
//   cas    one random 128-bit CAS per thread (ceil_cas128 of kernels/hashtable.cu);
//   claim  what an insert does to its b1: 4 lanes read the 64-byte bucket, then lane 1 CASes its
//          cell and lane 0 stores a stamp into the metadata cell.
// Then the real thing: building the 2^28-cell table to load 0.8 with ht_insert + ht_insert_rest (the
// launches of src/hashtable/gpu.rs launch_insert_only), each batch's keys in their random order or
// stably sorted by b1 >> s (regions of 2^s buckets); the sort is timed apart.
#include <cstdio>
#include <cstdlib>
#include <thrust/device_ptr.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>
#include <thrust/gather.h>
#include "hashtable.cu"

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__); exit(1); } } while (0)

__device__ __forceinline__ u64 cell_of(u64 op, u32 region_log2, u64 ops_per_region, u64 seed) {
    const u64 regions_mask = (1ull << (28 - region_log2)) - 1;
    u64 region = mix64((op / ops_per_region) ^ (seed * 3)) & regions_mask;
    return (region << region_log2) | (mix64(op ^ seed) & ((1ull << region_log2) - 1));
}

__global__ void probe_cas(Cell* buf, u32 region_log2, u64 ops_per_region, u64 n, u64 seed) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    cas_cell(buf + cell_of(i, region_log2, ops_per_region, seed), 0ull, 0ull, i + 1, seed);
}

__global__ void probe_claim(Cell* buf, u32 region_log2, u64 ops_per_region, u64 n, u64 seed, u64* sink) {
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 op = t / 4;
    if (op >= n) return;
    u32 lane = (u32)(t & 3);
    u64 bucket = cell_of(op, region_log2, ops_per_region, seed) & ~3ull;
    Cell c = ld_cell(buf + bucket + lane);
    if ((c.key ^ c.val) == 0x0123456789abcdefull) sink[0] = c.key;
    if (lane == 1) cas_cell(buf + bucket + 1, c.key, c.val, op + 1, seed);
    if (lane == 0) reinterpret_cast<volatile u16*>(buf + bucket)[2] = (u16)op;
}

__global__ void probe_keys(u64* keys, u64* vals, u64 n, u64 base) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    u64 k = mix64(base + i);
    if (k == EMPTY_KEY || k == RESERVED_KEY) k = mix64(0x7000000000000000ull + (k & 1ull));
    keys[i] = k;
    vals[i] = mix64(k ^ 0x5bd1e9955bd1e995ull);
}

__global__ void probe_region(const u64* keys, u32* region, u64 n, u64 bucket_mask, u32 shift) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) region[i] = bucket1(keys[i], bucket_mask) >> shift;
}

__global__ void probe_count(const u32* status, u64 n, unsigned long long* counts) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && status[i] < 8) atomicAdd(&counts[status[i]], 1ull);
}

// Builds a fresh 2^28-cell table to load 0.8 in batches of 64 Mi keys; shift < 0: random order.
static void build(Cell* table, int shift) {
    const u64 cells = 1ull << 28, bucket_mask = (cells / 4) - 1;
    const u64 total = (u64)(0.8 * 3 * (cells / 4)), batch = 64ull << 20;
    u64 *keys, *vals, *okey, *oval, *tk, *tv;
    u32 *status, *region, *perm;
    unsigned long long* counts;
    CK(cudaMalloc(&keys, total * 8));
    CK(cudaMalloc(&vals, total * 8));
    CK(cudaMalloc(&okey, batch * 8));
    CK(cudaMalloc(&oval, batch * 8));
    CK(cudaMalloc(&tk, batch * 8));
    CK(cudaMalloc(&tv, batch * 8));
    CK(cudaMalloc(&status, batch * 4));
    CK(cudaMalloc(&region, batch * 4));
    CK(cudaMalloc(&perm, batch * 4));
    CK(cudaMalloc(&counts, 8 * 8));
    CK(cudaMemset(counts, 0, 64));
    CK(cudaMemset(table, 0, cells * sizeof(Cell)));
    probe_keys<<<(unsigned)((total + 255) / 256), 256>>>(keys, vals, total, 0x9000000000000000ull);
    CK(cudaDeviceSynchronize());
    cudaEvent_t a, b, c;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    cudaEventCreate(&c);
    float sort_ms = 0, insert_ms = 0;
    u32 clk = 1;
    for (u64 off = 0; off < total; off += batch) {
        u64 n = total - off < batch ? total - off : batch;
        u64 *k = keys + off, *v = vals + off;
        cudaEventRecord(a);
        if (shift >= 0) {
            probe_region<<<(unsigned)((n + 255) / 256), 256>>>(k, region, n, bucket_mask, (u32)shift);
            thrust::device_ptr<u32> r(region), p(perm);
            thrust::sequence(p, p + n);
            thrust::stable_sort_by_key(r, r + n, p);
            thrust::gather(p, p + n, thrust::device_ptr<u64>(k), thrust::device_ptr<u64>(tk));
            thrust::gather(p, p + n, thrust::device_ptr<u64>(v), thrust::device_ptr<u64>(tv));
            k = tk;
            v = tv;
        }
        cudaEventRecord(b);
        ht_insert<<<(unsigned)((n + 255) / 256), 256>>>(table, bucket_mask, k, v, n, clk, status, okey, oval);
        u64 per_thread = (n + 256 * 1024 - 1) / (256 * 1024);
        per_thread = per_thread < 1 ? 1 : (per_thread > 32 ? 32 : per_thread);
        u64 tile = 256 * per_thread, grid = (n + tile - 1) / tile;
        grid = grid > 2048 ? 2048 : grid;
        ht_insert_rest<<<(unsigned)grid, 256>>>(table, bucket_mask, k, v, n, clk, status, okey, oval, (u32)per_thread);
        cudaEventRecord(c);
        CK(cudaEventSynchronize(c));
        CK(cudaGetLastError());
        float s1, s2;
        cudaEventElapsedTime(&s1, a, b);
        cudaEventElapsedTime(&s2, b, c);
        sort_ms += s1;
        insert_ms += s2;
        probe_count<<<(unsigned)((n + 255) / 256), 256>>>(status, n, counts);
        ++clk;
    }
    unsigned long long h[8];
    CK(cudaMemcpy(h, counts, 64, cudaMemcpyDeviceToHost));
    printf("%-22s %8.2f %10.2f %14.2f %10llu %10llu %8llu\n", shift < 0 ? "random order" : "", sort_ms, insert_ms,
           total / insert_ms / 1e6, h[ST_INSERTED], h[ST_EVICTED], h[ST_FAILED]);
    if (shift >= 0) printf("  ^ sorted by b1 >> %d (regions of %.3f MB)\n", shift, (double)(1ull << shift) * 64 / (1 << 20));
    cudaFree(keys); cudaFree(vals); cudaFree(okey); cudaFree(oval); cudaFree(tk); cudaFree(tv);
    cudaFree(status); cudaFree(region); cudaFree(perm); cudaFree(counts);
}

int main() {
    const u64 cells = 1ull << 28;
    const u64 n = 64ull << 20;
    Cell* buf;
    u64* sink;
    CK(cudaMalloc(&buf, cells * sizeof(Cell)));
    CK(cudaMalloc(&sink, 8));
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    const u32 regions[] = {28, 26, 24, 22, 21, 20, 18, 16, 12};
    printf("2^28 cells (4 GiB), %llu M ops per launch, best of 3; region = 2^r cells of 16 B\n", n >> 20);
    printf("%4s %10s %12s %12s\n", "r", "region", "cas G/s", "claim G/s");
    for (u32 r : regions) {
        // Operations per region: as many as land there when a batch of n is binned into its regions.
        u64 ops_per_region = n >> (28 - r);
        if (ops_per_region == 0) ops_per_region = 1;
        float best[2] = {1e30f, 1e30f};
        for (int k = 0; k < 2; ++k) {
            for (int rep = 0; rep < 3; ++rep) {
                CK(cudaMemset(buf, 0, cells * sizeof(Cell)));
                u64 seed = 0x1234567ull + rep * 977 + r;
                cudaEventRecord(a);
                if (k == 0) probe_cas<<<(unsigned)((n + 255) / 256), 256>>>(buf, r, ops_per_region, n, seed);
                else probe_claim<<<(unsigned)((4 * n + 255) / 256), 256>>>(buf, r, ops_per_region, n, seed, sink);
                cudaEventRecord(b);
                CK(cudaEventSynchronize(b));
                CK(cudaGetLastError());
                float ms;
                cudaEventElapsedTime(&ms, a, b);
                if (ms < best[k]) best[k] = ms;
            }
        }
        double mb = (double)(1ull << r) * 16 / (1 << 20);
        printf("%4u %8.2f MB %12.2f %12.2f\n", r, mb, n / best[0] / 1e6, n / best[1] / 1e6);
    }
    printf("\nbuild of 2^28 cells to load 0.8 (batches of 64 Mi keys), ht_insert + ht_insert_rest\n");
    printf("%-22s %8s %10s %14s %10s %10s %8s\n", "order", "sort ms", "insert ms", "G inserts/s", "inserted", "evicted", "failed");
    const int shifts[] = {-1, 0, 8, 12, 14, 16, 18, 20, -1};
    for (int s : shifts) build(buf, s);
    return 0;
}

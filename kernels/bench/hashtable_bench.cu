// Kernels of `hypermnf bench hashtable` only (src/bench/hashtable/kernels.rs): the find variants it
// measures beside ht_find, its key generators and tallies, the published linear-probing table it
// compares with, and the device ceilings. Not a program of its own: NVRTC compiles it appended to
// kernels/hashtable/ (whose types, device functions and ST_*/OP_* codes it uses), with the same
// options, into a module of its own; the service never loads it.

// ---------------------------------------------------------------- find variants (benchmark rows)
// Measured next to ht_find by `hypermnf bench hashtable`; same arguments as ht_find without clk and
// touch (touch == 0 only: they never write) and the same results.

// ht_find with the non-coherent 16-byte loads of ld_cell_nc instead of ld.relaxed.gpu.
extern "C" __global__ void HT_BOUNDS ht_find_nc(Cell* table, u64 bucket_mask, const u64* keys, u64 n, u32* status,
                                      u64* out_val) {
    find_batch<false, true>(table, bucket_mask, keys, n, 0u, status, out_val);
}

// One lane per lookup: each lane reads its own bucket with four 16-byte loads and compares the
// slot keys itself; no shuffles, no votes, no serving loop (finds are instruction-bound: the
// group version spends its instructions on each of 4 operations in turn, this one on its own). The
// price: 4 load instructions per lookup, each touching 32 different lines per warp.
template <bool NC>
__device__ __forceinline__ void find_lane_batch(const Cell* table, u64 bucket_mask, const u64* keys, u64 n,
                                                u32* status, u64* out_val) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    u64 key = keys[i];
    u32 st = ST_MISS;
    u64 v = 0;
    if (key == EMPTY_KEY || key == RESERVED_KEY) {
        st = ST_REJECTED;
    } else {
        u32 b1 = bucket1(key, bucket_mask);
        const Cell* bucket = table + (u64)b1 * GROUP;
        for (int r = 0; r < 2; ++r) {
            Cell c[GROUP];
#pragma unroll
            for (int s = 0; s < GROUP; ++s) c[s] = ld_cell_as<NC>(bucket + s);
            bool hit = false;
#pragma unroll
            for (int s = 1; s < GROUP; ++s) {
                if (!hit && c[s].key == key) {
                    hit = true;
                    v = c[s].val;
                }
            }
            if (hit) {
                st = ST_FOUND;
                break;
            }
            if (r == 1 || !((u32)c[0].val & overflow_tag(mix64(key)))) break;
            bucket = table + (u64)bucket2(key, bucket_mask, b1) * GROUP;
        }
    }
    status[i] = st;
    out_val[i] = v;
}

extern "C" __global__ void HT_BOUNDS ht_find_lane(const Cell* table, u64 bucket_mask, const u64* keys, u64 n, u32* status,
                                        u64* out_val) {
    find_lane_batch<false>(table, bucket_mask, keys, n, status, out_val);
}

extern "C" __global__ void HT_BOUNDS ht_find_lane_nc(const Cell* table, u64 bucket_mask, const u64* keys, u64 n,
                                           u32* status, u64* out_val) {
    find_lane_batch<true>(table, bucket_mask, keys, n, status, out_val);
}

// ---------------------------------------------------------------- keys and tallies

// The value the benchmark writes with key k: mix64(k ^ 0x5bd1e9955bd1e995) for the bucketed table's
// u64 keys; (k * 2654435761) | 1 for the linear-probing table's u32 keys (never its empty value).
__device__ __forceinline__ u64 bench_value(u64 k) { return mix64(k ^ 0x5bd1e9955bd1e995ull); }
__device__ __forceinline__ u32 bench_value(u32 k) { return (k * 2654435761u) | 1u; }

// Benchmark keys: key(i) = mix64(base + i) (a bijection, so distinct i give distinct keys);
// the two reserved keys are replaced by keys from far outside any benchmark range.
extern "C" __global__ void gen_keys(u64* keys, u64* vals, u64 n, u64 base) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    u64 k = mix64(base + i);
    if (k == EMPTY_KEY || k == RESERVED_KEY) k = mix64(0x7000000000000000ull + (k & 1ull));
    keys[i] = k;
    if (vals) vals[i] = bench_value(k);
}

// Interleave present and absent keys: out[i] = (i % 100 < hit_pct) ? present[..] : absent[..].
extern "C" __global__ void gen_mix(const u64* present, u64 n_present, const u64* absent, u64 n_absent,
                                   u64* out, u64 n, u32 hit_pct, u64 seed) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    u64 h = mix64(i ^ seed);
    out[i] = (h % 100u) < hit_pct ? present[(h >> 8) % n_present] : absent[(h >> 8) % n_absent];
}

// Cache mix: 80% finds (of which hit_pct% hit), 20% inserts of fresh keys.
extern "C" __global__ void gen_cache_mix(const u64* present, u64 n_present, const u64* absent, u64 n_absent,
                                         const u64* fresh, u32* ops, u64* keys, u64* vals, u64 n, u32 hit_pct,
                                         u64 seed) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    u64 h = mix64(i ^ seed);
    u64 k;
    if ((h % 100u) < 20u) {
        ops[i] = OP_INSERT;
        k = fresh[i];
    } else {
        ops[i] = OP_FIND;
        k = ((h >> 7) % 100u) < hit_pct ? present[(h >> 16) % n_present] : absent[(h >> 16) % n_absent];
    }
    keys[i] = k;
    vals[i] = bench_value(k);
}

// Tally statuses: counts[st] += 1 (st < 8), and for ST_FOUND results whose value is not
// bench_value(key), counts[8] += 1 (wrong values).
template <typename K>
__device__ __forceinline__ void tally_as(const u32* status, const K* keys, const K* out_val, u64 n,
                                        unsigned long long* counts) {
    __shared__ unsigned long long local[9];
    if (threadIdx.x < 9) local[threadIdx.x] = 0;
    __syncthreads();
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        u32 st = status[i];
        atomicAdd(&local[st < 8 ? st : 7], 1ull);
        if (st == ST_FOUND && out_val && keys && out_val[i] != bench_value(keys[i]))
            atomicAdd(&local[8], 1ull);
    }
    __syncthreads();
    if (threadIdx.x < 9 && local[threadIdx.x]) atomicAdd(&counts[threadIdx.x], local[threadIdx.x]);
}

extern "C" __global__ void tally(const u32* status, const u64* keys, const u64* out_val, u64 n,
                                 unsigned long long* counts) {
    tally_as<u64>(status, keys, out_val, n, counts);
}

// ---------------------------------------------------------------- reference: linear probing
// GPU_HASH_TABLES.md design 1 (nosferalatu/SimpleGPUHashTable): 32-bit keys and values in one 64-bit
// slot, key 0xffffffff = empty, atomicCAS on the key then a plain store of the value, delete by
// setting the value to empty (the key stays: a tombstone). Probe loops are bounded by max_probe.

#define LP_EMPTY 0xffffffffu

// MurmurHash3 fmix32, the linear-probing table's hash.
__device__ __forceinline__ u32 fmix32(u32 h) {
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    return h;
}

extern "C" __global__ void lp_insert(u32* slots, u32 cap_mask, const u32* keys, const u32* vals, u64 n,
                                     u32 max_probe, u32* status) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    u32 key = keys[i];
    u32 slot = fmix32(key) & cap_mask;
    u32 st = ST_FAILED;
    for (u32 p = 0; p < max_probe; ++p) {
        u32 prev = atomicCAS(&slots[2 * (u64)slot], LP_EMPTY, key);
        if (prev == LP_EMPTY || prev == key) {
            slots[2 * (u64)slot + 1] = vals[i];
            st = prev == LP_EMPTY ? ST_INSERTED : ST_UPDATED;
            break;
        }
        slot = (slot + 1) & cap_mask;
    }
    status[i] = st;
}

extern "C" __global__ void lp_find(const u32* slots, u32 cap_mask, const u32* keys, u64 n, u32 max_probe,
                                   u32* status, u32* out_val) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    u32 key = keys[i];
    u32 slot = fmix32(key) & cap_mask;
    u32 st = ST_MISS, v = LP_EMPTY;
    for (u32 p = 0; p < max_probe; ++p) {
        u64 kv = *reinterpret_cast<const volatile u64*>(&slots[2 * (u64)slot]);
        u32 k = (u32)kv, kval = (u32)(kv >> 32);
        if (k == key) {
            if (kval != LP_EMPTY) {
                st = ST_FOUND;
                v = kval;
            }
            break;
        }
        if (k == LP_EMPTY) break;
        slot = (slot + 1) & cap_mask;
    }
    status[i] = st;
    out_val[i] = v;
}

extern "C" __global__ void lp_erase(u32* slots, u32 cap_mask, const u32* keys, u64 n, u32 max_probe,
                                    u32* status) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    u32 key = keys[i];
    u32 slot = fmix32(key) & cap_mask;
    u32 st = ST_MISS;
    for (u32 p = 0; p < max_probe; ++p) {
        u32 k = *reinterpret_cast<const volatile u32*>(&slots[2 * (u64)slot]);
        if (k == key) {
            slots[2 * (u64)slot + 1] = LP_EMPTY;
            st = ST_ERASED;
            break;
        }
        if (k == LP_EMPTY) break;
        slot = (slot + 1) & cap_mask;
    }
    status[i] = st;
}

// lp keys: fmix32(base + i) (a bijection on 32 bits); the empty marker is replaced.
extern "C" __global__ void lp_gen(u32* keys, u32* vals, u64 n, u32 base) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    u32 k = fmix32(base + (u32)i);
    if (k == LP_EMPTY) k = fmix32(0x7fffffffu);
    keys[i] = k;
    if (vals) vals[i] = bench_value(k);
}

// tally for the linear-probing table.
extern "C" __global__ void lp_tally(const u32* status, const u32* keys, const u32* out_val, u64 n,
                                    unsigned long long* counts) {
    tally_as<u32>(status, keys, out_val, n, counts);
}

// ---------------------------------------------------------------- device ceilings
// Random 128-bit CAS over a buffer of cells (cell_mask + 1 cells): one CAS per thread.
extern "C" __global__ void ceil_cas128(Cell* buf, u64 cell_mask, u64 n, u64 seed) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    u64 c = mix64(i ^ seed) & cell_mask;
    cas_cell(buf + c, 0ull, 0ull, i + 1, seed);
}

// Random reads of `width` bytes (64 or 128) by width/16 cooperating lanes, one 16-byte load each;
// n = number of random reads. The xor lands in sink only if it hits a value that never occurs.
extern "C" __global__ void ceil_read(const Cell* buf, u64 cell_mask, u64 n, u32 width, u64 seed, u64* sink) {
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u32 lanes = width / 16u;
    u64 r = t / lanes;
    if (r >= n) return;
    u32 lane = (u32)(t % lanes);
    u64 line = (mix64(r ^ seed) & cell_mask) & ~(u64)(lanes - 1);
    Cell c = ld_cell(buf + line + lane);
    if ((c.key ^ c.val) == 0x0123456789abcdefull) sink[0] = c.key;
}

extern "C" __global__ void fill_u32(u32* p, u64 n, u32 v) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = v;
}

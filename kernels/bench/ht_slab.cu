// SlabHash after Ashkiani, Farach-Colton and Owens (IPDPS 2018; ../shared/docs/GPU_HASH_TABLES.md
// design 2), written from the published description, with 64-bit keys and values. Compiled at run
// time with NVRTC for sm_90 (`--device-int128`: one 128-bit atomicCAS publishes a key and its value).
// The design, its concurrency rules and where it departs from SlabHash are in src/bench/hashtable/slab.rs.
//
// Layout: `pool` is an array of slabs of 16 cells of 16 bytes = 256 bytes. Cells 0..14 of a slab are
// pairs {u64 key, u64 value} (key 0 = empty, the empty pair is all zeros); cell 15 holds the index of
// the next slab of the chain in its first word (0 = none) and zero in its second. Slabs 0..B-1 are
// the base slabs of the B buckets (a power of two); slabs B.. are handed out by a bump allocator
// (`alloc` holds the next free index; `nslabs` is the pool's size) and linked at a chain's tail. With
// 32-bit keys and values SlabHash packs 15 pairs and the next pointer into 128 bytes, one 4-byte word
// per lane; with 64-bit ones the same 15 pairs + next pointer take 256 bytes, which a warp reads as
// one coalesced access with lanes 0..15 loading one 16-byte cell each (lane i: pair i, lane 15: the
// next pointer), so every pair is read with one single-copy-atomic load.
//
// Warp-cooperative work sharing as published: each lane brings one operation; the warp takes the
// lowest pending lane (__ballot_sync, __ffs), broadcasts its key (__shfl_sync), and all lanes compare
// against the slab at once; the owner lane records the result.

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned __int128 u128;

#define FULL 0xffffffffu
#define EMPTY_KEY 0ull
#define RESERVED_KEY 0xffffffffffffffffull
#define SLAB_CELLS 16u
#define SLAB_PAIRS 15u
#define NEXT_LANE 15u
#define PAIR_LANES 0x7fffu
// Bounds on every loop that could otherwise run for ever.
#define MAX_ATTEMPTS 1024u
#define MAX_CHAIN (1u << 24)

// Status codes (src/hashtable/mod.rs `status`).
#define ST_MISS 0u
#define ST_FOUND 1u
#define ST_INSERTED 2u
#define ST_UPDATED 3u
#define ST_ERASED 5u
#define ST_FAILED 6u
#define ST_REJECTED 7u

struct __align__(16) Cell {
    u64 key;
    u64 val;
};

__device__ __forceinline__ u64 mix64(u64 x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

__device__ __forceinline__ Cell ld_cell(const Cell* p) {
    Cell c;
    asm volatile("{ .reg .b128 t; ld.relaxed.gpu.global.b128 t, [%2]; mov.b128 {%0, %1}, t; }"
                 : "=l"(c.key), "=l"(c.val)
                 : "l"(p)
                 : "memory");
    return c;
}

__device__ __forceinline__ Cell cas_cell(Cell* p, u64 ek, u64 ev, u64 nk, u64 nv) {
    u128 e = ((u128)ev << 64) | (u128)ek;
    u128 n = ((u128)nv << 64) | (u128)nk;
    u128 old = atomicCAS(reinterpret_cast<u128*>(p), e, n);
    Cell c;
    c.key = (u64)old;
    c.val = (u64)(old >> 64);
    return c;
}

__device__ __forceinline__ u32 lane_id() { return threadIdx.x & 31u; }

// Lanes 0..15 read the 16 cells of slab `s`; lanes 16..31 get an empty cell.
__device__ __forceinline__ Cell read_slab(const Cell* pool, u64 s) {
    Cell c;
    c.key = EMPTY_KEY;
    c.val = 0;
    if (lane_id() < SLAB_CELLS) c = ld_cell(pool + s * SLAB_CELLS + lane_id());
    return c;
}

__device__ __forceinline__ u32 pair_ballot(bool p) { return __ballot_sync(FULL, p) & PAIR_LANES; }

// Search: walk the chain until the key or the end of the chain.
__device__ u32 warp_find(const Cell* pool, u64 bucket_mask, u64 k, u64& val) {
    u64 s = mix64(k) & bucket_mask;
    for (u32 hops = 0; hops < MAX_CHAIN; ++hops) {
        Cell c = read_slab(pool, s);
        u32 hit = pair_ballot(c.key == k);
        if (hit) {
            val = __shfl_sync(FULL, c.val, __ffs(hit) - 1);
            return ST_FOUND;
        }
        u64 next = __shfl_sync(FULL, c.key, NEXT_LANE);
        if (next == 0) return ST_MISS;
        s = next;
    }
    return ST_FAILED;
}

// Insert-or-assign. Walks the whole chain: a present key gets its value replaced by an exchange;
// an absent key takes the first empty pair of the chain (chain order: slab by slab, lane by lane)
// with a 128-bit CAS that publishes key and value together; a chain without an empty pair gets a
// new slab (the warp's spare from a lost race, else a fresh one from the allocator) linked at its
// tail by a CAS on the tail's next pointer, and the walk restarts. A lost CAS restarts the walk.
// Unlike SlabHash's insertUnique (which claims the first empty pair of the slab it is reading once
// that slab lacks the key) the whole chain is checked first: erases leave empty pairs in front of
// keys, and claiming one of those could store a key twice. Duplicate-free only while no erase runs
// in the same kernel (src/bench/hashtable/slab.rs): then no pair ever becomes empty during the kernel.
__device__ u32 warp_insert(Cell* pool, u64 bucket_mask, u64* alloc, u64 nslabs, u64 k, u64 v, u64& spare, u64& old) {
    const u32 lane = lane_id();
    const u64 head = mix64(k) & bucket_mask;
    for (u32 attempt = 0; attempt < MAX_ATTEMPTS; ++attempt) {
        u64 s = head, empty_slab = 0, tail = 0;
        u32 empty_lane = 32;
        bool restart = false;
        for (u32 hops = 0; hops < MAX_CHAIN; ++hops) {
            Cell c = read_slab(pool, s);
            u32 hit = pair_ballot(c.key == k);
            if (hit) {
                const u32 at = __ffs(hit) - 1;
                u32 st = ST_FAILED;
                if (lane == at) {
                    // The key cannot leave its pair during an insert kernel (no erase runs in it), so
                    // the value word alone is swapped: wait-free. A CAS loop on the whole pair here
                    // starved under compute-sanitizer's scheduling (2048 inserts of one key, one warp
                    // losing 1024 rounds in a row: a spurious Failed), and it bought nothing.
                    old = atomicExch(&pool[s * SLAB_CELLS + at].val, v);
                    st = ST_UPDATED;
                }
                st = __shfl_sync(FULL, st, at);
                old = __shfl_sync(FULL, old, at);
                return st;
            }
            u32 empties = pair_ballot(c.key == EMPTY_KEY);
            if (empty_lane == 32 && empties) {
                empty_slab = s;
                empty_lane = __ffs(empties) - 1;
            }
            u64 next = __shfl_sync(FULL, c.key, NEXT_LANE);
            if (next == 0) {
                tail = s;
                break;
            }
            s = next;
        }
        if (empty_lane < 32) {
            bool won = false;
            if (lane == empty_lane)
                won = cas_cell(pool + empty_slab * SLAB_CELLS + empty_lane, EMPTY_KEY, 0, k, v).key == EMPTY_KEY;
            won = __shfl_sync(FULL, won, empty_lane);
            if (won) return ST_INSERTED;
            restart = true;  // someone took that pair first: walk again
        }
        if (!restart) {
            // No empty pair in the chain: link a new (all-zero) slab at the tail.
            u64 fresh = spare;
            if (fresh == 0) {
                if (lane == 0) fresh = atomicAdd(alloc, 1ull);
                fresh = __shfl_sync(FULL, fresh, 0);
                if (fresh >= nslabs) return ST_FAILED;  // the pool is used up
            }
            bool linked = false;
            if (lane == 0)
                linked = atomicCAS(&pool[tail * SLAB_CELLS + NEXT_LANE].key, 0ull, fresh) == 0ull;
            linked = __shfl_sync(FULL, linked, 0);
            spare = linked ? 0 : fresh;  // a slab that lost the race stays with this warp for next time
        }
    }
    return ST_FAILED;
}

// Delete: find the key and CAS its pair back to all zeros (plain empty, reusable at once; slabs are
// never unlinked or reclaimed, as in SlabHash).
__device__ u32 warp_erase(Cell* pool, u64 bucket_mask, u64 k, u64& old) {
    const u32 lane = lane_id();
    u64 s = mix64(k) & bucket_mask;
    for (u32 hops = 0; hops < MAX_CHAIN; ++hops) {
        Cell c = read_slab(pool, s);
        u32 hit = pair_ballot(c.key == k);
        if (hit) {
            const u32 at = __ffs(hit) - 1;
            u32 st = ST_FAILED;
            if (lane == at) {
                Cell prev = cas_cell(pool + s * SLAB_CELLS + at, k, c.val, EMPTY_KEY, 0);
                if (prev.key == k && prev.val == c.val) {
                    st = ST_ERASED;
                    old = c.val;
                } else if (prev.key != k) {
                    st = ST_MISS;  // a concurrent erase of the same key won
                }
            }
            st = __shfl_sync(FULL, st, at);
            old = __shfl_sync(FULL, old, at);
            return st;
        }
        u64 next = __shfl_sync(FULL, c.key, NEXT_LANE);
        if (next == 0) return ST_MISS;
        s = next;
    }
    return ST_FAILED;
}

// The batch kernels: one operation per thread, served by its warp. Reserved keys are rejected.
#define WORK_QUEUE_PROLOGUE                                                   \
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;                \
    const u32 lane = lane_id();                                               \
    bool pending = i < n;                                                     \
    u64 mykey = pending ? keys[i] : 0;                                        \
    if (pending && (mykey == EMPTY_KEY || mykey == RESERVED_KEY)) {           \
        status[i] = ST_REJECTED;                                              \
        pending = false;                                                      \
    }                                                                         \
    u32 queue;

extern "C" __global__ void __launch_bounds__(256) sl_insert(Cell* pool, u64 bucket_mask, u64* alloc, u64 nslabs,
                                                            const u64* keys, const u64* vals, u64 n, u32* status,
                                                            u64* out_val) {
    WORK_QUEUE_PROLOGUE
    const u64 myval = pending ? vals[i] : 0;
    u64 spare = 0;
    while ((queue = __ballot_sync(FULL, pending)) != 0u) {
        u32 src = __ffs(queue) - 1;
        u64 k = __shfl_sync(FULL, mykey, src), v = __shfl_sync(FULL, myval, src), old = 0;
        u32 st = warp_insert(pool, bucket_mask, alloc, nslabs, k, v, spare, old);
        if (lane == src) {
            status[i] = st;
            out_val[i] = old;
            pending = false;
        }
    }
}

extern "C" __global__ void __launch_bounds__(256) sl_find(const Cell* pool, u64 bucket_mask, const u64* keys, u64 n,
                                                          u32* status, u64* out_val) {
    WORK_QUEUE_PROLOGUE
    while ((queue = __ballot_sync(FULL, pending)) != 0u) {
        u32 src = __ffs(queue) - 1;
        u64 k = __shfl_sync(FULL, mykey, src), val = 0;
        u32 st = warp_find(pool, bucket_mask, k, val);
        if (lane == src) {
            status[i] = st;
            out_val[i] = val;
            pending = false;
        }
    }
}

extern "C" __global__ void __launch_bounds__(256) sl_erase(Cell* pool, u64 bucket_mask, const u64* keys, u64 n,
                                                           u32* status, u64* out_val) {
    WORK_QUEUE_PROLOGUE
    while ((queue = __ballot_sync(FULL, pending)) != 0u) {
        u32 src = __ffs(queue) - 1;
        u64 k = __shfl_sync(FULL, mykey, src), old = 0;
        u32 st = warp_erase(pool, bucket_mask, k, old);
        if (lane == src) {
            status[i] = st;
            out_val[i] = old;
            pending = false;
        }
    }
}

// Checks the table at rest, one thread per bucket: counters[0] problems (a key outside its bucket's
// chain, a key twice in one chain, a next pointer outside the allocated slabs, a nonzero spare word),
// counters[1] occupied pairs, counters[2] slabs in chains (base slabs included).
extern "C" __global__ void sl_audit(const Cell* pool, u64 bucket_mask, const u64* alloc, u64 nslabs, u64* counters) {
    const u64 b = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (b > bucket_mask) return;
    const u64 used = alloc[0] < nslabs ? alloc[0] : nslabs;
    u64 bad = 0, occupied = 0, slabs = 0;
    u64 s = b;
    for (u32 hops = 0; hops < MAX_CHAIN; ++hops) {
        ++slabs;
        const Cell* slab = pool + s * SLAB_CELLS;
        if (slab[NEXT_LANE].val != 0) bad = 1;
        for (u32 p = 0; p < SLAB_PAIRS; ++p) {
            u64 key = slab[p].key;
            if (key == EMPTY_KEY) continue;
            ++occupied;
            if ((mix64(key) & bucket_mask) != b || key == RESERVED_KEY) bad = 1;
            // Compare with every later pair of the chain.
            u64 t = s;
            u32 q = p + 1;
            for (u32 h2 = 0; h2 < MAX_CHAIN; ++h2) {
                const Cell* sl = pool + t * SLAB_CELLS;
                for (; q < SLAB_PAIRS; ++q)
                    if (sl[q].key == key) bad = 1;
                t = sl[NEXT_LANE].key;
                if (t == 0) break;
                q = 0;
            }
        }
        u64 next = slab[NEXT_LANE].key;
        if (next == 0) break;
        if (next <= bucket_mask || next >= used) {
            bad = 1;
            break;
        }
        s = next;
    }
    if (bad) atomicAdd(&counters[0], 1ull);
    atomicAdd(&counters[1], occupied);
    atomicAdd(&counters[2], slabs);
}

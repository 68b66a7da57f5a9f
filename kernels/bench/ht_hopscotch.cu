// Hopscotch hash table after GLHT (Zhang and Sun, 2019; ../shared/docs/GPU_HASH_TABLES.md design 3),
// written from the published description, with 64-bit keys and values. Compiled at run time with
// NVRTC for sm_90 (`--device-int128`: one 128-bit atomicCAS publishes a key and its value together).
// The design, its concurrency rules and where it departs from GLHT are in src/bench/hashtable/hopscotch.rs.
//
// Layout: `slots` is an array of N = mask + 1 16-byte cells {u64 key, u64 value} (N a power of two,
// at least 64); key 0 = empty, key u64::MAX = BUSY (a hole an insert has claimed and is moving
// towards its home; never a user key). `meta` holds one u64 per home slot h:
//   bits 0..31  hop bitmap: bit d set <=> slot (h + d) mod N holds a key whose home is h (H = 32)
//   bit 32      lock: held by the one insert or erase that writes h's keys or bitmap (GLHT's flags)
//   bits 33..63 version: +1 each time a key of home h is moved (so a lock-free find that misses can
//               tell that a move may have hidden its key, and read again)
// A key's home is mix64(key) & mask and it lives within H = 32 slots of it. Every operation is
// warp-cooperative: each lane brings one operation; the warp serves them one after the other
// (__ballot_sync work queue, __ffs picks the next, __shfl_sync broadcasts it), lane d reading slot
// home + d of the neighbourhood, __ballot_sync/__ffs picking the matching or empty lane.

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned __int128 u128;

#define FULL 0xffffffffu
#define EMPTY_KEY 0ull
#define BUSY_KEY 0xffffffffffffffffull
#define HOP 32u
#define META_LOCK (1ull << 32)
#define META_VER (1ull << 33)
// Bounds on every loop that could otherwise run for ever.
#define MAX_PROBE 4096ull
#define MAX_LOCK_SPINS (1u << 20)
#define MAX_MOVE_TRIES 256u
#define MAX_FIND_RETRIES 64u

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

// Single-copy-atomic 16-byte load that bypasses the (incoherent) L1.
__device__ __forceinline__ Cell ld_cell(const Cell* p) {
    Cell c;
    asm volatile("{ .reg .b128 t; ld.relaxed.gpu.global.b128 t, [%2]; mov.b128 {%0, %1}, t; }"
                 : "=l"(c.key), "=l"(c.val)
                 : "l"(p)
                 : "memory");
    return c;
}

__device__ __forceinline__ u64 ld_relaxed(const u64* p) {
    u64 v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

// Acquire load: the slot loads that follow cannot be served before it.
__device__ __forceinline__ u64 ld_acquire(const u64* p) {
    u64 v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void fence_acq_rel() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

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

// Takes the lock of home h for the warp (lane 0 spins, bounded). Returns false when it ran out; on
// success `m` is h's meta word as locked (bitmap exact: only the holder changes it).
__device__ __forceinline__ bool warp_lock(u64* meta, u64 h, u64& m) {
    bool ok = false;
    u64 mv = 0;
    if (lane_id() == 0) {
        u64* p = meta + h;
        for (u32 s = 0; s < MAX_LOCK_SPINS; ++s) {
            u64 cur = ld_relaxed(p);
            if (!(cur & META_LOCK)) {
                u64 prev = atomicCAS(p, cur, cur | META_LOCK);
                if (prev == cur) {
                    ok = true;
                    mv = cur | META_LOCK;
                    break;
                }
            } else {
                __nanosleep(64);
            }
        }
        fence_acq_rel();  // the holder's reads come after the acquisition
    }
    ok = __shfl_sync(FULL, ok, 0);
    m = __shfl_sync(FULL, mv, 0);
    return ok;
}

// Adds `delta` to h's meta word after the warp's earlier writes (release, by lane 0). With delta = -META_LOCK
// this is the unlock; an insert folds its bitmap bit into the same add.
__device__ __forceinline__ void warp_meta_release(u64* meta, u64 h, u64 delta) {
    __syncwarp();  // orders the other lanes' slot writes before lane 0's release
    if (lane_id() == 0) {
        fence_acq_rel();
        atomicAdd(meta + h, delta);
    }
    __syncwarp();
}

// Looks for key k among the slots of h's bitmap `bits`. Returns the lane (offset) that holds it, or
// 32; `c` is this lane's cell.
__device__ __forceinline__ u32 scan_hood(const Cell* slots, u64 mask, u64 h, u32 bits, u64 k, Cell& c) {
    const u32 lane = lane_id();
    c.key = EMPTY_KEY;
    c.val = 0;
    if ((bits >> lane) & 1u) c = ld_cell(slots + ((h + lane) & mask));
    u32 hit = __ballot_sync(FULL, ((bits >> lane) & 1u) && c.key == k);
    return hit ? (u32)(__ffs(hit) - 1) : HOP;
}

// Claims the nearest empty slot at or after h (at most MAX_PROBE slots away, and not beyond the
// table) by CAS to BUSY. Returns its distance from h, or ~0u when there was none.
__device__ __forceinline__ u32 claim_empty(Cell* slots, u64 mask, u64 h) {
    const u32 lane = lane_id();
    const u64 limit = (mask + 1) < MAX_PROBE ? (mask + 1) : MAX_PROBE;
    for (u64 base = 0; base < limit; base += HOP) {
        u64 s = (h + base + lane) & mask;
        u64 key = ld_relaxed(&slots[s].key);
        u32 empties = __ballot_sync(FULL, key == EMPTY_KEY && base + lane < limit);
        while (empties) {
            u32 j = __ffs(empties) - 1;
            bool won = false;
            if (lane == j) won = cas_cell(slots + s, EMPTY_KEY, 0, BUSY_KEY, 0).key == EMPTY_KEY;
            won = __shfl_sync(FULL, won, j);
            if (won) return (u32)(base + j);
            empties &= empties - 1;
        }
    }
    return ~0u;
}

// Moves the BUSY hole at distance `dist` from h (dist >= HOP) closer: some home j in the HOP - 1
// slots before the hole has a key between j and the hole; under j's lock (try-lock only: the warp
// already holds h's, so it never waits while holding one) that key is copied into the hole, j's
// bitmap gets the new position and its version a tick, then the old slot becomes the hole and j's
// bitmap loses it (version again). A reader therefore sees the key at one place or both, and one
// that read the bitmap before the move and the slot after it sees the version change. Returns the
// new distance, or ~0u when no key could be moved (none in reach, or all their homes locked).
__device__ u32 move_hole_closer(Cell* slots, u64* meta, u64 mask, u64 h, u32 dist) {
    const u32 lane = lane_id();
    const u64 e = (h + dist) & mask;
    // Lane l < 31 looks at home j = e - 31 + l, whose neighbourhood reaches the hole (e - j = 31 - l).
    const u64 j = (e - (HOP - 1) + lane) & mask;
    u64 mj = 0;
    bool cand = false;
    if (lane < HOP - 1) {
        mj = ld_relaxed(meta + j);
        u32 reach = (1u << (HOP - 1 - lane)) - 1u;
        cand = ((u32)mj & reach) != 0u && !(mj & META_LOCK);
    }
    u32 cands = __ballot_sync(FULL, cand);
    while (cands) {
        u32 l = __ffs(cands) - 1;  // the farthest home first
        cands &= cands - 1;
        const u64 jl = (e - (HOP - 1) + l) & mask;
        const u64 ml = __shfl_sync(FULL, mj, l);
        bool moved = false;
        u64 p = 0;
        if (lane == 0) {
            // Try-lock j from the exact word seen: success means j's bitmap is still `ml`.
            if (atomicCAS(meta + jl, ml, ml | META_LOCK) == ml) {
                fence_acq_rel();
                u32 bits = (u32)ml & ((1u << (HOP - 1 - l)) - 1u);
                u32 o = __ffs(bits) - 1;
                p = (jl + o) & mask;
                // The key at p has home j and stays put while j is locked.
                Cell c = ld_cell(slots + p);
                cas_cell(slots + e, BUSY_KEY, 0, c.key, c.val);  // e is this warp's hole
                fence_acq_rel();
                atomicAdd(meta + jl, META_VER + (1ull << (HOP - 1 - l)));
                fence_acq_rel();
                cas_cell(slots + p, c.key, c.val, BUSY_KEY, 0);  // p becomes the hole
                fence_acq_rel();
                // Clear bit o, tick the version and unlock j in one add.
                atomicAdd(meta + jl, META_VER - (1ull << o) - META_LOCK);
                moved = true;
            }
        }
        moved = __shfl_sync(FULL, moved, 0);
        if (moved) {
            p = __shfl_sync(FULL, p, 0);
            return (u32)((p - h) & mask);
        }
    }
    return ~0u;
}

// Insert-or-assign of (k, v), by the whole warp (k and v uniform). `old` gets the replaced value.
__device__ u32 warp_insert(Cell* slots, u64* meta, u64 mask, u64 k, u64 v, u64& old) {
    const u32 lane = lane_id();
    const u64 h = mix64(k) & mask;
    u64 m;
    if (!warp_lock(meta, h, m)) return ST_FAILED;
    // Under h's lock no key of home h is written, moved or erased by anyone else, so this check is exact.
    Cell c;
    u32 at = scan_hood(slots, mask, h, (u32)m, k, c);
    if (at < HOP) {
        bool ok = false;
        if (lane == at) {
            Cell prev = cas_cell(slots + ((h + at) & mask), k, c.val, k, v);
            ok = prev.key == k && prev.val == c.val;
            old = c.val;
        }
        ok = __shfl_sync(FULL, ok, at);
        old = __shfl_sync(FULL, old, at);
        warp_meta_release(meta, h, (u64)0 - META_LOCK);
        return ok ? ST_UPDATED : ST_FAILED;
    }
    u32 dist = claim_empty(slots, mask, h);
    for (u32 t = 0; dist != ~0u && dist >= HOP; ++t) {
        u32 nd = move_hole_closer(slots, meta, mask, h, dist);
        if (nd == ~0u) {
            if (t >= MAX_MOVE_TRIES) break;
            continue;  // every candidate home was locked: read them again
        }
        dist = nd;
    }
    if (dist == ~0u || dist >= HOP) {
        if (dist != ~0u && lane == 0) cas_cell(slots + ((h + dist) & mask), BUSY_KEY, 0, EMPTY_KEY, 0);
        warp_meta_release(meta, h, (u64)0 - META_LOCK);
        return ST_FAILED;
    }
    if (lane == 0) cas_cell(slots + ((h + dist) & mask), BUSY_KEY, 0, k, v);
    // Publish the bit (after the slot) and unlock in one add.
    warp_meta_release(meta, h, (1ull << dist) - META_LOCK);
    return ST_INSERTED;
}

__device__ u32 warp_erase(Cell* slots, u64* meta, u64 mask, u64 k, u64& old) {
    const u32 lane = lane_id();
    const u64 h = mix64(k) & mask;
    u64 m;
    if (!warp_lock(meta, h, m)) return ST_FAILED;
    Cell c;
    u32 at = scan_hood(slots, mask, h, (u32)m, k, c);
    if (at == HOP) {
        warp_meta_release(meta, h, (u64)0 - META_LOCK);
        return ST_MISS;
    }
    bool ok = false;
    if (lane == at) {
        Cell prev = cas_cell(slots + ((h + at) & mask), k, c.val, EMPTY_KEY, 0);
        ok = prev.key == k && prev.val == c.val;
        old = c.val;
    }
    ok = __shfl_sync(FULL, ok, at);
    old = __shfl_sync(FULL, old, at);
    warp_meta_release(meta, h, ok ? (u64)0 - (1ull << at) - META_LOCK : (u64)0 - META_LOCK);
    return ok ? ST_ERASED : ST_FAILED;
}

// Lock-free lookup of k with home h, given h's meta word `m` read with acquire. A hit reads one
// slot atomically. A miss is final only if h's version did not change between the bitmap read and
// the slot reads (fence, then read it again); else a move may have hidden the key: read again.
__device__ __forceinline__ u32 warp_find(const Cell* slots, const u64* meta, u64 mask, u64 h, u64 m, u64 k,
                                         u64& val) {
    for (u32 r = 0; r < MAX_FIND_RETRIES; ++r) {
        Cell c;
        u32 at = scan_hood(slots, mask, h, (u32)m, k, c);
        if (at < HOP) {
            val = __shfl_sync(FULL, c.val, at);
            return ST_FOUND;
        }
        u64 m2 = 0;
        if ((u32)m != 0u) {  // no slot read, nothing a move could have hidden
            fence_acq_rel();
            if (lane_id() == 0) m2 = ld_acquire(meta + h);
            m2 = __shfl_sync(FULL, m2, 0);
        } else {
            m2 = m;
        }
        if ((m2 >> 33) == (m >> 33)) return ST_MISS;
        m = m2;
    }
    return ST_FAILED;
}

// The three batch kernels: one operation per thread, served by its warp. Reserved keys are rejected.
extern "C" __global__ void __launch_bounds__(256) hs_insert(Cell* slots, u64* meta, u64 mask, const u64* keys,
                                                            const u64* vals, u64 n, u32* status, u64* out_val) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u32 lane = lane_id();
    bool pending = i < n;
    u64 mykey = pending ? keys[i] : 0, myval = pending ? vals[i] : 0;
    if (pending && (mykey == EMPTY_KEY || mykey == BUSY_KEY)) {
        status[i] = ST_REJECTED;
        pending = false;
    }
    u32 queue;
    while ((queue = __ballot_sync(FULL, pending)) != 0u) {
        u32 src = __ffs(queue) - 1;
        u64 k = __shfl_sync(FULL, mykey, src), v = __shfl_sync(FULL, myval, src), old = 0;
        u32 st = warp_insert(slots, meta, mask, k, v, old);
        if (lane == src) {
            status[i] = st;
            out_val[i] = old;
            pending = false;
        }
    }
}

extern "C" __global__ void __launch_bounds__(256) hs_erase(Cell* slots, u64* meta, u64 mask, const u64* keys, u64 n,
                                                           u32* status, u64* out_val) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u32 lane = lane_id();
    bool pending = i < n;
    u64 mykey = pending ? keys[i] : 0;
    if (pending && (mykey == EMPTY_KEY || mykey == BUSY_KEY)) {
        status[i] = ST_REJECTED;
        pending = false;
    }
    u32 queue;
    while ((queue = __ballot_sync(FULL, pending)) != 0u) {
        u32 src = __ffs(queue) - 1;
        u64 k = __shfl_sync(FULL, mykey, src), old = 0;
        u32 st = warp_erase(slots, meta, mask, k, old);
        if (lane == src) {
            status[i] = st;
            out_val[i] = old;
            pending = false;
        }
    }
}

extern "C" __global__ void __launch_bounds__(256) hs_find(const Cell* slots, const u64* meta, u64 mask, const u64* keys,
                                                          u64 n, u32* status, u64* out_val) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u32 lane = lane_id();
    bool pending = i < n;
    u64 mykey = pending ? keys[i] : 0;
    if (pending && (mykey == EMPTY_KEY || mykey == BUSY_KEY)) {
        status[i] = ST_REJECTED;
        pending = false;
    }
    // Every lane reads its own key's meta word first: one memory round trip for the whole warp.
    const u64 myh = mix64(mykey) & mask;
    const u64 mymeta = pending ? ld_acquire(meta + myh) : 0;
    u32 queue;
    while ((queue = __ballot_sync(FULL, pending)) != 0u) {
        u32 src = __ffs(queue) - 1;
        u64 k = __shfl_sync(FULL, mykey, src), h = __shfl_sync(FULL, myh, src), m = __shfl_sync(FULL, mymeta, src);
        u64 val = 0;
        u32 st = warp_find(slots, meta, mask, h, m, k, val);
        if (lane == src) {
            status[i] = st;
            out_val[i] = val;
            pending = false;
        }
    }
}

// Checks the table at rest (counters[0] problems, counters[1] occupied slots), one thread per slot:
// a BUSY slot or a held lock left behind; a key farther than HOP - 1 from its home or without its
// bit in its home's bitmap; a key stored twice in its neighbourhood; a bitmap bit whose slot does
// not hold a key of that home.
extern "C" __global__ void hs_audit(const Cell* slots, const u64* meta, u64 mask, u64* counters) {
    const u64 s = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (s > mask) return;
    u64 bad = 0;
    const u64 m = meta[s];
    if (m & META_LOCK) bad = 1;
    for (u32 d = 0; d < HOP; ++d) {
        if (!((m >> d) & 1ull)) continue;
        u64 key = slots[(s + d) & mask].key;
        if (key == EMPTY_KEY || key == BUSY_KEY || (mix64(key) & mask) != s) bad = 1;
    }
    const u64 key = slots[s].key;
    if (key == BUSY_KEY) bad = 1;
    if (key != EMPTY_KEY && key != BUSY_KEY) {
        atomicAdd(&counters[1], 1ull);
        const u64 h = mix64(key) & mask;
        const u64 d = (s - h) & mask;
        if (d >= HOP || !((meta[h] >> d) & 1ull)) bad = 1;
        for (u64 t = 0; t < d && t < HOP; ++t)
            if (slots[(h + t) & mask].key == key) bad = 1;
    }
    if (bad) atomicAdd(&counters[0], 1ull);
}

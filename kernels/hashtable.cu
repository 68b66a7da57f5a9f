// hypermnf GPU hash table: 64-bit keys and values, bucketed two-choice table with LRU eviction.
// Compiled at run time with NVRTC for sm_90 (`-arch=compute_90 --device-int128`): the 128-bit
// atomicCAS that publishes a key and its value together needs sm_90 and CUDA 12.3+.
//
// The design, the layout and the argument why no key is ever stored twice are written down in
// src/hashtable/mod.rs; src/hashtable/cpu.rs is the sequential twin of every device function here
// and must be changed together with it.
//
// Layout: the table is an array of 16-byte cells, 4 cells (64 bytes, half a cache line) per bucket.
//   cell 0 of a bucket = metadata: u16 ctl (bit 0: insert lock) then u16 stamp[1..3]; then
//                        u32 overflow tags (one bit per tag, see overflow_tag), then 4 zero bytes
//   cells 1..3         = slots {u64 key, u64 value}; key 0 = empty; the empty slot is all zeros.
// A group of 4 consecutive lanes reads a whole bucket with one coalesced 64-byte access
// (lane j reads cell j). Why 64 and not 128 bytes: a random 64-byte read costs the H100 about 2/3 of
// a random 128-byte one (31.8 vs 22.0 G/s over 4 GiB), and the finds and claims are bound by them.
//
// Insert paths: ht_mixed (and so every insert of the host API) takes b1's lock for every insert
// (group_insert). An insert-only batch is two kernels: ht_insert does without the lock everything
// that needs none (update a present key in place; else CAS into the LOWEST empty slot of b1; else,
// b1 full, set the key's tag and CAS into the lowest empty slot of b2) and marks the rest (both
// buckets full: an eviction; or a lost CAS race) for ht_insert_rest, which takes the lock where it
// must. Why that never stores a key twice (full argument in src/hashtable/mod.rs, points F1-F3 and
// 5-8): all kernels of a table go to one stream (src/hashtable/gpu.rs), so no erase runs during
// them and no slot ever becomes empty in them; hence every successful claim takes the lowest empty
// slot of its bucket at that moment, an inserter of k that claims slot q read every lower slot
// full and without k, and any placement of k outside b1's empty slots (a b2 claim, an eviction)
// follows a read of all of b1 full without k, after which b1 takes no claim. A copy in b2 from
// earlier kernels is found via the key's sticky overflow tag in b1. Each slot is reasoned about
// separately: the 4 lanes' loads are each atomic, the bucket read is no snapshot. Never use the
// lock-free paths where erases can run (ht_mixed).

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned __int128 u128;

#define GROUP 4
// Ballot bits of the slot lanes 1..GROUP-1 (lane 0 holds the metadata cell).
#define SLOT_LANES (((1u << GROUP) - 1u) & ~1u)
#define CTL_LOCK 1u
#define EMPTY_KEY 0ull
#define RESERVED_KEY 0xffffffffffffffffull
#define SALT2 0x9e3779b97f4a7c15ull

// Bounds on every loop that could otherwise spin for ever.
#define MAX_ATTEMPTS 64
#define MAX_LOCK_SPINS (1u << 20)

// Status codes (src/hashtable/mod.rs `status`).
#define ST_MISS 0u
#define ST_FOUND 1u
#define ST_INSERTED 2u
#define ST_UPDATED 3u
#define ST_EVICTED 4u
#define ST_ERASED 5u
#define ST_FAILED 6u
#define ST_REJECTED 7u

// Operation codes of the mixed kernel.
#define OP_FIND 0u
#define OP_INSERT 1u
#define OP_ERASE 2u

// Measurement switches, never defined in normal builds (the development knob HYPERMNF_HT_DEFINES of
// src/hashtable/gpu.rs passes them to NVRTC on the GPU host, 124019c:scripts/dev/ht-insert-experiments.sh):
// each makes the insert-only kernels skip part of their job, so that a benchmark run shows what that
// part costs. HT_DIAG_NO_STAMP: ht_insert writes no LRU stamps (which breaks the eviction order; no
// counter sees it). HT_DIAG_SKIP_REST: ht_insert_rest scans but serves nothing (no eviction, no
// retried race; the benchmark reports the lost keys and fails).

// Launch bounds of the batch kernels (256 threads per block). HT_MIN_BLOCKS, when the host defines it
// (HYPERMNF_HT_MIN_BLOCKS, a development knob), also asks for that many resident blocks per SM, which
// caps the registers per thread (finds, erase, mixed; ht_insert and ht_insert_rest have their own).
#ifdef HT_MIN_BLOCKS
#define HT_BOUNDS __launch_bounds__(256, HT_MIN_BLOCKS)
#else
#define HT_BOUNDS __launch_bounds__(256)
#endif
// ht_insert: 3 blocks per SM, the 72 registers ptxas wants. An earlier version was capped at 64 for 4
// blocks (more warps to hide its memory round trips); with the kernel as it is now, that cap measured
// slower on the 0.8 build on 2^28 cells: 7.91 against 8.10 G inserts/s.
#ifndef HT_INSERT_MIN_BLOCKS
#define HT_INSERT_MIN_BLOCKS 3
#endif
#define HT_INSERT_BOUNDS __launch_bounds__(256, HT_INSERT_MIN_BLOCKS)

struct __align__(16) Cell {
    u64 key;
    u64 val;
};

__device__ __forceinline__ u64 mix64(u64 x) {
    // MurmurHash3 fmix64: a bijection, so distinct inputs give distinct outputs.
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

// The two candidate buckets of a key (bucket_mask = buckets - 1, buckets >= 2).
__device__ __forceinline__ void bucket_pair(u64 key, u64 bucket_mask, u64& b1, u64& b2) {
    b1 = mix64(key) & bucket_mask;
    b2 = mix64(key ^ SALT2) & bucket_mask;
    if (b2 == b1) b2 = b1 ^ 1ull;
}

// The same pair as 32-bit indices: a table has at most 2^32 cells = 2^30 buckets (MAX_CELLS in
// src/hashtable/mod.rs), so bucket indices fit in a u32 and a group broadcasts one with a single
// shuffle. The batch kernels compute both once per lane, in the prologue (see GROUP_PROLOGUE).
__device__ __forceinline__ u32 bucket1(u64 key, u64 bucket_mask) {
    return (u32)(mix64(key) & bucket_mask);
}

__device__ __forceinline__ u32 bucket2(u64 key, u64 bucket_mask, u32 b1) {
    u32 b2 = (u32)(mix64(key ^ SALT2) & bucket_mask);
    return b2 == b1 ? (b1 ^ 1u) : b2;
}

// The overflow tag of a key: one of 32 bits, chosen by bits 48..52 of its hash (the bucket index
// uses at most the low 30). Before a key is placed in its b2, b1's tag word (the metadata cell's
// second half) gets the key's tag; a lookup that misses in b1 reads b2 only when its own tag is set
// there. Tags are only ever set (atomicOr; cleared by `clear` alone), so an evicted or erased key's
// tag stays: a wasted read, never a missed key. The tag word is apart from the lock word so that
// setting a tag never races the lock's CASes: ht_insert's lock-free b2 claims set tags with a
// fire-and-forget reduction. src/hashtable/mod.rs `overflow_tag` is the same function.
__device__ __forceinline__ u32 overflow_tag(u64 hash) {
    return 1u << (u32)((hash >> 48) & 31u);
}

// The tag word of a bucket (bytes 8..11 of its metadata cell).
__device__ __forceinline__ u32* tag_word(Cell* bucket) {
    return reinterpret_cast<u32*>(bucket) + 2;
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

// 16-byte load through the non-coherent (read-only) path, which may serve it from L1. Only for
// kernels during which nothing writes the table: the find variants with touch == 0 (every table
// kernel runs on the one stream of src/hashtable/gpu.rs, so no writer runs concurrently).
__device__ __forceinline__ Cell ld_cell_nc(const Cell* p) {
    Cell c;
    asm("ld.global.nc.v2.u64 {%0, %1}, [%2];" : "=l"(c.key), "=l"(c.val) : "l"(p));
    return c;
}

template <bool NC>
__device__ __forceinline__ Cell ld_cell_as(const Cell* p) {
    if (NC) return ld_cell_nc(p);
    return ld_cell(p);
}

__device__ __forceinline__ bool cas_cell(Cell* p, u64 ek, u64 ev, u64 nk, u64 nv) {
    u128 e = ((u128)ev << 64) | (u128)ek;
    u128 n = ((u128)nv << 64) | (u128)nk;
    u128 old = atomicCAS(reinterpret_cast<u128*>(p), e, n);
    return old == e;
}

// The same CAS, returning the slot's previous contents (equal to {ek, ev} exactly when it succeeded).
__device__ __forceinline__ Cell cas_cell_prev(Cell* p, u64 ek, u64 ev, u64 nk, u64 nv) {
    u128 e = ((u128)ev << 64) | (u128)ek;
    u128 n = ((u128)nv << 64) | (u128)nk;
    u128 old = atomicCAS(reinterpret_cast<u128*>(p), e, n);
    Cell c;
    c.key = (u64)old;
    c.val = (u64)(old >> 64);
    return c;
}

// Stamp of slot s (1..3) out of the metadata cell's first 64-bit word (ctl in bits 0..15).
__device__ __forceinline__ u32 stamp_of(u64 meta_lo, u32 s) {
    return (u32)((meta_lo >> (16 * s)) & 0xffffu);
}

__device__ __forceinline__ void store_stamp(Cell* bucket, u32 s, u32 clk) {
    volatile u16* st = reinterpret_cast<volatile u16*>(bucket);
    st[s] = (u16)clk;
}

// 16-bit CAS with acquire / release semantics at GPU scope: the lock needs ordering, not the
// sequentially consistent fence that __threadfence() (fence.sc.gpu) would cost on every insert.
__device__ __forceinline__ u16 cas16_acquire(u16* p, u16 cmp, u16 val) {
    u16 old;
    asm volatile("atom.acquire.gpu.global.cas.b16 %0, [%1], %2, %3;" : "=h"(old) : "l"(p), "h"(cmp), "h"(val) : "memory");
    return old;
}

__device__ __forceinline__ u16 cas16_release(u16* p, u16 cmp, u16 val) {
    u16 old;
    asm volatile("atom.release.gpu.global.cas.b16 %0, [%1], %2, %3;" : "=h"(old) : "l"(p), "h"(cmp), "h"(val) : "memory");
    return old;
}

// Start fetching a bucket's line into L2 (fire and forget): each lane prefetches the primary
// bucket of its own operation, so the group's operations overlap their DRAM latency instead of
// paying it one after the other.
__device__ __forceinline__ void prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

struct Group {
    u32 lane;   // 0..7 inside the group
    u32 base;   // first warp lane of the group
    u32 mask;   // the group's lanes in the warp
};

__device__ __forceinline__ Group make_group() {
    Group g;
    u32 wl = threadIdx.x & 31u;
    g.lane = wl & (GROUP - 1u);
    g.base = wl & ~(GROUP - 1u);
    g.mask = ((1u << GROUP) - 1u) << g.base;
    return g;
}

__device__ __forceinline__ u32 gballot(const Group& g, bool p) {
    return (__ballot_sync(g.mask, p) >> g.base) & ((1u << GROUP) - 1u);
}

template <typename T>
__device__ __forceinline__ T gshfl(const Group& g, T v, u32 src) {
    return __shfl_sync(g.mask, v, (int)src, GROUP);
}

// The same votes and shuffles with the whole warp's mask, for the batched rounds (read_round,
// find_round, ht_insert's claims), which every lane of the warp executes together whatever its
// group's operations: with a group's mask inside code whose control flow differs between the
// warp's groups, the compiler cannot assume convergence and wraps every shuffle and vote in a
// WARPSYNC.COLLECTIVE fallback (ptxas output: 68 such blocks in ht_insert, ~900 instructions per
// warp), which cost more than the work. Each group still reads only its own lanes (width GROUP).
__device__ __forceinline__ u32 wballot(const Group& g, bool p) {
    return (__ballot_sync(0xffffffffu, p) >> g.base) & ((1u << GROUP) - 1u);
}

template <typename T>
__device__ __forceinline__ T wshfl(T v, u32 src) {
    return __shfl_sync(0xffffffffu, v, (int)src, GROUP);
}

// One bucket as seen by a group: every lane holds its cell, plus the metadata broadcast.
struct View {
    Cell c;
    u64 meta_lo;  // the metadata cell's first word: ctl and stamps
    u32 tags;     // the metadata cell's tag word
    u32 hit;    // slot lanes (1..GROUP-1) whose key equals the probed key
    u32 empty;  // slot lanes whose slot is empty
};

__device__ __forceinline__ View read_bucket(const Group& g, Cell* bucket, u64 key) {
    View v;
    v.c = ld_cell(bucket + g.lane);
    v.meta_lo = gshfl(g, v.c.key, 0);
    v.tags = gshfl(g, (u32)v.c.val, 0);
    v.hit = gballot(g, g.lane != 0 && v.c.key == key);
    v.empty = gballot(g, g.lane != 0 && v.c.key == EMPTY_KEY);
    return v;
}

// The operation a group is serving: its key and primary bucket, broadcast from the lane `src` that
// brought it. b2 is broadcast only where an operation needs it (target_b2): every lane computed
// the b2 of its own operation in the prologue (own_b2).
struct Target {
    u64 key;
    u32 b1;
    u32 tag;     // overflow_tag of the key
    u32 own_b2;  // the calling lane's own b2, not the target's
    u32 src;
};

// Operation j of the group (the key, b1 and tag its lane computed in the prologue), as every lane sees it.
__device__ __forceinline__ Target target_of(const Group& g, u32 j, u64 mykey, u32 myb1, u32 myb2, u32 mytag) {
    Target t;
    t.key = gshfl(g, mykey, j);
    t.b1 = gshfl(g, myb1, j);
    t.tag = gshfl(g, mytag, j);
    t.own_b2 = myb2;
    t.src = j;
    return t;
}

__device__ __forceinline__ u32 target_b2(const Group& g, const Target& t) {
    return gshfl(g, t.own_b2, t.src);
}

// ---------------------------------------------------------------- cooperative operations
// Every function below is called by all lanes of a group with the same arguments and
// returns the same status in every lane; control flow depends only on broadcast values.
// Reserved keys never get here: the prologue answers them with ST_REJECTED.

// TOUCH is a compile-time choice, so lookups without touch carry no stamp code at all. NC: read
// through the non-coherent path (only with TOUCH == false, in a kernel that nothing else writes).
template <bool TOUCH, bool NC>
__device__ __forceinline__ u32 group_find(const Group& g, Cell* table, const Target& t, u32 clk, u64& out_val) {
    Cell* bucket = table + (u64)t.b1 * GROUP;
    Cell c = ld_cell_as<NC>(bucket + g.lane);
    // One vote answers both questions: bit 0 = the key's overflow tag in b1 (lane 0 holds the
    // metadata cell, whose second half holds the tag word), other bits = the slots holding the key.
    u32 m = gballot(g, g.lane == 0 ? ((u32)c.val & t.tag) != 0 : c.key == t.key);
    if (m <= 1u) {                    // not in b1
        if (m == 0u) return ST_MISS;  // tag clear: the key does not live in b2
        bucket = table + (u64)target_b2(g, t) * GROUP;
        c = ld_cell_as<NC>(bucket + g.lane);
        m = gballot(g, g.lane != 0 && c.key == t.key);
        if (m == 0u) return ST_MISS;
    }
    u32 s = __ffs(m & SLOT_LANES) - 1;
    out_val = gshfl(g, c.val, s);
    // Lane 0 holds the metadata of the bucket that hit, so it refreshes the stamp (only if it changes).
    if (TOUCH && g.lane == 0 && stamp_of(c.key, s) != (clk & 0xffffu)) store_stamp(bucket, s, clk);
    return ST_FOUND;
}

__device__ u32 group_erase(const Group& g, Cell* table, const Target& t, u64& out_val) {
    Cell* B1 = table + (u64)t.b1 * GROUP;
    Cell* B2 = table + (u64)target_b2(g, t) * GROUP;
    for (int attempt = 0; attempt < MAX_ATTEMPTS; ++attempt) {
        bool retry = false;
        for (int r = 0; r < 2; ++r) {
            Cell* bucket = r == 0 ? B1 : B2;
            View v = read_bucket(g, bucket, t.key);
            if (v.hit) {
                u32 s = __ffs(v.hit) - 1;
                u64 old = gshfl(g, v.c.val, s);
                bool ok = false;
                if (g.lane == s) ok = cas_cell(bucket + s, t.key, old, EMPTY_KEY, 0ull);
                ok = gshfl(g, (int)ok, s) != 0;
                if (ok) {
                    out_val = old;
                    return ST_ERASED;
                }
                retry = true;  // the slot changed under us: read again
                break;
            }
            if (r == 0 && !(v.tags & t.tag)) break;
        }
        if (!retry) return ST_MISS;
    }
    return ST_FAILED;
}

// Lane 0 takes the insert lock of a primary bucket with 16-bit CASes on the control word alone
// (the stamps beside it are plain 16-bit stores, so no access ever straddles them). The first CAS
// guesses "unlocked, no overflow"; a failed CAS returns the actual word for the next try. Bounded.
// `held` (lane 0 only) is the control word as this group holds it.
__device__ bool group_lock(const Group& g, Cell* bucket, u16& held) {
    bool got = false;
    if (g.lane == 0) {
        u16* ctl = reinterpret_cast<u16*>(bucket);
        u16 expect = 0;
        for (u32 i = 0; i < MAX_LOCK_SPINS; ++i) {
            u16 prev = cas16_acquire(ctl, expect, (u16)(expect | CTL_LOCK));
            if (prev == expect) {
                held = (u16)(expect | CTL_LOCK);
                got = true;
                break;
            }
            if (prev & CTL_LOCK) __nanosleep(32);
            expect = (u16)(prev & ~CTL_LOCK);
        }
    }
    got = gshfl(g, (int)got, 0) != 0;
    __syncwarp(g.mask);  // orders the other lanes' reads after lane 0's acquire
    return got;
}

// Lane 0, holding the lock: set the key's overflow tag in b1 (atomicOr: tags are only ever set, by
// whoever places a key in its b2). FENCE (ht_mixed, where finds run concurrently): then fence, so that
// the tag is visible before the key can appear in b2. The insert-only kernels need no fence: in them
// no find runs, a b1 found full always sends its reader to b2, and the kernel boundary publishes the
// tag to every later kernel.
template <bool FENCE>
__device__ __forceinline__ void set_overflow(const Group& g, Cell* bucket, u32 tag) {
    if (g.lane == 0) {
        atomicOr(tag_word(bucket), tag);
        if (FENCE) __threadfence();
    }
    __syncwarp(g.mask);
}

__device__ __forceinline__ void group_unlock(const Group& g, Cell* bucket, u16 held) {
    __syncwarp(g.mask);  // the lanes' slot CASes happen before lane 0's release
    if (g.lane == 0) cas16_release(reinterpret_cast<u16*>(bucket), held, (u16)(held & ~CTL_LOCK));
}

// The eviction rule, shared by group_insert and parallel_evict (src/hashtable/cpu.rs is its twin):
// the least recently used of the 2 * (GROUP - 1) entries of b1 and b2, i.e. the largest stamp age
// modulo 2^16, ties to b1, then to the lower slot. meta1/meta2: the buckets' metadata words (ctl and
// stamps). Returns the victim as `order`: slot = order & (GROUP - 1), in b2 when order >= GROUP.
// All lanes of `mask` call it (mask: the group's, or the whole warp's in the batched rounds).
__device__ __forceinline__ u32 lru_victim(const Group& g, u32 mask, u64 meta1, u64 meta2, u32 clk) {
    u32 best = 0;
    if (g.lane != 0) {
        u32 a1 = (clk - stamp_of(meta1, g.lane)) & 0xffffu;
        u32 a2 = (clk - stamp_of(meta2, g.lane)) & 0xffffu;
        u32 o1 = (a1 << 8) | (255u - g.lane);
        u32 o2 = (a2 << 8) | (255u - (GROUP + g.lane));
        best = o1 > o2 ? o1 : o2;
    }
#pragma unroll
    for (int off = GROUP / 2; off > 0; off >>= 1) {
        u32 other = __shfl_xor_sync(mask, best, off, GROUP);
        best = other > best ? other : best;
    }
    return 255u - (best & 0xffu);
}

// Insert-or-assign under the primary bucket's lock (the slow path of ht_insert, the only path of
// ht_mixed). out_key/out_val: the evicted entry (ST_EVICTED) or the previous value (ST_UPDATED).
// FENCE: see set_overflow (true in ht_mixed).
template <bool FENCE>
__device__ u32 group_insert(const Group& g, Cell* table, const Target& t, u64 val, u32 clk, u64& out_key,
                            u64& out_val) {
    const u64 key = t.key;
    Cell* B1 = table + (u64)t.b1 * GROUP;
    Cell* B2 = table + (u64)target_b2(g, t) * GROUP;
    u16 held = 0;
    if (!group_lock(g, B1, held)) return ST_FAILED;
    u32 status = ST_FAILED;
    for (int attempt = 0; attempt < MAX_ATTEMPTS; ++attempt) {
        View v1 = read_bucket(g, B1, key);
        View v2 = {};
        // b2 is read when the key may live there (its tag in b1) and whenever b1 is full (a claim in
        // b2 or an eviction follows, and a key that ht_insert's lock-free path put into b2 may not
        // show its tag to this read yet).
        if (!v1.hit && ((v1.tags & t.tag) || !v1.empty)) v2 = read_bucket(g, B2, key);
        // 1. The key is present: replace its value in place.
        if (v1.hit || v2.hit) {
            bool in1 = v1.hit != 0;
            Cell* bucket = in1 ? B1 : B2;
            u32 s = __ffs(in1 ? v1.hit : v2.hit) - 1;
            u64 old = gshfl(g, in1 ? v1.c.val : v2.c.val, s);
            bool ok = false;
            if (g.lane == s) {
                ok = cas_cell(bucket + s, key, old, key, val);
                if (ok) store_stamp(bucket, s, clk);
            }
            ok = gshfl(g, (int)ok, s) != 0;
            if (ok) {
                out_val = old;
                status = ST_UPDATED;
                break;
            }
            continue;  // erased or evicted meanwhile: read again
        }
        // 2. Absent: the lowest empty slot of b1.
        if (v1.empty) {
            u32 s = __ffs(v1.empty) - 1;
            bool ok = false;
            if (g.lane == s) {
                ok = cas_cell(B1 + s, EMPTY_KEY, 0ull, key, val);
                if (ok) store_stamp(B1, s, clk);
            }
            ok = gshfl(g, (int)ok, s) != 0;
            if (ok) {
                status = ST_INSERTED;
                break;
            }
            continue;
        }
        // 3. Else the lowest empty slot of b2, the overflow bit published first.
        if (v2.empty) {
            u32 s = __ffs(v2.empty) - 1;
            set_overflow<FENCE>(g, B1, t.tag);
            bool ok = false;
            if (g.lane == s) {
                ok = cas_cell(B2 + s, EMPTY_KEY, 0ull, key, val);
                if (ok) store_stamp(B2, s, clk);
            }
            ok = gshfl(g, (int)ok, s) != 0;
            if (ok) {
                status = ST_INSERTED;
                break;
            }
            continue;
        }
        // 4. Both buckets full: evict the least recently used of the 2 * (GROUP - 1) entries (largest
        //    stamp age, ties to the primary bucket, then to the lower slot).
        u32 order = lru_victim(g, g.mask, v1.meta_lo, v2.meta_lo, clk);
        bool in2 = order >= GROUP;
        u32 s = order & (GROUP - 1u);
        u64 vk = gshfl(g, in2 ? v2.c.key : v1.c.key, s);
        u64 vv = gshfl(g, in2 ? v2.c.val : v1.c.val, s);
        Cell* bucket = in2 ? B2 : B1;
        if (in2) set_overflow<FENCE>(g, B1, t.tag);
        bool ok = false;
        if (g.lane == s) {
            ok = cas_cell(bucket + s, vk, vv, key, val);
            if (ok) store_stamp(bucket, s, clk);
        }
        ok = gshfl(g, (int)ok, s) != 0;
        if (ok) {
            out_key = vk;
            out_val = vv;
            status = ST_EVICTED;
            break;
        }
    }
    group_unlock(g, B1, held);
    return status;
}

// Internal statuses, never seen by the host: ST_SLOW, "leave this insert to the locked slow path"
// (group_insert_fast; also what ht_insert hands ht_insert_rest after a lost CAS), and ST_FULL, what
// ht_insert hands ht_insert_rest for a key absent from two full buckets.
#define ST_SLOW 0xffu
#define ST_FULL 0xfeu

// Where a lock-free insert of t.key writes, read cooperatively: the slot holding the key (in b1, or
// in b2 when b1 carries the key's overflow tag) or, when the key is absent, the lowest empty slot of
// b1. Returns false when the key is absent and b1 is full (the locked path's case). On true, every lane
// holds the bucket, the slot and its contents as read (ek: the key or EMPTY_KEY, ev: its value or 0),
// which the CAS must find unchanged.
struct Claim {
    Cell* bucket;
    u32 s;
    u64 ek;
    u64 ev;
};

__device__ __forceinline__ bool insert_claim(const Group& g, Cell* table, const Target& t, Claim& out) {
    Cell* bucket = table + (u64)t.b1 * GROUP;
    Cell c = ld_cell(bucket + g.lane);
    // Bit 0: the key's overflow tag in b1 (lane 0 holds the metadata); bits 1..: slots holding the key.
    u32 m = gballot(g, g.lane == 0 ? ((u32)c.val & t.tag) != 0 : c.key == t.key);
    u32 empty = gballot(g, g.lane != 0 && c.key == EMPTY_KEY);
    u32 hit = m & SLOT_LANES;
    if (!hit && (m & 1u)) {  // the key may live in b2
        Cell* B2 = table + (u64)target_b2(g, t) * GROUP;
        Cell c2 = ld_cell(B2 + g.lane);
        u32 hit2 = gballot(g, g.lane != 0 && c2.key == t.key);
        if (hit2) {
            bucket = B2;
            c = c2;
            hit = hit2;
        }
    }
    if (!hit && !empty) return false;
    out.bucket = bucket;
    out.s = __ffs(hit ? hit : empty) - 1;
    out.ek = hit ? t.key : EMPTY_KEY;
    out.ev = hit ? gshfl(g, c.val, out.s) : 0ull;
    return true;
}

// Lock-free retry of an insert whose claim lost a CAS race in ht_insert, run by ht_insert_rest (never
// by ht_mixed: it is correct only while no erase runs, see "Why a key is never stored twice" in
// src/hashtable/mod.rs). Reads b1
// (and b2 if b1 carries the key's overflow tag), through insert_claim; a present key gets its value replaced in place, an absent
// key is claimed into the LOWEST empty slot of b1, both with one 128-bit CAS from the exact
// contents read. Returns ST_INSERTED / ST_UPDATED (out_val = previous value), or ST_SLOW when the
// key is absent and b1 is full (the slow path then claims in b2 or evicts) or the bounded retries
// ran out. Sequentially it does exactly what group_insert does in those two cases.
__device__ u32 group_insert_fast(const Group& g, Cell* table, const Target& t, u64 val, u32 clk, u64& out_val) {
    for (int attempt = 0; attempt < MAX_ATTEMPTS; ++attempt) {
        Claim cl;
        if (!insert_claim(g, table, t, cl)) return ST_SLOW;  // absent and b1 full
        Cell* bucket = cl.bucket;
        const u32 s = cl.s;
        // Lane s owns the slot: CAS from what it read. A claim that finds the key already there
        // (an insert of the same key got in first) turns into an update of that entry; an entry
        // whose value changed is updated from the value the CAS returned. Any other change (the
        // slot taken by another key, the entry evicted) sends the group back to read the bucket.
        u32 st = ST_SLOW;
        u64 old = 0;
        if (g.lane == s) {
            u64 ek = cl.ek;
            u64 ev = cl.ev;
            for (int i = 0; i < MAX_ATTEMPTS; ++i) {
                Cell prev = cas_cell_prev(bucket + s, ek, ev, t.key, val);
                if (prev.key == ek && prev.val == ev) {
                    st = ek == EMPTY_KEY ? ST_INSERTED : ST_UPDATED;
                    old = ev;
                    store_stamp(bucket, s, clk);
                    break;
                }
                if (prev.key != t.key) break;
                ek = t.key;
                ev = prev.val;
            }
        }
        st = gshfl(g, st, s);
        if (st != ST_SLOW) {
            out_val = gshfl(g, old, s);
            return st;
        }
    }
    return ST_SLOW;
}

// Batched reads: for each operation j of the group in `todo` (group-uniform), every lane loads its cell
// of the bucket `gshfl(mybucket, j)` into c[j]. The loads are independent, so a lane has up to GROUP
// of them in flight and the group pays one memory round trip for all its operations. c[j] is left
// unread (zero) for operations outside `todo`.
template <bool NC = false>
__device__ __forceinline__ void read_round(const Group& g, const Cell* table, u32 todo, u32 mybucket, Cell (&c)[GROUP]) {
#pragma unroll
    for (u32 j = 0; j < GROUP; ++j) {
        const u32 b = wshfl(mybucket, j);
        c[j].key = 0;
        c[j].val = 0;
        if (todo & (1u << j)) c[j] = ld_cell_as<NC>(table + (u64)b * GROUP + g.lane);
    }
}

// ---------------------------------------------------------------- batch kernels
// Warp-cooperative work sharing: each lane brings one operation; the group of GROUP lanes serves
// its lanes' operations, all its lanes cooperating on each: one after the other (erase, mixed, and
// the slow path of inserts), or in rounds that read all the group's buckets at once (find, and the
// claims of ht_insert; see read_round). Launch with a block size that is a multiple of 32.

// Each lane loads its own operation (coalesced), hashes its key once (both buckets: one fmix64
// each per lane, i.e. per warp for 32 operations, cheaper than hashing per served operation) and,
// in the kernels that serve operations one after the other (PREFETCH), prefetches its primary
// bucket into L2 so that the group's operations overlap their DRAM latency; a reserved key is
// answered ST_REJECTED here and never served. The group then serves the pending lanes,
// broadcasting key and b1 with __shfl_sync (b2 only on demand), and the owning lane keeps the
// result in registers so that all results are written at the end in one coalesced store per array.
#define GROUP_PROLOGUE(n, PREFETCH)                                            \
    Group g = make_group();                                                    \
    u64 my = (u64)blockIdx.x * blockDim.x + threadIdx.x;                       \
    bool active = my < (n);                                                    \
    u64 mykey = active ? keys[my] : EMPTY_KEY;                                 \
    bool valid = active && mykey != EMPTY_KEY && mykey != RESERVED_KEY;        \
    u64 myh = mix64(mykey);                                                    \
    u32 myb1 = (u32)(myh & bucket_mask);                                       \
    u32 mytag = overflow_tag(myh);                                             \
    u32 myb2 = bucket2(mykey, bucket_mask, myb1);                              \
    if (PREFETCH && valid) prefetch_l2(table + (u64)myb1 * GROUP);             \
    u32 pending = gballot(g, valid);                                           \
    u32 my_st = ST_REJECTED;                                                   \
    u64 my_ok = 0, my_ov = 0;

#define FOR_EACH_PENDING                                                       \
    while (pending) {                                                          \
        u32 j = __ffs(pending) - 1;                                            \
        pending &= pending - 1;                                                \
        Target t = target_of(g, j, mykey, myb1, myb2, mytag);

#define KEEP_RESULT(st, ok, ov)                                                \
        if (g.lane == j) {                                                     \
            my_st = (st);                                                      \
            my_ok = (ok);                                                      \
            my_ov = (ov);                                                      \
        }                                                                      \
    }

// Insert-or-assign a batch of inserts only, phase 1 of 2: every insert that can be done without the
// lock (an update in place, a claim of the lowest empty slot of b1, or of b2 when b1 is full);
// ht_insert_rest, launched next with the same arguments, does the rest. Must never run concurrently
// with an erase on the same table (all launches go to one stream, see src/hashtable/gpu.rs).
extern "C" __global__ void HT_INSERT_BOUNDS ht_insert(Cell* table, u64 bucket_mask, const u64* keys, const u64* vals, u64 n,
                                     u32 clk, u32* status, u64* out_key, u64* out_val) {
    GROUP_PROLOGUE(n, false)
    u64 myval = active ? vals[my] : 0ull;
    // Phase 1, pipelined claims. The group reads all its pending operations' primary buckets at once
    // (read_round) and votes on each; operations that did not find their key in b1 and either see
    // their overflow tag there or find b1 full read their b2 in a second round. Each owning lane then
    // holds its target: the slot holding its key (an update, in b1 or b2), else the lowest empty slot
    // of b1, else (b1 full) the lowest empty slot of b2, for which it first sets its tag in b1's tag
    // word (a fire-and-forget atomicOr). Every lane issues its own 128-bit CAS; the targets found in
    // round 1 go out before round 2's reads, so the two overlap. The earlier one-bucket-at-a-time
    // reads made the kernel latency-bound (ncu: 0.37 eligible warps per scheduler; more occupancy did
    // not help), and with 3-slot buckets a fifth of the inserts that build a table to load 0.8 find
    // b1 full, so the b2 claims are pipelined too; only evictions (both buckets full) take the lock,
    // in ht_insert_rest. No key can be stored twice (src/hashtable/mod.rs, "The lock-free paths of
    // ht_insert"): no slot empties during these kernels, each claim takes the lowest slot of its
    // bucket that was empty when read, and a claim into b2 follows a read of b1 full without the key.
    Claim mine = {};       // this lane's target (valid when `have` or `have2`)
    bool have = false;     // found in round 1
    bool have2 = false;    // found in round 2
    bool via_b2 = false;   // the target is an empty slot of b2: set the tag first
    bool both_full = false;  // absent from two full buckets
    Cell prev = {};        // what the claim's CAS found
    {
        Cell c[GROUP];
        read_round(g, table, pending, myb1, c);
        u32 again = 0;      // operations that read their b2 in round 2 (group-uniform)
        u32 my_empty = 0;   // owner lane: the empty slots of its b1
        // Every lane of the warp runs every step (warp-wide collectives, see wballot); `live` says
        // whether operation j of this lane's group is pending.
#pragma unroll
        for (u32 j = 0; j < GROUP; ++j) {
            const bool live = (pending >> j) & 1u;
            const u64 key = wshfl(mykey, j);
            const u32 tag = wshfl(mytag, j);
            const u32 b = wshfl(myb1, j);
            // Bit 0: the key's overflow tag in b1 (lane 0 holds the metadata); others: slots holding the key.
            const u32 m = wballot(g, live && (g.lane == 0 ? ((u32)c[j].val & tag) != 0 : c[j].key == key));
            const u32 empty = wballot(g, live && g.lane != 0 && c[j].key == EMPTY_KEY);
            const u32 hit = m & SLOT_LANES;
            const u32 s = (__ffs(hit ? hit : empty) - 1) & (GROUP - 1u);
            const u64 v = wshfl(c[j].val, s);
            if (!live) {
                // not an operation of this round
            } else if (!hit && ((m & 1u) || !empty)) {  // the key may live in b2, or b1 is full
                again |= 1u << j;
                if (g.lane == j) my_empty = empty;
            } else if (g.lane == j) {
                mine.bucket = table + (u64)b * GROUP;
                mine.s = s;
                mine.ek = hit ? key : EMPTY_KEY;
                mine.ev = hit ? v : 0ull;
                have = true;
            }
        }
        if (have) prev = cas_cell_prev(mine.bucket + mine.s, mine.ek, mine.ev, mykey, myval);
        if (__any_sync(0xffffffffu, again != 0)) {  // the whole warp takes part (see wballot)
            read_round(g, table, again, myb2, c);
#pragma unroll
            for (u32 j = 0; j < GROUP; ++j) {
                const bool live = (again >> j) & 1u;
                const u64 key = wshfl(mykey, j);
                const u32 b = wshfl(myb2, j);
                const u32 hit2 = wballot(g, live && g.lane != 0 && c[j].key == key);
                const u32 empty2 = wballot(g, live && g.lane != 0 && c[j].key == EMPTY_KEY);
                const u32 s = (__ffs(hit2 ? hit2 : empty2) - 1) & (GROUP - 1u);
                const u64 v = wshfl(c[j].val, s);
                if (live && g.lane == j) {
                    if (hit2) {  // present in b2: update it there
                        mine.bucket = table + (u64)b * GROUP;
                        mine.s = s;
                        mine.ek = key;
                        mine.ev = v;
                        have2 = true;
                    } else if (my_empty) {  // tagged b1 with room: the key is absent, claim in b1
                        mine.bucket = table + (u64)myb1 * GROUP;
                        mine.s = __ffs(my_empty) - 1;
                        mine.ek = EMPTY_KEY;
                        mine.ev = 0ull;
                        have2 = true;
                    } else if (empty2) {  // b1 full: claim the lowest empty slot of b2
                        mine.bucket = table + (u64)b * GROUP;
                        mine.s = s;
                        mine.ek = EMPTY_KEY;
                        mine.ev = 0ull;
                        via_b2 = true;
                        have2 = true;
                    } else {
                        both_full = true;  // ht_insert_rest evicts under the lock
                    }
                }
            }
        }
    }
    if (have2) {
        // The tag goes into b1's tag word before the claim; every later kernel sees both (the kernel
        // boundary), and inside the insert-only kernels nothing relies on the tag (a b1 found full
        // always sends its reader to b2).
        if (via_b2) atomicOr(tag_word(table + (u64)myb1 * GROUP), mytag);
        prev = cas_cell_prev(mine.bucket + mine.s, mine.ek, mine.ev, mykey, myval);
    }
    bool done = false;
    if ((have || have2) && prev.key == mine.ek && prev.val == mine.ev) {
#ifndef HT_DIAG_NO_STAMP
        store_stamp(mine.bucket, mine.s, clk);
#endif
        my_st = mine.ek == EMPTY_KEY ? ST_INSERTED : ST_UPDATED;
        my_ok = 0;
        my_ov = mine.ev;
        done = true;
    }
    // What is left goes to ht_insert_rest, launched next on the same stream, which finds it by its
    // status.
    if (valid && !done) my_st = both_full ? ST_FULL : ST_SLOW;
    // out_key and out_val mean something only for ST_EVICTED (key and value) and ST_UPDATED (the old
    // value), which is all the host reads (gpu.rs `decode`); this kernel never evicts, and skipping
    // the other writes saves 16 of the ~150 bytes of memory traffic per insert.
    (void)my_ok;
    if (active) status[my] = my_st;
    if (active && my_st == ST_UPDATED) out_val[my] = my_ov;
}

// The locked inserts of ht_insert_rest's ST_FULL operations (absent from two full buckets when
// ht_insert read them), all of a warp's at once instead of one after the other per group: every
// lane with one (`want`) tries its b1's lock once, without spinning; the holders' groups read both
// buckets of all their operations in one round (read_round) and decide each exactly as group_insert
// does under the lock (present: update; an empty slot of b1, else of b2 after setting the tag; else
// evict the least recently used of the 6, ties to b1 then the lower slot); each owner CASes from
// what was read, stamps, and releases. Whole-warp collectives, so every lane of the warp must call
// it. Returns true for the operations it finished; a lock held elsewhere (or by another lane of the
// warp for the same bucket) or a failed CAS (a locked insert of another key wrote into a shared
// bucket) leaves the operation to the one-at-a-time path. No fence for the tag: insert-only kernels
// (see set_overflow).
__device__ __forceinline__ bool parallel_evict(const Group& g, Cell* table, bool want, u64 mykey, u64 myval, u32 myb1,
                                               u32 myb2, u32 mytag, u32 clk, u32& my_st, u64& my_ok, u64& my_ov) {
    Cell* B1 = table + (u64)myb1 * GROUP;
    // Converge the warp before any lane takes a lock: its groups may still be finishing the previous
    // one-at-a-time operations, spinning on a lock in group_lock; a lane that took a lock and then
    // waited for the whole warp (the __syncwarp and whole-warp shuffles below) could wait for a
    // group that spins on that very lock. Measured before this line: a 2^24-cell build to load 0.9
    // took 732 ms and 34 inserts ran out of lock spins. Once converged, no lane here waits for a lock.
    __syncwarp();
    bool locked = want && cas16_acquire(reinterpret_cast<u16*>(B1), 0, (u16)CTL_LOCK) == 0;
    __syncwarp();  // orders every lane's reads below after the owners' acquires
    if (!__any_sync(0xffffffffu, locked)) return false;
    const u32 held = wballot(g, locked);
    Cell c1[GROUP], c2[GROUP];
    read_round(g, table, held, myb1, c1);
    read_round(g, table, held, myb2, c2);
    Claim mine = {};
    bool tag_first = false;
#pragma unroll
    for (u32 j = 0; j < GROUP; ++j) {
        const bool live = (held >> j) & 1u;
        const u64 key = wshfl(mykey, j);
        const u32 b1 = wshfl(myb1, j);
        const u32 b2 = wshfl(myb2, j);
        const u64 meta1 = wshfl(c1[j].key, 0);
        const u64 meta2 = wshfl(c2[j].key, 0);
        const u32 hit1 = wballot(g, live && g.lane != 0 && c1[j].key == key);
        const u32 hit2 = wballot(g, live && g.lane != 0 && c2[j].key == key);
        const u32 empty1 = wballot(g, live && g.lane != 0 && c1[j].key == EMPTY_KEY);
        const u32 empty2 = wballot(g, live && g.lane != 0 && c2[j].key == EMPTY_KEY);
        const u32 order = lru_victim(g, 0xffffffffu, meta1, meta2, clk);
        // The target, in group_insert's order of preference (all lanes compute it alike).
        bool t2;
        u32 s;
        bool victim = false;
        if (hit1) { t2 = false; s = __ffs(hit1) - 1; }
        else if (hit2) { t2 = true; s = __ffs(hit2) - 1; }
        else if (empty1) { t2 = false; s = __ffs(empty1) - 1; }
        else if (empty2) { t2 = true; s = __ffs(empty2) - 1; }
        else { t2 = order >= GROUP; s = order & (GROUP - 1u); victim = true; }
        s &= GROUP - 1u;
        const u64 tk = wshfl(t2 ? c2[j].key : c1[j].key, s);
        const u64 tv = wshfl(t2 ? c2[j].val : c1[j].val, s);
        if (live && g.lane == j) {
            mine.bucket = table + (u64)(t2 ? b2 : b1) * GROUP;
            mine.s = s;
            mine.ek = (hit1 || hit2 || victim) ? tk : EMPTY_KEY;
            mine.ev = (hit1 || hit2 || victim) ? tv : 0ull;
            tag_first = t2 && !hit2;  // k is about to appear in b2
        }
    }
    bool done = false;
    if (locked) {
        if (tag_first) atomicOr(tag_word(B1), mytag);
        const Cell prev = cas_cell_prev(mine.bucket + mine.s, mine.ek, mine.ev, mykey, myval);
        if (prev.key == mine.ek && prev.val == mine.ev) {
            store_stamp(mine.bucket, mine.s, clk);
            if (mine.ek == mykey) {
                my_st = ST_UPDATED;
                my_ok = 0;
            } else if (mine.ek == EMPTY_KEY) {
                my_st = ST_INSERTED;
                my_ok = 0;
            } else {
                my_st = ST_EVICTED;
                my_ok = mine.ek;
            }
            my_ov = mine.ev;
            done = true;
        }
        cas16_release(reinterpret_cast<u16*>(B1), (u16)CTL_LOCK, 0);
    }
    return done;
}

// Phase 2 of an insert-only batch, launched right after ht_insert with the same arguments: the
// operations it left (status ST_SLOW: the claim's CAS lost a race, retried through the lock-free
// group_insert_fast first; ST_FULL: absent from two full buckets, straight to the locked path,
// which evicts), one at a time per group. A kernel of its own so that ht_insert carries no
// locked-path code (with it, 80 registers: fewer resident warps to overlap its memory round
// trips). Each block takes tiles of 256 * per_thread operations (per_thread <= REST_MAX_PER_THREAD,
// chosen by the host so that small batches still get many blocks), gathers the left ones into
// shared memory and serves them densely: run over the whole batch one operation per lane, the few
// slow ones spread one or two per warp and every wave of blocks waited for them (ncu: 30 % of the
// build's time for the 6 % of its inserts that evict); a global queue filled by ht_insert cost that
// kernel a round trip per warp. Launch with blockDim.x == 256 (BLOCK), any grid size (grid-stride
// over tiles); at most 64 registers, so that 4 blocks fit on an SM (left to itself ptxas takes 80
// since the scan loads statuses in batches). No erase runs between or during the two kernels (one
// stream), so the lock-free argument holds.
#define REST_MAX_PER_THREAD 32u
// Statuses in flight at once per thread in ht_insert_rest's scan (more: ht_insert_rest needs more
// than 64 registers; with 16 and 3 blocks per SM the build was slower, 7.79 against 7.90 G/s).
#define SCAN_BATCH 8u
extern "C" __global__ void __launch_bounds__(256, 4) ht_insert_rest(Cell* table, u64 bucket_mask, const u64* keys,
                                                                 const u64* vals, u64 n, u32 clk, u32* status,
                                                                 u64* out_key, u64* out_val, u32 per_thread) {
    __shared__ u32 queue[256u * REST_MAX_PER_THREAD];  // offsets in the tile of the operations left
    __shared__ u32 count;
    Group g = make_group();
    const u32 wl = threadIdx.x & 31u;
    per_thread = per_thread < 1u ? 1u : (per_thread > REST_MAX_PER_THREAD ? REST_MAX_PER_THREAD : per_thread);
    const u64 tile = (u64)blockDim.x * per_thread;
    for (u64 t0 = (u64)blockIdx.x * tile; t0 < n; t0 += (u64)gridDim.x * tile) {
        if (threadIdx.x == 0) count = 0;
        __syncthreads();
        // The statuses are loaded SCAN_BATCH at a time, all in flight together, before any is used:
        // one load per step, each followed by its vote and shared-memory append, made the scan a
        // chain of per_thread dependent memory round trips per tile.
        for (u32 k0 = 0; k0 < per_thread; k0 += SCAN_BATCH) {
            u32 st[SCAN_BATCH];
#pragma unroll
            for (u32 i = 0; i < SCAN_BATCH; ++i) {
                const u32 off = (k0 + i) * blockDim.x + threadIdx.x;
                st[i] = (k0 + i < per_thread && t0 + off < n) ? status[t0 + off] : ST_INSERTED;
            }
#pragma unroll
            for (u32 i = 0; i < SCAN_BATCH; ++i) {
                const u32 off = (k0 + i) * blockDim.x + threadIdx.x;
                const bool left = st[i] >= ST_FULL;
                const u32 lefts = __ballot_sync(0xffffffffu, left);
                u32 base = 0;
                if (wl == 0 && lefts) base = atomicAdd(&count, (u32)__popc(lefts));
                base = __shfl_sync(0xffffffffu, base, 0);
                if (left) queue[base + __popc(lefts & ((1u << wl) - 1u))] = off;
            }
        }
        __syncthreads();
#ifdef HT_DIAG_SKIP_REST
        if (threadIdx.x == 0) count = 0;  // serve nothing
        __syncthreads();
#endif
        const u32 m = count;
        for (u32 q0 = 0; q0 < m; q0 += blockDim.x) {  // the same trip count for the whole block
            const u32 q = q0 + threadIdx.x;
            const bool valid = q < m;
            const u64 my = valid ? t0 + queue[q] : 0ull;
            const u32 st0 = valid ? status[my] : ST_INSERTED;
            const u64 mykey = valid ? keys[my] : EMPTY_KEY;
            const u64 myval = valid ? vals[my] : 0ull;
            const u64 myh = mix64(mykey);
            const u32 myb1 = (u32)(myh & bucket_mask);
            const u32 mytag = overflow_tag(myh);
            const u32 myb2 = bucket2(mykey, bucket_mask, myb1);
            const bool both_full = st0 == ST_FULL;
            // No L2 prefetch of the buckets here: prefetch.global.L2 brings the whole
            // 128-byte line, twice the bytes the eviction reads, and the build is bound by DRAM
            // traffic; without it the 0.8 build ran at 8.23 against 8.12 G inserts/s (a 64-byte
            // cp.async.bulk.prefetch.L2: 8.20).
            u32 my_st = st0;
            u64 my_ok = 0, my_ov = 0;
            const bool evicted_in_parallel = parallel_evict(g, table, valid && both_full, mykey, myval, myb1, myb2,
                                                            mytag, clk, my_st, my_ok, my_ov);
            u32 pending = gballot(g, valid && !evicted_in_parallel);
            FOR_EACH_PENDING
                u64 val = gshfl(g, myval, j);
                u64 ok = 0, ov = 0;
                u32 st = gshfl(g, (int)both_full, j) ? ST_SLOW : group_insert_fast(g, table, t, val, clk, ov);
                if (st == ST_SLOW) st = group_insert<false>(g, table, t, val, clk, ok, ov);
            KEEP_RESULT(st, ok, ov)
            if (valid) {
                status[my] = my_st;
                out_key[my] = my_ok;
                out_val[my] = my_ov;
            }
        }
        __syncthreads();  // the queue and count are reused by the next tile
    }
}

// One round of batched lookups: the group's operations in `todo` looked up in the buckets given by
// each owner's `mybucket`, all loads in flight at once (read_round), one vote each. A hit gives the
// owner ST_FOUND and the value (and, with TOUCH, lane 0 refreshes the slot's stamp); with CHECK_TAG
// (round 1, primary buckets) a miss whose key's overflow tag is set in the bucket is returned in the
// mask of operations that must read their b2; any other miss gives ST_MISS.
template <bool TOUCH, bool NC, bool CHECK_TAG>
__device__ __forceinline__ u32 find_round(const Group& g, Cell* table, u32 todo, u32 mybucket, u64 mykey, u32 mytag,
                                          u32 clk, u32& my_st, u64& my_ov) {
    Cell c[GROUP];
    read_round<NC>(g, table, todo, mybucket, c);
    u32 again = 0;
    // Every lane of the warp runs every step (warp-wide collectives, see wballot); `live` says
    // whether operation j of this lane's group is one of this round's.
#pragma unroll
    for (u32 j = 0; j < GROUP; ++j) {
        const bool live = (todo >> j) & 1u;
        const u64 key = wshfl(mykey, j);
        bool mine0 = false;
        if (CHECK_TAG) mine0 = ((u32)c[j].val & wshfl(mytag, j)) != 0;
        const u32 m = wballot(g, live && (g.lane == 0 ? mine0 : c[j].key == key));
        const u32 hit = m & SLOT_LANES;
        const u32 s = (__ffs(hit) - 1) & (GROUP - 1u);
        const u64 v = wshfl(c[j].val, s);
        if (TOUCH) {
            const u32 b = wshfl(mybucket, j);
            if (hit && g.lane == 0 && stamp_of(c[j].key, s) != (clk & 0xffffu)) store_stamp(table + (u64)b * GROUP, s, clk);
        }
        if (hit) {
            if (g.lane == j) {
                my_st = ST_FOUND;
                my_ov = v;
            }
        } else if (m & 1u) {
            again |= 1u << j;
        } else if (live && g.lane == j) {
            my_st = ST_MISS;
        }
    }
    return again;
}

// Batched lookups: round 1 reads all the group's primary buckets at once; round 2 (rare) the b2 of
// the operations whose b1 lacks the key but carries its overflow tag. One memory round trip per
// round instead of one per operation (the one-at-a-time version, still group_find for ht_mixed,
// reached 19 G/s even with the table inside L2: latency, not memory).
template <bool TOUCH, bool NC>
__device__ __forceinline__ void find_batch(Cell* table, u64 bucket_mask, const u64* keys, u64 n, u32 clk,
                                           u32* status, u64* out_val) {
    GROUP_PROLOGUE(n, false)
    u32 again = find_round<TOUCH, NC, true>(g, table, pending, myb1, mykey, mytag, clk, my_st, my_ov);
    // Round 2 when any group of the warp needs it (the whole warp takes part, see wballot).
    if (__any_sync(0xffffffffu, again != 0))
        find_round<TOUCH, NC, false>(g, table, again, myb2, mykey, mytag, clk, my_st, my_ov);
    if (active) {
        status[my] = my_st;
        out_val[my] = my_ov;
    }
    (void)my_ok;
}

extern "C" __global__ void HT_BOUNDS ht_find(Cell* table, u64 bucket_mask, const u64* keys, u64 n, u32 clk, u32 touch,
                                   u32* status, u64* out_val) {
    if (touch)
        find_batch<true, false>(table, bucket_mask, keys, n, clk, status, out_val);
    else
        find_batch<false, false>(table, bucket_mask, keys, n, clk, status, out_val);
}

extern "C" __global__ void HT_BOUNDS ht_erase(Cell* table, u64 bucket_mask, const u64* keys, u64 n, u32* status,
                                    u64* out_val) {
    GROUP_PROLOGUE(n, true)
    FOR_EACH_PENDING
        u64 v = 0;
        u32 st = group_erase(g, table, t, v);
    KEEP_RESULT(st, 0ull, v)
    if (active) {
        status[my] = my_st;
        out_val[my] = my_ov;
    }
    (void)my_ok;
}

// Interleaved finds, inserts and erases of one batch, all running concurrently. Inserts always take
// the locked path here (the lock-free fast path of ht_insert is wrong next to concurrent erases).
extern "C" __global__ void HT_BOUNDS ht_mixed(Cell* table, u64 bucket_mask, const u32* ops, const u64* keys,
                                    const u64* vals, u64 n, u32 clk, u32 touch, u32* status, u64* out_key,
                                    u64* out_val) {
    GROUP_PROLOGUE(n, true)
    u32 myop = active ? ops[my] : OP_FIND;
    u64 myval = active ? vals[my] : 0ull;
    FOR_EACH_PENDING
        u32 op = gshfl(g, myop, j);
        u64 val = gshfl(g, myval, j);
        u64 ok = 0, ov = 0;
        u32 st;
        if (op == OP_FIND) {
            st = touch ? group_find<true, false>(g, table, t, clk, ov) : group_find<false, false>(g, table, t, clk, ov);
        } else if (op == OP_INSERT) {
            st = group_insert<true>(g, table, t, val, clk, ok, ov);
        } else if (op == OP_ERASE) {
            st = group_erase(g, table, t, ov);
        } else {
            st = ST_REJECTED;
        }
    KEEP_RESULT(st, ok, ov)
    if (active) {
        status[my] = my_st;
        out_key[my] = my_ok;
        out_val[my] = my_ov;
    }
}

// ---------------------------------------------------------------- checks (tests and benchmark)

// counters[0]: keys stored twice (each extra copy counts once); counters[1]: occupied slots.
extern "C" __global__ void ht_audit(const Cell* table, u64 bucket_mask, u64 nbuckets,
                                    unsigned long long* counters) {
    u64 cell = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (cell >= nbuckets * GROUP) return;
    u32 s = (u32)(cell & (GROUP - 1u));
    if (s == 0) return;
    u64 key = table[cell].key;
    if (key == EMPTY_KEY) return;
    atomicAdd(&counters[1], 1ull);
    u64 b[2];
    bucket_pair(key, bucket_mask, b[0], b[1]);
    u64 dup = 0;
    for (int r = 0; r < 2; ++r)
        for (u32 t = 1; t < GROUP; ++t) {
            u64 other = b[r] * GROUP + t;
            if (other != cell && table[other].key == key && other < cell) dup = 1;
        }
    // A key stored outside both of its candidate buckets is as wrong as a duplicate, and so is a key in
    // its b2 whose b1 lacks its overflow tag (lookups would not find it).
    const u64 own = cell / GROUP;
    if (own != b[0] && own != b[1]) dup = 1;
    if (own == b[1] && own != b[0] && !((u32)table[b[0] * GROUP].val & overflow_tag(mix64(key)))) dup = 1;
    if (dup) atomicAdd(&counters[0], 1ull);
}

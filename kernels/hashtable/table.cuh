// hypermnf GPU hash table: 64-bit keys and values, bucketed two-choice table with LRU eviction.
// Compiled at run time with NVRTC for sm_90 (`-arch=compute_90 --device-int128`): the 128-bit
// atomicCAS that publishes a key and its value together needs sm_90 and CUDA 12.3+.
//
// The design, the layout and the argument why no key is ever stored twice are written down in
// src/hashtable/mod.rs; src/hashtable/cpu.rs is the sequential twin of every device function of the
// table and must be changed together with it.
//
// The program is three files that src/hashtable/gpu.rs (`SOURCE`) hands NVRTC as one source, in this
// order: this file (the layout, the status and operation codes, the device primitives), group_ops.cuh
// (what a group of lanes does together on one key) and batch.cu (the kernels).
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


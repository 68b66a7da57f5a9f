// hypermnf GPU hash table: the batch kernels (one operation per lane, served by its group) and the audit.
// Part of the hash-table program that src/hashtable/gpu.rs hands NVRTC as one source:
// kernels/hashtable/table.cuh, kernels/hashtable/group_ops.cuh, then this file.

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

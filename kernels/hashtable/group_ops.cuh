// hypermnf GPU hash table: the operations a group of GROUP lanes performs together on one key.
// Part of the hash-table program that src/hashtable/gpu.rs hands NVRTC as one source:
// kernels/hashtable/table.cuh, then this file, then kernels/hashtable/batch.cu.

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


//! The job cache's index: a fixed-capacity hash table from 64-bit keys (the first 8 bytes of a
//! content digest) to 64-bit values (handles), in GPU memory ([`GpuHashTable`], kernels in
//! `kernels/hashtable.cu`) with a sequential CPU twin ([`CpuHashTable`]) that follows the same
//! hashing, layout, eviction rule and results.
//!
//! # Layout
//! The table is an array of 16-byte cells, grouped into buckets of 8 cells = 128 bytes = one cache
//! line. Cell 0 of a bucket is its metadata: a `u16` control word (bit 0: insert lock, bit 1:
//! overflow) followed by seven `u16` LRU stamps, one per slot. Cells 1..=7 are slots
//! `{u64 key, u64 value}`; key 0 marks an empty slot and an empty slot is all zeros. A group of 8
//! GPU lanes reads a whole bucket in one coalesced 128-byte access, lane `j` holding cell `j`, and
//! `__ballot_sync`/`__ffs`/`__shfl_sync` pick the matching, empty or victim slot. The capacity is
//! given in cells (a power of two, at least 16); 7 of every 8 cells hold entries, so loads are
//! quoted against [`Geometry::usable_slots`].
//!
//! Why the stamps live in the bucket: the LRU stamp of a hit must be refreshed, and a stamp inside
//! the line that the lookup has just read costs a write to a line already in L2 rather than a
//! second random access (a parallel stamp array) or a CAS on the slot (stamp bits in the value,
//! which would also take bits away from the 64-bit handles). The price is one slot in eight.
//!
//! # Keys, buckets and the reserved keys
//! Keys 0 ([`EMPTY_KEY`]) and `u64::MAX` ([`RESERVED_KEY`]) are reserved and rejected at the API.
//! A key has two candidate buckets, `b1 = fmix64(k) & mask` (its *primary* bucket) and
//! `b2 = fmix64(k ^ SALT2) & mask` (`b1 ^ 1` if they coincide), so a lookup reads at most two
//! buckets at any load, and only one when the primary's overflow bit is clear.
//!
//! # Operations
//! * **find**: read b1; a hit returns its value (and, for cache lookups, refreshes the slot's stamp);
//!   a miss in b1 is final unless b1's overflow bit is set, else read b2. Finds never lock.
//! * **insert-or-assign**: take b1's insert lock (one 16-bit CAS on the control word, which also
//!   brings the bucket's line into L2), read b1 (and b2 if b1 overflowed); if the key is there, one
//!   128-bit CAS replaces its value in place. Otherwise claim: the lowest empty slot of b1; else
//!   the lowest empty slot of b2 (setting b1's overflow bit *before* the key can appear in b2); else
//!   evict the least recently used of the 14 entries (largest stamp age, ties to b1 then the lower
//!   slot), again setting the overflow bit first if the victim lies in b2. Every claim is one 128-bit
//!   CAS that publishes key and value together, from the exact old slot contents, so a slot changed
//!   by anyone in between makes it fail and re-read. Release the lock. Taking the lock first, rather
//!   than after a lock-free check, saves two dependent L2 round trips on the common path of a
//!   cache (insert after a miss); finds and erases never lock. This is the path of every insert in
//!   a mixed batch (`ht_mixed`, which the host API's `insert`/`insert_batch` use).
//! * **insert-only batches** (`ht_insert`: the benchmark, [`GpuHashTable::insert_only_batch`]) first
//!   try a lock-free fast path: read b1 (and b2 if b1's overflow bit is set); a present key gets
//!   the in-place CAS update; else, if b1 has an empty slot, one 128-bit CAS claims the *lowest*
//!   empty slot of b1 (re-read and retry on failure, bounded; a claim that finds the key already
//!   there becomes an update). Only an absent key whose b1 is full falls back to the locked path
//!   above (which then claims in b2 or evicts). One dependent atomic instead of three, correct
//!   only because no erase runs during the kernel (see below). Sequentially it does exactly what
//!   the locked path does, so the CPU twin is the same for both.
//! * **erase**: find the key and CAS its slot back to all zeros. No tombstones: an erased slot is
//!   plain empty and reusable at once. The overflow bit is sticky (cleared only by `clear`), which
//!   keeps lookups correct after erases at the price of a second bucket read.
//! * **overflow tags** (session 3): next to the overflow bit, the control word's bits 2..15 hold
//!   one tag per overflowed key ([`overflow_tag`]: a bit chosen by the key's hash), set together with
//!   the overflow bit before the key can appear in b2. Every lookup, erase and insert that misses in
//!   b1 reads b2 only when the key's own tag is set, so a miss in an overflowed bucket rarely costs a
//!   second read. Sticky like the bit; the audits check that every key in its b2 has its tag in b1.
//!
//! Why primary-first rather than "the emptier of the two" (power of two choices): with the
//! overflow bit, primary-first lets most lookups — hits *and* misses — read a single 128-byte
//! bucket up to high loads, which the goal of fast misses needs (a miss that must read two
//! buckets can reach at most half the device's random 128-byte read rate). The price is a less
//! even fill: pairs fill up earlier, so the table starts evicting at lower loads (measured on an
//! H100: about 2 % of inserts evict while building to load 0.8, 6 % to 0.95). For a cache that
//! evicts anyway this was judged the better side of the trade.
//!
//! The kernels serve operations warp-cooperatively: each lane loads its own operation, prefetches
//! its primary bucket into L2 (so a group's 8 operations overlap their DRAM latency), and the
//! group of 8 lanes then serves the pending lanes one after the other, `__shfl_sync` broadcasting
//! each key. The lock uses 16-bit `atom.acquire`/`atom.release` CASes, never a `fence.sc`.
//!
//! # Measured (H100 80GB HBM3, `hypermnf bench hashtable`, 2^28 cells = 4 GiB, batches of 64 M)
//! Device ceilings measured by the program: random 128-bit CAS 12.3 G/s, random 64-byte reads
//! 31.8 G/s, random 128-byte reads 22.0 G/s. At load 0.8: 3.7 G inserts/s, 14.7 G finds/s with
//! hits, 13.3 G/s with misses (goals 10 / 20 / 15 not met); at 0.95: 3.4 / 13.6 / 11.8, where the
//! linear-probing reference collapses to 0.27 G misses/s. The finds run at the same ~14 G/s when the
//! table fits in L2 (2^21 cells), so they are bound by instructions per operation (8 lanes per
//! lookup, each recomputing both hashes and broadcasting 64-bit words as two shuffles), not by
//! memory; inserts are bound by their chain of dependent L2 round trips (lock, read, CAS). Since
//! then every lane hashes its own key once in the kernel prologue and the group broadcasts 32-bit
//! bucket indices (b2 only on demand), finds are specialised on `touch` at compile time and read
//! the overflow bit and the hits in one vote, reserved keys are answered in the prologue, and
//! `ht_insert` has the lock-free fast path with pipelined claims (every lane's CAS in flight at
//! once), and misses consult per-key overflow tags. Measured after (session 3, same device), at load
//! 0.8: 16.8 G finds/s with hits (goal 20, not met), 16.2 with misses (goal 15, met), 5.8 G
//! inserts/s (goal 10, not met). The benchmark also prints rows of find variants (non-coherent
//! loads; one lane per lookup): neither is faster than `ht_find`.
//!
//! Every loop is bounded (64 attempts, 2^20 lock spins); an operation that runs out reports
//! [`InsertOutcome::Failed`] / [`EraseOutcome::Failed`] instead of spinning for ever.
//!
//! # Why a key is never stored twice
//! First for kernels whose inserts all take the lock (`ht_mixed`, any mix of concurrent finds,
//! inserts and erases); the insert-only fast path follows.
//!
//! 1. A slot for key `k` is claimed only by an insert that holds the lock of `b1(k)` and has read
//!    both candidate buckets *after* taking it. All inserts of `k` take the same lock, so no other
//!    insert of `k` is between its check and its claim.
//! 2. Nothing else creates a copy of `k`: erases and evictions only remove keys, and entries never
//!    move.
//! 3. The check under the lock sees every stored copy of `k`: a copy in b1 is read directly; a copy
//!    in b2 was placed there only after its inserter set b1's overflow bit (under the same lock,
//!    followed by a fence), so the check reads b2 whenever such a copy can exist.
//! 4. The claim CAS expects the exact contents it read (empty, or the victim's key and value), so a
//!    slot taken or changed in between (by an insert of another key, an erase, an eviction) makes it
//!    fail, and the insert reads again, still under the lock.
//!
//! Hence at most one slot holds `k` at any moment, whatever mixes of concurrent inserts, erases and
//! evictions run. The `ht_audit` kernel counts duplicates (and keys outside both of their buckets)
//! after every GPU test and benchmark run.
//!
//! ## The lock-free fast path of `ht_insert`
//! Every kernel of a table is launched on the one stream of its [`gpu::Device`]
//! (`ctx.default_stream()`; the methods of [`GpuHashTable`], its `audit`/`clear`, and the
//! benchmark all use `dev.stream`), so kernels on a table run one after the other, each seeing all
//! writes of the ones before; `ht_insert` itself contains no erase. So during an `ht_insert`
//! kernel only inserts (fast path, and the locked path as fallback) touch the table, and:
//!
//! * **F1.** No slot becomes empty: updates keep the key, evictions put the new key in place of
//!   the victim, claims only fill empty slots. Each slot's history within the kernel is: empty (or
//!   not) at the start, then, from its first write on, full for the rest of the kernel.
//! * **F2.** A successful claim of an empty slot, by either path, in any bucket, takes the lowest
//!   empty slot of that bucket at that moment: the group chose the lowest slot it saw empty, every
//!   slot below it was seen full and stays full (F1), and the CAS succeeded because it was empty.
//!
//! For a key `k` with primary bucket `B`:
//! 5. Two claims of `k` into empty slots `p < q` of `B` never leave two copies: the claimer of `q`
//!    read `p` full (else it would have chosen `p`). `p` was empty until the other claim's CAS
//!    (F1), so that read returned `k` — then it would have updated instead of claiming — or a later
//!    value, i.e. `k` had already been evicted from `p`. Two claims of the same slot: the second CAS
//!    fails, returns `k`, and becomes an update of that entry.
//! 6. The locked path puts `k` anywhere else (into b2, or over an evicted victim) only after reading
//!    all seven slots of `B` full and without `k`, holding `B`'s lock. A fast claim of `k` into slot
//!    `p` of `B` is either before that read of `p` in `p`'s history (the read then sees `k`, or `k`
//!    was evicted before it) or after it (then `p` is full and the claim's CAS fails). Copies made
//!    under the lock by earlier holders are seen through the lock (point 3).
//! 7. A copy of `k` in b2 from an earlier kernel is found: `B`'s overflow bit was set before that
//!    copy was published and is sticky, so the fast path, missing in `B`, reads b2 and updates it
//!    there. A copy put into b2 during this kernel needed `B` full (point 6), and a full `B` takes
//!    no fast claim, so the fast path re-reads and falls back to the locked path, which finds it.
//!
//! Points 5-7 reason about one slot at a time (its history and per-location coherence), never
//! about a snapshot of a bucket: the 8 lanes' 16-byte loads are each single-copy atomic, but they
//! are 8 loads at different instants. Stamps are plain 16-bit stores next to the control word;
//! they steer which victim an eviction picks and never which slot a claim takes, and the fast
//! path never writes the control word (so the lock holder's CAS that sets the overflow bit still
//! succeeds). Why `ht_mixed` keeps the lock for every insert: with a concurrent erase F1 fails. An
//! insert X of `k` sees slot 1 of `B` full (key `a`) and slot 2 empty; `a` is erased; an insert Y of
//! `k` now sees slot 1 empty and claims it; X claims slot 2: two copies.
//!
//! Finds are lock-free and linearizable per key: a hit reads one slot atomically (16-byte
//! single-copy-atomic load, key and value from the same CAS); a miss read b1's overflow bit clear, or
//! read both buckets, at instants where the key was absent from what it read.
//!
//! # GPU and CPU twin
//! For sequential operation sequences (one operation per batch, as the cache's single-key host API
//! issues them) the GPU table and the twin give identical results and identical cell contents;
//! `tests/gpu_hashtable` compares them. Within one concurrent batch these may differ: which empty
//! slot each new key takes (so later evictions may pick other victims), which of several inserts of
//! one key writes its value last, whether a find concurrent with an insert/erase of the same key
//! sees it, and the order in which two inserts compete for the last free slot of a bucket pair
//! (one may evict where the sequential order would not). Never different: no duplicates, no loss of
//! a key that was not reported evicted or erased, and values are always ones that were written.
//!
//! The LRU clock is a per-batch counter kept by the host (`u32`, stamps keep its low 16 bits); ages
//! are taken modulo 2^16, so an entry untouched for more than 65 535 batches can look young again.
//! That approximation only affects which entry a cache evicts, never correctness.

pub mod cpu;
pub mod gpu;

pub use cpu::CpuHashTable;
pub use gpu::GpuHashTable;

/// The key that marks an empty slot; rejected as a key.
pub const EMPTY_KEY: u64 = 0;
/// Reserved for future markers; rejected as a key.
pub const RESERVED_KEY: u64 = u64::MAX;
/// Cells per bucket (cell 0 is metadata).
pub const BUCKET_CELLS: usize = 8;
/// Entry slots per bucket.
pub const SLOTS_PER_BUCKET: usize = 7;
/// Control bits of a bucket's metadata.
pub const CTL_LOCK: u16 = 1;
pub const CTL_OVERFLOW: u16 = 2;
/// Salt of the second hash function.
pub const SALT2: u64 = 0x9e37_79b9_7f4a_7c15;
/// Largest table accepted, in cells (2^32 cells = 64 GiB).
pub const MAX_CELLS: u64 = 1 << 32;

/// Device status codes (kernels/hashtable.cu `ST_*`).
pub(crate) mod status {
    pub const MISS: u32 = 0;
    pub const FOUND: u32 = 1;
    pub const INSERTED: u32 = 2;
    pub const UPDATED: u32 = 3;
    pub const EVICTED: u32 = 4;
    pub const ERASED: u32 = 5;
    pub const FAILED: u32 = 6;
    pub const REJECTED: u32 = 7;
}

/// Errors of the hash tables.
#[derive(Debug, thiserror::Error)]
pub enum HashTableError {
    #[error("capacity must be a power of two between 16 and 2^32 cells, got {0}")]
    BadCapacity(u64),
    #[error("key {key:#x} at position {index} is reserved (0 and u64::MAX cannot be stored)")]
    ReservedKey { index: usize, key: u64 },
    #[error("keys and values differ in length ({keys} keys, {values} values)")]
    LengthMismatch { keys: usize, values: usize },
    #[error("no usable CUDA device: {0}")]
    NoDevice(String),
    #[error("the device has compute capability {0}.{1}; the table needs 9.0 or newer (128-bit atomicCAS)")]
    OldDevice(i32, i32),
    #[error("the table needs {need} bytes of device memory, {free} are free")]
    OutOfDeviceMemory { need: u64, free: u64 },
    #[error("compiling kernels/hashtable.cu with NVRTC failed: {0}")]
    Compile(String),
    #[error("CUDA driver error: {0}")]
    Driver(String),
    #[error("device reported an unknown status {0}")]
    BadStatus(u32),
}

/// What an insert-or-assign did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InsertOutcome {
    /// The key was absent and took a free slot.
    Inserted,
    /// The key was present; its value was replaced.
    Updated { old: u64 },
    /// The key was absent, both buckets were full, and this least-recently-used entry was evicted.
    Evicted { key: u64, value: u64 },
    /// The operation ran out of attempts under contention (never in sequential use).
    Failed,
}

/// What an erase did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EraseOutcome {
    Erased {
        value: u64,
    },
    Missing,
    /// The operation ran out of attempts under contention (never in sequential use).
    Failed,
}

impl EraseOutcome {
    pub fn is_erased(&self) -> bool {
        matches!(self, EraseOutcome::Erased { .. })
    }
}

/// One operation of a mixed batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Find(u64),
    Insert(u64, u64),
    Erase(u64),
}

impl Op {
    pub fn key(&self) -> u64 {
        match *self {
            Op::Find(k) | Op::Insert(k, _) | Op::Erase(k) => k,
        }
    }
}

/// The result of one operation of a mixed batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpResult {
    Find(Option<u64>),
    Insert(InsertOutcome),
    Erase(EraseOutcome),
}

/// Table geometry shared by both twins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    cells: u64,
}

impl Geometry {
    /// `cells`: capacity in 16-byte cells, a power of two in 16..=2^32.
    pub fn new(cells: u64) -> Result<Self, HashTableError> {
        if !cells.is_power_of_two() || !(16..=MAX_CELLS).contains(&cells) {
            return Err(HashTableError::BadCapacity(cells));
        }
        Ok(Self { cells })
    }
    pub fn cells(&self) -> u64 {
        self.cells
    }
    pub fn buckets(&self) -> u64 {
        self.cells / BUCKET_CELLS as u64
    }
    pub fn bucket_mask(&self) -> u64 {
        self.buckets() - 1
    }
    /// Slots that can hold entries (7 of every 8 cells).
    pub fn usable_slots(&self) -> u64 {
        self.buckets() * SLOTS_PER_BUCKET as u64
    }
    pub fn bytes(&self) -> u64 {
        self.cells * 16
    }
    /// The two candidate buckets of `key` (primary first).
    pub fn bucket_pair(&self, key: u64) -> (u64, u64) {
        bucket_pair(key, self.bucket_mask())
    }
}

/// MurmurHash3's 64-bit finaliser (a bijection).
#[inline]
pub fn fmix64(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^= x >> 33;
    x
}

/// Same as the kernels' `bucket_pair`.
#[inline]
pub fn bucket_pair(key: u64, bucket_mask: u64) -> (u64, u64) {
    let b1 = fmix64(key) & bucket_mask;
    let mut b2 = fmix64(key ^ SALT2) & bucket_mask;
    if b2 == b1 {
        b2 = b1 ^ 1;
    }
    (b1, b2)
}

/// The overflow tag of a key: one of the control word's bits 2..15, from bits 48.. of `fmix64(key)`
/// (bucket indices use at most the low 29). Before a key is placed in its b2, b1's control word gets
/// [`CTL_OVERFLOW`] and this tag; a lookup that misses in b1 reads b2 only when its tag is set there.
/// kernels/hashtable.cu `overflow_tag` is the same function.
#[inline]
pub fn overflow_tag(key: u64) -> u16 {
    1u16 << (2 + ((fmix64(key) >> 48) % 14) as u16)
}

/// Checks a batch of inserts: as many values as keys, and no reserved key.
pub fn check_insert_batch(keys: &[u64], values: &[u64]) -> Result<(), HashTableError> {
    if keys.len() != values.len() {
        return Err(HashTableError::LengthMismatch {
            keys: keys.len(),
            values: values.len(),
        });
    }
    keys.iter()
        .enumerate()
        .try_for_each(|(i, &k)| check_key(i, k))
}

/// Rejects the reserved keys.
pub fn check_key(index: usize, key: u64) -> Result<(), HashTableError> {
    if key == EMPTY_KEY || key == RESERVED_KEY {
        Err(HashTableError::ReservedKey { index, key })
    } else {
        Ok(())
    }
}

/// The key of a 32-byte digest: its first 8 bytes, little-endian; a digest whose prefix is a
/// reserved key is mapped to a fixed other key (the cache compares full digests on every hit).
pub fn digest_key(digest: &[u8; 32]) -> u64 {
    let k = u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"));
    match k {
        EMPTY_KEY => 1,
        RESERVED_KEY => RESERVED_KEY - 1,
        k => k,
    }
}

/// Checks a table dump (cells as `[key, value]`) for keys stored twice, outside both of their
/// candidate buckets, or in their b2 without their overflow tag in b1; returns (problems, occupied
/// slots). Used by tests of both twins.
pub fn audit_cells(geometry: Geometry, cells: &[[u64; 2]]) -> (u64, u64) {
    let mut seen = std::collections::HashSet::new();
    let (mut bad, mut occupied) = (0, 0);
    for (i, c) in cells.iter().enumerate() {
        if i % BUCKET_CELLS == 0 || c[0] == EMPTY_KEY {
            continue;
        }
        occupied += 1;
        let (b1, b2) = geometry.bucket_pair(c[0]);
        let b = (i / BUCKET_CELLS) as u64;
        // A key in its b2 whose b1 lacks its overflow tag would be invisible to lookups.
        let untagged = b == b2 && b != b1 && cells[b1 as usize * BUCKET_CELLS][0] as u16 & overflow_tag(c[0]) == 0;
        if !seen.insert(c[0]) || (b != b1 && b != b2) || untagged {
            bad += 1;
        }
    }
    (bad, occupied)
}

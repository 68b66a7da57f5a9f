//! The job cache's index: a fixed-capacity hash table from 64-bit keys (the first 8 bytes of a
//! content digest) to 64-bit values (handles), in GPU memory ([`GpuHashTable`], kernels in
//! `kernels/hashtable/`) with a sequential CPU twin ([`CpuHashTable`]) that follows the same
//! hashing, layout, eviction rule and results.
//!
//! # Layout
//! The table is an array of 16-byte cells, grouped into buckets of 4 cells = 64 bytes = half a
//! cache line. Cell 0 of a bucket is its metadata: a `u16` control word (bit 0: the insert lock)
//! and three `u16` LRU stamps, one per slot, then a `u32` word of overflow tags (see below) and
//! four zero bytes. Cells 1..=3 are slots `{u64 key, u64 value}`; key 0 marks an empty slot and an
//! empty slot is all zeros. A group of 4 GPU lanes reads a whole bucket in one coalesced 64-byte
//! access, lane `j` holding cell `j`, and `__ballot_sync`/`__ffs`/`__shfl_sync` pick the matching,
//! empty or victim slot. The capacity is given in cells (a power of two, at least 8 = two
//! buckets); 3 of every 4 cells hold entries, so loads are quoted against
//! [`Geometry::usable_slots`].
//!
//! Why 64-byte buckets (the first version had 128-byte buckets of 7 slots): on the H100 a
//! random 64-byte read runs at 31.8 G/s over a 4 GiB table, a random 128-byte read at 22.0 G/s, and
//! a lookup is one such read (two for the few keys that live in their second bucket). With 128-byte
//! buckets the goal of 20 G hits/s needed 91 % of the line-read ceiling before counting the keys,
//! results and second-bucket reads that share the same memory; with 64-byte buckets it needs about
//! 70 %. The price: a quarter of the memory is metadata instead of an eighth, and smaller buckets
//! overflow sooner (at load 0.8 about 13 % of the keys live in their b2 and 6 % of the inserts
//! that build the table evict, against 7 % and 2 % with 7 slots).
//!
//! Why the stamps live in the bucket: the LRU stamp of a hit must be refreshed, and a stamp inside
//! the line that the lookup has just read costs a write to a line already in L2 rather than a
//! second random access (a parallel stamp array) or a CAS on the slot (stamp bits in the value,
//! which would also take bits away from the 64-bit handles). The price is one slot in four.
//!
//! # Keys, buckets, overflow tags and the reserved keys
//! Keys 0 ([`EMPTY_KEY`]) and `u64::MAX` ([`RESERVED_KEY`]) are reserved and rejected at the API.
//! A key has two candidate buckets, `b1 = fmix64(k) & mask` (its *primary* bucket) and
//! `b2 = fmix64(k ^ SALT2) & mask` (`b1 ^ 1` if they coincide), so a lookup reads at most two
//! buckets at any load. Before a key is placed in its b2, its *overflow tag* ([`overflow_tag`],
//! one of 32 bits chosen by its hash) is set in b1's tag word; a lookup, erase or insert that
//! misses in b1 reads b2 only when the key's own tag is set there, so most misses cost one read
//! even in buckets that overflowed. Tags are only ever set (an `atomicOr`) and cleared by `clear`
//! alone: an evicted or erased key's tag stays, which costs a wasted read, never a missed key. The
//! audits (CPU [`audit_cells`], GPU `ht_audit`) check that every key in its b2 has its tag in b1.
//! The tag word is kept apart from the lock word so that setting a tag never races the lock's
//! 16-bit CASes (an earlier version kept 14 tags in the control word, which the lock-free b2 claims
//! below would have had to CAS around the lock).
//!
//! # Operations
//! * **find**: read b1; a hit returns its value (and, for cache lookups, refreshes the slot's
//!   stamp); a miss in b1 is final unless the key's tag is set in b1, else read b2. Finds never
//!   lock.
//! * **insert-or-assign, locked** (`group_insert`; every insert of a mixed batch, `ht_mixed`, which
//!   the host API's `insert`/`insert_batch` use): take b1's insert lock (one 16-bit CAS on the
//!   control word), read b1, and read b2 if the key's tag is set or b1 is full; if the key is
//!   there, one 128-bit CAS replaces its value in place. Otherwise claim: the lowest empty slot of
//!   b1; else the lowest empty slot of b2 (setting the key's tag in b1 *before*, and in `ht_mixed`
//!   fencing, so that no concurrent find can see the key in b2 without its tag); else evict the
//!   least recently used of the 6 entries (largest stamp age, ties to b1 then the lower slot),
//!   again setting the tag first if the victim lies in b2. Every claim is one 128-bit CAS that
//!   publishes key and value together, from the exact old slot contents, so a slot changed by
//!   anyone in between makes it fail and re-read. Release the lock.
//! * **insert-only batches** ([`GpuHashTable::insert_only_batch`], the benchmark) are two kernels
//!   on the table's stream. `ht_insert` does every insert that needs no lock: read b1 (and b2 when
//!   the key's tag is set in b1 or b1 is full); a present key gets the in-place CAS update; an
//!   absent key claims the *lowest* empty slot of b1, or, when b1 is full, sets its tag and claims
//!   the lowest empty slot of b2, each with one 128-bit CAS. What it cannot do (both buckets full:
//!   an eviction; or its CAS lost a race) it marks in the operation's status, and `ht_insert_rest`
//!   gathers those, tile by tile, into shared memory and does them densely, one at a time per
//!   group: a lost race retries lock-free once more, an eviction takes the lock (`parallel_evict`
//!   tries the locks of all of a warp's evictions at once, without spinning, and serves the holders
//!   together; the others take the locked path one at a time). Correct
//!   only because no erase runs during these kernels (see below). Sequentially they do exactly
//!   what the locked path does, so the CPU twin is the same for both.
//! * **erase**: find the key and CAS its slot back to all zeros. No tombstones: an erased slot is
//!   plain empty and reusable at once.
//!
//! Why primary-first rather than "the emptier of the two" (power of two choices): with the tags,
//! primary-first lets most lookups — hits *and* misses — read a single bucket up to high loads,
//! which the goal of fast misses needs (a miss that must read two buckets can reach at most half
//! the device's random read rate). The price is a less even fill: pairs fill up earlier, so the
//! table starts evicting at lower loads (with 7-slot buckets about 2 % of inserts evicted while
//! building to load 0.8; with 3-slot buckets about 6 %). For a cache that evicts anyway this was
//! judged the better side of the trade.
//!
//! The kernels serve operations warp-cooperatively: each lane loads its own operation and hashes
//! it once; the group of 4 lanes then serves its lanes' operations, `__shfl_sync` broadcasting each
//! key. Finds and the claims of `ht_insert` do so in rounds: every lane loads its cell of all the
//! group's buckets at once (4 independent loads in flight), then the group votes on each, so the
//! group pays one memory round trip per round rather than one per operation; the whole warp runs
//! the rounds together, with warp-wide votes and shuffles, because with a group's mask in code whose
//! branches differ between groups the compiler wraps every shuffle in a slow fallback for diverged
//! warps. The kernels that serve one operation after the other (erase, mixed) prefetch each lane's
//! primary bucket into L2 first; `ht_insert_rest` does not, since the insert build is bound by DRAM
//! traffic and a prefetch brings a whole 128-byte line (BENCHMARKS.md, GPU hash table). The lock uses 16-bit
//! `atom.acquire`/`atom.release` CASes, never a `fence.sc`.
//!
//! Every loop is bounded (64 attempts, 2^20 lock spins); an operation that runs out reports
//! [`InsertOutcome::Failed`] / [`EraseOutcome::Failed`] instead of spinning for ever.
//!
//! Measured speeds are in BENCHMARKS.md (at load 0.8 on 2^28 cells, 22.9 G finds/s with
//! hits, 25.5 G/s with misses, 8.2 G inserts/s on the H100, where the DRAM traffic of an insert
//! bounds the build at about 8.7 G/s).
//!
//! # Why a key is never stored twice
//! First for kernels whose inserts all take the lock (`ht_mixed`, any mix of concurrent finds,
//! inserts and erases); the insert-only kernels follow.
//!
//! 1. A slot for key `k` is filled (claim or eviction) only by an insert that holds the lock of
//!    `b1(k)` and has read the buckets *after* taking it (in `group_insert` lane 0 takes the lock and
//!    a `__syncwarp` orders the group's reads after it; in `parallel_evict` each owner lane takes
//!    its own, then the warp's `__syncwarp`). All inserts of `k` take the same lock, so no other
//!    insert of `k` is between its check and its claim.
//! 2. Nothing else creates a copy of `k`: erases and evictions only remove keys, and entries never
//!    move.
//! 3. The check under the lock sees every stored copy of `k`: a copy in b1 is read directly; a copy
//!    in b2 was placed there only after its inserter set `k`'s tag in b1 (under the same lock,
//!    followed by a fence), so the check reads b2 whenever such a copy can exist.
//! 4. The claim CAS expects the exact contents it read (empty, or the victim's key and value), so a
//!    slot taken or changed in between (by an insert of another key, an erase, an eviction) makes it
//!    fail, and the insert reads again, still under the lock.
//!
//! Hence at most one slot holds `k` at any moment, whatever mixes of concurrent inserts, erases and
//! evictions run. The `ht_audit` kernel counts duplicates (and keys outside both of their buckets,
//! or in their b2 without their tag) after every GPU test and benchmark run.
//!
//! ## The lock-free paths of `ht_insert` and `ht_insert_rest`
//! Every kernel of a table is launched on the one stream of its [`gpu::Device`]
//! (`ctx.default_stream()`; the methods of [`GpuHashTable`], its `audit`/`clear`, and the
//! benchmark all use `dev.stream`), so kernels on a table run one after the other, each seeing all
//! writes of the ones before; neither insert-only kernel contains an erase or a find. So during
//! either kernel only inserts (lock-free claims and updates, and the locked path) touch the table,
//! and:
//!
//! * **F1.** No slot becomes empty: updates keep the key, evictions put the new key in place of
//!   the victim, claims only fill empty slots. Each slot's history within the kernel is: empty (or
//!   not) at the start, then, from its first write on, full for the rest of the kernel.
//! * **F2.** A successful claim of an empty slot, by any path, in any bucket, takes the lowest
//!   empty slot of that bucket at that moment: the claimer chose the lowest slot it saw empty, every
//!   slot below it was seen full and stays full (F1), and the CAS succeeded because it was empty.
//! * **F3.** Every placement of `k` outside an empty slot of its b1 `B` — a claim in b2 or an
//!   eviction, lock-free or locked — comes after a read of `B` that found every slot full and none
//!   holding `k`, and every eviction also after a read of b2 that found it full without `k` (the
//!   locked path reads b2 whenever `B` is full).
//!
//! For a key `k` with primary bucket `B` and second bucket `B2`:
//! 5. Two claims of `k` into empty slots `p < q` of one bucket never leave two copies: the claimer
//!    of `q` read `p` full (else it would have chosen `p`). `p` was empty until the other claim's
//!    CAS (F1), so that read returned `k` — then it would have updated instead of claiming — or a
//!    later value, i.e. `k` had already been evicted from `p`. Two claims of the same slot: the
//!    second CAS fails and the claimer reads again (or, seeing `k`, updates).
//! 6. A claim of `k` into an empty slot `p` of `B` and a placement of `k` elsewhere never leave two
//!    copies: by F3 the placement read `p` full and without `k`. If the claim's CAS came before that
//!    read, the read would have seen `k` (or `k` had been evicted from `p` since); if after, `p` was
//!    already full (F1) and the claim's CAS fails.
//! 7. A claim of `k` into an empty slot `p` of `B2` and an eviction placing `k`: the eviction read
//!    `B2` full without `k` (F3), so by the same argument as 6 the claim's CAS cannot succeed after
//!    that read and, before it, would have been seen. Two evictions of `k` are serialized by `B`'s
//!    lock, and the second reads both buckets after the first's release (point 3, tags aside: `B` is
//!    full, so it reads `B2`).
//! 8. A copy of `k` in `B2` from an earlier kernel is found: its tag in `B` was set before that
//!    kernel ended, so every read that misses in `B` goes on to `B2` and updates it there. Inside
//!    the insert-only kernels the tag needs no ordering against the claim (it is a fire-and-forget
//!    `atomicOr` in `ht_insert` and unfenced in `ht_insert_rest`): by F3 a copy can enter `B2` only
//!    while `B` is full, and a full `B` sends every reader to `B2` whatever the tags say.
//!
//! Points 5-8 reason about one slot at a time (its history and per-location coherence), never
//! about a snapshot of a bucket: the 4 lanes' 16-byte loads are each single-copy atomic, but they
//! are 4 loads at different instants. Stamps are plain 16-bit stores next to the control word;
//! they steer which victim an eviction picks and never which slot a claim takes. Why `ht_mixed`
//! keeps the lock for every insert: with a concurrent erase F1 fails. An insert X of `k` sees slot
//! 1 of `B` full (key `a`) and slot 2 empty; `a` is erased; an insert Y of `k` now sees slot 1
//! empty and claims it; X claims slot 2: two copies.
//!
//! Finds are lock-free and linearizable per key: a hit reads one slot atomically (16-byte
//! single-copy-atomic load, key and value from the same CAS); a miss read `B` without the key's
//! tag, or read both buckets, at instants where the key was absent from what it read.
//!
//! # GPU and CPU twin
//! For sequential operation sequences (one operation per batch, as the cache's single-key host API
//! issues them) the GPU table and the twin give identical results and identical cell contents;
//! `tests/gpu_hashtable.rs` compares them. Within one concurrent batch these may differ: which empty
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
/// Cells per bucket (cell 0 is metadata): 64 bytes. kernels/hashtable/table.cuh `GROUP` is the same number.
pub const BUCKET_CELLS: usize = 4;
/// Entry slots per bucket.
pub const SLOTS_PER_BUCKET: usize = BUCKET_CELLS - 1;
/// Smallest table accepted, in cells: two buckets (a key's two candidate buckets must differ).
pub const MIN_CELLS: u64 = 2 * BUCKET_CELLS as u64;
/// The lock bit of a bucket's control word.
pub const CTL_LOCK: u16 = 1;
/// Salt of the second hash function.
pub const SALT2: u64 = 0x9e37_79b9_7f4a_7c15;
/// Largest table accepted, in cells (2^32 cells = 64 GiB).
pub const MAX_CELLS: u64 = 1 << 32;

/// Device status codes (kernels/hashtable/table.cuh `ST_*`).
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
    #[error("capacity must be a power of two between 8 and 2^32 cells, got {0}")]
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
    #[error("compiling the hash-table kernels (kernels/hashtable/ or a design compared with it) with NVRTC failed: {0}")]
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
    /// `cells`: capacity in 16-byte cells, a power of two in 8..=2^32.
    pub fn new(cells: u64) -> Result<Self, HashTableError> {
        if !cells.is_power_of_two() || !(MIN_CELLS..=MAX_CELLS).contains(&cells) {
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
    /// Slots that can hold entries (3 of every 4 cells).
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

/// The overflow tag of a key: one of the 32 bits of a bucket's tag word, from bits 48..53 of
/// `fmix64(key)` (bucket indices use at most the low 30). Before a key is placed in its b2, b1's tag
/// word gets this tag; a lookup that misses in b1 reads b2 only when its tag is set there.
/// kernels/hashtable/table.cuh `overflow_tag` is the same function.
#[inline]
pub fn overflow_tag(key: u64) -> u32 {
    1u32 << ((fmix64(key) >> 48) & 31)
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
        let untagged = b == b2 && b != b1 && cells[b1 as usize * BUCKET_CELLS][1] as u32 & overflow_tag(c[0]) == 0;
        if !seen.insert(c[0]) || (b != b1 && b != b2) || untagged {
            bad += 1;
        }
    }
    (bad, occupied)
}

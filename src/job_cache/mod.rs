//! The job cache: finished results and eigen systems found again by content digest, plus the
//! device-resident items kept in GPU memory under a byte budget.
//!
//! # Levels
//! * [`Level::Result`]: digest of (decoded cube, all parameters) → handle of a finished job; a
//!   repeated request is answered at once.
//! * [`Level::Statistics`]: digest of (decoded cube, noise estimator, bands, mask, window) → handle of
//!   a stored eigen system (means, transform, eigenvalues); a request that changes only
//!   `components`, `snr`, `inverse` or the output format runs only the projection.
//!
//! Each level's index is a [`crate::hashtable`] table keyed by the digest's first 8 bytes
//! ([`digest_key`]), on the GPU when one is usable and otherwise on the CPU twin (same results;
//! [`JobCache::index_backend`] says which and why). Handles are the caller's `u64` ids (job row
//! ids, say); the host-side store beside each index keeps the **full 32-byte digest** of every
//! handle, and every hit compares it, so a 64-bit key collision is a miss (counted in
//! `collisions`), never someone else's result. When both candidate buckets of a key are full the
//! index evicts its least recently used entry; [`JobCache::insert`] returns the evicted handles so
//! that the caller may drop what they point to.
//!
//! # Device-resident items
//! [`DeviceLevel`] keeps the most recent prepared cubes ([`ResidentCube`]: a backend's prepared cube
//! that owns its cube and backend, with the eigen systems recently used with it) resident in GPU
//! memory under a byte budget (`--gpu-cache-bytes`), over a [`DeviceLru`]: each item is stored with
//! its size in bytes, a hit refreshes it, and putting an item evicts the least recently used ones
//! until the total fits the budget; items larger than the whole budget are refused. Eviction frees
//! the device memory, and a job that needs memory evicts first ([`DeviceLevel::make_room`]).
//! [`DeviceLru`] is generic over the item type (`Arc<T>`: an item stays alive while a request still
//! uses it after eviction).
//!
//! # Keys and stored systems
//! [`keys`] computes the SHA-256 keys of the three levels (what each depends on, and nothing else);
//! [`eigen_file`] is the versioned, checksummed, bit-exact stored form of an eigen system.
//!
//! # Start-up and metrics
//! [`JobCache::rebuild`] fills the indexes from the job rows, `(level, digest, handle)`, at start.
//! [`JobCache::stats`] returns hits, misses, evictions, collisions and entries per level (and
//! bytes for the device level), serialisable for `/metrics`.
//!
//! # Use from the service
//! `JobCache` and `DeviceLru` take `&mut self`; the service (`jobs::service_cache::ServiceCache`)
//! wraps each in a `Mutex` (lookups are single-key and short: one kernel launch on the GPU index, a
//! few hundred nanoseconds on the CPU).
//! ```no_run
//! use hypermnf::job_cache::{CacheConfig, JobCache, Level};
//! let mut cache = JobCache::new(&CacheConfig::default()).unwrap();
//! let digest = [7u8; 32];
//! if cache.lookup(Level::Statistics, &digest).unwrap().is_none() {
//!     // ... compute, store the eigen system under handle 42 ...
//!     let evicted = cache.insert(Level::Statistics, &digest, 42).unwrap();
//!     # let _ = evicted;
//! }
//! ```

mod device_level;
mod device_lru;
pub mod eigen_file;
pub mod keys;
mod resident_cube;

pub use device_level::{resident_need, DeviceLevel};
pub use device_lru::{DeviceLru, DeviceLruStats};
pub use resident_cube::{ResidentCube, SystemRecord};

use std::collections::HashMap;

use crate::hashtable::{
    digest_key, CpuHashTable, EraseOutcome, GpuHashTable, HashTableError, InsertOutcome,
};

/// A 32-byte content digest (SHA-256).
pub type Digest = [u8; 32];
/// The caller's id of a cached item.
pub type Handle = u64;

/// Errors of the cache.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("cache index: {0}")]
    Index(#[from] HashTableError),
    #[error("handle {handle} already belongs to another digest at the {level:?} level")]
    HandleInUse { level: Level, handle: Handle },
}

/// The two digest levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    Result,
    Statistics,
}

/// Configuration of [`JobCache`].
#[derive(Debug, Clone)]
pub struct CacheConfig {
    /// Index capacity per level, in 16-byte cells (power of two; 3/4 of them hold entries).
    pub index_cells: u64,
    /// Put the indexes on the GPU when one is usable.
    pub prefer_gpu: bool,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            index_cells: 1 << 17,
            prefer_gpu: true,
        }
    }
}

/// Where the indexes live.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "note")]
pub enum IndexBackend {
    Gpu(String),
    /// The CPU twin, with the reason (no device, or not asked for).
    Cpu(String),
}

/// Counters of one level.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct LevelStats {
    pub hits: u64,
    pub misses: u64,
    /// Entries evicted by the index (both candidate buckets full).
    pub evictions: u64,
    /// Lookups whose 64-bit key matched an entry of another digest (counted as misses too), and
    /// inserts that replaced such an entry.
    pub collisions: u64,
    pub entries: u64,
}

/// Counters of the whole cache (for `/metrics`).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct CacheStats {
    pub result: LevelStats,
    pub statistics: LevelStats,
}

enum Table {
    Gpu(GpuHashTable),
    Cpu(CpuHashTable),
}

impl Table {
    fn find(&mut self, key: u64) -> Result<Option<u64>, HashTableError> {
        match self {
            Table::Gpu(t) => t.find(key, true),
            Table::Cpu(t) => t.find(key, true),
        }
    }
    fn insert(&mut self, key: u64, value: u64) -> Result<InsertOutcome, HashTableError> {
        match self {
            Table::Gpu(t) => t.insert(key, value),
            Table::Cpu(t) => t.insert(key, value),
        }
    }
    fn erase(&mut self, key: u64) -> Result<EraseOutcome, HashTableError> {
        match self {
            Table::Gpu(t) => t.erase(key),
            Table::Cpu(t) => t.erase(key),
        }
    }
    fn clear(&mut self) -> Result<(), HashTableError> {
        match self {
            Table::Gpu(t) => t.clear(),
            Table::Cpu(t) => {
                t.clear();
                Ok(())
            }
        }
    }
}

/// One level: the index plus the host-side store of full digests.
struct LevelIndex {
    table: Table,
    digests: HashMap<Handle, Digest>,
    stats: LevelStats,
}

impl LevelIndex {
    fn lookup(&mut self, digest: &Digest) -> Result<Option<Handle>, CacheError> {
        match self.table.find(digest_key(digest))? {
            Some(h) if self.digests.get(&h) == Some(digest) => {
                self.stats.hits += 1;
                Ok(Some(h))
            }
            Some(_) => {
                self.stats.collisions += 1;
                self.stats.misses += 1;
                Ok(None)
            }
            None => {
                self.stats.misses += 1;
                Ok(None)
            }
        }
    }

    fn insert(
        &mut self,
        level: Level,
        digest: &Digest,
        handle: Handle,
    ) -> Result<Vec<Handle>, CacheError> {
        if let Some(d) = self.digests.get(&handle) {
            if d != digest {
                return Err(CacheError::HandleInUse { level, handle });
            }
        }
        let mut dropped = Vec::new();
        match self.table.insert(digest_key(digest), handle)? {
            InsertOutcome::Inserted => {}
            InsertOutcome::Updated { old } => {
                if old != handle {
                    // Same key: either the same digest under a new handle, or a 64-bit collision.
                    if self.digests.get(&old) != Some(digest) {
                        self.stats.collisions += 1;
                    }
                    self.digests.remove(&old);
                    dropped.push(old);
                }
            }
            InsertOutcome::Evicted { value, .. } => {
                self.stats.evictions += 1;
                self.digests.remove(&value);
                dropped.push(value);
            }
            InsertOutcome::Failed => {
                // Only under heavy concurrent contention on the device, which a single-key call
                // cannot cause; report it rather than pretend the entry is stored.
                return Err(CacheError::Index(HashTableError::Driver(
                    "index insert ran out of attempts".into(),
                )));
            }
        }
        self.digests.insert(handle, *digest);
        self.stats.entries = self.digests.len() as u64;
        Ok(dropped)
    }

    fn remove(&mut self, digest: &Digest, only: Option<Handle>) -> Result<Option<Handle>, CacheError> {
        let key = digest_key(digest);
        // Only remove the entry if it really is this digest's (and, when asked, this handle's).
        match self.table.find(key)? {
            Some(h) if self.digests.get(&h) == Some(digest) && only.is_none_or(|o| o == h) => {
                self.table.erase(key)?;
                self.digests.remove(&h);
                self.stats.entries = self.digests.len() as u64;
                Ok(Some(h))
            }
            _ => Ok(None),
        }
    }
}

/// The two-level job cache (see the module doc).
pub struct JobCache {
    result: LevelIndex,
    statistics: LevelIndex,
    backend: IndexBackend,
}

impl std::fmt::Debug for JobCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobCache")
            .field("backend", &self.backend)
            .field("stats", &self.stats())
            .finish()
    }
}

impl JobCache {
    /// Creates empty indexes, on the GPU if `prefer_gpu` and one is usable, else on the CPU twin.
    pub fn new(config: &CacheConfig) -> Result<Self, CacheError> {
        let (tables, backend) = if config.prefer_gpu {
            match (
                GpuHashTable::new(config.index_cells),
                GpuHashTable::new(config.index_cells),
            ) {
                (Ok(a), Ok(b)) => {
                    let name = a.device().name().to_string();
                    ((Table::Gpu(a), Table::Gpu(b)), IndexBackend::Gpu(name))
                }
                (Err(HashTableError::BadCapacity(c)), _) => {
                    return Err(HashTableError::BadCapacity(c).into())
                }
                (Err(e), _) | (_, Err(e)) => (
                    Self::cpu_tables(config.index_cells)?,
                    IndexBackend::Cpu(e.to_string()),
                ),
            }
        } else {
            (
                Self::cpu_tables(config.index_cells)?,
                IndexBackend::Cpu("GPU index not requested".into()),
            )
        };
        let level = |table| LevelIndex {
            table,
            digests: HashMap::new(),
            stats: LevelStats::default(),
        };
        Ok(Self {
            result: level(tables.0),
            statistics: level(tables.1),
            backend,
        })
    }

    fn cpu_tables(cells: u64) -> Result<(Table, Table), CacheError> {
        Ok((
            Table::Cpu(CpuHashTable::new(cells)?),
            Table::Cpu(CpuHashTable::new(cells)?),
        ))
    }

    pub fn index_backend(&self) -> &IndexBackend {
        &self.backend
    }

    fn level(&mut self, level: Level) -> &mut LevelIndex {
        match level {
            Level::Result => &mut self.result,
            Level::Statistics => &mut self.statistics,
        }
    }

    /// The handle stored for `digest`, if any (full digest compared); refreshes its LRU stamp.
    pub fn lookup(&mut self, level: Level, digest: &Digest) -> Result<Option<Handle>, CacheError> {
        self.level(level).lookup(digest)
    }

    /// Stores `digest → handle`; returns the handles that left the cache because of it (evicted
    /// by the index, or replaced under the same key).
    pub fn insert(
        &mut self,
        level: Level,
        digest: &Digest,
        handle: Handle,
    ) -> Result<Vec<Handle>, CacheError> {
        self.level(level).insert(level, digest, handle)
    }

    /// Forgets `digest`; returns its handle if it was cached.
    pub fn remove(&mut self, level: Level, digest: &Digest) -> Result<Option<Handle>, CacheError> {
        self.level(level).remove(digest, None)
    }

    /// Forgets `digest` only while it still maps to `handle` (a deleted job's entry, say, which a
    /// newer job of the same digest may have replaced meanwhile). True when removed.
    pub fn remove_if(&mut self, level: Level, digest: &Digest, handle: Handle) -> Result<bool, CacheError> {
        Ok(self.level(level).remove(digest, Some(handle))?.is_some())
    }

    /// Empties both levels and fills them from `(level, digest, handle)` rows (the job table at
    /// start). Returns the handles evicted on the way (more rows than the index holds).
    pub fn rebuild<I>(&mut self, rows: I) -> Result<Vec<(Level, Handle)>, CacheError>
    where
        I: IntoIterator<Item = (Level, Digest, Handle)>,
    {
        for l in [Level::Result, Level::Statistics] {
            let li = self.level(l);
            li.table.clear()?;
            li.digests.clear();
            li.stats = LevelStats::default();
        }
        let mut dropped = Vec::new();
        for (level, digest, handle) in rows {
            for h in self.insert(level, &digest, handle)? {
                dropped.push((level, h));
            }
        }
        // Evictions during the rebuild are not request-time evictions.
        self.result.stats.evictions = 0;
        self.statistics.stats.evictions = 0;
        self.result.stats.collisions = 0;
        self.statistics.stats.collisions = 0;
        Ok(dropped)
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats {
            result: self.result.stats,
            statistics: self.statistics.stats,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn digest(seed: u8, tail: u8) -> Digest {
        let mut d = [0u8; 32];
        for (i, b) in d.iter_mut().enumerate() {
            *b = seed.wrapping_mul(31).wrapping_add(i as u8 * 7);
        }
        d[31] = tail;
        d
    }

    fn cpu_cache(cells: u64) -> JobCache {
        JobCache::new(&CacheConfig {
            index_cells: cells,
            prefer_gpu: false,
        })
        .unwrap()
    }

    #[test]
    fn hit_miss_and_levels_are_separate() {
        let mut c = cpu_cache(1 << 10);
        let d = digest(1, 0);
        assert_eq!(c.lookup(Level::Result, &d).unwrap(), None);
        assert!(c.insert(Level::Result, &d, 11).unwrap().is_empty());
        assert_eq!(c.lookup(Level::Result, &d).unwrap(), Some(11));
        assert_eq!(c.lookup(Level::Statistics, &d).unwrap(), None);
        let s = c.stats();
        assert_eq!(
            (s.result.hits, s.result.misses, s.result.entries),
            (1, 1, 1)
        );
        assert_eq!(s.statistics.misses, 1);
        assert!(matches!(c.index_backend(), IndexBackend::Cpu(_)));
    }

    /// Two digests with the same first 8 bytes: the second never gets the first one's handle.
    #[test]
    fn key_collisions_compare_the_full_digest() {
        let mut c = cpu_cache(1 << 10);
        let (a, b) = (digest(3, 1), digest(3, 2));
        assert_eq!(digest_key(&a), digest_key(&b));
        c.insert(Level::Statistics, &a, 1).unwrap();
        assert_eq!(c.lookup(Level::Statistics, &b).unwrap(), None);
        assert_eq!(c.stats().statistics.collisions, 1);
        // Storing b takes the shared key over: a's handle leaves the cache.
        assert_eq!(c.insert(Level::Statistics, &b, 2).unwrap(), vec![1]);
        assert_eq!(c.lookup(Level::Statistics, &b).unwrap(), Some(2));
        assert_eq!(c.lookup(Level::Statistics, &a).unwrap(), None);
        assert!(matches!(
            c.insert(Level::Statistics, &digest(9, 9), 2),
            Err(CacheError::HandleInUse { handle: 2, .. })
        ));
    }

    #[test]
    fn a_full_index_evicts_and_reports_the_handles() {
        let mut c = cpu_cache(8); // 6 slots, every key shares the same two buckets
        let mut dropped = Vec::new();
        for i in 0..20u8 {
            dropped.extend(
                c.insert(Level::Result, &digest(i, 0), i as u64 + 100)
                    .unwrap(),
            );
        }
        assert_eq!(dropped.len(), 14);
        let s = c.stats().result;
        assert_eq!((s.evictions, s.entries), (14, 6));
        for i in 0..20u8 {
            let h = c.lookup(Level::Result, &digest(i, 0)).unwrap();
            assert_eq!(
                h.is_none(),
                dropped.contains(&(i as u64 + 100)),
                "digest {i}"
            );
        }
    }

    #[test]
    fn rebuild_and_remove() {
        let mut c = cpu_cache(1 << 8);
        c.insert(Level::Result, &digest(50, 0), 5).unwrap();
        let rows = (0..30u8).map(|i| {
            (
                if i % 2 == 0 {
                    Level::Result
                } else {
                    Level::Statistics
                },
                digest(i, 1),
                i as u64,
            )
        });
        assert!(c.rebuild(rows).unwrap().is_empty());
        assert_eq!(
            c.lookup(Level::Result, &digest(50, 0)).unwrap(),
            None,
            "rebuild starts empty"
        );
        assert_eq!(c.lookup(Level::Result, &digest(4, 1)).unwrap(), Some(4));
        assert_eq!(c.lookup(Level::Statistics, &digest(7, 1)).unwrap(), Some(7));
        assert_eq!(c.lookup(Level::Result, &digest(7, 1)).unwrap(), None);
        assert_eq!(c.remove(Level::Statistics, &digest(7, 1)).unwrap(), Some(7));
        assert_eq!(c.lookup(Level::Statistics, &digest(7, 1)).unwrap(), None);
        assert_eq!(c.remove(Level::Statistics, &digest(7, 1)).unwrap(), None);
        assert_eq!(c.stats().statistics.entries, 14);
        // remove_if leaves an entry that maps to another handle.
        assert!(!c.remove_if(Level::Result, &digest(4, 1), 99).unwrap());
        assert_eq!(c.lookup(Level::Result, &digest(4, 1)).unwrap(), Some(4));
        assert!(c.remove_if(Level::Result, &digest(4, 1), 4).unwrap());
        assert_eq!(c.lookup(Level::Result, &digest(4, 1)).unwrap(), None);
    }

    /// Asking for the GPU works everywhere: without a device the cache says why and uses the twin.
    #[test]
    fn gpu_preference_falls_back_cleanly() {
        let mut c = JobCache::new(&CacheConfig {
            index_cells: 1 << 8,
            prefer_gpu: true,
        })
        .unwrap();
        match c.index_backend() {
            IndexBackend::Cpu(why) => assert!(!why.is_empty()),
            IndexBackend::Gpu(name) => assert!(!name.is_empty()),
        }
        c.insert(Level::Result, &digest(1, 1), 9).unwrap();
        assert_eq!(c.lookup(Level::Result, &digest(1, 1)).unwrap(), Some(9));
        assert!(matches!(
            JobCache::new(&CacheConfig {
                index_cells: 100,
                prefer_gpu: true
            }),
            Err(CacheError::Index(HashTableError::BadCapacity(100)))
        ));
    }

    /// The service shares the cache between tasks behind a mutex.
    #[test]
    fn cache_can_be_shared_between_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<std::sync::Mutex<JobCache>>();
        send_sync::<std::sync::Mutex<DeviceLru<Vec<u8>>>>();
    }

    #[test]
    fn device_lru_keeps_the_budget() {
        let mut lru: DeviceLru<&'static str> = DeviceLru::new(100);
        let (a, b, cc) = (digest(1, 0), digest(2, 0), digest(3, 0));
        assert!(lru.put(a, Arc::new("a"), 40).unwrap().is_empty());
        assert!(lru.put(b, Arc::new("b"), 40).unwrap().is_empty());
        assert_eq!(lru.get(&a).as_deref(), Some(&"a")); // a is now the most recent
        let ev = lru.put(cc, Arc::new("c"), 40).unwrap();
        assert_eq!(ev.iter().map(|(d, _)| *d).collect::<Vec<_>>(), vec![b]);
        assert_eq!(lru.used_bytes(), 80);
        assert!(lru.get(&b).is_none());
        assert!(lru.put(digest(4, 0), Arc::new("huge"), 101).is_err());
        // Replacing an item re-counts its bytes; a larger replacement evicts the oldest other.
        let ev = lru.put(cc, Arc::new("c2"), 70).unwrap();
        assert_eq!(ev.len(), 1);
        assert_eq!(lru.used_bytes(), 70);
        assert_eq!(lru.remove(&cc).as_deref(), Some(&"c2"));
        let s = lru.stats();
        assert_eq!(
            (s.hits, s.misses, s.evictions, s.refused, s.entries, s.bytes),
            (1, 1, 2, 1, 0, 0)
        );
    }
}

//! The device-resident level: the most recent prepared cubes (and their eigen systems) kept in GPU
//! memory under a byte budget (`--gpu-cache-bytes`), least recently used first out.
//!
//! Two rules make it safe to hold device memory between jobs:
//! * eviction frees memory: an evicted cube's buffers are dropped and its backend's idle buffer pool
//!   is released to the driver (`Backend::release_idle_memory`); a cube still used by a running job
//!   is freed when that job ends ([`DeviceLevel::done_with`]);
//! * jobs come first: before a job prepares a cube of its own, [`DeviceLevel::make_room`] evicts
//!   until the device has what the cube needs, and [`DeviceLevel::clear`] lets a job that still ran
//!   out of device memory retry with nothing cached.

use std::sync::{Arc, Mutex};

use super::{DeviceLru, DeviceLruStats, Digest, ResidentCube};
use crate::backend::Backend;
use crate::cube::Cube;

pub struct DeviceLevel {
    lru: Mutex<DeviceLru<ResidentCube>>,
}

impl std::fmt::Debug for DeviceLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceLevel").field("stats", &self.stats()).finish()
    }
}

/// Device bytes a cube needs to be prepared resident by the CUDA backend: the raw cube, its one-byte
/// pixel mask, the per-pass chunk buffers (three 64 MiB work matrices, rounded up), and the margin the
/// backend leaves free (a tenth of the free memory plus 256 MiB).
pub fn resident_need(cube: &Cube) -> u64 {
    let raw = cube.raw_len() as u64;
    let mask = cube.pixels() as u64;
    let passes = 256u64 << 20;
    (raw + mask + passes) * 10 / 9 + (256 << 20)
}

impl DeviceLevel {
    pub fn new(budget_bytes: u64) -> DeviceLevel {
        DeviceLevel { lru: Mutex::new(DeviceLru::new(budget_bytes)) }
    }

    fn lru(&self) -> std::sync::MutexGuard<'_, DeviceLru<ResidentCube>> {
        self.lru.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The resident cube of `key`, refreshed as most recently used.
    pub fn get(&self, key: &Digest) -> Option<Arc<ResidentCube>> {
        self.lru().get(key)
    }

    /// Keeps `item` under `key` if its backend holds it on the device and it fits the budget,
    /// evicting least recently used cubes to make it fit. True when kept.
    pub fn keep(&self, key: Digest, item: Arc<ResidentCube>) -> bool {
        let bytes = item.resident_bytes();
        if bytes == 0 {
            // Streamed (or not on a device): keeping it would save no upload.
            return false;
        }
        let (replaced, outcome) = {
            let mut lru = self.lru();
            // Two jobs may have prepared the same cube at once: the later one replaces the earlier,
            // whose memory must be released like an evicted cube's.
            let replaced = lru.remove(&key);
            (replaced, lru.put(key, item, bytes))
        };
        release(replaced.into_iter().collect());
        match outcome {
            Ok(evicted) => {
                release(evicted.into_iter().map(|(_, c)| c).collect());
                true
            }
            Err(_too_big) => false,
        }
    }

    /// Evicts least recently used cubes until `backend`'s device has `need` bytes free, or nothing
    /// is left to evict. Does nothing for a backend without device memory.
    pub fn make_room(&self, backend: &dyn Backend, need: u64) {
        let free = || backend.memory_in_use().map(|(used, total)| total.saturating_sub(used));
        match free() {
            Some(f) if f < need => {}
            _ => return,
        }
        // Idle pooled buffers count as used for the driver; give them back before evicting anything.
        backend.release_idle_memory();
        while free().is_some_and(|f| f < need) {
            let victim = self.lru().evict_oldest();
            match victim {
                Some((_, cube)) => release(vec![cube]),
                None => break,
            }
        }
    }

    /// Evicts every cube; returns how many there were.
    pub fn clear(&self) -> usize {
        let mut all = Vec::new();
        {
            let mut lru = self.lru();
            while let Some((_, c)) = lru.evict_oldest() {
                all.push(c);
            }
        }
        let n = all.len();
        release(all);
        n
    }

    /// A job is done with `item` (got or kept under `key`): if the cache evicted it meanwhile, this
    /// was its last user, and its device memory goes back to the driver now.
    pub fn done_with(&self, key: &Digest, item: Arc<ResidentCube>) {
        let still_cached = self.lru().peek(key).is_some_and(|c| Arc::ptr_eq(c, &item));
        if !still_cached {
            release(vec![item]);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.lru().is_empty()
    }

    pub fn stats(&self) -> DeviceLruStats {
        self.lru().stats()
    }
}

/// Drops evicted cubes, then releases the idle device memory of their backends (each once). A cube
/// another job still holds is freed when that job lets go of it.
fn release(evicted: Vec<Arc<ResidentCube>>) {
    let mut backends: Vec<Arc<dyn Backend>> = Vec::new();
    for c in &evicted {
        if !backends.iter().any(|b| Arc::ptr_eq(b, c.backend())) {
            backends.push(c.backend().clone());
        }
    }
    drop(evicted);
    for b in backends {
        b.release_idle_memory();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{BackendError, PreparedCube};
    use crate::mnf::stats::{Denoise, Moments, Projection, Statistics, StatsSpec};
    use crate::mnf::Monitor;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A device of `total` bytes whose prepared cubes hold their raw size until dropped, and whose
    /// idle pool holds what was last released by a cube until `release_idle_memory`.
    struct FakeDevice {
        total: u64,
        used: Arc<AtomicU64>,
        pooled: Arc<AtomicU64>,
        released: AtomicU64,
    }

    struct FakeCube {
        bytes: u64,
        pooled: Arc<AtomicU64>,
    }

    impl Drop for FakeCube {
        fn drop(&mut self) {
            // Like the CUDA backend: buffers go to the pool, still allocated.
            self.pooled.fetch_add(self.bytes, Ordering::SeqCst);
        }
    }

    impl PreparedCube for FakeCube {
        fn statistics(&mut self, _: &StatsSpec, _: &mut dyn FnMut(&Moments), _: &Monitor) -> Result<Statistics, BackendError> {
            Err(BackendError::Invalid("not used".into()))
        }
        fn project(&mut self, _: &Projection, _: &mut [f32], _: &Monitor) -> Result<(), BackendError> {
            Ok(())
        }
        fn denoise(&mut self, _: &Denoise, _: &mut [f32], _: &Monitor) -> Result<(), BackendError> {
            Ok(())
        }
        fn resident_bytes(&self) -> u64 {
            self.bytes
        }
    }

    impl Backend for FakeDevice {
        fn name(&self) -> &'static str {
            "fake"
        }
        fn device(&self) -> String {
            "fake device".into()
        }
        fn memory_in_use(&self) -> Option<(u64, u64)> {
            Some((self.used.load(Ordering::SeqCst), self.total))
        }
        fn prepare<'c>(&'c self, cube: &'c Cube, _: &Monitor) -> Result<Box<dyn PreparedCube + Send + 'c>, BackendError> {
            let bytes = cube.raw_len() as u64;
            self.used.fetch_add(bytes, Ordering::SeqCst);
            Ok(Box::new(FakeCube { bytes, pooled: self.pooled.clone() }))
        }
        fn release_idle_memory(&self) {
            let p = self.pooled.swap(0, Ordering::SeqCst);
            self.used.fetch_sub(p, Ordering::SeqCst);
            self.released.fetch_add(p, Ordering::SeqCst);
        }
    }

    fn device(total: u64) -> Arc<FakeDevice> {
        Arc::new(FakeDevice {
            total,
            used: Arc::new(AtomicU64::new(0)),
            pooled: Arc::new(AtomicU64::new(0)),
            released: AtomicU64::new(0),
        })
    }

    /// A cube of `kib` KiB of raw f32 samples.
    fn cube(kib: usize, seed: f32) -> Arc<Cube> {
        let values = vec![seed; kib * 256];
        Arc::new(Cube::from_f32(kib, 16, 16, &values).unwrap())
    }

    fn resident(dev: &Arc<FakeDevice>, kib: usize, seed: f32) -> Arc<ResidentCube> {
        let backend: Arc<dyn Backend> = dev.clone();
        Arc::new(ResidentCube::prepare(cube(kib, seed), backend, &Monitor::silent()).unwrap())
    }

    #[test]
    fn eviction_frees_device_memory_and_keeps_the_budget() {
        let dev = device(1 << 30);
        let level = DeviceLevel::new(10 << 10); // 10 KiB
        assert!(level.keep([1; 32], resident(&dev, 4, 1.0)));
        assert!(level.keep([2; 32], resident(&dev, 4, 2.0)));
        assert_eq!(dev.used.load(Ordering::SeqCst), 8 << 10);
        // A third 4 KiB cube evicts the least recently used (the first) and frees its memory.
        assert!(level.get(&[2; 32]).is_some());
        assert!(level.keep([3; 32], resident(&dev, 4, 3.0)));
        assert!(level.get(&[1; 32]).is_none());
        assert_eq!(dev.used.load(Ordering::SeqCst), 8 << 10, "the evicted cube's memory went back to the device");
        assert_eq!(dev.released.load(Ordering::SeqCst), 4 << 10);
        // Larger than the whole budget: not kept, and its memory is the caller's to drop.
        let big = resident(&dev, 12, 4.0);
        assert!(!level.keep([4; 32], big.clone()));
        level.done_with(&[4; 32], big);
        assert_eq!(dev.used.load(Ordering::SeqCst), 8 << 10);
        let s = level.stats();
        assert_eq!((s.entries, s.bytes, s.evictions, s.refused), (2, 8 << 10, 1, 1));
        assert_eq!(level.clear(), 2);
        assert_eq!(dev.used.load(Ordering::SeqCst), 0);
        assert!(level.is_empty());
    }

    #[test]
    fn make_room_evicts_oldest_first_until_the_job_fits() {
        let dev = device(100 << 10);
        let level = DeviceLevel::new(1 << 30);
        for i in 0..4u8 {
            assert!(level.keep([i; 32], resident(&dev, 20, i as f32)));
        }
        assert!(level.get(&[0; 32]).is_some()); // 0 becomes the most recent: 1 is the oldest
        // 80 KiB used of 100: a job that needs 45 KiB free makes the two oldest go (1, then 2).
        level.make_room(dev.as_ref(), 45 << 10);
        assert_eq!(dev.used.load(Ordering::SeqCst), 40 << 10);
        assert!(level.get(&[1; 32]).is_none() && level.get(&[2; 32]).is_none());
        assert!(level.get(&[0; 32]).is_some() && level.get(&[3; 32]).is_some());
        // Enough room already: nothing goes.
        level.make_room(dev.as_ref(), 10 << 10);
        assert_eq!(level.stats().entries, 2);
        // More than the device can ever give: everything goes, and that is all.
        level.make_room(dev.as_ref(), 1 << 30);
        assert!(level.is_empty());
        assert_eq!(dev.used.load(Ordering::SeqCst), 0);
    }

    /// A cube evicted while a job still uses it is freed when that job is done with it.
    #[test]
    fn a_cube_in_use_is_freed_by_its_last_user() {
        let dev = device(1 << 30);
        let level = DeviceLevel::new(1 << 30);
        assert!(level.keep([1; 32], resident(&dev, 8, 1.0)));
        let in_use = level.get(&[1; 32]).unwrap();
        assert_eq!(level.clear(), 1);
        assert_eq!(dev.used.load(Ordering::SeqCst), 8 << 10, "still held by the job");
        level.done_with(&[1; 32], in_use);
        assert_eq!(dev.used.load(Ordering::SeqCst), 0);
        // The same key kept again (two jobs prepared the same cube): the older copy's memory goes.
        assert!(level.keep([3; 32], resident(&dev, 8, 3.0)));
        assert!(level.keep([3; 32], resident(&dev, 8, 3.0)));
        assert_eq!((level.stats().entries, dev.used.load(Ordering::SeqCst)), (1, 8 << 10));
        assert_eq!(level.clear(), 1);
        // A job done with a cube that is still cached leaves it there.
        assert!(level.keep([2; 32], resident(&dev, 8, 2.0)));
        let c = level.get(&[2; 32]).unwrap();
        level.done_with(&[2; 32], c);
        assert_eq!((level.stats().entries, dev.used.load(Ordering::SeqCst)), (1, 8 << 10));
    }

    #[test]
    fn streamed_cubes_are_not_kept() {
        let level = DeviceLevel::new(1 << 30);
        let cpu: Arc<dyn Backend> = Arc::new(crate::backend::cpu::CpuBackend::new());
        let c = Arc::new(ResidentCube::prepare(cube(4, 1.0), cpu.clone(), &Monitor::silent()).unwrap());
        assert!(!level.keep([1; 32], c));
        assert!(level.is_empty());
        level.make_room(cpu.as_ref(), u64::MAX); // no device memory: nothing to do, no panic
        assert!(resident_need(&cube(4, 1.0)) > 4 << 10);
    }
}

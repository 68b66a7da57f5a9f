//! SlabHash (Ashkiani, Farach-Colton and Owens, IPDPS 2018; ../shared/docs/GPU_HASH_TABLES.md
//! design 2), written from the published description with 64-bit keys and values, as a reference
//! that `hypermnf bench hashtable` measures beside the job cache's bucketed table
//! ([`crate::hashtable::GpuHashTable`]). Kernels in `kernels/bench/ht_slab.cu`.
//!
//! # Layout, and the 64-bit adaptation
//! A warp-cooperative chained table: `B` buckets (a power of two), each a linked list of *slabs*;
//! a key's bucket is `fmix64(key) & (B - 1)`. SlabHash's slab is 128 bytes = 32 four-byte lanes: 15
//! interleaved 32-bit key/value pairs and a next pointer, one word per lane of a warp. With 64-bit
//! keys and values the same 15 pairs and next pointer take **256 bytes** (16 cells of 16 bytes:
//! pairs in cells 0..14, the next slab's index in cell 15, whose second word is unused), and a warp
//! reads a slab with one coalesced access, lanes 0..15 loading one 16-byte cell each, so every
//! pair is read with one single-copy-atomic load and is published by one 128-bit CAS (SlabHash
//! publishes its 32-bit pair with one 64-bit CAS). The alternatives were a 128-byte slab of 7 pairs
//! (twice the chain hops for the same keys) or keys and values in separate slabs (two reads per
//! hit, and no single write that publishes a pair); both keep less of the design. Slabs `0..B` are
//! the buckets' base slabs; more come from a pool (pre-allocated, never reclaimed, as SlabAlloc's)
//! through a bump allocator. A warp that loses the race to link a slab keeps it as its spare for its
//! next allocation (SlabAlloc frees it instead); a spare still held when the kernel ends is not used
//! again. Load is quoted against the base slabs' pairs, `15 B`.
//!
//! # Operations (warp-cooperative as published: each lane brings one operation; the warp takes the
//! lowest pending lane with `__ballot_sync`/`__ffs`, broadcasts its key with `__shfl_sync`, and all
//! lanes compare against the slab at once; the owner lane records the result)
//! * **search**: walk the chain: a matching pair gives its value; a slab without it whose next
//!   pointer is empty ends the search.
//! * **insert-or-assign**: walk the *whole* chain; a present key gets its value word swapped
//!   (`atomicExch`: the key cannot leave its pair during an insert kernel, so no CAS loop, which
//!   could starve under many inserts of one key); an absent key takes the first empty pair of the chain with a 128-bit CAS that
//!   publishes key and value together; a chain with no empty pair gets a new slab linked at its tail
//!   by a CAS on the tail's next pointer; a lost CAS walks again. SlabHash's `insertUnique` claims
//!   the first empty pair of the slab it is reading as soon as that slab lacks the key; after an
//!   erase has emptied a pair in front of the key that stores the key twice (GPU_HASH_TABLES.md,
//!   "lessons"), so this version reads the rest of the chain first.
//! * **delete**: find the key and CAS its pair back to all zeros: an empty pair, reusable at once
//!   (no tombstone); chains never shrink.
//!
//! # Concurrency
//! Inserts run concurrently with inserts and finds only, erases with erases and finds; the batch
//! kernels run one kind of operation each, on the device's one stream. Why concurrent inserts never
//! store a key twice: during an insert kernel no pair becomes empty and no stored key changes, and
//! chains only grow at the tail, so the pairs of a chain are totally ordered and each successful
//! claim takes the first empty pair at that moment; an insert that claims pair `q` (or links a slab
//! after every existing pair) read every earlier pair full, and a pair `p < q` that another insert
//! of the same key filled was empty until that claim and full ever after, so the read of `p` saw the
//! key and would have updated instead (the argument of src/hashtable/mod.rs, F1, F2 and point 5,
//! along a chain instead of a bucket). With an erase in the same kernel that fails (a pair can become
//! empty behind a reader), which is why no mixed kernel is offered.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use cudarc::driver::{CudaSlice, CudaStream, CudaView, PushKernelArg};

use super::batch::BatchKernels;
use super::kernels::DesignKernels;
use crate::hashtable::gpu::{cfg, drv, Device};
use crate::hashtable::{HashTableError, EMPTY_KEY};

const SOURCE: &str = include_str!("../../../kernels/bench/ht_slab.cu");

/// Pairs per slab.
pub const SLAB_PAIRS: u64 = 15;
/// 16-byte cells per slab (15 pairs and the next pointer): 256 bytes.
pub const SLAB_CELLS: u64 = 16;
pub const SLAB_BYTES: u64 = SLAB_CELLS * 16;
/// Most slabs in one table (base and pool; 2^28 slabs = 64 GiB).
pub const MAX_SLABS: u64 = 1 << 28;

fn kernels(dev: &Device) -> Result<&'static DesignKernels, HashTableError> {
    static K: OnceLock<Result<DesignKernels, String>> = OnceLock::new();
    DesignKernels::load(&K, dev, SOURCE, "ht_slab.cu", "sl")
}

/// Checks a geometry: `buckets` a power of two (at least 2), base and pool slabs together at most
/// [`MAX_SLABS`]. Returns the total number of slabs.
pub fn check_geometry(buckets: u64, pool_slabs: u64) -> Result<u64, HashTableError> {
    let total = buckets.saturating_add(pool_slabs);
    if buckets.is_power_of_two() && buckets >= 2 && total <= MAX_SLABS {
        Ok(total)
    } else {
        Err(HashTableError::BadCapacity(buckets))
    }
}

/// The slab hash table (see the module doc).
pub struct SlabHashTable {
    dev: Arc<Device>,
    k: &'static DesignKernels,
    /// `2 * SLAB_CELLS` `u64` per slab.
    pool: CudaSlice<u64>,
    /// The allocator's next free slab.
    alloc: CudaSlice<u64>,
    buckets: u64,
    nslabs: u64,
}

impl std::fmt::Debug for SlabHashTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlabHashTable")
            .field("buckets", &self.buckets)
            .field("slabs", &self.nslabs)
            .finish()
    }
}

impl SlabHashTable {
    /// `buckets` base slabs and a pool of `pool_slabs` more, on device 0.
    pub fn new(buckets: u64, pool_slabs: u64) -> Result<Self, HashTableError> {
        Self::with_device(Device::shared()?, buckets, pool_slabs)
    }

    pub fn with_device(dev: Arc<Device>, buckets: u64, pool_slabs: u64) -> Result<Self, HashTableError> {
        let nslabs = check_geometry(buckets, pool_slabs)?;
        let (free, _) = dev.mem_info()?;
        if nslabs * SLAB_BYTES > free {
            return Err(HashTableError::OutOfDeviceMemory {
                need: nslabs * SLAB_BYTES,
                free,
            });
        }
        let k = kernels(&dev)?;
        let s = dev.stream.clone();
        let pool = s.alloc_zeros::<u64>((nslabs * SLAB_CELLS * 2) as usize).map_err(drv)?;
        let alloc = s.alloc_zeros::<u64>(1).map_err(drv)?;
        let mut t = Self {
            dev,
            k,
            pool,
            alloc,
            buckets,
            nslabs,
        };
        t.clear()?;
        Ok(t)
    }

    pub fn buckets(&self) -> u64 {
        self.buckets
    }

    /// Pairs in the base slabs: the capacity loads are quoted against.
    pub fn base_pairs(&self) -> u64 {
        self.buckets * SLAB_PAIRS
    }

    pub fn bytes(&self) -> u64 {
        self.nslabs * SLAB_BYTES
    }

    /// Slabs handed out so far, base slabs included (at most the pool's size).
    pub fn slabs_used(&self) -> Result<u64, HashTableError> {
        let a = self.dev.stream.clone_dtoh(&self.alloc).map_err(drv)?;
        Ok(a[0].min(self.nslabs))
    }

    /// Empties the table and its pool.
    pub fn clear(&mut self) -> Result<(), HashTableError> {
        let s = &self.dev.stream;
        s.memset_zeros(&mut self.pool).map_err(drv)?;
        s.memcpy_htod(&[self.buckets], &mut self.alloc).map_err(drv)?;
        s.synchronize().map_err(drv)
    }

    /// (problems, occupied pairs, slabs in chains), counted on the device with the table at rest: a
    /// key in another bucket's chain, a key twice in a chain, a next pointer outside the allocated
    /// slabs, a nonzero unused word.
    pub fn audit(&self) -> Result<(u64, u64, u64), HashTableError> {
        let s = &self.dev.stream;
        let mut counters = s.alloc_zeros::<u64>(3).map_err(drv)?;
        let bmask = self.buckets - 1;
        let mut b = s.launch_builder(&self.k.audit);
        b.arg(&self.pool).arg(&bmask).arg(&self.alloc).arg(&self.nslabs).arg(&mut counters);
        // SAFETY: arguments match sl_audit's signature; counters has 3 elements.
        unsafe { b.launch(cfg(self.buckets)) }.map_err(drv)?;
        let c = s.clone_dtoh(&counters).map_err(drv)?;
        Ok((c[0], c[1], c[2]))
    }

    /// Every stored entry (copied to the host; the next pointers are left out).
    pub fn entries(&self) -> Result<HashMap<u64, u64>, HashTableError> {
        let raw = self.dev.stream.clone_dtoh(&self.pool).map_err(drv)?;
        Ok(raw
            .chunks_exact(2)
            .enumerate()
            .filter(|(i, c)| (*i as u64 % SLAB_CELLS) != SLAB_CELLS - 1 && c[0] != EMPTY_KEY)
            .map(|(_, c)| (c[0], c[1]))
            .collect())
    }
}

impl BatchKernels for SlabHashTable {
    fn stream(&self) -> Arc<CudaStream> {
        self.dev.stream.clone()
    }

    /// Launches `sl_insert` over `keys`/`vals` (already checked) on the device's stream.
    fn launch_insert(
        &mut self,
        keys: &CudaView<u64>,
        vals: &CudaView<u64>,
        status: &mut CudaSlice<u32>,
        out_val: &mut CudaSlice<u64>,
    ) -> Result<(), HashTableError> {
        let n = keys.len() as u64;
        let bmask = self.buckets - 1;
        let mut b = self.dev.stream.launch_builder(&self.k.insert);
        b.arg(&mut self.pool)
            .arg(&bmask)
            .arg(&mut self.alloc)
            .arg(&self.nslabs)
            .arg(keys)
            .arg(vals)
            .arg(&n)
            .arg(status)
            .arg(out_val);
        // SAFETY: arguments match sl_insert's signature; keys, vals, status and out_val hold at least n.
        unsafe { b.launch(cfg(n)) }.map_err(drv)?;
        Ok(())
    }

    /// Launches `sl_find` (never writes the table).
    fn launch_find(
        &self,
        keys: &CudaView<u64>,
        status: &mut CudaSlice<u32>,
        out_val: &mut CudaSlice<u64>,
    ) -> Result<(), HashTableError> {
        let n = keys.len() as u64;
        let bmask = self.buckets - 1;
        let mut b = self.dev.stream.launch_builder(&self.k.find);
        b.arg(&self.pool).arg(&bmask).arg(keys).arg(&n).arg(status).arg(out_val);
        // SAFETY: arguments match sl_find's signature; keys, status and out_val hold at least n.
        unsafe { b.launch(cfg(n)) }.map_err(drv)?;
        Ok(())
    }

    /// Launches `sl_erase`.
    fn launch_erase(
        &mut self,
        keys: &CudaView<u64>,
        status: &mut CudaSlice<u32>,
        out_val: &mut CudaSlice<u64>,
    ) -> Result<(), HashTableError> {
        let n = keys.len() as u64;
        let bmask = self.buckets - 1;
        let mut b = self.dev.stream.launch_builder(&self.k.erase);
        b.arg(&mut self.pool).arg(&bmask).arg(keys).arg(&n).arg(status).arg(out_val);
        // SAFETY: arguments match sl_erase's signature; keys, status and out_val hold at least n.
        unsafe { b.launch(cfg(n)) }.map_err(drv)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometries_are_checked() {
        assert_eq!(check_geometry(2, 0).unwrap(), 2);
        assert_eq!(check_geometry(1 << 20, 1 << 19).unwrap(), 3 << 19);
        for (b, p) in [(0, 5), (1, 5), (3, 0), (1 << 28, 1), (2, u64::MAX)] {
            assert!(check_geometry(b, p).is_err(), "{b} {p}");
        }
    }
}

//! Hopscotch hashing on the GPU after GLHT (Zhang and Sun, 2019; ../shared/docs/GPU_HASH_TABLES.md
//! design 3), written from the published description with 64-bit keys and values, as a reference
//! that `hypermnf bench hashtable` measures beside the job cache's bucketed table
//! ([`crate::hashtable::GpuHashTable`]). Kernels in `kernels/bench/ht_hopscotch.cu`.
//!
//! # Layout
//! `N` slots (a power of two, at least 64) of 16 bytes `{u64 key, u64 value}`, key 0 empty and
//! `u64::MAX` (the API's reserved key) the mark of a *hole* that an insert has claimed and is moving
//! home. Beside them one `u64` of metadata per home slot `h`: bits 0..31 the hop bitmap (bit `d`:
//! slot `h + d` holds a key whose home is `h`; neighbourhood H = 32), bit 32 a lock, bits 33..63 a
//! version that counts the moves of `h`'s keys. A key's home is `fmix64(key) & (N - 1)` and it lives
//! within H slots of it, so a lookup reads one meta word and at most 32 consecutive slots (one
//! coalesced 512-byte access by the warp, lane `d` reading slot `h + d`; lanes whose bitmap bit is
//! clear read nothing). 24 bytes per slot in all.
//!
//! # Operations (warp-cooperative: each lane brings one operation; the warp serves them in turn,
//! `__ballot_sync`/`__ffs`/`__shfl_sync` as a work queue)
//! * **find** (lock-free): read `h`'s meta word (acquire), then the slots its bitmap names; a match
//!   is the answer (one single-copy-atomic 16-byte load: key and value from the same write). A miss
//!   reads the meta word again after a fence and is final only if the version is unchanged;
//!   otherwise a concurrent move may have hidden the key and the lookup reads again (bounded).
//! * **insert-or-assign**: take `h`'s lock (CAS on bit 32); look for the key in the bitmap's slots
//!   (exact under the lock: only holders of `h`'s lock write, move or erase `h`'s keys) and replace
//!   its value with a 128-bit CAS; else claim the nearest empty slot at or after `h` (128-bit CAS to
//!   the hole mark; at most 4096 slots away); while the hole is H or more slots from `h`, move it
//!   closer: among the homes `j` of the 31 slots before the hole, the farthest one with a key between
//!   `j` and the hole is *try*-locked (never waited for, so no two warps wait on each other), its
//!   nearest such key is copied into the hole, `j`'s bitmap gets the new position and a version
//!   tick, the old slot becomes the hole, and `j`'s bitmap loses it (another tick; the same atomic
//!   add unlocks `j`). Then the key and value go into the hole with one 128-bit CAS, and one atomic
//!   add sets `h`'s bit and releases its lock. No hole within reach or every candidate home locked
//!   for 256 rounds: the hole is given back and the insert reports `Failed`.
//! * **erase**: under `h`'s lock, CAS the key's slot to all zeros and clear its bit (one add that
//!   also unlocks). No tombstones.
//!
//! # Where it departs from GLHT, and why
//! GLHT keeps its two lock flags (multiple_lock, swap_lock) inside the 64-bit slot words next to the
//! key and the hop bitmap; the design notes (GPU_HASH_TABLES.md) record that its public code loses
//! keys because a key write overwrites the bitmap sharing its word. Here the bitmap, the one lock
//! and a version live in a word of their own per home slot and the entry is a separate 16-byte slot
//! published by one 128-bit CAS (64-bit keys and values need it; GLHT's 32-bit pairs fit one 64-bit
//! word). The lock plays multiple_lock's part (write–write exclusion on a home; finds ignore it); the
//! try-lock of the displaced key's home plays swap_lock's. The claimed hole carrying the reserved
//! key is GLHT's locked empty target; the copy-then-clear of a move is its "temporary duplication".
//! The version lets a lock-free find detect a move that overlapped it (the standard remedy for
//! concurrent hopscotch lookups), which GLHT's readers lack. Inserts and erases take locks, as
//! GLHT's do under the name of flags: "lock-free" holds for finds only; every spin is bounded.
//!
//! # Concurrency
//! Any mix of concurrent inserts, erases and finds is safe (no key stored twice, none lost, values
//! only ones written): every write of `h`'s keys happens under `h`'s lock, moves copy before they
//! clear, and finds confirm misses by the version. The batch kernels run one kind of operation each
//! on the device's one stream. Within a batch, inserts of one key leave one entry holding one of
//! the values; otherwise a batch of distinct keys gives the results of any sequential order.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use cudarc::driver::{CudaSlice, CudaStream, CudaView, PushKernelArg};

use super::batch::BatchKernels;
use super::kernels::DesignKernels;
use crate::hashtable::gpu::{cfg, drv, Device};
use crate::hashtable::{HashTableError, EMPTY_KEY};

const SOURCE: &str = include_str!("../../../kernels/bench/ht_hopscotch.cu");

/// Neighbourhood size: a key lives at most `HOP - 1` slots after its home.
pub const HOP: u64 = 32;
/// Smallest table: two neighbourhoods.
pub const MIN_SLOTS: u64 = 2 * HOP;
/// Largest table (2^32 slots = 96 GiB with the metadata).
pub const MAX_SLOTS: u64 = 1 << 32;
/// Bytes per slot: the 16-byte entry and the 8-byte metadata word of its home.
pub const BYTES_PER_SLOT: u64 = 24;

fn kernels(dev: &Device) -> Result<&'static DesignKernels, HashTableError> {
    static K: OnceLock<Result<DesignKernels, String>> = OnceLock::new();
    DesignKernels::load(&K, dev, SOURCE, "ht_hopscotch.cu", "hs")
}

/// Checks a slot count: a power of two in `MIN_SLOTS..=MAX_SLOTS`.
pub fn check_slots(slots: u64) -> Result<(), HashTableError> {
    if slots.is_power_of_two() && (MIN_SLOTS..=MAX_SLOTS).contains(&slots) {
        Ok(())
    } else {
        Err(HashTableError::BadCapacity(slots))
    }
}

/// The hopscotch table (see the module doc).
pub struct HopscotchTable {
    dev: Arc<Device>,
    k: &'static DesignKernels,
    /// Two `u64` per slot.
    slots: CudaSlice<u64>,
    meta: CudaSlice<u64>,
    mask: u64,
}

impl std::fmt::Debug for HopscotchTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HopscotchTable").field("slots", &(self.mask + 1)).finish()
    }
}

impl HopscotchTable {
    /// A table of `slots` slots on device 0.
    pub fn new(slots: u64) -> Result<Self, HashTableError> {
        Self::with_device(Device::shared()?, slots)
    }

    pub fn with_device(dev: Arc<Device>, slots: u64) -> Result<Self, HashTableError> {
        check_slots(slots)?;
        let (free, _) = dev.mem_info()?;
        if slots * BYTES_PER_SLOT > free {
            return Err(HashTableError::OutOfDeviceMemory {
                need: slots * BYTES_PER_SLOT,
                free,
            });
        }
        let k = kernels(&dev)?;
        let s = dev.stream.clone();
        let cells = s.alloc_zeros::<u64>(2 * slots as usize).map_err(drv)?;
        let meta = s.alloc_zeros::<u64>(slots as usize).map_err(drv)?;
        Ok(Self {
            dev,
            k,
            slots: cells,
            meta,
            mask: slots - 1,
        })
    }

    pub fn slots(&self) -> u64 {
        self.mask + 1
    }

    pub fn bytes(&self) -> u64 {
        self.slots() * BYTES_PER_SLOT
    }

    /// Empties the table.
    pub fn clear(&mut self) -> Result<(), HashTableError> {
        let s = &self.dev.stream;
        s.memset_zeros(&mut self.slots).map_err(drv)?;
        s.memset_zeros(&mut self.meta).map_err(drv)?;
        s.synchronize().map_err(drv)
    }

    /// (problems, occupied slots), counted on the device with the table at rest: a hole or a lock
    /// left behind, a key out of its neighbourhood or missing from its home's bitmap, a key stored
    /// twice, a bitmap bit naming a slot without a key of that home.
    pub fn audit(&self) -> Result<(u64, u64), HashTableError> {
        let s = &self.dev.stream;
        let mut counters = s.alloc_zeros::<u64>(2).map_err(drv)?;
        let mut b = s.launch_builder(&self.k.audit);
        b.arg(&self.slots).arg(&self.meta).arg(&self.mask).arg(&mut counters);
        // SAFETY: arguments match hs_audit's signature; counters has 2 elements.
        unsafe { b.launch(cfg(self.slots())) }.map_err(drv)?;
        let c = s.clone_dtoh(&counters).map_err(drv)?;
        Ok((c[0], c[1]))
    }

    /// Every stored entry (copied to the host).
    pub fn entries(&self) -> Result<HashMap<u64, u64>, HashTableError> {
        let raw = self.dev.stream.clone_dtoh(&self.slots).map_err(drv)?;
        Ok(raw
            .chunks_exact(2)
            .filter(|c| c[0] != EMPTY_KEY)
            .map(|c| (c[0], c[1]))
            .collect())
    }
}

impl BatchKernels for HopscotchTable {
    fn stream(&self) -> Arc<CudaStream> {
        self.dev.stream.clone()
    }

    /// Launches `hs_insert` over `keys`/`vals` (already checked) on the device's stream.
    fn launch_insert(
        &mut self,
        keys: &CudaView<u64>,
        vals: &CudaView<u64>,
        status: &mut CudaSlice<u32>,
        out_val: &mut CudaSlice<u64>,
    ) -> Result<(), HashTableError> {
        let n = keys.len() as u64;
        let mut b = self.dev.stream.launch_builder(&self.k.insert);
        b.arg(&mut self.slots)
            .arg(&mut self.meta)
            .arg(&self.mask)
            .arg(keys)
            .arg(vals)
            .arg(&n)
            .arg(status)
            .arg(out_val);
        // SAFETY: arguments match hs_insert's signature; keys, vals, status and out_val hold at least n.
        unsafe { b.launch(cfg(n)) }.map_err(drv)?;
        Ok(())
    }

    /// Launches `hs_find` (never writes the table).
    fn launch_find(
        &self,
        keys: &CudaView<u64>,
        status: &mut CudaSlice<u32>,
        out_val: &mut CudaSlice<u64>,
    ) -> Result<(), HashTableError> {
        let n = keys.len() as u64;
        let mut b = self.dev.stream.launch_builder(&self.k.find);
        b.arg(&self.slots)
            .arg(&self.meta)
            .arg(&self.mask)
            .arg(keys)
            .arg(&n)
            .arg(status)
            .arg(out_val);
        // SAFETY: arguments match hs_find's signature; keys, status and out_val hold at least n.
        unsafe { b.launch(cfg(n)) }.map_err(drv)?;
        Ok(())
    }

    /// Launches `hs_erase`.
    fn launch_erase(
        &mut self,
        keys: &CudaView<u64>,
        status: &mut CudaSlice<u32>,
        out_val: &mut CudaSlice<u64>,
    ) -> Result<(), HashTableError> {
        let n = keys.len() as u64;
        let mut b = self.dev.stream.launch_builder(&self.k.erase);
        b.arg(&mut self.slots)
            .arg(&mut self.meta)
            .arg(&self.mask)
            .arg(keys)
            .arg(&n)
            .arg(status)
            .arg(out_val);
        // SAFETY: arguments match hs_erase's signature; keys, status and out_val hold at least n.
        unsafe { b.launch(cfg(n)) }.map_err(drv)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_counts_are_checked() {
        for ok in [MIN_SLOTS, 128, 1 << 20, MAX_SLOTS] {
            assert!(check_slots(ok).is_ok(), "{ok}");
        }
        for bad in [0, 1, 32, MIN_SLOTS - 1, 100, MAX_SLOTS * 2] {
            assert!(check_slots(bad).is_err(), "{bad}");
        }
    }
}

//! Host side shared by the published designs compared with the job cache's table
//! ([`super::hopscotch`], [`super::slab`]): their kernels take a batch of keys (and values), write
//! one status code (`crate::hashtable::status`) and one value per operation, and the host turns
//! those into the outcomes of [`InsertOutcome`] / [`EraseOutcome`].

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, CudaView};

use crate::hashtable::gpu::drv;
use crate::hashtable::{check_insert_batch, check_key, status, EraseOutcome, HashTableError, InsertOutcome};

/// A published design's kernels, launched on device buffers (what the benchmark times), and the
/// batch operations on host slices written once over them (what the tests call).
pub trait BatchKernels {
    /// The stream the table's kernels run on.
    fn stream(&self) -> Arc<CudaStream>;
    /// Insert-or-assign `keys[i]` → `vals[i]` (already checked) concurrently.
    fn launch_insert(
        &mut self,
        keys: &CudaView<u64>,
        vals: &CudaView<u64>,
        status: &mut CudaSlice<u32>,
        out_val: &mut CudaSlice<u64>,
    ) -> Result<(), HashTableError>;
    /// Finds `keys` (never writes the table).
    fn launch_find(&self, keys: &CudaView<u64>, status: &mut CudaSlice<u32>, out_val: &mut CudaSlice<u64>) -> Result<(), HashTableError>;
    /// Erases `keys`.
    fn launch_erase(&mut self, keys: &CudaView<u64>, status: &mut CudaSlice<u32>, out_val: &mut CudaSlice<u64>) -> Result<(), HashTableError>;

    /// Insert-or-assign a batch concurrently (see the design's module doc for what a batch guarantees).
    fn insert_batch(&mut self, keys: &[u64], values: &[u64]) -> Result<Vec<InsertOutcome>, HashTableError> {
        let s = self.stream();
        let mut b = Batch::new(&s, keys, Some(values))?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let n = keys.len();
        let (kv, vv) = (b.keys.slice(0..n), b.vals.as_ref().expect("values").slice(0..n));
        self.launch_insert(&kv, &vv, &mut b.status, &mut b.out_val)?;
        let (st, v) = b.results(&s, n)?;
        st.iter().zip(v).map(|(&st, v)| insert_outcome(st, v)).collect()
    }

    fn find_batch(&mut self, keys: &[u64]) -> Result<Vec<Option<u64>>, HashTableError> {
        let s = self.stream();
        let mut b = Batch::new(&s, keys, None)?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let n = keys.len();
        let kv = b.keys.slice(0..n);
        self.launch_find(&kv, &mut b.status, &mut b.out_val)?;
        let (st, v) = b.results(&s, n)?;
        st.iter().zip(v).map(|(&st, v)| find_outcome(st, v)).collect()
    }

    fn erase_batch(&mut self, keys: &[u64]) -> Result<Vec<EraseOutcome>, HashTableError> {
        let s = self.stream();
        let mut b = Batch::new(&s, keys, None)?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let n = keys.len();
        let kv = b.keys.slice(0..n);
        self.launch_erase(&kv, &mut b.status, &mut b.out_val)?;
        let (st, v) = b.results(&s, n)?;
        st.iter().zip(v).map(|(&st, v)| erase_outcome(st, v)).collect()
    }
}

/// Device buffers of one batch and the kernel's results read back.
pub(crate) struct Batch {
    pub keys: CudaSlice<u64>,
    pub vals: Option<CudaSlice<u64>>,
    pub status: CudaSlice<u32>,
    pub out_val: CudaSlice<u64>,
}

impl Batch {
    /// Checks the keys (and values) and copies them to the device.
    pub fn new(s: &Arc<CudaStream>, keys: &[u64], vals: Option<&[u64]>) -> Result<Self, HashTableError> {
        match vals {
            Some(v) => check_insert_batch(keys, v)?,
            None => keys.iter().enumerate().try_for_each(|(i, &k)| check_key(i, k))?,
        }
        // Zero-length device buffers are not allowed; an empty batch launches nothing anyway.
        let n = keys.len().max(1);
        let mut d_keys = s.alloc_zeros::<u64>(n).map_err(drv)?;
        if !keys.is_empty() {
            s.memcpy_htod(keys, &mut d_keys).map_err(drv)?;
        }
        let d_vals = match vals {
            Some(v) => {
                let mut d = s.alloc_zeros::<u64>(n).map_err(drv)?;
                if !v.is_empty() {
                    s.memcpy_htod(v, &mut d).map_err(drv)?;
                }
                Some(d)
            }
            None => None,
        };
        Ok(Self {
            keys: d_keys,
            vals: d_vals,
            status: s.alloc_zeros::<u32>(n).map_err(drv)?,
            out_val: s.alloc_zeros::<u64>(n).map_err(drv)?,
        })
    }

    /// Status codes and values of the first `n` operations.
    pub fn results(&self, s: &Arc<CudaStream>, n: usize) -> Result<(Vec<u32>, Vec<u64>), HashTableError> {
        let mut st = s.clone_dtoh(&self.status).map_err(drv)?;
        let mut v = s.clone_dtoh(&self.out_val).map_err(drv)?;
        st.truncate(n);
        v.truncate(n);
        Ok((st, v))
    }
}

pub(crate) fn insert_outcome(st: u32, old: u64) -> Result<InsertOutcome, HashTableError> {
    match st {
        status::INSERTED => Ok(InsertOutcome::Inserted),
        status::UPDATED => Ok(InsertOutcome::Updated { old }),
        status::FAILED => Ok(InsertOutcome::Failed),
        other => Err(HashTableError::BadStatus(other)),
    }
}

pub(crate) fn find_outcome(st: u32, val: u64) -> Result<Option<u64>, HashTableError> {
    match st {
        status::FOUND => Ok(Some(val)),
        status::MISS => Ok(None),
        other => Err(HashTableError::BadStatus(other)),
    }
}

pub(crate) fn erase_outcome(st: u32, old: u64) -> Result<EraseOutcome, HashTableError> {
    match st {
        status::ERASED => Ok(EraseOutcome::Erased { value: old }),
        status::MISS => Ok(EraseOutcome::Missing),
        status::FAILED => Ok(EraseOutcome::Failed),
        other => Err(HashTableError::BadStatus(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_map_to_outcomes() {
        assert_eq!(insert_outcome(status::INSERTED, 9).unwrap(), InsertOutcome::Inserted);
        assert_eq!(insert_outcome(status::UPDATED, 9).unwrap(), InsertOutcome::Updated { old: 9 });
        assert_eq!(insert_outcome(status::FAILED, 0).unwrap(), InsertOutcome::Failed);
        assert!(insert_outcome(status::FOUND, 0).is_err());
        assert_eq!(find_outcome(status::FOUND, 5).unwrap(), Some(5));
        assert_eq!(find_outcome(status::MISS, 5).unwrap(), None);
        assert!(find_outcome(status::ERASED, 0).is_err());
        assert_eq!(erase_outcome(status::ERASED, 3).unwrap(), EraseOutcome::Erased { value: 3 });
        assert_eq!(erase_outcome(status::MISS, 0).unwrap(), EraseOutcome::Missing);
        assert!(erase_outcome(status::INSERTED, 0).is_err());
    }
}

//! The CPU twin of the GPU table: the same cells, hashing, claim order and eviction rule as
//! `kernels/hashtable/`, run sequentially (see the module doc of [`crate::hashtable`]). Every
//! change to a device function must be mirrored here; `tests/gpu_hashtable.rs` compares cell dumps.

use super::{
    bucket_pair, check_insert_batch, check_key, EraseOutcome, Geometry, HashTableError, InsertOutcome, Op, OpResult,
    overflow_tag, BUCKET_CELLS, EMPTY_KEY,
};

/// Sequential twin of [`super::GpuHashTable`].
#[derive(Debug, Clone)]
pub struct CpuHashTable {
    geometry: Geometry,
    /// `[key, value]` per cell; cell 0 of each bucket holds the metadata: in its first word the
    /// control word (bits 0..16, the lock bit, never set here) and the stamp of slot `s` in u16
    /// number `s`; in the low 32 bits of its second word the overflow tags.
    cells: Vec<[u64; 2]>,
    clock: u32,
}

impl CpuHashTable {
    /// A table of `cells` 16-byte cells (power of two, 16..=2^32).
    pub fn new(cells: u64) -> Result<Self, HashTableError> {
        let geometry = Geometry::new(cells)?;
        let n = usize::try_from(cells).map_err(|_| HashTableError::BadCapacity(cells))?;
        let mut v = Vec::new();
        v.try_reserve_exact(n)
            .map_err(|_| HashTableError::BadCapacity(cells))?;
        v.resize(n, [0u64; 2]);
        Ok(Self {
            geometry,
            cells: v,
            clock: 0,
        })
    }

    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// The LRU clock of the last batch.
    pub fn clock(&self) -> u32 {
        self.clock
    }

    /// Raw cells, for comparison with the GPU table's dump.
    pub fn cells(&self) -> &[[u64; 2]] {
        &self.cells
    }

    /// Number of stored entries (counts slots).
    pub fn len(&self) -> u64 {
        self.cells
            .iter()
            .enumerate()
            .filter(|(i, c)| i % BUCKET_CELLS != 0 && c[0] != EMPTY_KEY)
            .count() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Empties the table (overflow bits and stamps included); the clock keeps running.
    pub fn clear(&mut self) {
        self.cells.iter_mut().for_each(|c| *c = [0, 0]);
    }

    fn next_clock(&mut self) -> u32 {
        self.clock = self.clock.wrapping_add(1);
        self.clock
    }

    pub fn insert(&mut self, key: u64, value: u64) -> Result<InsertOutcome, HashTableError> {
        Ok(self.insert_batch(&[key], &[value])?[0])
    }

    pub fn find(&mut self, key: u64, touch: bool) -> Result<Option<u64>, HashTableError> {
        Ok(self.find_batch(&[key], touch)?[0])
    }

    pub fn erase(&mut self, key: u64) -> Result<EraseOutcome, HashTableError> {
        Ok(self.erase_batch(&[key])?[0])
    }

    /// Insert-or-assign a batch (one clock tick), operations applied in order.
    pub fn insert_batch(
        &mut self,
        keys: &[u64],
        values: &[u64],
    ) -> Result<Vec<InsertOutcome>, HashTableError> {
        check_insert_batch(keys, values)?;
        let clk = self.next_clock();
        Ok(keys
            .iter()
            .zip(values)
            .map(|(&k, &v)| self.insert_one(k, v, clk))
            .collect())
    }

    /// Look up a batch; `touch` refreshes the LRU stamps of hits (cache lookups).
    pub fn find_batch(
        &mut self,
        keys: &[u64],
        touch: bool,
    ) -> Result<Vec<Option<u64>>, HashTableError> {
        keys.iter()
            .enumerate()
            .try_for_each(|(i, &k)| check_key(i, k))?;
        let clk = self.next_clock();
        Ok(keys.iter().map(|&k| self.find_one(k, clk, touch)).collect())
    }

    pub fn erase_batch(&mut self, keys: &[u64]) -> Result<Vec<EraseOutcome>, HashTableError> {
        keys.iter()
            .enumerate()
            .try_for_each(|(i, &k)| check_key(i, k))?;
        self.next_clock();
        Ok(keys.iter().map(|&k| self.erase_one(k)).collect())
    }

    /// A mixed batch, applied in order (the GPU runs it concurrently).
    pub fn mixed(&mut self, ops: &[Op], touch: bool) -> Result<Vec<OpResult>, HashTableError> {
        ops.iter()
            .enumerate()
            .try_for_each(|(i, op)| check_key(i, op.key()))?;
        let clk = self.next_clock();
        Ok(ops
            .iter()
            .map(|op| match *op {
                Op::Find(k) => OpResult::Find(self.find_one(k, clk, touch)),
                Op::Insert(k, v) => OpResult::Insert(self.insert_one(k, v, clk)),
                Op::Erase(k) => OpResult::Erase(self.erase_one(k)),
            })
            .collect())
    }

    // ------------------------------------------------------------------ one operation

    fn base(bucket: u64) -> usize {
        bucket as usize * BUCKET_CELLS
    }

    fn tags(&self, bucket: u64) -> u32 {
        self.cells[Self::base(bucket)][1] as u32
    }

    /// Marks that `key` (whose primary bucket this is) now lives in its b2: the key's overflow tag.
    fn set_overflow(&mut self, bucket: u64, key: u64) {
        self.cells[Self::base(bucket)][1] |= overflow_tag(key) as u64;
    }

    /// Stamp of slot `s` (1..=3): u16 number `s` of the metadata cell's first word.
    fn stamp(&self, bucket: u64, s: usize) -> u32 {
        ((self.cells[Self::base(bucket)][0] >> (16 * s)) & 0xffff) as u32
    }

    fn set_stamp(&mut self, bucket: u64, s: usize, clk: u32) {
        let m = &mut self.cells[Self::base(bucket)][0];
        let shift = 16 * s;
        *m = (*m & !(0xffffu64 << shift)) | (((clk & 0xffff) as u64) << shift);
    }

    /// Slot (1..=3) of `key` in `bucket`, if present.
    fn slot_of(&self, bucket: u64, key: u64) -> Option<usize> {
        let b = Self::base(bucket);
        (1..BUCKET_CELLS).find(|&s| self.cells[b + s][0] == key)
    }

    fn locate(&self, key: u64) -> Option<(u64, usize)> {
        let (b1, b2) = bucket_pair(key, self.geometry.bucket_mask());
        if let Some(s) = self.slot_of(b1, key) {
            return Some((b1, s));
        }
        if self.tags(b1) & overflow_tag(key) != 0 {
            if let Some(s) = self.slot_of(b2, key) {
                return Some((b2, s));
            }
        }
        None
    }

    fn find_one(&mut self, key: u64, clk: u32, touch: bool) -> Option<u64> {
        let (b, s) = self.locate(key)?;
        if touch {
            self.set_stamp(b, s, clk);
        }
        Some(self.cells[Self::base(b) + s][1])
    }

    fn erase_one(&mut self, key: u64) -> EraseOutcome {
        match self.locate(key) {
            Some((b, s)) => {
                let cell = &mut self.cells[Self::base(b) + s];
                let value = cell[1];
                *cell = [0, 0];
                EraseOutcome::Erased { value }
            }
            None => EraseOutcome::Missing,
        }
    }

    fn insert_one(&mut self, key: u64, value: u64, clk: u32) -> InsertOutcome {
        if let Some((b, s)) = self.locate(key) {
            let cell = &mut self.cells[Self::base(b) + s];
            let old = cell[1];
            cell[1] = value;
            self.set_stamp(b, s, clk);
            return InsertOutcome::Updated { old };
        }
        let (b1, b2) = bucket_pair(key, self.geometry.bucket_mask());
        let empty = |t: &Self, b: u64| {
            (1..BUCKET_CELLS).find(|&s| t.cells[Self::base(b) + s][0] == EMPTY_KEY)
        };
        if let Some(s) = empty(self, b1) {
            self.cells[Self::base(b1) + s] = [key, value];
            self.set_stamp(b1, s, clk);
            return InsertOutcome::Inserted;
        }
        if let Some(s) = empty(self, b2) {
            self.set_overflow(b1, key);
            self.cells[Self::base(b2) + s] = [key, value];
            self.set_stamp(b2, s, clk);
            return InsertOutcome::Inserted;
        }
        // Least recently used of the 6: largest age modulo 2^16, ties to b1, then the lower slot.
        let mut best: Option<(u32, u64, usize)> = None;
        for (bucket, _) in [(b1, 0), (b2, 1)] {
            for s in 1..BUCKET_CELLS {
                let age = clk.wrapping_sub(self.stamp(bucket, s)) & 0xffff;
                if best.is_none_or(|(a, _, _)| age > a) {
                    best = Some((age, bucket, s));
                }
            }
        }
        let (_, vb, vs) = best.expect("6 candidates");
        if vb != b1 {
            self.set_overflow(b1, key);
        }
        let cell = &mut self.cells[Self::base(vb) + vs];
        let [vk, vv] = *cell;
        *cell = [key, value];
        self.set_stamp(vb, vs, clk);
        InsertOutcome::Evicted { key: vk, value: vv }
    }
}

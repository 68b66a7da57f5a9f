//! Byte-budgeted least-recently-used store for device-resident items (cubes, eigen systems).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::Digest;

/// Counters of the device level.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct DeviceLruStats {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    /// Items refused because they alone exceed the budget.
    pub refused: u64,
    pub entries: u64,
    pub bytes: u64,
    pub budget_bytes: u64,
}

struct Slot<T> {
    item: Arc<T>,
    bytes: u64,
    tick: u64,
}

/// Items keyed by digest, evicted least-recently-used first so that their bytes stay within the
/// budget. `get` and `put` both count as a use.
pub struct DeviceLru<T> {
    budget: u64,
    used: u64,
    tick: u64,
    items: HashMap<Digest, Slot<T>>,
    /// Use order: tick → digest (the smallest tick is the least recently used).
    order: BTreeMap<u64, Digest>,
    stats: DeviceLruStats,
}

impl<T> std::fmt::Debug for DeviceLru<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceLru")
            .field("stats", &self.stats())
            .finish()
    }
}

impl<T> DeviceLru<T> {
    pub fn new(budget_bytes: u64) -> Self {
        Self {
            budget: budget_bytes,
            used: 0,
            tick: 0,
            items: HashMap::new(),
            order: BTreeMap::new(),
            stats: DeviceLruStats::default(),
        }
    }

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// The item of `digest`, refreshed as most recently used.
    pub fn get(&mut self, digest: &Digest) -> Option<Arc<T>> {
        let tick = self.next_tick();
        match self.items.get_mut(digest) {
            Some(slot) => {
                self.order.remove(&slot.tick);
                slot.tick = tick;
                self.order.insert(tick, *digest);
                self.stats.hits += 1;
                Some(slot.item.clone())
            }
            None => {
                self.stats.misses += 1;
                None
            }
        }
    }

    /// Stores `item` (of `bytes` device bytes) under `digest`, replacing an older item of the same
    /// digest, and evicts least-recently-used items until the budget holds. Returns the evicted
    /// items; an item larger than the whole budget is not stored and comes back as `Err(item)`.
    pub fn put(
        &mut self,
        digest: Digest,
        item: Arc<T>,
        bytes: u64,
    ) -> Result<Vec<(Digest, Arc<T>)>, Arc<T>> {
        if bytes > self.budget {
            self.stats.refused += 1;
            return Err(item);
        }
        let mut evicted = Vec::new();
        if let Some(old) = self.items.remove(&digest) {
            self.order.remove(&old.tick);
            self.used -= old.bytes;
        }
        while self.used + bytes > self.budget {
            let (_, victim) = self.order.pop_first().expect("used > 0 implies an item");
            let slot = self.items.remove(&victim).expect("order and items agree");
            self.used -= slot.bytes;
            self.stats.evictions += 1;
            evicted.push((victim, slot.item));
        }
        let tick = self.next_tick();
        self.order.insert(tick, digest);
        self.items.insert(digest, Slot { item, bytes, tick });
        self.used += bytes;
        Ok(evicted)
    }

    /// Evicts the least recently used item (counted as an eviction), if there is one: the device
    /// level calls it when a job needs device memory the cache holds.
    pub fn evict_oldest(&mut self) -> Option<(Digest, Arc<T>)> {
        let (_, victim) = self.order.pop_first()?;
        let slot = self.items.remove(&victim).expect("order and items agree");
        self.used -= slot.bytes;
        self.stats.evictions += 1;
        Some((victim, slot.item))
    }

    /// The item of `digest` without refreshing it or counting a hit or a miss.
    pub fn peek(&self, digest: &Digest) -> Option<&Arc<T>> {
        self.items.get(digest).map(|s| &s.item)
    }

    /// Removes the item of `digest`, if any.
    pub fn remove(&mut self, digest: &Digest) -> Option<Arc<T>> {
        let slot = self.items.remove(digest)?;
        self.order.remove(&slot.tick);
        self.used -= slot.bytes;
        Some(slot.item)
    }

    pub fn used_bytes(&self) -> u64 {
        self.used
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn stats(&self) -> DeviceLruStats {
        DeviceLruStats {
            entries: self.items.len() as u64,
            bytes: self.used,
            budget_bytes: self.budget,
            ..self.stats
        }
    }
}

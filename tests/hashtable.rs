//! The CPU twin of the GPU hash table against an independent model: a `HashMap` of the entries plus
//! the clock of each key's last use. Eviction is checked precisely: an insert may evict only when
//! both candidate buckets were full before it, and the victim must be the entry of those 6 with the
//! largest LRU age (ties: primary bucket first, then the lower slot), the ages coming from the model's
//! own bookkeeping, never from the table's stamps.

use std::collections::HashMap;

use hypermnf::hashtable::{
    audit_cells, bucket_pair, digest_key, CpuHashTable, EraseOutcome, Geometry, HashTableError,
    InsertOutcome, Op, OpResult, BUCKET_CELLS, EMPTY_KEY, RESERVED_KEY,
};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Step {
    Insert(u64, u64),
    Find(u64, bool),
    Erase(u64),
}

fn step() -> impl Strategy<Value = Step> {
    // Few distinct keys, so that erase/re-insert, updates and full buckets are frequent.
    let key = 1u64..48;
    prop_oneof![
        5 => (key.clone(), any::<u64>()).prop_map(|(k, v)| Step::Insert(k, v)),
        3 => (key.clone(), any::<bool>()).prop_map(|(k, t)| Step::Find(k, t)),
        2 => key.prop_map(Step::Erase),
    ]
}

#[derive(Default)]
struct Model {
    entries: HashMap<u64, u64>,
    last_use: HashMap<u64, u32>,
}

/// Keys of the 6 slots of `key`'s two buckets, in tie-break order (None = empty).
fn candidates(t: &CpuHashTable, key: u64) -> Vec<Option<u64>> {
    let (b1, b2) = t.geometry().bucket_pair(key);
    let mut out = Vec::new();
    for b in [b1, b2] {
        for s in 1..BUCKET_CELLS {
            let k = t.cells()[b as usize * BUCKET_CELLS + s][0];
            out.push((k != EMPTY_KEY).then_some(k));
        }
    }
    out
}

fn dump_map(t: &CpuHashTable) -> HashMap<u64, u64> {
    t.cells()
        .iter()
        .enumerate()
        .filter(|(i, c)| i % BUCKET_CELLS != 0 && c[0] != EMPTY_KEY)
        .map(|(_, c)| (c[0], c[1]))
        .collect()
}

fn apply(t: &mut CpuHashTable, m: &mut Model, s: &Step) -> Result<(), TestCaseError> {
    match *s {
        Step::Insert(k, v) => {
            let before = candidates(t, k);
            let got = t.insert(k, v).unwrap();
            let clk = t.clock();
            match m.entries.get(&k).copied() {
                Some(old) => prop_assert_eq!(got, InsertOutcome::Updated { old }),
                None => {
                    let has_room = before.iter().any(Option::is_none);
                    if has_room {
                        prop_assert_eq!(got, InsertOutcome::Inserted);
                    } else {
                        // Expected victim: largest age (mod 2^16) among the 6, first in order on ties.
                        let mut best: Option<(u32, u64)> = None;
                        for c in before.iter().flatten() {
                            let age = clk.wrapping_sub(m.last_use[c]) & 0xffff;
                            if best.is_none_or(|(a, _)| age > a) {
                                best = Some((age, *c));
                            }
                        }
                        let victim = best.unwrap().1;
                        prop_assert_eq!(
                            got,
                            InsertOutcome::Evicted {
                                key: victim,
                                value: m.entries[&victim]
                            }
                        );
                        m.entries.remove(&victim);
                        m.last_use.remove(&victim);
                    }
                }
            }
            m.entries.insert(k, v);
            m.last_use.insert(k, clk);
        }
        Step::Find(k, touch) => {
            let got = t.find(k, touch).unwrap();
            prop_assert_eq!(got, m.entries.get(&k).copied());
            if touch && got.is_some() {
                m.last_use.insert(k, t.clock());
            }
        }
        Step::Erase(k) => {
            let got = t.erase(k).unwrap();
            match m.entries.remove(&k) {
                Some(value) => prop_assert_eq!(got, EraseOutcome::Erased { value }),
                None => prop_assert_eq!(got, EraseOutcome::Missing),
            }
            m.last_use.remove(&k);
        }
    }
    // After every step: no duplicates, nothing outside its buckets, and exactly the model's entries.
    let (bad, occupied) = audit_cells(t.geometry(), t.cells());
    prop_assert_eq!(bad, 0);
    prop_assert_eq!(occupied, m.entries.len() as u64);
    prop_assert_eq!(dump_map(t), m.entries.clone());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn twin_matches_model(cells in prop_oneof![Just(8u64), Just(16), Just(32), Just(64)],
                          steps in prop::collection::vec(step(), 1..300)) {
        let mut t = CpuHashTable::new(cells).unwrap();
        let mut m = Model::default();
        for s in &steps {
            apply(&mut t, &mut m, s)?;
        }
    }

    /// A mixed batch applied by the twin equals the same operations one by one (the twin's batches
    /// are sequential; only the clock differs, which `touch = false` and no eviction make invisible).
    #[test]
    fn mixed_batch_equals_single_steps(keys in prop::collection::vec((1u64..1000, any::<u64>(), 0u8..3), 1..200)) {
        let ops: Vec<Op> = keys.iter().map(|&(k, v, o)| match o {
            0 => Op::Insert(k, v), 1 => Op::Find(k), _ => Op::Erase(k),
        }).collect();
        let mut a = CpuHashTable::new(1 << 12).unwrap();
        let mut b = CpuHashTable::new(1 << 12).unwrap();
        let batch = a.mixed(&ops, false).unwrap();
        for (op, r) in ops.iter().zip(&batch) {
            let single = match *op {
                Op::Insert(k, v) => OpResult::Insert(b.insert(k, v).unwrap()),
                Op::Find(k) => OpResult::Find(b.find(k, false).unwrap()),
                Op::Erase(k) => OpResult::Erase(b.erase(k).unwrap()),
            };
            prop_assert_eq!(&single, r);
        }
        prop_assert_eq!(dump_map(&a), dump_map(&b));
    }
}

#[test]
fn reserved_keys_are_rejected_and_nothing_is_written() {
    let mut t = CpuHashTable::new(64).unwrap();
    for k in [EMPTY_KEY, RESERVED_KEY] {
        assert!(matches!(t.insert(k, 5), Err(HashTableError::ReservedKey { key, .. }) if key == k));
        assert!(matches!(
            t.find(k, true),
            Err(HashTableError::ReservedKey { .. })
        ));
        assert!(matches!(
            t.erase(k),
            Err(HashTableError::ReservedKey { .. })
        ));
    }
    // A reserved key anywhere in a batch rejects the whole batch before any write.
    let err = t
        .insert_batch(&[3, 4, RESERVED_KEY], &[1, 2, 3])
        .unwrap_err();
    assert!(matches!(err, HashTableError::ReservedKey { index: 2, .. }));
    assert!(t.is_empty());
    assert!(matches!(
        t.insert_batch(&[3], &[1, 2]),
        Err(HashTableError::LengthMismatch { .. })
    ));
}

#[test]
fn bad_capacities_are_rejected() {
    for c in [0u64, 4, 15, 17, 100, 1 << 33] {
        assert!(
            matches!(CpuHashTable::new(c), Err(HashTableError::BadCapacity(x)) if x == c),
            "{c}"
        );
    }
    assert_eq!(Geometry::new(64).unwrap().usable_slots(), 48);
    assert_eq!(Geometry::new(8).unwrap().buckets(), 2);
}

#[test]
fn candidate_buckets_differ_and_stay_in_range() {
    for mask in [1u64, 3, 1023] {
        for k in 1..5000u64 {
            let (b1, b2) = bucket_pair(k.wrapping_mul(0x9e37_79b9), mask);
            assert_ne!(b1, b2);
            assert!(b1 <= mask && b2 <= mask);
        }
    }
}

#[test]
fn digest_keys_avoid_the_reserved_values() {
    let mut d = [7u8; 32];
    assert_eq!(digest_key(&d), u64::from_le_bytes([7; 8]));
    d[..8].fill(0);
    assert_ne!(digest_key(&d), EMPTY_KEY);
    d[..8].fill(0xff);
    assert_ne!(digest_key(&d), RESERVED_KEY);
}

/// Filling one bucket pair far past its 6 slots keeps exactly 6 entries, evicts the oldest each
/// time, and a key that was looked up (touched) survives the next eviction.
#[test]
fn full_pair_evicts_least_recently_used() {
    let mut t = CpuHashTable::new(8).unwrap(); // 2 buckets: every key has the same pair
    for k in 1..=6u64 {
        assert_eq!(t.insert(k, k * 10).unwrap(), InsertOutcome::Inserted);
    }
    assert_eq!(t.find(1, true).unwrap(), Some(10)); // 1 becomes the most recent
    match t.insert(100, 1).unwrap() {
        InsertOutcome::Evicted { key, value } => {
            assert_eq!((key, value), (2, 20), "key 2 is the oldest untouched entry");
        }
        other => panic!("expected an eviction, got {other:?}"),
    }
    assert_eq!(t.len(), 6);
    assert_eq!(t.find(1, false).unwrap(), Some(10));
    assert_eq!(t.find(2, false).unwrap(), None);
    // Erase frees a slot that the next insert takes without evicting (no tombstone).
    assert_eq!(t.erase(5).unwrap(), EraseOutcome::Erased { value: 50 });
    assert_eq!(t.insert(200, 2).unwrap(), InsertOutcome::Inserted);
    assert_eq!(
        t.insert(5, 3).unwrap(),
        InsertOutcome::Evicted { key: 3, value: 30 }
    );
}

/// Many keys with erases in between: the dump never holds a key twice, and the overflow rule keeps
/// every stored key findable.
#[test]
fn churn_on_a_larger_table_keeps_every_key() {
    let mut t = CpuHashTable::new(1 << 10).unwrap();
    let mut model = HashMap::new();
    let mut x = 0x1234_5678_u64;
    for round in 0..20u64 {
        let keys: Vec<u64> = (0..600)
            .map(|i| hypermnf::hashtable::fmix64(round * 1000 + i + 1) | 1)
            .collect();
        let vals: Vec<u64> = keys.iter().map(|k| k ^ round).collect();
        for (o, (&k, &v)) in t
            .insert_batch(&keys, &vals)
            .unwrap()
            .into_iter()
            .zip(keys.iter().zip(&vals))
        {
            if let InsertOutcome::Evicted { key, .. } = o {
                model.remove(&key);
            }
            model.insert(k, v);
        }
        let erase: Vec<u64> = keys
            .iter()
            .copied()
            .filter(|_| {
                x = hypermnf::hashtable::fmix64(x);
                x % 2 == 0
            })
            .collect();
        for (o, k) in t.erase_batch(&erase).unwrap().into_iter().zip(&erase) {
            assert_eq!(o.is_erased(), model.remove(k).is_some());
        }
        assert_eq!(
            audit_cells(t.geometry(), t.cells()),
            (0, model.len() as u64)
        );
        let found = t
            .find_batch(&model.keys().copied().collect::<Vec<_>>(), false)
            .unwrap();
        assert!(found
            .iter()
            .zip(model.values())
            .all(|(f, v)| *f == Some(*v)));
    }
}

/// Entries stamped in the same batch have equal ages: the victim is then the first slot of the
/// primary bucket (the GPU's reduction order), read here from the cell layout.
#[test]
fn equal_ages_evict_the_primary_buckets_first_slot() {
    let mut t = CpuHashTable::new(8).unwrap();
    let keys: Vec<u64> = (1..=6).collect();
    let vals: Vec<u64> = keys.iter().map(|k| k + 1000).collect();
    assert!(t
        .insert_batch(&keys, &vals)
        .unwrap()
        .iter()
        .all(|o| *o == InsertOutcome::Inserted));
    let newcomer = 99u64;
    let (b1, _) = t.geometry().bucket_pair(newcomer);
    let first = t.cells()[b1 as usize * BUCKET_CELLS + 1];
    assert_eq!(
        t.insert(newcomer, 1).unwrap(),
        InsertOutcome::Evicted {
            key: first[0],
            value: first[1]
        }
    );
}

/// Without a usable GPU, creating the device table is a clean error, never a panic.
#[test]
fn gpu_table_without_a_device_is_an_error_not_a_panic() {
    match hypermnf::hashtable::GpuHashTable::new(64) {
        Ok(t) => assert_eq!(t.geometry().cells(), 64),
        Err(e) => assert!(
            matches!(
                e,
                HashTableError::NoDevice(_) | HashTableError::OldDevice(..)
            ),
            "unexpected error {e}"
        ),
    }
}

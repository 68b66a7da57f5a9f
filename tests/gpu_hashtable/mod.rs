//! GPU hash table tests (need an sm_90 CUDA device): the device table against its CPU twin, and the
//! races the design must survive. Included by tests/gpu.rs and tests/gpu_ht.rs.

use std::collections::{HashMap, HashSet};

use hypermnf::hashtable::{
    fmix64, CpuHashTable, EraseOutcome, GpuHashTable, HashTableError, InsertOutcome, Op, OpResult,
    BUCKET_CELLS, EMPTY_KEY, RESERVED_KEY,
};
use rand::{rngs::StdRng, Rng, SeedableRng};

fn gpu(cells: u64) -> GpuHashTable {
    GpuHashTable::new(cells).expect("an sm_90 CUDA device")
}

fn entries(cells: &[[u64; 2]]) -> HashMap<u64, u64> {
    cells
        .iter()
        .enumerate()
        .filter(|(i, c)| i % BUCKET_CELLS != 0 && c[0] != EMPTY_KEY)
        .map(|(_, c)| (c[0], c[1]))
        .collect()
}

fn assert_clean(t: &GpuHashTable) -> u64 {
    let (bad, occupied) = t.audit().unwrap();
    assert_eq!(bad, 0, "keys stored twice or outside their buckets");
    occupied
}

/// One operation per batch: results and every cell (stamps, overflow bits) equal the twin's.
#[test]
#[ignore = "needs a CUDA device"]
fn single_operations_match_the_twin_cell_for_cell() {
    for (cells, key_range, seed) in [(16u64, 30u64, 1u64), (64, 90, 2), (256, 400, 3)] {
        let mut g = gpu(cells);
        let mut c = CpuHashTable::new(cells).unwrap();
        let mut rng = StdRng::seed_from_u64(seed);
        let mut evictions = 0;
        for step in 0..1500 {
            let k = rng.random_range(1..key_range);
            let (rg, rc) = match rng.random_range(0..10) {
                0..=4 => {
                    let v: u64 = rng.random();
                    let (a, b) = (g.insert(k, v).unwrap(), c.insert(k, v).unwrap());
                    evictions += matches!(b, InsertOutcome::Evicted { .. }) as u32;
                    (OpResult::Insert(a), OpResult::Insert(b))
                }
                5..=7 => {
                    let touch = rng.random_bool(0.5);
                    (
                        OpResult::Find(g.find(k, touch).unwrap()),
                        OpResult::Find(c.find(k, touch).unwrap()),
                    )
                }
                _ => (
                    OpResult::Erase(g.erase(k).unwrap()),
                    OpResult::Erase(c.erase(k).unwrap()),
                ),
            };
            assert_eq!(rg, rc, "cells {cells}, step {step}, key {k}");
            if step % 25 == 0 || step == 1499 {
                assert_eq!(g.dump().unwrap(), c.cells(), "cells {cells}, step {step}");
            }
        }
        assert!(
            evictions > 0,
            "the sequence must exercise eviction (cells {cells})"
        );
        assert_clean(&g);
    }
}

/// Batches of distinct keys at a load (0.09) where no bucket pair fills up: same results and same
/// entries as the twin (slot positions may differ; with evictions the victims could differ too).
#[test]
#[ignore = "needs a CUDA device"]
fn distinct_key_batches_match_the_twin() {
    let cells = 1u64 << 18;
    let mut g = gpu(cells);
    let mut c = CpuHashTable::new(cells).unwrap();
    let keys: Vec<u64> = (1..=20_000u64).map(|i| fmix64(i) | 1).collect();
    let vals: Vec<u64> = keys.iter().map(|k| k.rotate_left(17) ^ 0xabcdef).collect();
    assert_eq!(
        g.insert_batch(&keys, &vals).unwrap(),
        c.insert_batch(&keys, &vals).unwrap()
    );
    assert_eq!(entries(&g.dump().unwrap()), entries(c.cells()));
    let erase: Vec<u64> = keys.iter().step_by(3).copied().collect();
    assert_eq!(
        g.erase_batch(&erase).unwrap(),
        c.erase_batch(&erase).unwrap()
    );
    let probe: Vec<u64> = keys
        .iter()
        .copied()
        .chain((1..5000u64).map(|i| fmix64(i + 1_000_000) | 1))
        .collect();
    let found = g.find_batch(&probe, false).unwrap();
    assert_eq!(found, c.find_batch(&probe, false).unwrap());
    assert!(found.iter().filter(|f| f.is_some()).count() > 10_000);
    // Re-insert the erased keys with new values: updates nowhere, no duplicates.
    let vals2: Vec<u64> = erase.iter().map(|k| !k).collect();
    assert_eq!(
        g.insert_batch(&erase, &vals2).unwrap(),
        c.insert_batch(&erase, &vals2).unwrap()
    );
    assert_eq!(entries(&g.dump().unwrap()), entries(c.cells()));
    assert_eq!(assert_clean(&g), c.len());
}

/// 64 K concurrent inserts of one key: exactly one entry, one `Inserted`, and a value that was written.
#[test]
#[ignore = "needs a CUDA device"]
fn concurrent_inserts_of_one_key_leave_one_entry() {
    let mut g = gpu(1 << 12);
    let n = 1 << 16;
    let keys = vec![0x5eed_u64; n];
    let vals: Vec<u64> = (0..n as u64).map(|i| i * 7 + 3).collect();
    let out = g.insert_batch(&keys, &vals).unwrap();
    let inserted = out
        .iter()
        .filter(|o| **o == InsertOutcome::Inserted)
        .count();
    let failed = out.iter().filter(|o| **o == InsertOutcome::Failed).count();
    assert_eq!(inserted, 1, "exactly one insert claims a slot");
    assert_eq!(
        out.iter()
            .filter(|o| matches!(o, InsertOutcome::Evicted { .. }))
            .count(),
        0
    );
    eprintln!(
        "one key, {n} concurrent inserts: {failed} ran out of attempts (allowed under contention)"
    );
    assert_eq!(assert_clean(&g), 1);
    let v = g.find(0x5eed, false).unwrap().expect("the key is stored");
    assert!(vals.contains(&v));

    // 4096 keys, each inserted 64 times in one shuffled batch, into a table with room for all.
    let mut g = gpu(1 << 14);
    let mut rng = StdRng::seed_from_u64(9);
    let mut ops: Vec<(u64, u64)> = (1..=4096u64)
        .flat_map(|k| (0..64).map(move |r| (fmix64(k) | 1, r)))
        .collect();
    for i in (1..ops.len()).rev() {
        ops.swap(i, rng.random_range(0..=i));
    }
    let (keys, vals): (Vec<u64>, Vec<u64>) = ops.iter().copied().unzip();
    let out = g.insert_batch(&keys, &vals).unwrap();
    assert_eq!(
        out.iter()
            .filter(|o| **o == InsertOutcome::Inserted)
            .count(),
        4096
    );
    assert_eq!(assert_clean(&g), 4096);
}

/// Concurrent inserts, erases and finds in one mixed batch, with evictions: afterwards no key is
/// stored twice, every key that no operation erased or evicted is present, and every stored value
/// is one that was written for that key.
#[test]
#[ignore = "needs a CUDA device"]
fn mixed_concurrent_batches_lose_nothing() {
    let cells = 1u64 << 14; // 14 336 slots
    let mut g = gpu(cells);
    let base: Vec<u64> = (1..=8000u64).map(|i| fmix64(i) | 1).collect();
    let bvals: Vec<u64> = base.iter().map(|k| k ^ 1).collect();
    g.insert_batch(&base, &bvals).unwrap();
    let mut rng = StdRng::seed_from_u64(11);
    for round in 0..5u64 {
        let mut ops = Vec::new();
        let mut written: HashMap<u64, HashSet<u64>> = HashMap::new();
        for i in 0..20_000u64 {
            let op = match rng.random_range(0..10) {
                0..=3 => {
                    let k = fmix64(1_000_000 * (round + 1) + i) | 1; // fresh keys: the table overfills and evicts
                    let v = rng.random();
                    written.entry(k).or_default().insert(v);
                    Op::Insert(k, v)
                }
                4..=5 => Op::Erase(base[rng.random_range(0..base.len())]),
                _ => Op::Find(base[rng.random_range(0..base.len())]),
            };
            ops.push(op);
        }
        let before = entries(&g.dump().unwrap());
        let res = g.mixed(&ops, true).unwrap();
        let after = entries(&g.dump().unwrap());
        let mut gone: HashSet<u64> = HashSet::new();
        for (op, r) in ops.iter().zip(&res) {
            match (op, r) {
                (Op::Erase(k), OpResult::Erase(EraseOutcome::Erased { .. })) => {
                    gone.insert(*k);
                }
                (_, OpResult::Insert(InsertOutcome::Evicted { key, value })) => {
                    assert!(
                        before.get(key) == Some(value)
                            || written.get(key).is_some_and(|w| w.contains(value)),
                        "evicted entry ({key:#x}, {value:#x}) was never stored"
                    );
                    gone.insert(*key);
                }
                (Op::Find(k), OpResult::Find(Some(v))) => assert_eq!(before.get(k), Some(v)),
                _ => {}
            }
        }
        for (k, v) in &before {
            if !gone.contains(k) {
                assert_eq!(after.get(k), Some(v), "round {round}: key {k:#x} lost");
            }
        }
        for (k, v) in &after {
            assert!(before.get(k) == Some(v) || written.get(k).is_some_and(|w| w.contains(v)));
        }
        assert_eq!(assert_clean(&g), after.len() as u64);
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn reserved_keys_are_rejected_on_the_device_too() {
    let mut g = gpu(64);
    assert!(matches!(
        g.insert(RESERVED_KEY, 1),
        Err(HashTableError::ReservedKey { .. })
    ));
    assert!(matches!(
        g.find_batch(&[5, EMPTY_KEY], true),
        Err(HashTableError::ReservedKey { index: 1, .. })
    ));
    assert_eq!(assert_clean(&g), 0);
    assert!(matches!(
        GpuHashTable::new(100),
        Err(HashTableError::BadCapacity(100))
    ));
}

//! GPU hash table tests (need an sm_90 CUDA device): the device table against its CPU twin, and the
//! races the design must survive. Ignored elsewhere; run on the GPU host with `--include-ignored`.

use std::collections::{HashMap, HashSet};

use hypermnf::hashtable::{
    fmix64, CpuHashTable, EraseOutcome, Geometry, GpuHashTable, HashTableError, InsertOutcome, Op,
    OpResult, BUCKET_CELLS, EMPTY_KEY, RESERVED_KEY, SLOTS_PER_BUCKET,
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
    single_operations_match_the_twin(false);
}

/// The same with every insert going through the insert-only kernel `ht_insert` (its lock-free fast
/// path must do sequentially exactly what the locked path and the twin do).
#[test]
#[ignore = "needs a CUDA device"]
fn single_insert_only_operations_match_the_twin_cell_for_cell() {
    single_operations_match_the_twin(true);
}

fn single_operations_match_the_twin(insert_only: bool) {
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
                    let a = if insert_only {
                        g.insert_only(k, v).unwrap()
                    } else {
                        g.insert(k, v).unwrap()
                    };
                    let b = c.insert(k, v).unwrap();
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
            assert_eq!(
                rg, rc,
                "cells {cells}, step {step}, key {k}, insert_only {insert_only}"
            );
            if step % 25 == 0 || step == 1499 {
                assert_eq!(
                    g.dump().unwrap(),
                    c.cells(),
                    "cells {cells}, step {step}, insert_only {insert_only}"
                );
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

    // 4096 keys, each inserted 64 times in one shuffled batch, into a table with room for all
    // (load 0.08: no bucket pair of these keys fills up).
    let mut g = gpu(1 << 16);
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
    let cells = 1u64 << 14; // 12 288 slots
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

/// Keys (from 1, 2, ...) whose primary bucket is `b1`, in a table of `cells` cells.
fn keys_with_primary(cells: u64, b1: u64, count: usize, skip: &[u64]) -> Vec<u64> {
    let geo = Geometry::new(cells).unwrap();
    (1u64..)
        .map(|i| fmix64(i ^ 0x1234_5678) | 1)
        .filter(|k| geo.bucket_pair(*k).0 == b1 && !skip.contains(k))
        .take(count)
        .collect()
}

/// The bucket (0..buckets) and slot of every copy of `key` in a dump.
fn copies(cells: &[[u64; 2]], key: u64) -> Vec<(usize, usize)> {
    cells
        .iter()
        .enumerate()
        .filter(|(i, c)| i % BUCKET_CELLS != 0 && c[0] == key)
        .map(|(i, _)| (i / BUCKET_CELLS, i % BUCKET_CELLS))
        .collect()
}

/// 64 K concurrent inserts of one absent `key` through ht_insert (values `i * mult + 1`): exactly one
/// claims a slot and none evicts; the rest update it or run out of attempts. Returns the values.
fn insert_one_key_concurrently(g: &mut GpuHashTable, key: u64, mult: u64) -> Vec<u64> {
    let n = 1 << 16;
    let keys = vec![key; n];
    let vals: Vec<u64> = (0..n as u64).map(|i| i * mult + 1).collect();
    let out = g.insert_only_batch(&keys, &vals).unwrap();
    let count = |f: &dyn Fn(&InsertOutcome) -> bool| out.iter().filter(|o| f(o)).count();
    assert_eq!(count(&|o| *o == InsertOutcome::Inserted), 1, "exactly one insert claims a slot");
    assert_eq!(count(&|o| matches!(o, InsertOutcome::Evicted { .. })), 0);
    eprintln!(
        "one key, {n} concurrent ht_insert calls: {} ran out of attempts (allowed under contention)",
        count(&|o| *o == InsertOutcome::Failed)
    );
    vals
}

/// ht_insert's lock-free path: 64 K concurrent inserts of one absent key into a table whose primary
/// bucket for that key has holes (made by erases in an earlier batch) leave exactly one entry, in
/// the lowest hole, with one of the written values; then 32 concurrent inserts of each of 3000 keys
/// (erased ones and new ones, shuffled) over a table with holes everywhere.
#[test]
#[ignore = "needs a CUDA device"]
fn insert_only_concurrent_same_key_into_holes_leaves_one_entry() {
    let cells = 64u64; // 16 buckets
    let mut g = gpu(cells);
    let key = fmix64(0xfeed) | 1;
    let b1 = Geometry::new(cells).unwrap().bucket_pair(key).0;
    let fill = keys_with_primary(cells, b1, SLOTS_PER_BUCKET, &[key]);
    let fvals: Vec<u64> = fill.iter().map(|k| k ^ 5).collect();
    assert!(g
        .insert_batch(&fill, &fvals)
        .unwrap()
        .iter()
        .all(|o| *o == InsertOutcome::Inserted));
    // Holes at slots 1 and 3 of b1 (which key took which slot in that batch is read from the dump).
    let dump = g.dump().unwrap();
    let at = |s: usize| dump[b1 as usize * BUCKET_CELLS + s][0];
    let holes = [at(1), at(3)];
    assert!(g.erase_batch(&holes).unwrap().iter().all(|o| o.is_erased()));
    let vals = insert_one_key_concurrently(&mut g, key, 11);
    assert_eq!(assert_clean(&g), SLOTS_PER_BUCKET as u64 - 1);
    let dump = g.dump().unwrap();
    assert_eq!(copies(&dump, key), vec![(b1 as usize, 1)], "the lowest hole of b1");
    let v = g.find(key, false).unwrap().expect("the key is stored");
    assert!(vals.contains(&v));

    // Many keys, each 32 times, over a table with holes: one entry each, no failures (a lane's
    // CAS retries on one slot outnumber its 31 rivals), values that were written.
    let cells = 1u64 << 16;
    let mut g = gpu(cells);
    let mut c = CpuHashTable::new(cells).unwrap();
    let base: Vec<u64> = (1..=4000u64).map(|i| fmix64(i) | 1).collect();
    let bvals: Vec<u64> = base.iter().map(|k| k ^ 1).collect();
    g.insert_batch(&base, &bvals).unwrap();
    c.insert_batch(&base, &bvals).unwrap();
    let erase: Vec<u64> = base.iter().step_by(2).copied().collect();
    g.erase_batch(&erase).unwrap();
    c.erase_batch(&erase).unwrap();
    let fresh: Vec<u64> = (1..=1000u64).map(|i| fmix64(i + 500_000) | 1).collect();
    let distinct: Vec<u64> = erase.iter().chain(&fresh).copied().collect();
    // The premise: at this load (0.1) no bucket pair of these keys fills up, nothing is evicted.
    let twin_vals: Vec<u64> = distinct.iter().map(|k| k.rotate_left(7)).collect();
    assert!(c
        .insert_batch(&distinct, &twin_vals)
        .unwrap()
        .iter()
        .all(|o| *o == InsertOutcome::Inserted));
    let mut rng = StdRng::seed_from_u64(21);
    let mut ops: Vec<(u64, u64)> = distinct
        .iter()
        .flat_map(|&k| (0..32u64).map(move |r| (k, k.rotate_left(7) ^ r)))
        .collect();
    for i in (1..ops.len()).rev() {
        ops.swap(i, rng.random_range(0..=i));
    }
    let (keys, vals): (Vec<u64>, Vec<u64>) = ops.iter().copied().unzip();
    let out = g.insert_only_batch(&keys, &vals).unwrap();
    let inserted = out.iter().filter(|o| **o == InsertOutcome::Inserted).count();
    assert!(out.iter().all(|o| matches!(o, InsertOutcome::Inserted | InsertOutcome::Updated { .. })));
    assert_eq!(inserted, distinct.len(), "one Inserted per absent key");
    let after = entries(&g.dump().unwrap());
    for k in &distinct {
        let v = after.get(k).expect("every inserted key is stored");
        assert!((0..32u64).any(|r| *v == k.rotate_left(7) ^ r));
    }
    assert_eq!(assert_clean(&g), c.len());
    // The twin, which inserted the same keys once, holds the same set of keys.
    let twin = entries(c.cells());
    assert_eq!(
        after.keys().collect::<HashSet<_>>(),
        twin.keys().collect::<HashSet<_>>()
    );
}

/// A key living in b2 (b1 was full, so b1's overflow bit is set), whose b1 later got holes from
/// erases: inserting it again through ht_insert, alone or 4096 times concurrently, updates it in
/// b2 and never puts a second copy into b1's holes.
#[test]
#[ignore = "needs a CUDA device"]
fn insert_only_updates_a_key_in_b2_despite_holes_in_b1() {
    let cells = 64u64;
    let geo = Geometry::new(cells).unwrap();
    let mut g = gpu(cells);
    let mut c = CpuHashTable::new(cells).unwrap();
    let key = fmix64(0xb2b2) | 1;
    let (b1, b2) = geo.bucket_pair(key);
    let fill = keys_with_primary(cells, b1, SLOTS_PER_BUCKET, &[key]);
    for &k in &fill {
        assert_eq!(g.insert(k, k ^ 3).unwrap(), InsertOutcome::Inserted);
        assert_eq!(c.insert(k, k ^ 3).unwrap(), InsertOutcome::Inserted);
    }
    assert_eq!(g.insert(key, 1).unwrap(), InsertOutcome::Inserted);
    assert_eq!(c.insert(key, 1).unwrap(), InsertOutcome::Inserted);
    assert_eq!(copies(&g.dump().unwrap(), key), copies(c.cells(), key));
    assert_eq!(copies(&g.dump().unwrap(), key)[0].0 as u64, b2, "b1 was full: the key went to b2");
    let holes = [fill[0], fill[2]];
    assert_eq!(g.erase_batch(&holes).unwrap(), c.erase_batch(&holes).unwrap());
    // One insert: updated in b2, cell for cell as the twin.
    assert_eq!(
        g.insert_only(key, 2).unwrap(),
        InsertOutcome::Updated { old: 1 }
    );
    assert_eq!(c.insert(key, 2).unwrap(), InsertOutcome::Updated { old: 1 });
    assert_eq!(g.dump().unwrap(), c.cells());
    assert_eq!(g.find(key, false).unwrap(), Some(2));
    // Many at once, mixed with inserts of other keys that take b1's holes.
    let mut skip = fill.clone();
    skip.push(key);
    let others = keys_with_primary(cells, b1, 2, &skip);
    let mut keys = vec![key; 4096];
    let mut vals: Vec<u64> = (0..4096u64).map(|i| 100 + i).collect();
    keys.extend(&others);
    vals.extend(others.iter().map(|k| k ^ 9));
    let out = g.insert_only_batch(&keys, &vals).unwrap();
    for o in &out[..4096] {
        assert!(
            matches!(o, InsertOutcome::Updated { .. } | InsertOutcome::Failed),
            "the key is present: {o:?}"
        );
    }
    assert!(out[4096..].iter().all(|o| *o == InsertOutcome::Inserted), "{:?}", &out[4096..]);
    let dump = g.dump().unwrap();
    let at = copies(&dump, key);
    assert_eq!(at.len(), 1, "one copy: {at:?}");
    assert_eq!(at[0].0 as u64, b2);
    let v = g.find(key, false).unwrap().expect("stored");
    assert!((100..100 + 4096).contains(&v) || v == 2);
    assert_clean(&g);
}

/// ht_insert's lock-free claims into b2: 64 K concurrent inserts of one absent key whose b1 is full
/// leave exactly one entry, in the lowest empty slot of its b2, with its overflow tag set in b1 (the
/// audit checks the tag), and the key is found afterwards.
#[test]
#[ignore = "needs a CUDA device"]
fn insert_only_concurrent_same_key_into_b2_leaves_one_entry() {
    let cells = 64u64;
    let geo = Geometry::new(cells).unwrap();
    let mut g = gpu(cells);
    let key = fmix64(0xb2c1) | 1;
    let (b1, b2) = geo.bucket_pair(key);
    let fill = keys_with_primary(cells, b1, SLOTS_PER_BUCKET, &[key]);
    let fvals: Vec<u64> = fill.iter().map(|k| k ^ 7).collect();
    assert!(g.insert_batch(&fill, &fvals).unwrap().iter().all(|o| *o == InsertOutcome::Inserted));
    let dump = g.dump().unwrap();
    let lowest_empty_of_b2 = (1..BUCKET_CELLS)
        .find(|&s| dump[b2 as usize * BUCKET_CELLS + s][0] == EMPTY_KEY)
        .expect("b2 has room");
    let vals = insert_one_key_concurrently(&mut g, key, 13);
    assert_eq!(copies(&g.dump().unwrap(), key), vec![(b2 as usize, lowest_empty_of_b2)]);
    assert_eq!(assert_clean(&g), SLOTS_PER_BUCKET as u64 + 1);
    let v = g.find(key, false).unwrap().expect("the key is found through its tag");
    assert!(vals.contains(&v));
}

/// Insert-only batches that overfill a small table, so that many inserts evict (in ht_insert_rest)
/// while others claim concurrently: afterwards no key is stored twice, and the
/// table holds exactly the batch's keys minus those reported evicted or failed, with their values.
#[test]
#[ignore = "needs a CUDA device"]
fn insert_only_batches_that_evict_lose_nothing() {
    let cells = 1u64 << 10; // 768 slots
    let mut g = gpu(cells);
    let mut present: HashMap<u64, u64> = HashMap::new();
    for round in 0..4u64 {
        let keys: Vec<u64> = (1..=700u64).map(|i| fmix64(round * 10_000 + i) | 1).collect();
        let vals: Vec<u64> = keys.iter().map(|k| k.rotate_left(11) ^ round).collect();
        let out = g.insert_only_batch(&keys, &vals).unwrap();
        let mut evicted = 0;
        for ((k, v), o) in keys.iter().zip(&vals).zip(&out) {
            match o {
                InsertOutcome::Inserted => {
                    present.insert(*k, *v);
                }
                InsertOutcome::Evicted { .. } => {
                    evicted += 1;
                    present.insert(*k, *v);
                }
                InsertOutcome::Updated { .. } => panic!("round {round}: key {k:#x} was not present"),
                InsertOutcome::Failed => {}
            }
        }
        for o in &out {
            if let InsertOutcome::Evicted { key, value } = o {
                assert_eq!(present.remove(key), Some(*value), "round {round}: evicted an entry that was not there");
            }
        }
        assert!(round == 0 || evicted > 0, "round {round}: the batch must evict");
        assert_eq!(entries(&g.dump().unwrap()), present, "round {round}");
        assert_eq!(assert_clean(&g), present.len() as u64);
    }
}

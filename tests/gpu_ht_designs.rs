//! GPU tests of the published designs that `hypermnf bench hashtable` compares with the job cache's
//! table (need an sm_90 CUDA device): the hopscotch table after GLHT and SlabHash, each against a
//! `HashMap` model, plus the cases each design must survive (concurrent inserts of one key, keys
//! piled on a few homes or buckets, a pool that runs out). Ignored elsewhere; run on the GPU host with
//! `--include-ignored`.

/// The GPU suites' helpers (`common::gpu`: the printed random seed).
mod common;

use std::collections::{HashMap, HashSet};

use hypermnf::bench::hashtable::hopscotch::HopscotchTable;
use hypermnf::bench::hashtable::slab::SlabHashTable;
use hypermnf::bench::hashtable::BatchKernels;
use hypermnf::hashtable::{fmix64, EraseOutcome, HashTableError, InsertOutcome, RESERVED_KEY};
use common::gpu::seed;
use rand::{rngs::StdRng, Rng, SeedableRng};

/// What the tests drive of a design.
trait Table {
    fn ins(&mut self, k: &[u64], v: &[u64]) -> Vec<InsertOutcome>;
    fn find(&mut self, k: &[u64]) -> Vec<Option<u64>>;
    fn erase(&mut self, k: &[u64]) -> Vec<EraseOutcome>;
    /// (problems, stored entries)
    fn audit(&self) -> (u64, u64);
    fn entries(&self) -> HashMap<u64, u64>;
    fn reserved_rejected(&mut self) -> bool;
}

impl Table for HopscotchTable {
    fn ins(&mut self, k: &[u64], v: &[u64]) -> Vec<InsertOutcome> {
        self.insert_batch(k, v).unwrap()
    }
    fn find(&mut self, k: &[u64]) -> Vec<Option<u64>> {
        self.find_batch(k).unwrap()
    }
    fn erase(&mut self, k: &[u64]) -> Vec<EraseOutcome> {
        self.erase_batch(k).unwrap()
    }
    fn audit(&self) -> (u64, u64) {
        HopscotchTable::audit(self).unwrap()
    }
    fn entries(&self) -> HashMap<u64, u64> {
        HopscotchTable::entries(self).unwrap()
    }
    fn reserved_rejected(&mut self) -> bool {
        matches!(self.insert_batch(&[5, 0], &[1, 2]), Err(HashTableError::ReservedKey { index: 1, .. }))
            && matches!(self.find_batch(&[RESERVED_KEY]), Err(HashTableError::ReservedKey { .. }))
            && matches!(self.erase_batch(&[0]), Err(HashTableError::ReservedKey { .. }))
    }
}

impl Table for SlabHashTable {
    fn ins(&mut self, k: &[u64], v: &[u64]) -> Vec<InsertOutcome> {
        self.insert_batch(k, v).unwrap()
    }
    fn find(&mut self, k: &[u64]) -> Vec<Option<u64>> {
        self.find_batch(k).unwrap()
    }
    fn erase(&mut self, k: &[u64]) -> Vec<EraseOutcome> {
        self.erase_batch(k).unwrap()
    }
    fn audit(&self) -> (u64, u64) {
        let (bad, occupied, _) = SlabHashTable::audit(self).unwrap();
        (bad, occupied)
    }
    fn entries(&self) -> HashMap<u64, u64> {
        SlabHashTable::entries(self).unwrap()
    }
    fn reserved_rejected(&mut self) -> bool {
        matches!(self.insert_batch(&[5, 0], &[1, 2]), Err(HashTableError::ReservedKey { index: 1, .. }))
            && matches!(self.find_batch(&[RESERVED_KEY]), Err(HashTableError::ReservedKey { .. }))
            && matches!(self.erase_batch(&[0]), Err(HashTableError::ReservedKey { .. }))
    }
}

fn hopscotch(slots: u64) -> HopscotchTable {
    HopscotchTable::new(slots).expect("an sm_90 CUDA device")
}

fn slab(buckets: u64, pool: u64) -> SlabHashTable {
    SlabHashTable::new(buckets, pool).expect("an sm_90 CUDA device")
}

fn assert_matches_model(t: &impl Table, model: &HashMap<u64, u64>, what: &str) {
    let (bad, occupied) = t.audit();
    assert_eq!(bad, 0, "{what}: the audit found keys stored twice or out of place");
    assert_eq!(occupied, model.len() as u64, "{what}: stored entries");
    assert_eq!(&t.entries(), model, "{what}: the table's entries differ from the model's");
}

/// A few operations: the kernels compile, run and give the obvious answers.
fn tiny_case(t: &mut impl Table) {
    assert_eq!(t.ins(&[7, 8, 9], &[70, 80, 90]), vec![InsertOutcome::Inserted; 3]);
    assert_eq!(t.ins(&[8], &[81]), vec![InsertOutcome::Updated { old: 80 }]);
    assert_eq!(t.find(&[7, 8, 9, 10]), vec![Some(70), Some(81), Some(90), None]);
    assert_eq!(t.erase(&[9, 10]), vec![EraseOutcome::Erased { value: 90 }, EraseOutcome::Missing]);
    assert_eq!(t.find(&[9]), vec![None]);
    assert!(t.reserved_rejected(), "reserved keys must be rejected");
    assert_matches_model(t, &HashMap::from([(7, 70), (8, 81)]), "tiny case");
}

#[test]
#[ignore = "needs a CUDA device"]
fn hopscotch_tiny_case() {
    tiny_case(&mut hopscotch(64));
}

#[test]
#[ignore = "needs a CUDA device"]
fn slab_tiny_case() {
    tiny_case(&mut slab(2, 4));
}

/// Random batches of distinct keys (inserts of present and absent keys, erases, finds) against a
/// HashMap: with distinct keys a batch's results are those of any sequential order. `cap` bounds the
/// model's size; an insert may fail only when `may_fail` says so at that fill, and then leaves the
/// key absent.
fn random_batches(t: &mut impl Table, rng: &mut StdRng, universe: u64, cap: usize, rounds: usize) -> u64 {
    let mut model: HashMap<u64, u64> = HashMap::new();
    let mut failed = 0;
    let pick = |rng: &mut StdRng, n: usize| -> Vec<u64> {
        let mut s = HashSet::new();
        while s.len() < n {
            s.insert(fmix64(rng.random_range(1..=universe)) | 1);
        }
        s.into_iter().collect()
    };
    for round in 0..rounds {
        // Inserts: as many as keep the model within cap (present keys only update).
        let n = rng.random_range(1..=64);
        let keys: Vec<u64> = pick(rng, n);
        let absent = keys.iter().filter(|k| !model.contains_key(k)).count();
        let keys: Vec<u64> = if model.len() + absent > cap {
            keys.into_iter().filter(|k| model.contains_key(k)).collect()
        } else {
            keys
        };
        if !keys.is_empty() {
            let vals: Vec<u64> = keys.iter().map(|_| rng.random()).collect();
            let got = t.ins(&keys, &vals);
            for ((k, v), o) in keys.iter().zip(&vals).zip(got) {
                match (model.get(k).copied(), o) {
                    (None, InsertOutcome::Inserted) => {
                        model.insert(*k, *v);
                    }
                    (Some(old), InsertOutcome::Updated { old: o }) => {
                        assert_eq!(old, o, "round {round}: old value of {k:#x}");
                        model.insert(*k, *v);
                    }
                    (None, InsertOutcome::Failed) => failed += 1,
                    (m, o) => panic!("round {round}: insert of {k:#x} gave {o:?}, model {m:?}"),
                }
            }
        }
        // Erases of present and absent keys.
        let n = rng.random_range(1..=24);
        let mut keys: Vec<u64> = model.keys().copied().take(n / 2).collect();
        let extra: Vec<u64> = pick(rng, n - keys.len()).into_iter().filter(|k| !keys.contains(k)).collect();
        keys.extend(extra);
        let got = t.erase(&keys);
        for (k, o) in keys.iter().zip(got) {
            match model.remove(k) {
                Some(v) => assert_eq!(o, EraseOutcome::Erased { value: v }, "round {round}: erase {k:#x}"),
                None => assert_eq!(o, EraseOutcome::Missing, "round {round}: erase {k:#x}"),
            }
        }
        // Finds (repeats allowed).
        let mut keys: Vec<u64> = model.keys().copied().take(32).collect();
        keys.extend((0..32).map(|_| fmix64(rng.random_range(1..=universe)) | 1));
        let got = t.find(&keys);
        for (k, g) in keys.iter().zip(got) {
            assert_eq!(g, model.get(k).copied(), "round {round}: find {k:#x}");
        }
        if round % 16 == 15 {
            assert_matches_model(t, &model, &format!("round {round}"));
        }
    }
    assert_matches_model(t, &model, "end");
    failed
}

#[test]
#[ignore = "needs a CUDA device"]
fn hopscotch_random_batches_match_a_hashmap() {
    let mut rng = StdRng::seed_from_u64(seed());
    // 256 slots filled to at most 0.85: displacements are frequent, failures must not happen.
    let mut t = hopscotch(256);
    let failed = random_batches(&mut t, &mut rng, 600, 217, 300);
    assert_eq!(failed, 0, "inserts failed at load <= 0.85");
}

#[test]
#[ignore = "needs a CUDA device"]
fn slab_random_batches_match_a_hashmap() {
    let mut rng = StdRng::seed_from_u64(seed());
    // 4 buckets: chains of several slabs, erases leave holes in front of keys.
    let mut t = slab(4, 64);
    let failed = random_batches(&mut t, &mut rng, 600, 300, 300);
    assert_eq!(failed, 0, "the pool of 64 slabs cannot run out with 300 keys");
}

/// Keys whose home (hopscotch) / bucket (slab) is `target` under `mask`.
fn keys_at(mask: u64, target: u64, count: usize, from: u64) -> Vec<u64> {
    (from..)
        .map(|i| fmix64(i) | 1)
        .filter(|&k| fmix64(k) & mask == target)
        .take(count)
        .collect()
}

/// Many inserts of one key in one batch (and of other keys beside it) leave one entry, holding one
/// of the values written; exactly one reports Inserted.
fn one_key_many_inserts(t: &mut impl Table, others: Vec<u64>) {
    let key = 0x1234_5678_9abc_def1u64;
    for round in 0..4u64 {
        let mut keys = vec![key; 2048];
        keys.extend(&others);
        let vals: Vec<u64> = (0..keys.len() as u64).map(|i| i + 1000 * round + 1).collect();
        let got = t.ins(&keys, &vals);
        let inserted = got[..2048].iter().filter(|o| **o == InsertOutcome::Inserted).count();
        assert_eq!(inserted, usize::from(round == 0), "round {round}: Inserted outcomes of the repeated key");
        assert!(got.iter().all(|o| !matches!(o, InsertOutcome::Failed)), "round {round}: a failed insert");
        let v = t.find(&[key])[0].expect("the key is stored");
        assert!(vals[..2048].contains(&v), "round {round}: value {v} was never written");
        let (bad, occupied) = t.audit();
        assert_eq!(bad, 0, "round {round}: audit");
        assert_eq!(occupied, 1 + others.len() as u64, "round {round}: entries");
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn hopscotch_concurrent_inserts_of_one_key_leave_one_entry() {
    let mut t = hopscotch(1024);
    let home = fmix64(0x1234_5678_9abc_def1) & 1023;
    // Other keys of the same home and of the homes just before it, inserted in the same batches:
    // the repeated key's inserts contend for the home's lock while holes move around them.
    let mut others = keys_at(1023, home, 12, 1);
    others.extend(keys_at(1023, (home + 1023) & 1023, 12, 1));
    one_key_many_inserts(&mut t, others);
}

#[test]
#[ignore = "needs a CUDA device"]
fn slab_concurrent_inserts_of_one_key_leave_one_entry() {
    // 2 buckets, 200 other keys: every warp's insert walks and extends the same two chains.
    let mut t = slab(2, 64);
    let others: Vec<u64> = (1..=200u64).map(|i| fmix64(i) | 1).filter(|&k| k != 0x1234_5678_9abc_def1).collect();
    one_key_many_inserts(&mut t, others);
}

#[test]
#[ignore = "needs a CUDA device"]
fn hopscotch_keys_piled_on_few_homes_are_displaced_home() {
    // 4 keys for each of 8 neighbouring homes (32 keys for the 39 slots they can reach) and 8 keys
    // of the home 32 slots on. One key per batch, last home first: the first home's keys find their
    // nearest holes beyond its neighbourhood, and only displacement brings them in.
    let mask = 4095u64;
    let base = 1000u64;
    let mut keys = keys_at(mask, base + 32, 8, 1);
    for h in (0..8).rev() {
        keys.extend(keys_at(mask, base + h, 4, 1));
    }
    let vals: Vec<u64> = keys.iter().map(|k| k ^ 0x55).collect();
    // Once all in one concurrent batch, once one key per batch.
    for concurrent in [true, false] {
        let mut t = hopscotch(mask + 1);
        if concurrent {
            assert!(t.ins(&keys, &vals).iter().all(|o| *o == InsertOutcome::Inserted));
        } else {
            for (k, v) in keys.iter().zip(&vals) {
                assert_eq!(t.ins(&[*k], &[*v]), vec![InsertOutcome::Inserted]);
            }
        }
        let model: HashMap<u64, u64> = keys.iter().copied().zip(vals.iter().copied()).collect();
        assert_eq!(t.find(&keys), vals.iter().map(|&v| Some(v)).collect::<Vec<_>>());
        assert_matches_model(&t, &model, &format!("concurrent {concurrent}"));
        // A 33rd key of one home cannot fit its neighbourhood: it fails and leaves nothing behind.
        let mut more = keys_at(mask, base + 200, 33, 1);
        let last = more.pop().expect("33 keys");
        assert!(t.ins(&more, &more).iter().all(|o| *o == InsertOutcome::Inserted));
        assert_eq!(t.ins(&[last], &[1]), vec![InsertOutcome::Failed]);
        assert_eq!(t.find(&[last]), vec![None]);
        let mut model = model;
        model.extend(more.iter().map(|&k| (k, k)));
        assert_matches_model(&t, &model, "after a failed insert");
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn hopscotch_fills_to_095_concurrently() {
    let mut rng = StdRng::seed_from_u64(seed());
    let slots = 1u64 << 14;
    let mut t = hopscotch(slots);
    let n = (slots as f64 * 0.95) as usize;
    let mut set = HashSet::new();
    while set.len() < n {
        set.insert(rng.random_range(1..u64::MAX));
    }
    let keys: Vec<u64> = set.into_iter().collect();
    let vals: Vec<u64> = keys.iter().map(|k| k.rotate_left(17)).collect();
    let got = t.ins(&keys, &vals);
    let mut model = HashMap::new();
    for ((k, v), o) in keys.iter().zip(&vals).zip(&got) {
        match o {
            InsertOutcome::Inserted => {
                model.insert(*k, *v);
            }
            InsertOutcome::Failed => {}
            o => panic!("{o:?}"),
        }
    }
    let failed = n - model.len();
    eprintln!("{failed} of {n} inserts failed at load 0.95");
    assert!(failed * 100 < n, "{failed} of {n} failed");
    let found = t.find(&keys);
    for (k, f) in keys.iter().zip(found) {
        assert_eq!(f, model.get(k).copied());
    }
    assert_matches_model(&t, &model, "load 0.95");
    // Erase half concurrently, then insert them again.
    let half: Vec<u64> = model.keys().copied().take(model.len() / 2).collect();
    assert!(t.erase(&half).iter().all(|o| o.is_erased()));
    let hv: Vec<u64> = half.iter().map(|k| k ^ 1).collect();
    assert!(t.ins(&half, &hv).iter().all(|o| *o == InsertOutcome::Inserted));
    for (k, v) in half.iter().zip(&hv) {
        model.insert(*k, *v);
    }
    assert_matches_model(&t, &model, "after erase and re-insert");
}

#[test]
#[ignore = "needs a CUDA device"]
fn slab_pool_that_runs_out_fails_inserts_and_loses_nothing() {
    // 2 buckets and 2 pool slabs: at most 60 pairs for 100 keys.
    let mut t = slab(2, 2);
    let keys: Vec<u64> = (1..=100u64).map(|i| fmix64(i) | 1).collect();
    let got = t.ins(&keys, &keys);
    let mut model = HashMap::new();
    for (k, o) in keys.iter().zip(&got) {
        match o {
            InsertOutcome::Inserted => {
                model.insert(*k, *k);
            }
            InsertOutcome::Failed => {}
            o => panic!("{o:?}"),
        }
    }
    assert!(model.len() < 100 && model.len() >= 30, "{} stored", model.len());
    assert_matches_model(&t, &model, "pool used up");
    assert_eq!(t.find(&keys), keys.iter().map(|k| model.get(k).copied()).collect::<Vec<_>>());
    // Erased pairs are reused even though no slab is left.
    let gone: Vec<u64> = model.keys().copied().take(10).collect();
    assert!(t.erase(&gone).iter().all(|o| o.is_erased()));
    let fresh: Vec<u64> = keys.iter().copied().filter(|k| !model.contains_key(k)).collect();
    let got = t.ins(&fresh, &fresh);
    for k in &gone {
        model.remove(k);
    }
    for (k, o) in fresh.iter().zip(&got) {
        if *o == InsertOutcome::Inserted {
            model.insert(*k, *k);
        }
    }
    assert!(got.iter().filter(|o| **o == InsertOutcome::Inserted).count() >= 10);
    assert_matches_model(&t, &model, "holes reused");
}

#[test]
#[ignore = "needs a CUDA device"]
fn slab_keys_of_one_bucket_chain_and_survive_churn() {
    // 40 keys of one bucket (3 slabs), erase every other one, insert 40 more of it: holes in
    // front of keys are refilled, no key is stored twice, chains only grow.
    let mut t = slab(64, 16);
    let keys = keys_at(63, 5, 80, 1);
    let (a, b) = keys.split_at(40);
    assert!(t.ins(a, a).iter().all(|o| *o == InsertOutcome::Inserted));
    let odd: Vec<u64> = a.iter().copied().skip(1).step_by(2).collect();
    assert!(t.erase(&odd).iter().all(|o| o.is_erased()));
    // Re-insert everything of a (half present, half erased) and all of b, concurrently.
    let all: Vec<u64> = a.iter().chain(b).copied().collect();
    let got = t.ins(&all, &all);
    for (k, o) in all.iter().zip(&got) {
        let present = a.contains(k) && !odd.contains(k);
        let want = if present { InsertOutcome::Updated { old: *k } } else { InsertOutcome::Inserted };
        assert_eq!(*o, want, "{k:#x}");
    }
    let model: HashMap<u64, u64> = all.iter().map(|&k| (k, k)).collect();
    assert_matches_model(&t, &model, "one bucket");
    let (_, _, slabs) = t.audit().unwrap();
    assert_eq!(slabs, 64 + 5, "80 keys in one bucket take 6 slabs, the other 63 buckets one each");
}

//! Rows of the published designs (GPU_HASH_TABLES.md designs 2 and 3) measured in the same run and
//! on the same keys as the bucketed table: `hopsc` (lock-free-find hopscotch after GLHT,
//! [`HopscotchTable`]) and `slab` (SlabHash, [`SlabHashTable`]). Per capacity `2^c` (in 16-byte
//! cells of the bucketed table): the hopscotch table gets `2^c` slots (24 bytes each with its meta
//! word: 1.5x the bucketed table's bytes), the slab table `2^c / 16` buckets of one 256-byte base
//! slab each (the bucketed table's bytes) and a pool of half as many slabs again (1.5x in all).
//! Loads are quoted against each table's own capacity (slots; base-slab pairs), and the keys are
//! the first `n` of the bucketed table's sequence (`gen_keys` from 0).
//!
//! Rows per load: the build (`insert`), finds with 100 %, 50 % and 0 % hits, and at load 0.8 ten
//! rounds of erase/insert churn, each checked like the bucketed table's: `lost` = keys neither found
//! nor reported failed (and stored entries against the audit's count), `dup` = the audit kernel's
//! problems (keys stored twice or out of place), `wrong` = hits with a value never written. Neither
//! design evicts, so there is no cache-mix row.

use cudarc::driver::{CudaSlice, CudaView, PushKernelArg};

use super::{cfg, dbg_err, launch_gen, Bench, Results, Tally, KIND_INSERT};
use super::hopscotch::HopscotchTable;
use super::slab::{SlabHashTable, SLAB_CELLS, SLAB_PAIRS};
use super::BatchKernels;
use crate::hashtable::status;

/// What the benchmark drives of a design.
pub(super) trait Design {
    /// The `table` column.
    const NAME: &'static str;
    /// Entries at load 1.0.
    fn capacity(&self) -> u64;
    fn clear(&mut self) -> anyhow::Result<()>;
    fn insert(&mut self, k: &CudaView<u64>, v: &CudaView<u64>, r: &mut Results) -> anyhow::Result<()>;
    fn find(&self, k: &CudaView<u64>, r: &mut Results) -> anyhow::Result<()>;
    fn erase(&mut self, k: &CudaView<u64>, r: &mut Results) -> anyhow::Result<()>;
    /// (problems, stored entries), with the table at rest.
    fn audit(&self) -> anyhow::Result<(u64, u64)>;
}

impl Design for HopscotchTable {
    const NAME: &'static str = "hopsc";
    fn capacity(&self) -> u64 {
        self.slots()
    }
    fn clear(&mut self) -> anyhow::Result<()> {
        Ok(HopscotchTable::clear(self)?)
    }
    fn insert(&mut self, k: &CudaView<u64>, v: &CudaView<u64>, r: &mut Results) -> anyhow::Result<()> {
        Ok(self.launch_insert(k, v, &mut r.status, &mut r.oval)?)
    }
    fn find(&self, k: &CudaView<u64>, r: &mut Results) -> anyhow::Result<()> {
        Ok(self.launch_find(k, &mut r.status, &mut r.oval)?)
    }
    fn erase(&mut self, k: &CudaView<u64>, r: &mut Results) -> anyhow::Result<()> {
        Ok(self.launch_erase(k, &mut r.status, &mut r.oval)?)
    }
    fn audit(&self) -> anyhow::Result<(u64, u64)> {
        Ok(HopscotchTable::audit(self)?)
    }
}

impl Design for SlabHashTable {
    const NAME: &'static str = "slab";
    fn capacity(&self) -> u64 {
        self.base_pairs()
    }
    fn clear(&mut self) -> anyhow::Result<()> {
        Ok(SlabHashTable::clear(self)?)
    }
    fn insert(&mut self, k: &CudaView<u64>, v: &CudaView<u64>, r: &mut Results) -> anyhow::Result<()> {
        Ok(self.launch_insert(k, v, &mut r.status, &mut r.oval)?)
    }
    fn find(&self, k: &CudaView<u64>, r: &mut Results) -> anyhow::Result<()> {
        Ok(self.launch_find(k, &mut r.status, &mut r.oval)?)
    }
    fn erase(&mut self, k: &CudaView<u64>, r: &mut Results) -> anyhow::Result<()> {
        Ok(self.launch_erase(k, &mut r.status, &mut r.oval)?)
    }
    fn audit(&self) -> anyhow::Result<(u64, u64)> {
        let (bad, occupied, _) = SlabHashTable::audit(self)?;
        Ok((bad, occupied))
    }
}

impl Bench {
    /// The hopscotch and slab rows of capacity `2^c` cells (whichever the arguments leave in).
    pub(super) fn designs(&mut self, c: u32) -> anyhow::Result<()> {
        if !self.args.no_hopscotch {
            let mut t = HopscotchTable::with_device(self.dev.clone(), 1u64 << c)?;
            self.design(&mut t, c)?;
        }
        if !self.args.no_slab {
            let buckets = ((1u64 << c) / SLAB_CELLS).max(2);
            let mut t = SlabHashTable::with_device(self.dev.clone(), buckets, buckets / 2 + 64)?;
            self.design(&mut t, c)?;
            let used = t.slabs_used()?;
            println!(
                "slab    2^{c}: {buckets} buckets, {} pool slabs used of {} ({:.1} MiB in all), {} pairs per base slab",
                used - buckets,
                buckets / 2 + 64,
                t.bytes() as f64 / (1 << 20) as f64,
                SLAB_PAIRS
            );
        }
        Ok(())
    }

    fn design<D: Design>(&mut self, t: &mut D, c: u32) -> anyhow::Result<()> {
        let cap = t.capacity();
        let max_load = self.args.loads.iter().cloned().fold(0.0, f64::max);
        let n_max = ((cap as f64 * max_load) as u64).max(1);
        let bmax = self.batch_of(n_max);
        let mut keys = self.s.alloc_zeros::<u64>(n_max as usize).map_err(dbg_err)?;
        let mut vals = self.s.alloc_zeros::<u64>(n_max as usize).map_err(dbg_err)?;
        let mut absent = self.s.alloc_zeros::<u64>(bmax as usize).map_err(dbg_err)?;
        let mut query = self.s.alloc_zeros::<u64>(bmax as usize).map_err(dbg_err)?;
        let mut res = self.alloc_results(bmax)?;
        launch_gen(self, &self.k.gen_keys, &mut keys, Some(&mut vals), 0, n_max, 0)?;
        launch_gen(self, &self.k.gen_keys, &mut absent, None, 0, bmax, 1 << 40)?;
        for load in self.args.loads.clone() {
            let n = ((cap as f64 * load) as u64).max(1);
            let b = self.batch_of(n);
            t.clear()?;
            let mut built = Tally::default();
            let mut ms = 0.0;
            let mut off = 0;
            while off < n {
                let m = b.min(n - off);
                let kv = keys.slice(off as usize..(off + m) as usize);
                let vv = vals.slice(off as usize..(off + m) as usize);
                ms += self.time(|_| t.insert(&kv, &vv, &mut res))?;
                built.add(self.tally(&res, &kv, false)?);
                off += m;
            }
            let failed = built.get(status::FAILED);
            let (lost, wrong) = self.verify_design(t, &keys, n, failed, &mut res)?;
            let (dup, occupied) = t.audit()?;
            let mut r = self.row(D::NAME, c, load, KIND_INSERT, b, n, ms, self.ceil.cas128);
            r.failed = failed;
            r.lost = Some(lost + (n - failed).abs_diff(occupied));
            r.dup = Some(dup);
            r.wrong = Some(wrong);
            self.emit(r)?;
            let q = b;
            for (label, hit_pct) in [("find-hit100", 100u32), ("find-hit50", 50), ("find-hit0", 0)] {
                {
                    let pres = keys.slice(0..n as usize);
                    let abs = absent.slice(0..q as usize);
                    let seed = 7u64 + hit_pct as u64;
                    let mut l = self.s.launch_builder(&self.k.gen_mix);
                    l.arg(&pres)
                        .arg(&n)
                        .arg(&abs)
                        .arg(&q)
                        .arg(&mut query)
                        .arg(&q)
                        .arg(&hit_pct)
                        .arg(&seed);
                    // SAFETY: arguments match gen_mix's signature; query holds bmax >= q elements.
                    unsafe { l.launch(cfg(q)) }.map_err(dbg_err)?;
                }
                let qv = query.slice(0..q as usize);
                t.find(&qv, &mut res)?; // warm-up
                let mut times = Vec::new();
                for _ in 0..self.args.reps {
                    times.push(self.time(|_| t.find(&qv, &mut res))?);
                }
                times.sort_by(f64::total_cmp);
                let tal = self.tally(&res, &qv, false)?;
                let mut r = self.row(D::NAME, c, load, label, q, q, times[times.len() / 2], self.ceil.read64);
                r.failed = tal.get(status::FAILED);
                r.wrong = Some(tal.wrong());
                r.hit_rate = Some(tal.get(status::FOUND) as f64 / q as f64);
                if hit_pct == 100 && failed == 0 {
                    r.lost = Some(q - tal.get(status::FOUND));
                }
                self.emit(r)?;
            }
            if (load - 0.8).abs() < 1e-9 {
                self.design_churn(t, c, load, &mut keys, &mut vals, n, failed, &mut res)?;
            }
        }
        Ok(())
    }

    /// Finds keys[0..n]: (lost, wrong values); lost = keys neither found nor among the `missing`
    /// ones known to be absent (failed inserts).
    fn verify_design<D: Design>(
        &self,
        t: &D,
        keys: &CudaSlice<u64>,
        n: u64,
        missing: u64,
        res: &mut Results,
    ) -> anyhow::Result<(u64, u64)> {
        let b = self.batch_of(n);
        let mut total = Tally::default();
        let mut off = 0;
        while off < n {
            let m = b.min(n - off);
            let kv = keys.slice(off as usize..(off + m) as usize);
            t.find(&kv, res)?;
            total.add(self.tally(res, &kv, false)?);
            off += m;
        }
        Ok((n.abs_diff(total.get(status::FOUND) + missing), total.wrong()))
    }

    /// Ten rounds of: erase a tenth of the keys, insert as many fresh ones in their places (the
    /// bucketed table's churn, on this design).
    #[allow(clippy::too_many_arguments)]
    fn design_churn<D: Design>(
        &mut self,
        t: &mut D,
        c: u32,
        load: f64,
        keys: &mut CudaSlice<u64>,
        vals: &mut CudaSlice<u64>,
        n: u64,
        build_failed: u64,
        res: &mut Results,
    ) -> anyhow::Result<()> {
        let r = self.batch_of((n / 10).max(1));
        let (mut ms, mut failed, mut erased) = (0.0, 0, 0);
        for round in 0..10u64 {
            let off = (round * r) % (n - r + 1);
            {
                let kv = keys.slice(off as usize..(off + r) as usize);
                ms += self.time(|_| t.erase(&kv, res))?;
                let tal = self.tally(res, &kv, false)?;
                erased += tal.get(status::ERASED);
                failed += tal.get(status::FAILED);
            }
            launch_gen(self, &self.k.gen_keys, keys, Some(vals), off, r, (round + 1) << 36)?;
            let kv = keys.slice(off as usize..(off + r) as usize);
            let vv = vals.slice(off as usize..(off + r) as usize);
            ms += self.time(|_| t.insert(&kv, &vv, res))?;
            failed += self.tally(res, &kv, false)?.get(status::FAILED);
        }
        let (dup, occupied) = t.audit()?;
        // As in the bucketed churn: a failed insert leaves its position without its key; an erase
        // that finds nothing there (the key had failed) hands the position a fresh key. (A failed
        // erase, never seen, would leave an extra entry, which the lost column then shows.)
        let missing = (build_failed + failed).saturating_sub(10 * r - erased);
        let (lost, wrong) = self.verify_design(t, keys, n, missing, res)?;
        let mut row = self.row(D::NAME, c, load, "churn-10x", r, 20 * r, ms, self.ceil.cas128);
        row.failed = failed;
        row.lost = Some(lost + (n - missing).abs_diff(occupied));
        row.dup = Some(dup);
        row.wrong = Some(wrong);
        row.hit_rate = Some(erased as f64 / (10 * r) as f64);
        self.emit(row)
    }
}

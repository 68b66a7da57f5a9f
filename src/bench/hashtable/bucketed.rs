//! The bucketed table's rows: build to each load, finds (with the find variants), churn, the cache mix.


use cudarc::driver::{CudaSlice, PushKernelArg};

use crate::hashtable::gpu::cfg;
use crate::hashtable::{status, GpuHashTable};
use super::{dbg_err, launch_gen, Bench, Results, Tally, KIND_INSERT};

impl Bench {
    pub(super) fn bucketed(&mut self, c: u32) -> anyhow::Result<()> {
        let mut t = GpuHashTable::with_device(self.dev.clone(), 1u64 << c)?;
        let usable = t.geometry().usable_slots();
        let max_load = self.args.loads.iter().cloned().fold(0.0, f64::max);
        let n_max = ((usable as f64 * max_load) as u64).max(1);
        let bmax = self.batch_of(n_max);
        let mut keys = self.s.alloc_zeros::<u64>(n_max as usize).map_err(dbg_err)?;
        let mut vals = self.s.alloc_zeros::<u64>(n_max as usize).map_err(dbg_err)?;
        let mut absent = self.s.alloc_zeros::<u64>(bmax as usize).map_err(dbg_err)?;
        let mut query = self.s.alloc_zeros::<u64>(bmax as usize).map_err(dbg_err)?;
        let mut res = self.alloc_results(bmax)?;
        launch_gen(self, &self.k.gen_keys, &mut keys, Some(&mut vals), 0, n_max, 0)?;
        launch_gen(self, &self.k.gen_keys, &mut absent, None, 0, bmax, 1 << 40)?;
        let loads = self.args.loads.clone();
        for &load in &loads {
            let n = ((usable as f64 * load) as u64).max(1);
            let b = self.batch_of(n);
            t.clear()?;
            let (ms, tal) = self.build(&mut t, &keys, &vals, n, b, &mut res)?;
            let (lost, found_wrong) = self.verify(&mut t, &keys, n, b, &mut res, &tal)?;
            let (dup, occupied) = t.audit()?;
            let mut r = self.row("bucket", c, load, KIND_INSERT, b, n, ms, self.ceil.cas128);
            r.evicted = tal.get(status::EVICTED);
            r.failed = tal.get(status::FAILED);
            r.lost = Some(lost + (n - r.evicted - r.failed).abs_diff(occupied));
            r.dup = Some(dup);
            r.wrong = Some(found_wrong);
            let build_dropped = r.evicted + r.failed;
            self.emit(r)?;
            // Finds: 100 %, 50 %, 0 % hits over one batch of q keys.
            let q = b;
            for (label, hit_pct) in [
                ("find-hit100", 100u32),
                ("find-hit50", 50),
                ("find-hit0", 0),
            ] {
                {
                    let pres = keys.slice(0..n as usize);
                    let abs = absent.slice(0..q as usize);
                    let nq = q;
                    let seed = 7u64 + hit_pct as u64;
                    let mut l = self.s.launch_builder(&self.k.gen_mix);
                    l.arg(&pres)
                        .arg(&n)
                        .arg(&abs)
                        .arg(&q)
                        .arg(&mut query)
                        .arg(&nq)
                        .arg(&hit_pct)
                        .arg(&seed);
                    unsafe { l.launch(cfg(q)) }.map_err(dbg_err)?;
                }
                let qv = query.slice(0..q as usize);
                // The kept kernel first, then the variants on the same query (None = ht_find).
                let k = self.k;
                let mut variants = vec![(label.to_string(), None)];
                if !self.args.no_variants {
                    let pct = label.trim_start_matches("find-");
                    variants.push((format!("nc-{pct}"), Some(&k.ht_find_nc)));
                    variants.push((format!("lane-{pct}"), Some(&k.ht_find_lane)));
                    variants.push((format!("lanenc-{pct}"), Some(&k.ht_find_lane_nc)));
                }
                for (op, kernel) in variants {
                    let launch = |bn: &Self, t: &mut GpuHashTable, res: &mut Results| match kernel {
                        None => bn.ht_find(t, &qv, false, res),
                        Some(k) => bn.find_variant(k, t, &qv, res),
                    };
                    launch(self, &mut t, &mut res)?; // warm-up
                    let mut times = Vec::new();
                    for _ in 0..self.args.reps {
                        times.push(self.time(|bn| launch(bn, &mut t, &mut res))?);
                    }
                    times.sort_by(f64::total_cmp);
                    let tal = self.tally(&res, &qv, false)?;
                    let mut r = self.row(
                        "bucket",
                        c,
                        load,
                        &op,
                        q,
                        q,
                        times[times.len() / 2],
                        self.ceil.read64,
                    );
                    r.wrong = Some(tal.wrong());
                    r.hit_rate = Some(tal.get(status::FOUND) as f64 / q as f64);
                    // When the build evicted nothing, a hit-100 batch must find every key.
                    if hit_pct == 100 && build_dropped == 0 {
                        r.lost = Some(q - tal.get(status::FOUND));
                    }
                    self.emit(r)?;
                }
            }
            if (load - 0.8).abs() < 1e-9 {
                self.churn(
                    &mut t,
                    c,
                    load,
                    &mut keys,
                    &mut vals,
                    n,
                    &mut res,
                    build_dropped,
                )?;
            }
            if load == max_load {
                self.cache_mix(&mut t, c, load, &keys, n, &absent, &mut res)?;
            }
        }
        Ok(())
    }

    pub(super) fn build(
        &self,
        t: &mut GpuHashTable,
        keys: &CudaSlice<u64>,
        vals: &CudaSlice<u64>,
        n: u64,
        b: u64,
        res: &mut Results,
    ) -> anyhow::Result<(f64, Tally)> {
        let mut total = Tally::default();
        let mut ms = 0.0;
        let mut off = 0;
        while off < n {
            let m = b.min(n - off);
            let kv = keys.slice(off as usize..(off + m) as usize);
            let vv = vals.slice(off as usize..(off + m) as usize);
            ms += self.time(|bn| bn.ht_insert(t, &kv, &vv, res))?;
            total.add(self.tally(res, &kv, false)?);
            off += m;
        }
        Ok((ms, total))
    }

    /// Finds every built key: returns (lost, wrong values). lost = keys neither found nor accounted
    /// for by an eviction or a failed insert.
    pub(super) fn verify(
        &self,
        t: &mut GpuHashTable,
        keys: &CudaSlice<u64>,
        n: u64,
        b: u64,
        res: &mut Results,
        built: &Tally,
    ) -> anyhow::Result<(u64, u64)> {
        let mut total = Tally::default();
        let mut off = 0;
        while off < n {
            let m = b.min(n - off);
            let kv = keys.slice(off as usize..(off + m) as usize);
            self.ht_find(t, &kv, false, res)?;
            total.add(self.tally(res, &kv, false)?);
            off += m;
        }
        let accounted =
            total.get(status::FOUND) + built.get(status::EVICTED) + built.get(status::FAILED);
        Ok((n.abs_diff(accounted), total.wrong()))
    }

    #[allow(clippy::too_many_arguments)]
    /// Churn starts from a build that may have evicted keys: `build_dropped` of the n keys are gone.
    pub(super) fn churn(
        &mut self,
        t: &mut GpuHashTable,
        c: u32,
        load: f64,
        keys: &mut CudaSlice<u64>,
        vals: &mut CudaSlice<u64>,
        n: u64,
        res: &mut Results,
        build_dropped: u64,
    ) -> anyhow::Result<()> {
        let r = self.batch_of((n / 10).max(1));
        let mut ms = 0.0;
        let mut evicted = 0;
        let mut failed = 0;
        let mut erased = 0;
        for round in 0..10u64 {
            let off = (round * r) % (n - r + 1);
            {
                let kv = keys.slice(off as usize..(off + r) as usize);
                ms += self.time(|bn| bn.ht_erase(t, &kv, res))?;
                erased += self.tally(res, &kv, false)?.get(status::ERASED);
            }
            launch_gen(self, &self.k.gen_keys, keys, Some(vals), off, r, (round + 1) << 36)?;
            let kv = keys.slice(off as usize..(off + r) as usize);
            let vv = vals.slice(off as usize..(off + r) as usize);
            ms += self.time(|bn| bn.ht_insert(t, &kv, &vv, res))?;
            let tal = self.tally(res, &kv, false)?;
            evicted += tal.get(status::EVICTED);
            failed += tal.get(status::FAILED);
        }
        let (dup, occupied) = t.audit()?;
        // Every eviction or failed insert leaves one position of keys[0..n] without its key; an
        // erase that finds nothing (its key was evicted before) hands that position a fresh key,
        // repairing one. So the keys that must be missing now number:
        let missing = (build_dropped + evicted + failed).saturating_sub(10 * r - erased);
        let built = Tally({
            let mut a = [0u64; 9];
            a[status::EVICTED as usize] = missing;
            a
        });
        let (lost, wrong) = self.verify(t, keys, n, self.batch_of(n), res, &built)?;
        let lost = lost + (n - missing).abs_diff(occupied);
        let mut row = self.row(
            "bucket",
            c,
            load,
            "churn-10x",
            r,
            20 * r,
            ms,
            self.ceil.cas128,
        );
        row.evicted = evicted;
        row.failed = failed;
        row.lost = Some(lost);
        row.dup = Some(dup);
        row.wrong = Some(wrong);
        row.hit_rate = Some(erased as f64 / (10 * r) as f64);
        self.emit(row)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn cache_mix(
        &mut self,
        t: &mut GpuHashTable,
        c: u32,
        load: f64,
        keys: &CudaSlice<u64>,
        n: u64,
        absent: &CudaSlice<u64>,
        res: &mut Results,
    ) -> anyhow::Result<()> {
        let q = self.batch_of(n);
        let mut fresh = self.s.alloc_zeros::<u64>(q as usize).map_err(dbg_err)?;
        launch_gen(self, &self.k.gen_keys, &mut fresh, None, 0, q, 3 << 40)?;
        let mut ops = self.s.alloc_zeros::<u32>(q as usize).map_err(dbg_err)?;
        let mut mkeys = self.s.alloc_zeros::<u64>(q as usize).map_err(dbg_err)?;
        let mut mvals = self.s.alloc_zeros::<u64>(q as usize).map_err(dbg_err)?;
        {
            let pres = keys.slice(0..n as usize);
            let hit = 70u32;
            let seed = 42u64;
            let mut l = self.s.launch_builder(&self.k.gen_cache_mix);
            l.arg(&pres)
                .arg(&n)
                .arg(absent)
                .arg(&q)
                .arg(&fresh)
                .arg(&mut ops)
                .arg(&mut mkeys)
                .arg(&mut mvals)
                .arg(&q)
                .arg(&hit)
                .arg(&seed);
            unsafe { l.launch(cfg(q)) }.map_err(dbg_err)?;
        }
        let mask = t.geometry().bucket_mask();
        let clk = t.next_clock();
        let touch = 1u32;
        let ms = self.time(|bn| {
            let mut l = bn.s.launch_builder(&bn.dev.k.ht_mixed);
            l.arg(t.cells_mut())
                .arg(&mask)
                .arg(&ops)
                .arg(&mkeys)
                .arg(&mvals)
                .arg(&q)
                .arg(&clk)
                .arg(&touch)
                .arg(&mut res.status)
                .arg(&mut res.okey)
                .arg(&mut res.oval);
            unsafe { l.launch(cfg(q)) }.map_err(dbg_err)?;
            Ok(())
        })?;
        let kv = mkeys.slice(0..q as usize);
        let tal = self.tally(res, &kv, false)?;
        let (dup, _) = t.audit()?;
        let mut row = self.row(
            "bucket",
            c,
            load,
            "cache-mix",
            q,
            q,
            ms,
            self.ceil.cas128.min(self.ceil.read64),
        );
        row.evicted = tal.get(status::EVICTED);
        row.failed = tal.get(status::FAILED);
        row.dup = Some(dup);
        row.wrong = Some(tal.wrong());
        let finds = q
            - tal.get(status::INSERTED)
            - tal.get(status::UPDATED)
            - tal.get(status::EVICTED)
            - tal.get(status::FAILED);
        row.hit_rate = Some(tal.get(status::FOUND) as f64 / finds.max(1) as f64);
        self.emit(row)
    }
}

//! The batch-size sweep of the bucketed table at one capacity.



use crate::hashtable::{status, GpuHashTable};
use super::{dbg_err, launch_gen, Bench, Tally};

impl Bench {
    pub(super) fn sweep(&mut self, c: u32) -> anyhow::Result<()> {
        let mut t = GpuHashTable::with_device(self.dev.clone(), 1u64 << c)?;
        let load = 0.8;
        let n = (t.geometry().usable_slots() as f64 * load) as u64;
        let mut keys = self.s.alloc_zeros::<u64>(n as usize).map_err(dbg_err)?;
        let mut vals = self.s.alloc_zeros::<u64>(n as usize).map_err(dbg_err)?;
        launch_gen(self, &self.k.gen_keys, &mut keys, Some(&mut vals), 0, n, 5 << 40)?;
        let sizes = self.args.sweep.clone();
        for &b in &sizes {
            let b = b.clamp(1, n);
            let mut res = self.alloc_results(b)?;
            t.clear()?;
            let (ms, tal) = self.build(&mut t, &keys, &vals, n, b, &mut res)?;
            let (lost, wrong) = self.verify(&mut t, &keys, n, b, &mut res, &tal)?;
            let (dup, _) = t.audit()?;
            let mut r = self.row(
                "bucket",
                c,
                load,
                "sweep-insert",
                b,
                n,
                ms,
                self.ceil.cas128,
            );
            r.evicted = tal.get(status::EVICTED);
            r.failed = tal.get(status::FAILED);
            r.lost = Some(lost);
            r.dup = Some(dup);
            r.wrong = Some(wrong);
            self.emit(r)?;
            let mut ms = 0.0;
            let mut found = Tally::default();
            let mut off = 0;
            while off < n {
                let m = b.min(n - off);
                let kv = keys.slice(off as usize..(off + m) as usize);
                ms += self.time(|bn| bn.ht_find(&mut t, &kv, false, &mut res))?;
                found.add(self.tally(&res, &kv, false)?);
                off += m;
            }
            let mut r = self.row("bucket", c, load, "sweep-find", b, n, ms, self.ceil.read64);
            r.wrong = Some(found.wrong());
            r.hit_rate = Some(found.get(status::FOUND) as f64 / n as f64);
            self.emit(r)?;
        }
        Ok(())
    }
}

//! The published linear-probing table (GPU_HASH_TABLES.md design 1) on the same keys.


use cudarc::driver::{CudaSlice, CudaView, PushKernelArg};

use crate::hashtable::gpu::cfg;
use crate::hashtable::status;
use super::{dbg_err, launch_gen, Bench, Tally, KIND_INSERT};

impl Bench {
    pub(super) fn linear(&mut self, c: u32) -> anyhow::Result<()> {
        let slots: u64 = 1 << c;
        let cap_mask = (slots - 1) as u32;
        let max_load = self.args.loads.iter().cloned().fold(0.0, f64::max);
        let n_max = ((slots as f64 * max_load) as u64).max(1);
        let bmax = self.batch_of(n_max);
        let mut table = self
            .s
            .alloc_zeros::<u32>(2 * slots as usize)
            .map_err(dbg_err)?;
        let mut keys = self.s.alloc_zeros::<u32>(n_max as usize).map_err(dbg_err)?;
        let mut vals = self.s.alloc_zeros::<u32>(n_max as usize).map_err(dbg_err)?;
        let mut absent = self.s.alloc_zeros::<u32>(bmax as usize).map_err(dbg_err)?;
        let mut status_buf = self.s.alloc_zeros::<u32>(bmax as usize).map_err(dbg_err)?;
        let mut oval = self.s.alloc_zeros::<u32>(bmax as usize).map_err(dbg_err)?;
        let mp = self.args.lp_max_probe;
        launch_gen(self, &self.k.lp_gen, &mut keys, Some(&mut vals), 0, n_max, 0)?;
        launch_gen(self, &self.k.lp_gen, &mut absent, None, 0, bmax, 0x8000_0000)?;
        let lp_tally = |b: &Self,
                        st: &CudaSlice<u32>,
                        k: &CudaView<u32>,
                        ov: &CudaSlice<u32>|
         -> anyhow::Result<Tally> {
            let n = k.len() as u64;
            let mut counts = b.s.alloc_zeros::<u64>(9).map_err(dbg_err)?;
            let mut l = b.s.launch_builder(&b.k.lp_tally);
            l.arg(st).arg(k).arg(ov).arg(&n).arg(&mut counts);
            unsafe { l.launch(cfg(n)) }.map_err(dbg_err)?;
            Ok(Tally(
                b.s.clone_dtoh(&counts)
                    .map_err(dbg_err)?
                    .try_into()
                    .expect("9"),
            ))
        };
        let insert = |b: &Self,
                      table: &mut CudaSlice<u32>,
                      k: &CudaView<u32>,
                      v: &CudaView<u32>,
                      st: &mut CudaSlice<u32>|
         -> anyhow::Result<()> {
            let n = k.len() as u64;
            let mut l = b.s.launch_builder(&b.k.lp_insert);
            l.arg(table)
                .arg(&cap_mask)
                .arg(k)
                .arg(v)
                .arg(&n)
                .arg(&mp)
                .arg(st);
            unsafe { l.launch(cfg(n)) }.map_err(dbg_err)?;
            Ok(())
        };
        let find = |b: &Self,
                    table: &CudaSlice<u32>,
                    k: &CudaView<u32>,
                    st: &mut CudaSlice<u32>,
                    ov: &mut CudaSlice<u32>|
         -> anyhow::Result<()> {
            let n = k.len() as u64;
            let mut l = b.s.launch_builder(&b.k.lp_find);
            l.arg(table)
                .arg(&cap_mask)
                .arg(k)
                .arg(&n)
                .arg(&mp)
                .arg(st)
                .arg(ov);
            unsafe { l.launch(cfg(n)) }.map_err(dbg_err)?;
            Ok(())
        };
        let erase = |b: &Self,
                     table: &mut CudaSlice<u32>,
                     k: &CudaView<u32>,
                     st: &mut CudaSlice<u32>|
         -> anyhow::Result<()> {
            let n = k.len() as u64;
            let mut l = b.s.launch_builder(&b.k.lp_erase);
            l.arg(table).arg(&cap_mask).arg(k).arg(&n).arg(&mp).arg(st);
            unsafe { l.launch(cfg(n)) }.map_err(dbg_err)?;
            Ok(())
        };
        // Verify: find all n keys; lost = keys neither found nor failed at insert.
        let verify = |b: &Self,
                      table: &CudaSlice<u32>,
                      keys: &CudaSlice<u32>,
                      n: u64,
                      st: &mut CudaSlice<u32>,
                      ov: &mut CudaSlice<u32>|
         -> anyhow::Result<Tally> {
            let bsz = b.batch_of(n);
            let mut total = Tally::default();
            let mut off = 0;
            while off < n {
                let m = bsz.min(n - off);
                let kv = keys.slice(off as usize..(off + m) as usize);
                find(b, table, &kv, st, ov)?;
                total.add(lp_tally(b, st, &kv, ov)?);
                off += m;
            }
            Ok(total)
        };
        let loads = self.args.loads.clone();
        for &load in &loads {
            let n = ((slots as f64 * load) as u64).max(1);
            let b = self.batch_of(n);
            fill_ff(self, &mut table)?;
            let mut ms = 0.0;
            let mut built = Tally::default();
            let mut off = 0;
            while off < n {
                let m = b.min(n - off);
                let kv = keys.slice(off as usize..(off + m) as usize);
                let vv = vals.slice(off as usize..(off + m) as usize);
                ms += self.time(|bn| insert(bn, &mut table, &kv, &vv, &mut status_buf))?;
                built.add(lp_tally(self, &status_buf, &kv, &oval)?);
                off += m;
            }
            let found = verify(self, &table, &keys, n, &mut status_buf, &mut oval)?;
            let mut r = self.row("linear", c, load, KIND_INSERT, b, n, ms, self.ceil.cas128);
            r.failed = built.get(status::FAILED);
            r.lost = Some(n.abs_diff(found.get(status::FOUND) + r.failed));
            r.wrong = Some(found.wrong());
            self.emit(r)?;
            let q = b;
            for (label, hit_pct) in [
                ("find-hit100", 100u32),
                ("find-hit50", 50),
                ("find-hit0", 0),
            ] {
                // Build the query on the host side of the device: half present, half absent by position.
                let mut query = self.s.alloc_zeros::<u32>(q as usize).map_err(dbg_err)?;
                let present_n = (q * hit_pct as u64 / 100).min(n);
                if present_n > 0 {
                    let mut qv = query.slice_mut(0..present_n as usize);
                    self.s
                        .memcpy_dtod(&keys.slice(0..present_n as usize), &mut qv)
                        .map_err(dbg_err)?;
                }
                if present_n < q {
                    let mut qv = query.slice_mut(present_n as usize..q as usize);
                    self.s
                        .memcpy_dtod(&absent.slice(0..(q - present_n) as usize), &mut qv)
                        .map_err(dbg_err)?;
                }
                let qv = query.slice(0..q as usize);
                find(self, &table, &qv, &mut status_buf, &mut oval)?;
                let mut times = Vec::new();
                for _ in 0..self.args.reps {
                    times.push(self.time(|bn| find(bn, &table, &qv, &mut status_buf, &mut oval))?);
                }
                times.sort_by(f64::total_cmp);
                let tal = lp_tally(self, &status_buf, &qv, &oval)?;
                let mut r = self.row(
                    "linear",
                    c,
                    load,
                    label,
                    q,
                    q,
                    times[times.len() / 2],
                    self.ceil.read64,
                );
                r.wrong = Some(tal.wrong());
                r.hit_rate = Some(tal.get(status::FOUND) as f64 / q as f64);
                self.emit(r)?;
            }
            // Churn fills the linear table with tombstones until every insert fails after
            // lp_max_probe probes; past 2^24 slots that alone would take minutes, so it is left out.
            if (load - 0.8).abs() < 1e-9 && c <= 24 {
                let r = self.batch_of((n / 10).max(1));
                let mut ms = 0.0;
                let mut failed = 0;
                for round in 0..10u64 {
                    let off = (round * r) % (n - r + 1);
                    {
                        let kv = keys.slice(off as usize..(off + r) as usize);
                        ms += self.time(|bn| erase(bn, &mut table, &kv, &mut status_buf))?;
                    }
                    launch_gen(
                        self,
                        &self.k.lp_gen,
                        &mut keys,
                        Some(&mut vals),
                        off,
                        r,
                        0x4000_0000u32.wrapping_add((round as u32).wrapping_mul(r as u32)),
                    )?;
                    let kv = keys.slice(off as usize..(off + r) as usize);
                    let vv = vals.slice(off as usize..(off + r) as usize);
                    ms += self.time(|bn| insert(bn, &mut table, &kv, &vv, &mut status_buf))?;
                    failed += lp_tally(self, &status_buf, &kv, &oval)?.get(status::FAILED);
                }
                let found = verify(self, &table, &keys, n, &mut status_buf, &mut oval)?;
                let mut row = self.row(
                    "linear",
                    c,
                    load,
                    "churn-10x",
                    r,
                    20 * r,
                    ms,
                    self.ceil.cas128,
                );
                row.failed = failed;
                row.lost = Some(n.abs_diff(found.get(status::FOUND) + failed));
                row.wrong = Some(found.wrong());
                self.emit(row)?;
            }
        }
        Ok(())
    }
}

/// The linear-probing table's empty marker is all ones.
fn fill_ff(b: &Bench, table: &mut CudaSlice<u32>) -> anyhow::Result<()> {
    let n = table.len() as u64;
    let v = u32::MAX;
    let mut l = b.s.launch_builder(&b.k.fill_u32);
    l.arg(table).arg(&n).arg(&v);
    unsafe { l.launch(cfg(n)) }.map_err(dbg_err)?;
    Ok(())
}

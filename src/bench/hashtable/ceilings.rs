//! The device's own ceilings for the bucketed table's access patterns, measured before the rows.


use cudarc::driver::PushKernelArg;

use crate::hashtable::gpu::cfg;
use super::{dbg_err, Bench, Ceilings};

impl Bench {
    pub(super) fn measure_ceilings(&self) -> anyhow::Result<Ceilings> {
        let cells: u64 = 1 << 28; // 4 GiB
        let buf = self
            .s
            .alloc_zeros::<u64>(2 * cells as usize)
            .map_err(dbg_err)?;
        let sink = self.s.alloc_zeros::<u64>(1).map_err(dbg_err)?;
        let n: u64 = 1 << 28;
        let mask = cells - 1;
        let best = |f: &dyn Fn(&Self, u64) -> anyhow::Result<()>| -> anyhow::Result<f64> {
            f(self, 99)?; // warm-up
            let mut v = Vec::new();
            for r in 0..3 {
                v.push(self.time(|b| f(b, r))?);
            }
            v.sort_by(f64::total_cmp);
            Ok(n as f64 / (v[1] * 1e-3) / 1e9)
        };
        let cas = best(&|b: &Self, seed| {
            let mut l = b.s.launch_builder(&b.k.ceil_cas128);
            l.arg(&buf).arg(&mask).arg(&n).arg(&seed);
            unsafe { l.launch(cfg(n)) }.map_err(dbg_err)?;
            Ok(())
        })?;
        let read = |width: u32| {
            let sink = &sink;
            let buf = &buf;
            move |b: &Self, seed: u64| -> anyhow::Result<()> {
                let mut l = b.s.launch_builder(&b.k.ceil_read);
                l.arg(buf)
                    .arg(&mask)
                    .arg(&n)
                    .arg(&width)
                    .arg(&seed)
                    .arg(sink);
                unsafe { l.launch(cfg(n * (width as u64 / 16))) }.map_err(dbg_err)?;
                Ok(())
            }
        };
        let r64 = best(&read(64))?;
        let r128 = best(&read(128))?;
        Ok(Ceilings {
            cas128: cas,
            read64: r64,
            read128: r128,
        })
    }
}

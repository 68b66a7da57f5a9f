//! The bucketed table's batch launches as the benchmark times them, their tallies, and the rows they make.


use cudarc::driver::{CudaView, PushKernelArg};

use crate::hashtable::gpu::{cfg, launch_insert_only};
use crate::hashtable::GpuHashTable;
use super::{dbg_err, Bench, Results, Row, Tally};

impl Bench {
    pub(super) fn alloc_results(&self, n: u64) -> anyhow::Result<Results> {
        Ok(Results {
            status: self.s.alloc_zeros::<u32>(n as usize).map_err(dbg_err)?,
            okey: self.s.alloc_zeros::<u64>(n as usize).map_err(dbg_err)?,
            oval: self.s.alloc_zeros::<u64>(n as usize).map_err(dbg_err)?,
        })
    }

    pub(super) fn ht_insert(
        &self,
        t: &mut GpuHashTable,
        keys: &CudaView<u64>,
        vals: &CudaView<u64>,
        r: &mut Results,
    ) -> anyhow::Result<()> {
        let mask = t.geometry().bucket_mask();
        let clk = t.next_clock();
        // The same two launches as GpuHashTable::insert_only_batch.
        launch_insert_only(
            &self.dev,
            &self.s,
            t.cells_mut(),
            mask,
            keys,
            vals,
            clk,
            &mut r.status,
            &mut r.okey,
            &mut r.oval,
        )
        .map_err(dbg_err)?;
        Ok(())
    }

    pub(super) fn ht_find(
        &self,
        t: &mut GpuHashTable,
        keys: &CudaView<u64>,
        touch: bool,
        r: &mut Results,
    ) -> anyhow::Result<()> {
        let n = keys.len() as u64;
        let mask = t.geometry().bucket_mask();
        let clk = t.next_clock();
        let touch = touch as u32;
        let mut l = self.s.launch_builder(&self.dev.k.ht_find);
        l.arg(t.cells_mut())
            .arg(&mask)
            .arg(keys)
            .arg(&n)
            .arg(&clk)
            .arg(&touch)
            .arg(&mut r.status)
            .arg(&mut r.oval);
        unsafe { l.launch(cfg(n)) }.map_err(dbg_err)?;
        Ok(())
    }

    /// A find variant (`ht_find_nc`, `ht_find_lane`, `ht_find_lane_nc`): ht_find's arguments
    /// without clk and touch (they never touch); also `ht_erase`, whose arguments are the same.
    pub(super) fn find_variant(
        &self,
        kernel: &cudarc::driver::CudaFunction,
        t: &mut GpuHashTable,
        keys: &CudaView<u64>,
        r: &mut Results,
    ) -> anyhow::Result<()> {
        let n = keys.len() as u64;
        let mask = t.geometry().bucket_mask();
        t.next_clock();
        let mut l = self.s.launch_builder(kernel);
        l.arg(t.cells_mut())
            .arg(&mask)
            .arg(keys)
            .arg(&n)
            .arg(&mut r.status)
            .arg(&mut r.oval);
        unsafe { l.launch(cfg(n)) }.map_err(dbg_err)?;
        Ok(())
    }

    pub(super) fn ht_erase(
        &self,
        t: &mut GpuHashTable,
        keys: &CudaView<u64>,
        r: &mut Results,
    ) -> anyhow::Result<()> {
        // ht_erase takes the find variants' arguments.
        self.find_variant(&self.dev.k.ht_erase, t, keys, r)
    }

    pub(super) fn tally(&self, r: &Results, keys: &CudaView<u64>, lp: bool) -> anyhow::Result<Tally> {
        let n = keys.len() as u64;
        let mut counts = self.s.alloc_zeros::<u64>(9).map_err(dbg_err)?;
        let mut l = self.s.launch_builder(if lp {
            &self.k.lp_tally
        } else {
            &self.k.tally
        });
        l.arg(&r.status)
            .arg(keys)
            .arg(&r.oval)
            .arg(&n)
            .arg(&mut counts);
        unsafe { l.launch(cfg(n)) }.map_err(dbg_err)?;
        let c = self.s.clone_dtoh(&counts).map_err(dbg_err)?;
        Ok(Tally(c.try_into().expect("9 counters")))
    }

    pub(super) fn batch_of(&self, n: u64) -> u64 {
        self.args.max_batch.min(n).max(1)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn row(
        &self,
        table: &'static str,
        c: u32,
        load: f64,
        op: &str,
        batch: u64,
        ops: u64,
        ms: f64,
        ceiling: f64,
    ) -> Row {
        let gops = ops as f64 / (ms * 1e-3) / 1e9;
        Row {
            table,
            log2_cells: c,
            load,
            op: op.into(),
            batch,
            ops,
            ms,
            gops,
            pct_ceiling: 100.0 * gops / ceiling,
            ..Row::default()
        }
    }
}

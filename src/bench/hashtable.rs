//! `hypermnf bench hashtable`: the GPU hash table (src/hashtable) and the published linear-probing
//! table (GPU_HASH_TABLES.md design 1) side by side, against the device's own measured ceilings,
//! and beside them the other two published designs on the same keys: hopscotch after GLHT and
//! SlabHash (rows `hopsc` and `slab`, see [`designs`]).
//!
//! Rows, per capacity (in 16-byte cells for the bucketed table; the linear-probing table gets the
//! same number of 8-byte slots): build to each load, then find with 100 %, 50 % and 0 % hits; at
//! load 0.8, 10 rounds of erase/insert churn; at the highest load, the cache mix (80 % lookups at a
//! 70 % hit rate that refresh LRU stamps, 20 % inserts of new keys that evict when both buckets are
//! full). Each find row of the bucketed table (`ht_find`, the kernel the cache uses) is followed by
//! the same query through the find variants: `nc-*` (ht_find reading through the non-coherent
//! path), `lane-*` (one lane per lookup, four 16-byte loads each) and `lanenc-*` (both); leave
//! them out with `--no-variants`. A batch-size sweep at 2^24 cells follows. Loads of the bucketed table are quoted against
//! its usable slots (3 of 4 cells).
//!
//! Every run is checked on the device: `lost` = keys neither found nor reported evicted/failed,
//! `dup` = keys stored twice (audit kernel), `wrong` = hits whose value is not the one written.
//! Keys are generated on the device (`fmix64` of a counter: distinct, uniformly spread).

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use cudarc::driver::{sys::CUevent_flags, CudaFunction, CudaSlice, CudaStream, CudaView, DeviceRepr, PushKernelArg};

use crate::hashtable::gpu::{cfg, launch_insert_only, Device};
use crate::hashtable::{status, GpuHashTable};

/// The host side of the published designs' batches.
mod batch;
/// The published designs' rows (hopscotch after GLHT, SlabHash).
mod designs;
/// The hopscotch table after GLHT, a published design compared with the job cache's table.
pub mod hopscotch;
/// The kernels only the benchmark loads.
mod kernels;
/// SlabHash, a published design compared with the job cache's table.
pub mod slab;

pub use batch::BatchKernels;

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Capacities as log2 of the number of cells (16-byte cells; 2^28 cells = 4 GiB).
    #[arg(long, value_delimiter = ',', default_value = "21,24,28")]
    pub capacities: Vec<u32>,
    /// Loads to build to (fraction of usable slots).
    #[arg(long, value_delimiter = ',', default_value = "0.5,0.8,0.9,0.95")]
    pub loads: Vec<f64>,
    /// Largest batch (keys per kernel launch).
    #[arg(long, default_value_t = 1 << 26)]
    pub max_batch: u64,
    /// Batch sizes of the sweep (run at 2^24 cells, load 0.8).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "8192,65536,524288,4194304,67108864"
    )]
    pub sweep: Vec<u64>,
    /// Skip the batch-size sweep.
    #[arg(long)]
    pub no_sweep: bool,
    /// Leave out the rows of the find variants (`nc-*`: ht_find with non-coherent loads, `lane-*`:
    /// one lane per lookup, `lanenc-*`: both), printed after each find row of the bucketed table.
    #[arg(long)]
    pub no_variants: bool,
    /// Leave out the linear-probing reference table.
    #[arg(long)]
    pub no_linear: bool,
    /// Leave out the hopscotch table (after GLHT; src/bench/hashtable/hopscotch.rs).
    #[arg(long)]
    pub no_hopscotch: bool,
    /// Leave out the slab hash table (after SlabHash; src/bench/hashtable/slab.rs).
    #[arg(long)]
    pub no_slab: bool,
    /// Probe limit of the linear-probing table (its inserts fail beyond it).
    #[arg(long, default_value_t = 4096)]
    pub lp_max_probe: u32,
    /// Timed repetitions of each find row (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Skip measuring the device ceilings (for sanitizer runs; % of ceiling is then not shown).
    #[arg(long)]
    pub no_ceilings: bool,
    /// Also write the rows as JSON lines to this file.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

const KIND_INSERT: &str = "insert";

#[derive(Debug, Clone, Default, serde::Serialize)]
struct Row {
    table: &'static str,
    log2_cells: u32,
    load: f64,
    op: String,
    batch: u64,
    ops: u64,
    ms: f64,
    gops: f64,
    pct_ceiling: f64,
    evicted: u64,
    failed: u64,
    lost: Option<u64>,
    dup: Option<u64>,
    wrong: Option<u64>,
    hit_rate: Option<f64>,
}

#[derive(Debug, Clone, Copy, serde::Serialize)]
struct Ceilings {
    cas128: f64,
    read64: f64,
    read128: f64,
}

struct Bench {
    dev: Arc<Device>,
    /// The benchmark's own kernels (the table's are `dev.k`).
    k: &'static kernels::Kernels,
    s: Arc<CudaStream>,
    args: Args,
    ceil: Ceilings,
    rows: Vec<Row>,
    problems: u64,
    json: Option<std::fs::File>,
}

/// Device buffers of per-op results.
struct Results {
    status: CudaSlice<u32>,
    okey: CudaSlice<u64>,
    oval: CudaSlice<u64>,
}

/// Tallied statuses: counts[status] and counts[8] = wrong values.
#[derive(Debug, Default, Clone, Copy)]
struct Tally([u64; 9]);

impl Tally {
    fn add(&mut self, o: Tally) {
        for i in 0..9 {
            self.0[i] += o.0[i];
        }
    }
    fn get(&self, st: u32) -> u64 {
        self.0[st as usize]
    }
    fn wrong(&self) -> u64 {
        self.0[8]
    }
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let dev = Device::shared().context("bench hashtable needs an sm_90 CUDA device")?;
    if args.loads.iter().any(|l| !(0.0..=1.0).contains(l)) || args.max_batch == 0 || args.reps == 0
    {
        bail!("loads must lie in [0, 1], max-batch and reps must be positive");
    }
    if args.capacities.iter().any(|&c| !(4..=31).contains(&c)) {
        bail!("capacities are log2 cells in 4..=31");
    }
    let json = match &args.json {
        Some(p) => {
            Some(std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?)
        }
        None => None,
    };
    let s = dev.stream.clone();
    let mut b = Bench {
        k: kernels::Kernels::load(&dev)?,
        dev: dev.clone(),
        s,
        args: args.clone(),
        ceil: Ceilings {
            cas128: 0.0,
            read64: 0.0,
            read128: 0.0,
        },
        rows: Vec::new(),
        problems: 0,
        json,
    };
    println!("device: {}", dev.name());
    if args.no_ceilings {
        b.ceil = Ceilings {
            cas128: f64::NAN,
            read64: f64::NAN,
            read128: f64::NAN,
        };
    } else {
        b.ceil = b.measure_ceilings()?;
    }
    println!(
        "ceilings over a 4 GiB buffer: random 128-bit CAS {:.2} G/s, random 64-byte reads {:.2} G/s, random 128-byte reads {:.2} G/s",
        b.ceil.cas128, b.ceil.read64, b.ceil.read128
    );
    print_header();
    for &c in &args.capacities.clone() {
        b.bucketed(c)?;
        if !args.no_linear {
            b.linear(c)?;
        }
        b.designs(c)?;
    }
    if !args.no_sweep && !args.sweep.is_empty() {
        b.sweep(24.min(*args.capacities.iter().max().unwrap_or(&24)))?;
    }
    if let Some(f) = b.json.as_mut() {
        use std::io::Write;
        writeln!(f, "{}", serde_json::json!({ "ceilings": b.ceil }))?;
    }
    println!(
        "total {:.1} s; correctness problems (lost + dup + wrong over all runs): {}",
        t0.elapsed().as_secs_f64(),
        b.problems
    );
    if b.problems > 0 {
        bail!(
            "{} correctness problems (see the lost/dup/wrong columns)",
            b.problems
        );
    }
    Ok(())
}

fn print_header() {
    println!(
        "{:<7} {:>5} {:>5} {:<13} {:>9} {:>10} {:>9} {:>8} {:>6} {:>9} {:>8} {:>5} {:>4} {:>5} {:>5}",
        "table", "cells", "load", "op", "batch", "ops", "ms", "G ops/s", "%ceil", "evicted", "failed", "lost", "dup", "wrong", "hit%"
    );
}

fn opt(v: Option<u64>) -> String {
    v.map_or("-".into(), |x| x.to_string())
}

impl Bench {
    fn emit(&mut self, r: Row) -> anyhow::Result<()> {
        self.problems += r.lost.unwrap_or(0) + r.dup.unwrap_or(0) + r.wrong.unwrap_or(0);
        println!(
            "{:<7} {:>5} {:>5.2} {:<13} {:>9} {:>10} {:>9.3} {:>8.2} {:>5.0}% {:>9} {:>8} {:>5} {:>4} {:>5} {:>5}",
            r.table,
            format!("2^{}", r.log2_cells),
            r.load,
            r.op,
            r.batch,
            r.ops,
            r.ms,
            r.gops,
            r.pct_ceiling,
            r.evicted,
            r.failed,
            opt(r.lost),
            opt(r.dup),
            opt(r.wrong),
            r.hit_rate.map_or("-".into(), |h| format!("{:.0}", 100.0 * h)),
        );
        if let Some(f) = self.json.as_mut() {
            use std::io::Write;
            writeln!(f, "{}", serde_json::to_string(&r)?)?;
        }
        self.rows.push(r);
        Ok(())
    }

    /// Milliseconds of device time for the launches that `f` issues.
    fn time(&self, f: impl FnOnce(&Self) -> anyhow::Result<()>) -> anyhow::Result<f64> {
        let start = self
            .s
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(dbg_err)?;
        f(self)?;
        let end = self
            .s
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(dbg_err)?;
        Ok(start.elapsed_ms(&end).map_err(dbg_err)? as f64)
    }

    fn measure_ceilings(&self) -> anyhow::Result<Ceilings> {
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

    fn alloc_results(&self, n: u64) -> anyhow::Result<Results> {
        Ok(Results {
            status: self.s.alloc_zeros::<u32>(n as usize).map_err(dbg_err)?,
            okey: self.s.alloc_zeros::<u64>(n as usize).map_err(dbg_err)?,
            oval: self.s.alloc_zeros::<u64>(n as usize).map_err(dbg_err)?,
        })
    }

    fn ht_insert(
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

    fn ht_find(
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
    fn find_variant(
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

    fn ht_erase(
        &self,
        t: &mut GpuHashTable,
        keys: &CudaView<u64>,
        r: &mut Results,
    ) -> anyhow::Result<()> {
        // ht_erase takes the find variants' arguments.
        self.find_variant(&self.dev.k.ht_erase, t, keys, r)
    }

    fn tally(&self, r: &Results, keys: &CudaView<u64>, lp: bool) -> anyhow::Result<Tally> {
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

    fn batch_of(&self, n: u64) -> u64 {
        self.args.max_batch.min(n).max(1)
    }

    #[allow(clippy::too_many_arguments)]
    fn row(
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

    // ------------------------------------------------------------------ the bucketed table

    fn bucketed(&mut self, c: u32) -> anyhow::Result<()> {
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

    fn build(
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
    fn verify(
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
    fn churn(
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
    fn cache_mix(
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

    // ------------------------------------------------------------------ the linear-probing table

    fn linear(&mut self, c: u32) -> anyhow::Result<()> {
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

    // ------------------------------------------------------------------ batch-size sweep

    fn sweep(&mut self, c: u32) -> anyhow::Result<()> {
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

/// Launches a key generator, `gen_keys` (u64 keys from a u64 base) or `lp_gen` (u32 keys from a u32
/// base), over `keys[off..off + n]` and, when given, `vals[off..off + n]` (else the kernel gets a
/// null pointer and writes no values).
fn launch_gen<T: DeviceRepr>(
    b: &Bench,
    kernel: &CudaFunction,
    keys: &mut CudaSlice<T>,
    vals: Option<&mut CudaSlice<T>>,
    off: u64,
    n: u64,
    base: T,
) -> anyhow::Result<()> {
    let mut kv = keys.slice_mut(off as usize..(off + n) as usize);
    let mut l = b.s.launch_builder(kernel);
    l.arg(&mut kv);
    let null = 0u64;
    let mut vv;
    match vals {
        Some(v) => {
            vv = v.slice_mut(off as usize..(off + n) as usize);
            l.arg(&mut vv);
        }
        None => {
            l.arg(&null);
        }
    }
    l.arg(&n).arg(&base);
    unsafe { l.launch(cfg(n)) }.map_err(dbg_err)?;
    Ok(())
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

fn dbg_err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow::anyhow!("CUDA: {e:?}")
}

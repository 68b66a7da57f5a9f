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
use cudarc::driver::{sys::CUevent_flags, CudaFunction, CudaSlice, CudaStream, DeviceRepr, PushKernelArg};

use crate::hashtable::gpu::{cfg, Device};

/// The host side of the published designs' batches.
mod batch;
/// The bucketed table's rows: build to each load, finds, churn, the cache mix.
mod bucketed;
/// The device's own ceilings the rows are quoted against.
mod ceilings;
/// The published designs' rows (hopscotch after GLHT, SlabHash).
mod designs;
/// The hopscotch table after GLHT, a published design compared with the job cache's table.
pub mod hopscotch;
/// The kernels only the benchmark loads.
mod kernels;
/// The bucketed table's launches, their tallies and the rows they make.
mod launches;
/// The published linear-probing table's rows.
mod linear;
/// SlabHash, a published design compared with the job cache's table.
pub mod slab;
/// The batch-size sweep.
mod sweep;

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

fn dbg_err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow::anyhow!("CUDA: {e:?}")
}

//! `hypermnf bench cpu`: the CPU backend end to end (int16 in memory → float32 components in memory) on
//! a synthetic cube of the published design's size (1087 × 614 × 224 int16), k = 10, with peak resident
//! memory. Spectral Python needs 3.45 s and 2.9 GB on the 2-core machine class; the goal is half the time
//! and under 1 GB.

use std::time::Instant;

use crate::backend::cpu::CpuBackend;
use crate::cube::synthetic::{generate, SyntheticSpec};
use crate::mnf::{self, MnfParams, Monitor, NoiseEstimator};

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub cube: super::CubeSize,
    /// Timed repetitions (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub repeat: usize,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let spec = SyntheticSpec { lines: args.cube.lines, samples: args.cube.samples, bands: args.cube.bands, ..SyntheticSpec::paper_size() };
    let t = Instant::now();
    let cube = generate(&spec);
    println!(
        "cube: {} x {} x {} int16 ({:.0} MB), generated in {:.2} s; {} threads",
        spec.lines,
        spec.samples,
        spec.bands,
        cube.raw_len() as f64 / 1e6,
        t.elapsed().as_secs_f64(),
        rayon::current_num_threads()
    );
    let rss_before = super::peak_rss().unwrap_or(0);
    let backend = CpuBackend::new();
    println!("{:<18} {:>10} {:>10} {:>10} {:>10} {:>10}", "noise", "median s", "min s", "stats ms", "eigen ms", "proj ms");
    for noise in [NoiseEstimator::MeanFilter, NoiseEstimator::ShiftDifference] {
        let params = MnfParams { components: Some(args.cube.components), noise, ..Default::default() };
        let mut times = Vec::new();
        let mut last = None;
        for _ in 0..args.repeat.max(1) {
            let t = Instant::now();
            let out = mnf::run(&cube, &params, &backend, &Monitor::silent())?;
            times.push(t.elapsed().as_secs_f64());
            last = Some(out);
        }
        times.sort_by(f64::total_cmp);
        let md = last.expect("at least one run").metadata;
        let tm = |k: &str| md.timings_ms.get(k).copied().unwrap_or(0.0);
        println!(
            "{:<18} {:>10.3} {:>10.3} {:>10.0} {:>10.1} {:>10.0}",
            noise.name(),
            times[times.len() / 2],
            times[0],
            tm("statistics"),
            tm("eigen"),
            tm("projection")
        );
    }
    let peak = super::peak_rss().unwrap_or(0);
    println!(
        "peak resident memory: {:.0} MB (cube {:.0} MB + components {:.0} MB; {:.0} MB before the runs)",
        peak as f64 / 1e6,
        cube.raw_len() as f64 / 1e6,
        (cube.pixels() * args.cube.components * 4) as f64 / 1e6,
        rss_before as f64 / 1e6
    );
    Ok(())
}

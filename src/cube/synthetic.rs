//! Synthetic cubes with a known signal subspace plus white noise, for tests and benchmarks.
//!
//! x(line, sample, ·) = offset + Σ_j a_j(line, sample) · e_j(·) + n, where the e_j are smooth spectra
//! (sums of Gaussian bumps), the abundances a_j are spatially smooth (sums of low-frequency plane waves,
//! so the noise filters see little of them) and n is white Gaussian noise of standard deviation
//! `noise_sigma` in every band. The signal spans exactly `signal_dims` dimensions, so MNF must find
//! `signal_dims` eigenvalues well above 1 and the rest near 1. Generation is deterministic in `seed`
//! and parallel by lines.

use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal};
use rayon::prelude::*;

use super::{ByteOrder, Cube, CubeMeta, DataType};

#[derive(Debug, Clone)]
pub struct SyntheticSpec {
    pub lines: usize,
    pub samples: usize,
    pub bands: usize,
    /// Dimension of the signal subspace.
    pub signal_dims: usize,
    /// Standard deviation of the white noise, in data units.
    pub noise_sigma: f64,
    /// Peak amplitude of each abundance map, in data units.
    pub amplitude: f64,
    /// Constant added to every sample (keeps int16 data positive, like radiance).
    pub offset: f64,
    /// I16 (rounded and clamped, like AVIRIS) or F32; other types are produced by rounding as well.
    pub dtype: DataType,
    pub seed: u64,
}

impl SyntheticSpec {
    /// The published design's cube size: 1087 lines × 614 samples × 224 bands, int16.
    pub fn paper_size() -> Self {
        SyntheticSpec { lines: 1087, samples: 614, bands: 224, ..Self::small(0, 0, 0) }
    }

    /// A cube of the given shape with 5 signal dimensions, σ = 10, amplitude 400, offset 1000, int16.
    pub fn small(lines: usize, samples: usize, bands: usize) -> Self {
        SyntheticSpec {
            lines,
            samples,
            bands,
            signal_dims: 5,
            noise_sigma: 10.0,
            amplitude: 400.0,
            offset: 1000.0,
            dtype: DataType::I16,
            seed: 42,
        }
    }
}

/// The smooth spectra e_j (signal_dims × bands, row-major) of a spec.
pub fn spectra(spec: &SyntheticSpec) -> Vec<f64> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(spec.seed ^ 0x5eed_5bec);
    let b = spec.bands as f64;
    let mut e = Vec::with_capacity(spec.signal_dims * spec.bands);
    for _ in 0..spec.signal_dims {
        let bumps: Vec<(f64, f64, f64)> = (0..3)
            .map(|_| (rng.random_range(0.3..1.0), rng.random_range(0.0..b), rng.random_range(b / 20.0..b / 4.0 + 1.0)))
            .collect();
        for band in 0..spec.bands {
            let v: f64 = bumps.iter().map(|(h, mu, w)| h * (-((band as f64 - mu) / w).powi(2)).exp()).sum();
            e.push(v);
        }
    }
    e
}

/// Plane waves of an abundance map: (amplitude share, cycles per line, cycles per sample, phase).
type Waves = Vec<(f64, f64, f64, f64)>;

fn abundance_waves(spec: &SyntheticSpec) -> Vec<Waves> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(spec.seed ^ 0xab0d_a9ce);
    (0..spec.signal_dims)
        .map(|_| {
            (0..3)
                .map(|_| {
                    (
                        rng.random_range(0.2..0.5),
                        rng.random_range(-1.0..1.0) / 80.0,
                        rng.random_range(-1.0..1.0) / 80.0,
                        rng.random_range(0.0..std::f64::consts::TAU),
                    )
                })
                .collect()
        })
        .collect()
}

/// The noise-free signal at one pixel (bands values) into `out`.
fn clean_pixel(spec: &SyntheticSpec, e: &[f64], waves: &[Waves], line: usize, sample: usize, out: &mut [f64]) {
    out.fill(spec.offset);
    for (j, w) in waves.iter().enumerate() {
        let a: f64 = w
            .iter()
            .map(|(h, fl, fs, ph)| h * (std::f64::consts::TAU * (fl * line as f64 + fs * sample as f64) + ph).sin())
            .sum::<f64>()
            * spec.amplitude;
        for (o, ev) in out.iter_mut().zip(&e[j * spec.bands..(j + 1) * spec.bands]) {
            *o += a * ev;
        }
    }
}

/// Generates the noisy cube.
pub fn generate(spec: &SyntheticSpec) -> Cube {
    generate_inner(spec, false).0
}

/// Generates the noisy cube and the noise-free signal (f64, BIP) — doubles memory: tests only.
pub fn generate_with_truth(spec: &SyntheticSpec) -> (Cube, Vec<f64>) {
    let (c, t) = generate_inner(spec, true);
    (c, t.expect("truth requested"))
}

fn generate_inner(spec: &SyntheticSpec, truth: bool) -> (Cube, Option<Vec<f64>>) {
    let (l, s, b) = (spec.lines, spec.samples, spec.bands);
    let size = spec.dtype.size();
    let e = spectra(spec);
    let waves = abundance_waves(spec);
    let noise = Normal::new(0.0, spec.noise_sigma.max(0.0)).expect("finite sigma");
    let mut data = vec![0u8; l * s * b * size];
    let mut clean_all = if truth { vec![0.0f64; l * s * b] } else { Vec::new() };
    let line_bytes = s * b * size;
    let fill_line = |line: usize, bytes: &mut [u8], clean_line: Option<&mut [f64]>| {
        let mut rng = rand::rngs::StdRng::seed_from_u64(spec.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ line as u64);
        let mut px = vec![0.0; b];
        let mut clean_line = clean_line;
        for sample in 0..s {
            clean_pixel(spec, &e, &waves, line, sample, &mut px);
            if let Some(cl) = clean_line.as_deref_mut() {
                cl[sample * b..(sample + 1) * b].copy_from_slice(&px);
            }
            for (band, v) in px.iter().enumerate() {
                let x = v + noise.sample(&mut rng);
                let o = (sample * b + band) * size;
                encode(x, spec.dtype, &mut bytes[o..o + size]);
            }
        }
    };
    if truth {
        data.par_chunks_mut(line_bytes)
            .zip(clean_all.par_chunks_mut(s * b))
            .enumerate()
            .for_each(|(line, (bytes, cl))| fill_line(line, bytes, Some(cl)));
    } else {
        data.par_chunks_mut(line_bytes).enumerate().for_each(|(line, bytes)| fill_line(line, bytes, None));
    }
    let cube = Cube::from_raw(l, s, b, spec.dtype, ByteOrder::Little, data, CubeMeta::default())
        .expect("synthetic sizes are consistent");
    (cube, truth.then_some(clean_all))
}

/// Writes `x` as one little-endian sample of `dtype` (integers rounded and clamped to the type's range).
fn encode(x: f64, dtype: DataType, out: &mut [u8]) {
    match dtype {
        DataType::U8 => out[0] = x.round().clamp(0.0, 255.0) as u8,
        DataType::I16 => out.copy_from_slice(&(x.round().clamp(i16::MIN as f64, i16::MAX as f64) as i16).to_le_bytes()),
        DataType::U16 => out.copy_from_slice(&(x.round().clamp(0.0, u16::MAX as f64) as u16).to_le_bytes()),
        DataType::I32 => out.copy_from_slice(&(x.round() as i32).to_le_bytes()),
        DataType::U32 => out.copy_from_slice(&(x.round().max(0.0) as u32).to_le_bytes()),
        DataType::I64 => out.copy_from_slice(&(x.round() as i64).to_le_bytes()),
        DataType::U64 => out.copy_from_slice(&(x.round().max(0.0) as u64).to_le_bytes()),
        DataType::F32 => out.copy_from_slice(&(x as f32).to_le_bytes()),
        DataType::F64 => out.copy_from_slice(&x.to_le_bytes()),
    }
}

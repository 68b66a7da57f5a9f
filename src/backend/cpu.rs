//! The CPU backend: the reference implementation, multi-threaded with rayon and memory-bounded.
//!
//! Every pass walks the cube in chunks of whole lines. A chunk is widened to float64 (with a one-line
//! halo for the noise filter), its moments are formed with a centred matrix product, and the per-chunk
//! moments are merged in chunk order. Chunk boundaries depend only on the cube's shape, never on the
//! thread count, so results are bit-identical from run to run (the cache and the service rely on it).
//! Working memory is O(threads × chunk), on top of the input cube and the output.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};

use rayon::prelude::*;

use super::{Backend, BackendError, PreparedCube};
use crate::cube::Cube;
use crate::mnf::stats::{is_masked, Denoise, Moments, Projection, Statistics, StatsSpec};
use crate::mnf::{Monitor, NoiseEstimator, Stage};

/// Pixels per chunk: large enough for efficient matrix products, small enough to stay in cache-sized
/// working sets (a few MB per thread).
const CHUNK_PIXELS: usize = 8192;

pub struct CpuBackend;

impl CpuBackend {
    pub fn new() -> Self {
        CpuBackend
    }
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }
    fn device(&self) -> String {
        format!("CPU ({} threads)", rayon::current_num_threads())
    }
    fn prepare<'c>(&'c self, cube: &'c Cube, _monitor: &Monitor) -> Result<Box<dyn PreparedCube + Send + 'c>, BackendError> {
        Ok(Box::new(CpuCube { cube, view: 0..cube.lines() }))
    }
    fn prepare_lines<'c>(
        &'c self,
        cube: &'c Cube,
        lines: Range<usize>,
        _monitor: &Monitor,
    ) -> Result<Box<dyn PreparedCube + Send + 'c>, BackendError> {
        super::check_line_range(cube, &lines)?;
        Ok(Box::new(CpuCube { cube, view: lines }))
    }
}

/// Lines `view` of a cube, seen by the passes as a cube of their own: the image ends at the view's
/// ends (no noise residual reaches past them) and a noise window is in the view's coordinates. The
/// whole cube is the view 0..lines.
struct CpuCube<'c> {
    cube: &'c Cube,
    view: Range<usize>,
}

/// Line ranges (in the cube) of the chunks of `view`, fixed by the cube's shape and the view.
fn chunks(cube: &Cube, view: &Range<usize>) -> Vec<(usize, usize)> {
    let per = (CHUNK_PIXELS / cube.samples().max(1)).clamp(1, view.len().max(1));
    view.clone().step_by(per).map(|l0| (l0, (l0 + per).min(view.end))).collect()
}

/// Counts finished chunks and reports progress / checks cancellation.
struct Ticker<'m> {
    monitor: &'m Monitor,
    stage: Stage,
    done: AtomicUsize,
    total: usize,
}

impl Ticker<'_> {
    fn tick(&self) -> Result<(), BackendError> {
        let d = self.done.fetch_add(1, Ordering::Relaxed) + 1;
        self.monitor.tick(self.stage, d as f64 / self.total as f64)
    }
}

impl PreparedCube for CpuCube<'_> {
    fn statistics(
        &mut self,
        spec: &StatsSpec,
        on_noise: &mut dyn FnMut(&Moments),
        monitor: &Monitor,
    ) -> Result<Statistics, BackendError> {
        let cube = self.cube;
        let view = &self.view;
        let chunks = chunks(cube, view);
        let ticker = Ticker { monitor, stage: Stage::Statistics, done: AtomicUsize::new(0), total: chunks.len() };
        monitor.tick(Stage::Statistics, 0.0)?;
        let parts: Vec<(Moments, Moments, u64)> = chunks
            .par_iter()
            .map(|&(l0, l1)| {
                let r = chunk_statistics(cube, spec, view, l0, l1);
                ticker.tick()?;
                Ok(r)
            })
            .collect::<Result<_, BackendError>>()?;
        // Merge in chunk order: deterministic whatever the scheduling.
        let b = cube.bands();
        let (mut data, mut noise, mut masked) = (Moments::new(b), Moments::new(b), 0u64);
        for (d, n, m) in &parts {
            data.merge(d);
            noise.merge(n);
            masked += m;
        }
        on_noise(&noise);
        Ok(Statistics { data, noise, masked_pixels: masked })
    }

    fn project(&mut self, p: &Projection, out: &mut [f32], monitor: &Monitor) -> Result<(), BackendError> {
        let u = p.bands_used.len();
        let k = p.k;
        transform_pass(self.cube, &self.view, out, k, Stage::Projection, monitor, p.ignore_value, &p.mask_bands, |x, rows, z| {
            // z (rows × k) = (x_used − μ) (rows × u) · T (u × k)
            let centred = gather_centred(x, rows, self.cube.bands(), &p.bands_used, &p.means);
            let mut zz = vec![0.0f64; rows * k];
            gemm(rows, u, k, &centred, u as isize, 1, &p.transform, k as isize, 1, &mut zz);
            for (o, v) in z.iter_mut().zip(&zz) {
                *o = *v as f32;
            }
        })
    }

    fn denoise(&mut self, d: &Denoise, out: &mut [f32], monitor: &Monitor) -> Result<(), BackendError> {
        let u = d.bands_used.len();
        let b = self.cube.bands();
        transform_pass(self.cube, &self.view, out, b, Stage::Inverse, monitor, d.ignore_value, &d.mask_bands, |x, rows, z| {
            // x̂_used (rows × u) = μ + (x_used − μ) · Aᵀ; other bands pass through.
            let centred = gather_centred(x, rows, b, &d.bands_used, &d.means);
            let mut y = vec![0.0f64; rows * u];
            // Aᵀ as a u × u operand: element (q, r) = A[r, q] → row stride 1, column stride u.
            gemm(rows, u, u, &centred, u as isize, 1, &d.matrix, 1, u as isize, &mut y);
            for (r, (px_in, px_out)) in x.chunks_exact(b).zip(z.chunks_exact_mut(b)).enumerate() {
                for (o, v) in px_out.iter_mut().zip(px_in) {
                    *o = *v as f32;
                }
                for (j, &band) in d.bands_used.iter().enumerate() {
                    px_out[band] = (d.means[j] + y[r * u + j]) as f32;
                }
            }
        })
    }
}

/// Widens one chunk, lines l0..l1 of the cube (with halo lines inside `view`), and forms its data
/// moments and the moments of the noise residuals centred on its lines whose neighbours lie in `view`.
/// Lines are the cube's; `spec.window` is in the view's coordinates.
pub(crate) fn chunk_statistics(cube: &Cube, spec: &StatsSpec, view: &Range<usize>, l0: usize, l1: usize) -> (Moments, Moments, u64) {
    let (s, b) = (cube.samples(), cube.bands());
    // The view's first line plays line 0, its end the image's end.
    let (top, lines) = (view.start, view.end);
    let h0 = l0.saturating_sub(1).max(top);
    let h1 = (l1 + 1).min(lines);
    let mut x = vec![0.0f64; (h1 - h0) * s * b];
    cube.decode_lines_f64(h0, h1 - h0, &mut x);
    let valid: Vec<bool> = x.chunks_exact(b).map(|p| !is_masked(p, spec.ignore_value, &spec.mask_bands)).collect();
    let ok = |l: usize, c: usize| valid[(l - h0) * s + c];
    macro_rules! px {
        ($l:expr, $c:expr) => {{
            let i = (($l - h0) * s + $c) * b;
            &x[i..i + b]
        }};
    }

    // Noise first: the data moments below may centre the chunk's lines of `x` in place.
    let mut rows: Vec<f64> = Vec::new();
    let in_window = |l: usize, c: usize| spec.window.is_none_or(|w| w.contains(l - top, c));
    match spec.noise {
        NoiseEstimator::MeanFilter if lines - top >= 3 && s >= 3 => {
            rows.reserve((l1 - l0) * s * b);
            for l in l0.max(top + 1)..l1.min(lines - 1) {
                for c in 1..s - 1 {
                    if !in_window(l, c) || !(l - 1..=l + 1).all(|ll| (c - 1..=c + 1).all(|cc| ok(ll, cc))) {
                        continue;
                    }
                    // The three rows of the 3 × 3 window, each 3 pixels × b bands, contiguous in BIP.
                    let (up, mid, down) = (px3(&x, s, b, l - 1 - h0, c), px3(&x, s, b, l - h0, c), px3(&x, s, b, l + 1 - h0, c));
                    let centre = &mid[b..2 * b];
                    let start = rows.len();
                    rows.resize(start + b, 0.0);
                    let dst = &mut rows[start..];
                    for band in 0..b {
                        let nb = up[band] + up[b + band] + up[2 * b + band] + mid[band] + mid[2 * b + band]
                            + down[band] + down[b + band] + down[2 * b + band];
                        dst[band] = centre[band] - nb * 0.125;
                    }
                }
            }
        }
        NoiseEstimator::ShiftDifference if lines - top >= 2 && s >= 2 => {
            rows.reserve((l1 - l0) * s * b);
            for l in l0..l1.min(lines - 1) {
                for c in 0..s - 1 {
                    if !in_window(l, c) || !ok(l, c) || !ok(l + 1, c + 1) {
                        continue;
                    }
                    let (a, d) = (px!(l, c), px!(l + 1, c + 1));
                    rows.extend(a.iter().zip(d).map(|(p, q)| p - q));
                }
            }
        }
        _ => {}
    }
    let mut noise = Moments::new(b);
    let n = rows.len() / b;
    noise.add_rows_in_place(&mut rows, n);

    // Data: the valid pixels of lines l0..l1 (in place when none is masked: no copy).
    let masked = (l0..l1).flat_map(|l| (0..s).map(move |c| (l, c))).filter(|&(l, c)| !ok(l, c)).count() as u64;
    let mut data = Moments::new(b);
    if masked == 0 {
        let lines_of_chunk = &mut x[(l0 - h0) * s * b..(l1 - h0) * s * b];
        data.add_rows_in_place(lines_of_chunk, (l1 - l0) * s);
    } else {
        rows.clear();
        for l in l0..l1 {
            for c in 0..s {
                if ok(l, c) {
                    rows.extend_from_slice(px!(l, c));
                }
            }
        }
        let n = rows.len() / b;
        data.add_rows_in_place(&mut rows, n);
    }
    (data, noise, masked)
}

/// The three pixels (c − 1, c, c + 1) of row `line` of a BIP chunk: 3 × b contiguous values.
#[inline]
fn px3(x: &[f64], s: usize, b: usize, line: usize, c: usize) -> &[f64] {
    let i = (line * s + c - 1) * b;
    &x[i..i + 3 * b]
}

/// (x_used − μ) for `rows` pixels of `x` (rows × bands): rows × u, row-major.
fn gather_centred(x: &[f64], rows: usize, bands: usize, used: &[usize], means: &[f64]) -> Vec<f64> {
    let mut c = Vec::with_capacity(rows * used.len());
    for px in x.chunks_exact(bands) {
        c.extend(used.iter().zip(means).map(|(&b, m)| px[b] - m));
    }
    c
}

/// Runs a per-pixel linear map over the cube in chunks of lines, writing `width` values per pixel;
/// masked pixels are NaN.
#[allow(clippy::too_many_arguments)]
fn transform_pass(
    cube: &Cube,
    view: &Range<usize>,
    out: &mut [f32],
    width: usize,
    stage: Stage,
    monitor: &Monitor,
    ignore: Option<f64>,
    mask_bands: &[usize],
    map: impl Fn(&[f64], usize, &mut [f32]) + Sync,
) -> Result<(), BackendError> {
    let (s, b) = (cube.samples(), cube.bands());
    if out.len() != view.len() * s * width {
        return Err(BackendError::Invalid(format!(
            "output buffer of {} values for {} lines x {s} samples x {width}",
            out.len(),
            view.len()
        )));
    }
    let chunks = chunks(cube, view);
    let per = chunks[0].1 - chunks[0].0;
    let ticker = Ticker { monitor, stage, done: AtomicUsize::new(0), total: chunks.len() };
    monitor.tick(stage, 0.0)?;
    out.par_chunks_mut(per * s * width).zip(chunks.par_iter()).try_for_each(|(z, &(l0, l1))| {
        let rows = (l1 - l0) * s;
        let mut x = vec![0.0f64; rows * b];
        cube.decode_lines_f64(l0, l1 - l0, &mut x);
        map(&x, rows, z);
        if ignore.is_some() {
            for (px, o) in x.chunks_exact(b).zip(z.chunks_exact_mut(width)) {
                if is_masked(px, ignore, mask_bands) {
                    o.fill(f32::NAN);
                }
            }
        }
        ticker.tick()
    })
}

/// C (m × n, row-major, contiguous) = A (m × k) · B (k × n) with explicit strides (float64).
#[allow(clippy::too_many_arguments)]
fn gemm(m: usize, k: usize, n: usize, a: &[f64], rsa: isize, csa: isize, b: &[f64], rsb: isize, csb: isize, c: &mut [f64]) {
    assert!(a.len() >= m * k && b.len() >= k * n && c.len() >= m * n);
    if m == 0 || n == 0 {
        return;
    }
    // SAFETY: the asserts above bound every index the strides can reach for these shapes.
    unsafe {
        matrixmultiply::dgemm(m, k, n, 1.0, a.as_ptr(), rsa, csa, b.as_ptr(), rsb, csb, 0.0, c.as_mut_ptr(), n as isize, 1);
    }
}

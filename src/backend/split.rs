//! One cube over several devices, split by lines (`--split-cube`, or when a cube does not fit one
//! device's memory).
//!
//! The lines are cut into contiguous shares, one per device, and every pass runs on all shares at
//! once, one host thread per device. Each device prepares only its share (`Backend::prepare_lines`:
//! its lines are uploaded, no other) and sees it as a cube of its own, so it computes the data moments
//! of its lines and the noise residuals whose neighbourhood lies inside them. The residuals whose
//! neighbourhood crosses a seam are the only ones missing: they are computed once, by the device
//! above the seam, from a strip of the seam's lines with one halo line on each side (only the noise
//! moments of the strip are kept, and a noise window restricts them to the seam's own lines). So each
//! shift-difference pair and each 3 × 3 neighbourhood is counted exactly once.
//!
//! Precision: every share is given the whole cube's shifts (`Backend`s that form sums of shifted
//! float32 values, the CUDA one), so each device forms exactly the float32 values, products and noise
//! residuals one device would. Only the order of the float64 additions differs: the moments of the
//! shares and seams are merged on the host in a fixed order (each share's noise with the seam below
//! it, then share 0, share 1, …) with the pairwise update of `Moments::merge`, where one device adds all tiles before converting the sums
//! once. The statistics therefore agree with one device's to float64 rounding, not bit for bit; the
//! tests hold them to 1e-12 relative (`tests/gpu_split.rs` on devices, `tests` below on the CPU backend).
//! The projection needs no neighbours: each device projects its share into its part of the output.

use std::ops::Range;
use std::sync::Arc;

use super::{check_window, cuda, Backend, BackendError, PreparedCube};
use crate::cube::Cube;
use crate::mnf::params::Window;
use crate::mnf::compute::ChunkDone;
use crate::mnf::stats::{Denoise, Moments, Projection, Statistics, StatsSpec};
use crate::mnf::{Monitor, NoiseEstimator};

/// An output pass (the projection or the inverse) on one share: its prepared cube, and its part of
/// the output.
type SharePass<'f, 'c> = dyn Fn(&mut (dyn PreparedCube + Send + 'c), &mut [f32], &Monitor) -> Result<(), BackendError> + Sync + 'f;

/// The fewest lines a share may have: with two, the residuals missing at the seams above and below a
/// share are centred on different lines, so no residual is counted twice.
pub const MIN_SHARE_LINES: usize = 2;

/// Contiguous shares of `lines` over at most `parts` devices, as even as possible; fewer shares when
/// the cube has fewer than `MIN_SHARE_LINES` lines per device.
pub fn shares(lines: usize, parts: usize) -> Vec<Range<usize>> {
    let n = parts.min(lines / MIN_SHARE_LINES).max(1);
    (0..n).map(|i| lines * i / n..lines * (i + 1) / n).collect()
}

/// Lines whose noise residual reads lines on both sides of the seam before line `seam` (the first
/// line of the lower share): the residuals neither share computes.
pub fn seam_centres(noise: NoiseEstimator, seam: usize) -> Range<usize> {
    match noise {
        // x(l) − mean of its 8 neighbours: line seam − 1 reads seam, line seam reads seam − 1.
        NoiseEstimator::MeanFilter => seam - 1..seam + 1,
        // x(l, s) − x(l + 1, s + 1): only line seam − 1 reads across.
        NoiseEstimator::ShiftDifference => seam - 1..seam,
    }
}

/// The lines the seam's residuals read: its centres with their halo lines, inside the cube.
pub fn seam_strip(noise: NoiseEstimator, seam: usize, lines: usize) -> Range<usize> {
    let c = seam_centres(noise, seam);
    match noise {
        NoiseEstimator::MeanFilter => c.start.saturating_sub(1)..(c.end + 1).min(lines),
        NoiseEstimator::ShiftDifference => c.start..(c.end + 1).min(lines),
    }
}

/// The noise window's lines inside `lines` (cube coordinates), or all of `lines` without a window.
fn window_lines(spec: &StatsSpec, lines: &Range<usize>) -> Range<usize> {
    match spec.window {
        Some(w) => w.y0.max(lines.start)..w.y1.min(lines.end).max(w.y0.max(lines.start)),
        None => lines.clone(),
    }
}

/// `spec` for the view `view` of a cube of `samples` samples, whose residuals are kept only on the
/// view's lines `keep` (cube coordinates): the noise window in the view's coordinates. None when no
/// residual of `keep` lies in the spec's window.
fn view_spec(spec: &StatsSpec, view: &Range<usize>, keep: &Range<usize>, samples: usize) -> Option<StatsSpec> {
    let rows = window_lines(spec, keep);
    if rows.is_empty() {
        return None;
    }
    let (x0, x1) = spec.window.map_or((0, samples), |w| (w.x0, w.x1));
    let window = if spec.window.is_none() && rows == *view {
        None
    } else {
        Some(Window { x0, x1, y0: rows.start - view.start, y1: rows.end - view.start })
    };
    Some(StatsSpec { window, ..spec.clone() })
}

/// When the cube is split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitMode {
    /// Every cube (`--split-cube`).
    Always,
    /// Only a cube that does not fit the first device's free memory; others run on that device, and
    /// the backend then stands for that device (its name, memory and ordinal, so that the job cache
    /// keeps its cubes in that device's level).
    WhenTooLarge,
}

/// Several backends (one per device) running one cube together.
pub struct SplitBackend {
    parts: Vec<Arc<dyn Backend>>,
    mode: SplitMode,
}

impl SplitBackend {
    pub fn new(parts: Vec<Arc<dyn Backend>>, mode: SplitMode) -> Result<Self, BackendError> {
        if parts.is_empty() {
            return Err(BackendError::Invalid("a split cube needs at least one device".into()));
        }
        Ok(SplitBackend { parts, mode })
    }

    pub fn parts(&self) -> &[Arc<dyn Backend>] {
        &self.parts
    }

    /// Whether `cube` is split over the devices (else it runs on the first).
    pub fn splits(&self, cube: &Cube) -> bool {
        shares(cube.lines(), self.parts.len()).len() > 1
            && match self.mode {
                SplitMode::Always => true,
                SplitMode::WhenTooLarge => !fits(self.parts[0].as_ref(), cube),
            }
    }
}

/// Whether the CUDA backend can keep `cube` resident on `backend`'s device: the raw cube, its pixel
/// mask and the per-pass buffers, less the margin it leaves free (a tenth plus 256 MiB; see
/// `CudaBackend::memory_budget`). A backend without device memory always fits.
fn fits(backend: &dyn Backend, cube: &Cube) -> bool {
    let Some((used, total)) = backend.memory_in_use() else { return true };
    let need = (cube.raw_len() as u64 + cube.pixels() as u64 + (256 << 20)) * 10 / 9 + (256 << 20);
    total.saturating_sub(used) >= need
}

impl Backend for SplitBackend {
    /// The first device's, as a split cube's (`SplitCube::eigen_solver`).
    fn eigen_solver(&self) -> Option<&dyn crate::mnf::eigen::GeneralizedEigenSolver> {
        self.parts.first().and_then(|p| p.eigen_solver())
    }
    /// The devices' backend name: the results are those of that backend.
    fn name(&self) -> &'static str {
        self.parts[0].name()
    }
    fn device(&self) -> String {
        let first = self.parts[0].device();
        if self.mode == SplitMode::WhenTooLarge {
            return first;
        }
        if self.parts.iter().all(|p| p.device() == first) {
            format!("{} x {first}", self.parts.len())
        } else {
            self.parts.iter().map(|p| p.device()).collect::<Vec<_>>().join(" + ")
        }
    }
    /// Always-split: None, so that the job cache's device level (one per device) keeps no split cube.
    /// Split only when too large: the first device's (a split cube holds no resident bytes, so the
    /// cache never keeps one).
    fn memory_in_use(&self) -> Option<(u64, u64)> {
        match self.mode {
            SplitMode::Always => None,
            SplitMode::WhenTooLarge => self.parts[0].memory_in_use(),
        }
    }
    fn ordinal(&self) -> Option<usize> {
        match self.mode {
            SplitMode::Always => None,
            SplitMode::WhenTooLarge => self.parts[0].ordinal(),
        }
    }
    fn release_idle_memory(&self) {
        for p in &self.parts {
            p.release_idle_memory();
        }
    }
    fn prepare<'c>(&'c self, cube: &'c Cube, monitor: &Monitor) -> Result<Box<dyn PreparedCube + Send + 'c>, BackendError> {
        if !self.splits(cube) {
            return self.parts[0].prepare(cube, monitor);
        }
        if self.mode == SplitMode::WhenTooLarge {
            tracing::info!(
                bytes = cube.raw_len(),
                device = %self.parts[0].device(),
                devices = self.parts.len(),
                "the cube does not fit the device's free memory: split over the devices"
            );
        }
        let mut out = Vec::new();
        for (lines, backend) in shares(cube.lines(), self.parts.len()).into_iter().zip(&self.parts) {
            let prepared = backend.prepare_lines(cube, lines.clone(), monitor)?;
            out.push(Share { lines, backend: backend.as_ref(), prepared });
        }
        tracing::debug!(shares = ?out.iter().map(|s| s.lines.clone()).collect::<Vec<_>>(), "cube split over the devices");
        Ok(Box::new(SplitCube { cube, shares: out }))
    }
}

struct Share<'c> {
    lines: Range<usize>,
    backend: &'c dyn Backend,
    prepared: Box<dyn PreparedCube + Send + 'c>,
}

/// A cube prepared in shares, one per device. Usable on any backends that implement
/// `prepare_lines` (the CPU backend too: the tests prove the seams with it).
pub struct SplitCube<'c> {
    cube: &'c Cube,
    shares: Vec<Share<'c>>,
}

impl<'c> SplitCube<'c> {
    /// Prepares `cube` in `shares(cube.lines(), parts.len())`, share i on `parts[i]`.
    pub fn new(cube: &'c Cube, parts: &'c [Arc<dyn Backend>], monitor: &Monitor) -> Result<Self, BackendError> {
        let mut out = Vec::new();
        for (lines, backend) in shares(cube.lines(), parts.len()).into_iter().zip(parts) {
            let prepared = backend.prepare_lines(cube, lines.clone(), monitor)?;
            out.push(Share { lines, backend: backend.as_ref(), prepared });
        }
        Ok(SplitCube { cube, shares: out })
    }

    /// The line ranges of the shares.
    pub fn share_lines(&self) -> Vec<Range<usize>> {
        self.shares.iter().map(|s| s.lines.clone()).collect()
    }

    /// Runs `f` on every share at once (one thread each), share i writing `width` values per pixel
    /// into its lines' part of `out`. The first share reports progress; every share sees cancellation.
    fn output(
        &mut self,
        out: &mut [f32],
        width: usize,
        monitor: &Monitor,
        f: &SharePass<'_, 'c>,
    ) -> Result<(), BackendError> {
        let per_line = self.cube.samples() * width;
        if out.len() != self.cube.lines() * per_line {
            return Err(BackendError::Invalid(format!(
                "output buffer of {} values for {} lines x {per_line} values",
                out.len(),
                self.cube.lines()
            )));
        }
        let mut parts = Vec::with_capacity(self.shares.len());
        let mut rest = out;
        for s in &self.shares {
            let (mine, tail) = rest.split_at_mut(s.lines.len() * per_line);
            parts.push(mine);
            rest = tail;
        }
        let results: Vec<Result<(), BackendError>> = std::thread::scope(|sc| {
            let handles: Vec<_> = self
                .shares
                .iter_mut()
                .zip(parts)
                .enumerate()
                .map(|(i, (share, mine))| {
                    let m = share_monitor(monitor, i);
                    sc.spawn(move || f(share.prepared.as_mut(), mine, &m))
                })
                .collect();
            handles.into_iter().map(join).collect()
        });
        first_error(results)
    }
}

/// The monitor of share i: the first reports progress, the others only share the cancel flag (the
/// shares are the same size, so the first's progress stands for all).
fn share_monitor(monitor: &Monitor, i: usize) -> Monitor {
    if i == 0 {
        monitor.clone()
    } else {
        Monitor::silent().with_cancel_flag(monitor.cancel_flag())
    }
}

/// A run of a share's output lent to the caller's thread: where it starts in the whole output, and
/// the values (valid until `answer` is sent; the lender waits for it).
struct LentRun {
    first: usize,
    ptr: *const f32,
    len: usize,
    answer: std::sync::mpsc::SyncSender<Result<(), BackendError>>,
}

// SAFETY: the pointer is only read on the receiving thread while the lending thread waits for the
// answer, so the values it points to are neither freed nor written meanwhile.
unsafe impl Send for LentRun {}

/// Lends `values` (the run starting at `first` of the whole output) to the thread that holds the
/// receiver and waits until it has passed them on, returning its answer.
fn lend(tx: &std::sync::mpsc::SyncSender<LentRun>, first: usize, values: &[f32]) -> Result<(), BackendError> {
    let (answer, answered) = std::sync::mpsc::sync_channel(1);
    let run = LentRun { first, ptr: values.as_ptr(), len: values.len(), answer };
    tx.send(run).map_err(|_| BackendError::Canceled)?;
    answered.recv().unwrap_or(Err(BackendError::Canceled))
}

fn join<T>(h: std::thread::ScopedJoinHandle<'_, Result<T, BackendError>>) -> Result<T, BackendError> {
    h.join()
        .unwrap_or_else(|_| Err(BackendError::Invalid("the thread of one device's share panicked".into())))
}

/// The first error in share order (a real error before the cancellations it caused elsewhere).
fn first_error(results: Vec<Result<(), BackendError>>) -> Result<(), BackendError> {
    let mut canceled = false;
    for r in results {
        match r {
            Ok(()) => {}
            Err(BackendError::Canceled) => canceled = true,
            Err(e) => return Err(e),
        }
    }
    if canceled {
        Err(BackendError::Canceled)
    } else {
        Ok(())
    }
}

/// The noise moments of the residuals crossing the seam before line `seam`, on `backend`; None where
/// the noise window leaves none.
fn seam_noise(
    backend: &dyn Backend,
    cube: &Cube,
    spec: &StatsSpec,
    seam: usize,
    shifts: &(Vec<f64>, Vec<f64>),
    monitor: &Monitor,
) -> Result<Option<Moments>, BackendError> {
    let strip = seam_strip(spec.noise, seam, cube.lines());
    let Some(strip_spec) = view_spec(spec, &strip, &seam_centres(spec.noise, seam), cube.samples()) else {
        return Ok(None);
    };
    // The strip's statistics tick from 0 to 1 on their own: progress stays with the share.
    let quiet = Monitor::silent().with_cancel_flag(monitor.cancel_flag());
    let mut p = backend.prepare_lines(cube, strip, &quiet)?;
    p.use_shifts(&shifts.0, &shifts.1);
    Ok(Some(p.statistics(&strip_spec, &mut |_| {}, &quiet)?.noise))
}

impl PreparedCube for SplitCube<'_> {
    fn statistics(
        &mut self,
        spec: &StatsSpec,
        on_noise: &mut dyn FnMut(&Moments),
        monitor: &Monitor,
    ) -> Result<Statistics, BackendError> {
        let cube = self.cube;
        let (lines, samples, b) = (cube.lines(), cube.samples(), cube.bands());
        check_window(spec, samples, lines)?;
        // Where a split's fixed cost goes (target hypermnf::split, debug; no device sync added).
        let began = std::time::Instant::now();
        let ms = |t: std::time::Instant| (t - began).as_secs_f64() * 1e3;
        let shifts = cuda::whole_cube_shifts(cube, spec);
        tracing::debug!(target: "hypermnf::split", shifts_ms = ms(std::time::Instant::now()), "the whole cube's shifts");
        let n = self.shares.len();
        let results: Vec<Result<Statistics, BackendError>> = std::thread::scope(|sc| {
            let handles: Vec<_> = self
                .shares
                .iter_mut()
                .enumerate()
                .map(|(i, share)| {
                    let m = share_monitor(monitor, i);
                    let shifts = &shifts;
                    sc.spawn(move || -> Result<_, BackendError> {
                        share.prepared.use_shifts(&shifts.0, &shifts.1);
                        // Without a residual in the window, the share's noise moments are dropped (the
                        // pass runs without the window, which would be empty in its coordinates).
                        let view_spec = view_spec(spec, &share.lines, &share.lines, samples);
                        let wanted = view_spec.is_some();
                        let view_spec = view_spec.unwrap_or_else(|| StatsSpec { window: None, ..spec.clone() });
                        let (backend, seam) = (share.backend, share.lines.end);
                        let (st, seam) = std::thread::scope(|sc| {
                            // The seam below the share on a thread of its own, from the start, beside
                            // the share's pass on the same device (a strip of a few lines: its upload
                            // and pass hide under the share's); after the share it added 0.6–1.1 ms
                            // to a 16x cube over four H200s.
                            let seam = (i + 1 < n).then(|| sc.spawn(|| seam_noise(backend, cube, spec, seam, shifts, &m)));
                            let st = share.prepared.statistics(&view_spec, &mut |_| {}, &m);
                            (st, seam.map(join))
                        });
                        let mut st = st?;
                        if !wanted {
                            st.noise = Moments::new(b);
                        }
                        // The seam's moments into the share's here, on the share's thread: the merge
                        // below has half as many steps in its chain.
                        if let Some(seam) = seam.transpose()?.flatten() {
                            st.noise.merge(&seam);
                        }
                        tracing::debug!(target: "hypermnf::split", share = i, done_ms = ms(std::time::Instant::now()), "a share's statistics, with its seam");
                        Ok(st)
                    })
                })
                .collect();
            handles.into_iter().map(join).collect()
        });
        let mut parts = Vec::with_capacity(n);
        let mut failure = Vec::new();
        for r in results {
            match r {
                Ok(p) => parts.push(p),
                Err(e) => failure.push(Err(e)),
            }
        }
        first_error(failure)?;
        // Fixed order: share 0 (with the seam below it), share 1, … whatever thread finished first;
        // the data's and the noise's chains on two threads.
        let (data, noise) = std::thread::scope(|sc| {
            let data = sc.spawn(|| {
                let mut data = Moments::new(b);
                parts.iter().for_each(|st| data.merge(&st.data));
                data
            });
            let mut noise = Moments::new(b);
            parts.iter().for_each(|st| noise.merge(&st.noise));
            (data.join().expect("merging moments does not panic"), noise)
        });
        let masked = parts.iter().map(|st| st.masked_pixels).sum();
        tracing::debug!(target: "hypermnf::split", merged_ms = ms(std::time::Instant::now()), "the shares' moments merged");
        on_noise(&noise);
        Ok(Statistics { data, noise, masked_pixels: masked })
    }

    fn project(&mut self, projection: &Projection, out: &mut [f32], monitor: &Monitor) -> Result<(), BackendError> {
        self.output(out, projection.k, monitor, &|p, o, m| p.project(projection, o, m))
    }

    /// Every share projects on its own thread as `project` does, streaming: the runs each share
    /// finishes (the CUDA backend's page-locked download chunks) are handed to `done` here, on the
    /// caller's thread, one at a time. Without it a split job's components went to fresh pageable
    /// memory through the default (`project`, then one `done` at the end): the driver's staged
    /// download of that memory made a device's run ~1.5x its pinned one at 16x (BENCHMARKS, Several
    /// GPUs), and nothing was written until the last share finished.
    fn project_streamed(
        &mut self,
        projection: &Projection,
        out: &mut [f32],
        done: &mut ChunkDone,
        monitor: &Monitor,
    ) -> Result<(), BackendError> {
        // A share's part of `out` tells where its runs start in the whole output.
        let base = out.as_ptr() as usize;
        let (tx, rx) = std::sync::mpsc::sync_channel::<LentRun>(0);
        let mut done_error: Option<BackendError> = None;
        let passed = std::thread::scope(|sc| {
            let shares = sc.spawn({
                let this = &mut *self;
                move || {
                    let passed = this.output(out, projection.k, monitor, &|p, o, m| {
                        let first = (o.as_ptr() as usize - base) / std::mem::size_of::<f32>();
                        p.project_streamed(projection, o, &mut |at, values| lend(&tx, first + at, values), m)
                    });
                    drop(tx); // the loop below ends once no share can lend a run
                    passed
                }
            });
            // The shares' runs, until every share's thread has finished (and dropped its sender).
            for run in rx.iter() {
                // SAFETY: the share's thread lent the run and waits for the answer below before
                // touching it again (`lend`).
                let values = unsafe { std::slice::from_raw_parts(run.ptr, run.len) };
                let answer = match &done_error {
                    Some(_) => Err(BackendError::Canceled),
                    // The share is told to stop; the caller gets `done`'s own error.
                    None => done(run.first, values).map_err(|e| {
                        done_error = Some(e);
                        BackendError::Canceled
                    }),
                };
                let _ = run.answer.send(answer);
            }
            shares.join()
        });
        let shares = passed.unwrap_or_else(|_| Err(BackendError::Invalid("the thread of the split's shares panicked".into())));
        match done_error {
            Some(e) => Err(e),
            None => shares,
        }
    }

    fn denoise(&mut self, d: &Denoise, out: &mut [f32], monitor: &Monitor) -> Result<(), BackendError> {
        let width = self.cube.bands();
        self.output(out, width, monitor, &|p, o, m| p.denoise(d, o, m))
    }

    /// The first device solves the eigenproblem (where its backend does so on the device).
    fn eigen_solver(&self) -> Option<&dyn crate::mnf::eigen::GeneralizedEigenSolver> {
        self.shares[0].prepared.eigen_solver()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;
    use crate::cube::synthetic::{self, SyntheticSpec};
    use crate::mnf::{MnfParams, Monitor};

    #[test]
    fn shares_cover_the_lines_once_and_in_order() {
        for lines in [2usize, 3, 5, 7, 100, 1087] {
            for parts in 1..=5 {
                let s = shares(lines, parts);
                assert_eq!(s[0].start, 0);
                assert_eq!(s.last().unwrap().end, lines);
                assert!(s.windows(2).all(|w| w[0].end == w[1].start));
                assert!(s.iter().all(|r| r.len() >= MIN_SHARE_LINES), "{lines} {parts} {s:?}");
                assert!(s.len() <= parts);
                let (lo, hi) = (s.iter().map(|r| r.len()).min().unwrap(), s.iter().map(|r| r.len()).max().unwrap());
                assert!(hi - lo <= 1, "even shares: {s:?}");
            }
        }
        assert_eq!(shares(1, 4), vec![0..1]);
        assert_eq!(shares(5, 4), vec![0..2, 2..5]);
    }

    #[test]
    fn seam_strips_hold_the_centres_and_their_halo() {
        assert_eq!(seam_centres(NoiseEstimator::MeanFilter, 10), 9..11);
        assert_eq!(seam_strip(NoiseEstimator::MeanFilter, 10, 100), 8..12);
        assert_eq!(seam_centres(NoiseEstimator::ShiftDifference, 10), 9..10);
        assert_eq!(seam_strip(NoiseEstimator::ShiftDifference, 10, 100), 9..11);
        // A seam one line above the end: the mean filter's strip stops at the cube's end.
        assert_eq!(seam_strip(NoiseEstimator::MeanFilter, 99, 100), 97..100);
    }

    /// A cube with fresh random values (never all zeros), int16 or float32.
    fn cube(lines: usize, samples: usize, bands: usize, seed: u64, float: bool) -> Cube {
        let spec = SyntheticSpec { seed, ..SyntheticSpec::small(lines, samples, bands) };
        let c = synthetic::generate(&spec);
        if !float {
            return c;
        }
        // Float values that are not on an integer grid, so that float32 rounding takes part.
        let v: Vec<f32> = c.to_f64().iter().map(|&x| (x * 0.37 + 11.0) as f32).collect();
        Cube::from_f32(lines, samples, bands, &v).unwrap()
    }

    fn rel(a: &[f64], b: &[f64]) -> f64 {
        let scale = b.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(f64::MIN_POSITIVE);
        a.iter().zip(b).fold(0.0f64, |m, (x, y)| m.max((x - y).abs())) / scale
    }

    fn stats(p: &mut dyn PreparedCube, spec: &StatsSpec) -> Statistics {
        p.statistics(spec, &mut |_| {}, &Monitor::silent()).unwrap()
    }

    fn spec_for(c: &Cube, noise: NoiseEstimator, window: Option<Window>, ignore: Option<f64>) -> StatsSpec {
        StatsSpec { noise, window, ignore_value: ignore, mask_bands: (0..c.bands()).collect() }
    }

    /// The seams, proved on the CPU backend: split statistics equal the unsplit ones (same counts
    /// exactly, moments to 1e-12 relative) for both estimators, 1 to 5 shares, with a noise window that
    /// starts and ends inside shares and with no-data pixels.
    #[test]
    fn split_statistics_equal_the_unsplit_ones_on_the_cpu() {
        let cpu: Arc<dyn Backend> = Arc::new(CpuBackend::new());
        for (seed, float) in [(11u64, false), (12, true)] {
            let c = cube(37, 9, 6, seed, float);
            let masked_value = c.to_f64()[(5 * 9 + 4) * 6];
            for noise in [NoiseEstimator::MeanFilter, NoiseEstimator::ShiftDifference] {
                for (window, ignore) in [
                    (None, None),
                    (Some(Window { x0: 1, x1: 8, y0: 6, y1: 29 }), None),
                    (None, Some(masked_value)),
                ] {
                    let spec = spec_for(&c, noise, window, ignore);
                    let whole = stats(cpu.prepare(&c, &Monitor::silent()).unwrap().as_mut(), &spec);
                    assert!(whole.noise.n > 0 && whole.data.n > 0);
                    for parts in 2..=5 {
                        let devices: Vec<Arc<dyn Backend>> = vec![cpu.clone(); parts];
                        let mut split = SplitCube::new(&c, &devices, &Monitor::silent()).unwrap();
                        assert_eq!(split.share_lines().len(), parts);
                        let s = stats(&mut split, &spec);
                        let what = format!("seed {seed} {noise:?} window {window:?} ignore {ignore:?}, {parts} shares");
                        assert_eq!(s.data.n, whole.data.n, "{what}");
                        assert_eq!(s.noise.n, whole.noise.n, "noise residuals counted once: {what}");
                        assert_eq!(s.masked_pixels, whole.masked_pixels, "{what}");
                        for (a, b, name) in [
                            (&s.data.mean, &whole.data.mean, "data mean"),
                            (&s.data.m2, &whole.data.m2, "data M2"),
                            (&s.noise.mean, &whole.noise.mean, "noise mean"),
                            (&s.noise.m2, &whole.noise.m2, "noise M2"),
                        ] {
                            let r = rel(a, b);
                            assert!(r <= 1e-12, "{name}: relative error {r:e} ({what})");
                        }
                    }
                }
            }
        }
    }

    /// Without the seam strips the split would lose exactly the residuals that cross the seams: the
    /// test above could not pass by accident.
    #[test]
    fn the_shares_alone_miss_the_residuals_across_the_seams() {
        let cpu: Arc<dyn Backend> = Arc::new(CpuBackend::new());
        let c = cube(20, 7, 4, 3, false);
        let spec = spec_for(&c, NoiseEstimator::ShiftDifference, None, None);
        let whole = stats(cpu.prepare(&c, &Monitor::silent()).unwrap().as_mut(), &spec);
        let mut alone = 0;
        for r in shares(20, 2) {
            alone += stats(cpu.prepare_lines(&c, r, &Monitor::silent()).unwrap().as_mut(), &spec).noise.n;
        }
        // One seam, one line of pairs: samples − 1 residuals.
        assert_eq!(whole.noise.n - alone, 6);
    }

    /// The whole pipeline through a split backend gives the unsplit result (CPU backend).
    #[test]
    fn a_split_run_projects_like_an_unsplit_one() {
        let c = cube(23, 8, 6, 5, true);
        let cpu: Arc<dyn Backend> = Arc::new(CpuBackend::new());
        let split = SplitBackend::new(vec![cpu.clone(), cpu.clone(), cpu.clone()], SplitMode::Always).unwrap();
        assert!(split.splits(&c));
        let params = MnfParams { components: Some(3), inverse: true, ..MnfParams::default() };
        let a = crate::mnf::run(&c, &params, cpu.as_ref(), &Monitor::silent()).unwrap();
        let b = crate::mnf::run(&c, &params, &split, &Monitor::silent()).unwrap();
        assert_eq!(a.k, b.k);
        let ev = rel(&b.metadata.eigenvalues, &a.metadata.eigenvalues);
        assert!(ev <= 1e-9, "eigenvalues {ev:e}");
        let (za, zb): (Vec<f64>, Vec<f64>) =
            a.components.iter().zip(&b.components).map(|(&x, &y)| (x as f64, y as f64)).unzip();
        assert!(rel(&zb, &za) <= 1e-5, "components {:e}", rel(&zb, &za));
        let (da, db) = (a.denoised.unwrap(), b.denoised.unwrap());
        assert_eq!(da.len(), db.len());
        // WhenTooLarge on a backend without device memory: never split.
        let lazy = SplitBackend::new(vec![cpu.clone(), cpu], SplitMode::WhenTooLarge).unwrap();
        assert!(!lazy.splits(&c));
    }

    /// The streamed projection hands every value over exactly once, equal to `project`'s, on the
    /// caller's thread; a failing `done` stops it with `done`'s own error.
    #[test]
    fn a_streamed_split_projection_hands_every_value_over_once() {
        let c = cube(23, 8, 6, 7, true);
        let cpu: Arc<dyn Backend> = Arc::new(CpuBackend::new());
        let devices = vec![cpu.clone(), cpu.clone(), cpu];
        let mut split = SplitCube::new(&c, &devices, &Monitor::silent()).unwrap();
        let k = 2;
        let p = Projection {
            bands_used: (0..6).collect(),
            means: (0..6).map(|b| b as f64 * 0.5).collect(),
            transform: (0..6 * k).map(|i| ((i * 7 % 5) as f64 - 1.7) * 0.3).collect(),
            k,
            ignore_value: None,
            mask_bands: vec![],
        };
        let n = c.pixels() * k;
        let mut whole = vec![0.0f32; n];
        split.project(&p, &mut whole, &Monitor::silent()).unwrap();
        let caller = std::thread::current().id();
        let (mut streamed, mut seen) = (vec![f32::NAN; n], vec![0u8; n]);
        let mut scratch = vec![0.0f32; n];
        split
            .project_streamed(
                &p,
                &mut scratch,
                &mut |first, values| {
                    assert_eq!(std::thread::current().id(), caller, "runs are handed over on the caller's thread");
                    for (i, &v) in values.iter().enumerate() {
                        streamed[first + i] = v;
                        seen[first + i] += 1;
                    }
                    Ok(())
                },
                &Monitor::silent(),
            )
            .unwrap();
        assert!(seen.iter().all(|&s| s == 1), "every value once: {seen:?}");
        assert!(whole.iter().any(|&v| v != 0.0));
        assert_eq!(streamed.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), whole.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
        let e = split
            .project_streamed(&p, &mut scratch, &mut |_, _| Err(BackendError::Invalid("the disk is full".into())), &Monitor::silent())
            .unwrap_err();
        assert!(e.to_string().contains("the disk is full"), "{e}");
    }

    #[test]
    fn bad_output_sizes_and_ranges_are_errors() {
        let c = cube(10, 4, 3, 1, false);
        let cpu: Arc<dyn Backend> = Arc::new(CpuBackend::new());
        assert!(cpu.prepare_lines(&c, 5..5, &Monitor::silent()).is_err());
        assert!(cpu.prepare_lines(&c, 3..11, &Monitor::silent()).is_err());
        let devices = vec![cpu.clone(), cpu];
        let mut split = SplitCube::new(&c, &devices, &Monitor::silent()).unwrap();
        let p = Projection {
            bands_used: vec![0, 1, 2],
            means: vec![0.0; 3],
            transform: vec![1.0; 3],
            k: 1,
            ignore_value: None,
            mask_bands: vec![],
        };
        let mut out = vec![0.0f32; 39];
        let e = split.project(&p, &mut out, &Monitor::silent()).unwrap_err();
        assert_eq!(e.code(), "invalid_input");
        assert!(SplitBackend::new(Vec::new(), SplitMode::Always).is_err());
    }
}

//! Launchers of the statistics pass's kernels: noise residuals, shifted conversion, covariance sums.


use cudarc::driver::{CudaStream, LaunchConfig};

use crate::backend::cuda::device::DevBuf;
use crate::backend::BackendError;

use super::args::Extent;
use super::{grid_for, w16_eligible, DevPtr, Kernels, NoiseArgs, Pixels, RawType, COV_TILE, THREADS, W16_LINES};

impl Kernels {
    /// Noise residual rows for lines out_l0..out_l1 into `out`, minus `shift`; `count` += residuals.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn noise(
        &self,
        s: &CudaStream,
        mean_filter: bool,
        raw: DevPtr<u8>,
        valid: Option<DevPtr<u8>>,
        t: RawType,
        g: NoiseArgs,
        shift: DevPtr<f64>,
        out: DevPtr<f32>,
        count: DevPtr<u64>,
    ) -> Result<(), BackendError> {
        let rows = (g.out_l1 - g.out_l0).max(0) as u64;
        if rows == 0 {
            return Ok(());
        }
        let buf_pixels = g.buf_lines as usize * g.samples as usize;
        raw.holds(buf_pixels * g.bands as usize * t.size);
        valid.holds(buf_pixels);
        shift.holds(g.bands as usize);
        out.holds(rows as usize * g.samples as usize * g.bands as usize);
        // The 2-byte integer fast path needs 16-byte aligned rows in and out.
        let wide = mean_filter
            && self.wide
            && w16_eligible(t, g.bands as usize)
            && raw.addr() % 16 == 0
            && out.addr() % 16 == 0;
        let cfg = if wide {
            let threads = g.samples as u64 * (g.bands as u64 / 8);
            LaunchConfig {
                grid_dim: (threads.div_ceil(THREADS as u64) as u32, (rows as u32).div_ceil(W16_LINES), 1),
                block_dim: (THREADS, 1, 1),
                shared_mem_bytes: 0,
            }
        } else if mean_filter {
            LaunchConfig {
                grid_dim: ((g.samples as u32).div_ceil(16), (rows as u32).div_ceil(16), 1),
                block_dim: (THREADS, 1, 1),
                shared_mem_bytes: 0,
            }
        } else {
            grid_for(rows * g.samples as u64 * g.bands as u64, self.sms)
        };
        let f = if wide {
            &self.noise_mean_filter_w16[(t.code == 2) as usize]
        } else if mean_filter {
            &self.noise_mean_filter
        } else {
            &self.noise_shift_difference
        };
        let [wx0, wx1, wy0, wy1] = g.window;
        // One argument list for noise_mean_filter / noise_shift_difference / noise_mean_filter_w16{s,u}.
        #[rustfmt::skip]
        let args = [raw.into(), valid.into(), t.code.into(), t.swap.into(), g.lines.into(), g.samples.into(),
            g.bands.into(), g.buf_l0.into(), g.buf_lines.into(), g.out_l0.into(), g.out_l1.into(), wx0.into(),
            wx1.into(), wy0.into(), wy1.into(), shift.into(), out.into(), count.into()];
        self.launch(s, f, cfg, &args, "launch noise kernel")
    }

    /// out = raw − shift (float32), zero rows at invalid pixels.
    pub(crate) fn convert_shifted(
        &self,
        s: &CudaStream,
        px: Pixels,
        shift: DevPtr<f64>,
        out: DevPtr<f32>,
    ) -> Result<(), BackendError> {
        let Pixels { npix, bands, .. } = px;
        if npix == 0 {
            return Ok(());
        }
        px.check();
        let n = npix as usize * bands as usize;
        shift.holds(bands as usize);
        out.holds(n);
        let cfg = grid_for(n as u64, self.sms);
        self.launch(s, &self.convert_shifted, cfg, &px.args(&[shift.into(), out.into()]), "launch convert_shifted")
    }

    /// sums[b] += Σ_p d[p, b] (float64 atomics, one per block and band).
    pub(crate) fn col_sums(
        &self,
        s: &CudaStream,
        d: DevPtr<f32>,
        npix: i64,
        bands: i32,
        sums: DevPtr<f64>,
    ) -> Result<(), BackendError> {
        if npix == 0 {
            return Ok(());
        }
        d.holds(npix as usize * bands as usize);
        sums.holds(bands as usize);
        let per_block: i64 = 256;
        let blocks = (npix as u64).div_ceil(per_block as u64) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let args = [d.into(), npix.into(), bands.into(), per_block.into(), sums.into()];
        self.launch(s, &self.col_sums, cfg, &args, "launch col_sums")
    }

    /// Adds the rows of `d` into the per-split partial sums (see CovParts).
    pub(crate) fn cov_lower(&self, s: &CudaStream, d: DevPtr<f32>, npix: i64, parts: &CovParts) -> Result<(), BackendError> {
        if npix == 0 {
            return Ok(());
        }
        d.holds(npix as usize * parts.bands);
        // The m16 kernel stages 32 pixels per step and runs 128 threads; the others 16 and 256.
        let (step, threads) = if self.cov_lower_m16.is_some() {
            (32, 128)
        } else {
            (16, THREADS)
        };
        let per_split = (npix as u64).div_ceil(parts.splits as u64).div_ceil(step) * step;
        let per_split = per_split.max(step) as i64;
        let bands = parts.bands as i32;
        let (pairs, tiles) = (parts.pairs as i32, parts.tiles as i32);
        let cfg = LaunchConfig {
            grid_dim: (parts.pairs as u32, parts.splits as u32, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let (pc, ps) = parts.ptrs();
        let f = if let Some(m16) = &self.cov_lower_m16 {
            m16
        } else if self.use_dmma {
            &self.cov_lower_dmma
        } else {
            &self.cov_lower
        };
        // One argument list for cov_lower / cov_lower_dmma / cov_lower_m16; parts holds splits × pairs tiles.
        #[rustfmt::skip]
        let args = [d.into(), npix.into(), bands.into(), per_split.into(), pairs.into(), tiles.into(), pc.into(),
            ps.into()];
        self.launch(s, f, cfg, &args, "launch cov_lower")
    }

    /// c (B × B, lower triangle) and sums (B) from the partial sums.
    pub(crate) fn reduce_parts(
        &self,
        s: &CudaStream,
        parts: &CovParts,
        c: DevPtr<f64>,
        sums: DevPtr<f64>,
    ) -> Result<(), BackendError> {
        c.holds(parts.bands * parts.bands);
        sums.holds(parts.bands);
        let cfg = grid_for((parts.pairs * COV_TILE * COV_TILE) as u64, self.sms);
        let (splits, pairs, tiles, bands) = (
            parts.splits as i32,
            parts.pairs as i32,
            parts.tiles as i32,
            parts.bands as i32,
        );
        let (pc, ps) = parts.ptrs();
        #[rustfmt::skip]
        let args = [pc.into(), ps.into(), splits.into(), pairs.into(), tiles.into(), bands.into(), c.into(),
            sums.into()];
        self.launch(s, &self.reduce_parts, cfg, &args, "launch reduce_parts")
    }

    /// C_N (the noise's, divided by `noise_scale`) and C_D of the bands `used` (u of them, as i32) into
    /// `cn` and `cd` (u × u each), from the pass's device sums (`noise` and `data`: the lower triangle
    /// of the shifted cross sums, B × B row-major, then the B band sums) and `counters` (valid pixels,
    /// noise residuals; the data's count is `total` where the pass did not mask): the bits the host
    /// forms from the same sums downloaded (kernels/covariance.cu).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn covariances_from_sums(
        &self,
        s: &CudaStream,
        bands: usize,
        noise: DevPtr<f64>,
        data: DevPtr<f64>,
        counters: DevPtr<u64>,
        masked: bool,
        total: u64,
        used: DevPtr<i32>,
        u: usize,
        noise_scale: f64,
        part: FormedPart,
        out: DevPtr<f64>,
    ) -> Result<(), BackendError> {
        let bb = bands * bands;
        noise.holds(bb + bands);
        data.holds(bb + bands);
        counters.holds(2);
        used.holds(u);
        out.holds(u * u);
        // The kernel writes only the part asked for (`which`), into `out`; its other pointer is unused.
        let which: i32 = match part {
            FormedPart::Noise => 1,
            FormedPart::Data => 2,
        };
        let cfg = grid_for((u * u) as u64, self.sms);
        #[rustfmt::skip]
        let args = [noise.into(), noise.skip(bb).into(), data.into(), data.skip(bb).into(), counters.into(),
            (masked as i32).into(), (total as i64).into(), (bands as i32).into(), used.into(), (u as i32).into(),
            noise_scale.into(), which.into(), out.into(), out.into()];
        self.launch(s, &self.cov_pair_from_sums, cfg, &args, "launch cov_pair_from_sums")
    }

    /// out (float64) = in (float32), n values.
    pub(crate) fn widen_f64(&self, s: &CudaStream, input: DevPtr<f32>, n: i64, out: DevPtr<f64>) -> Result<(), BackendError> {
        if n == 0 {
            return Ok(());
        }
        input.holds(n as usize);
        out.holds(n as usize);
        let cfg = grid_for(n as u64, self.sms);
        self.launch(s, &self.widen_f64, cfg, &[input.into(), n.into(), out.into()], "launch widen_f64")
    }
}

/// Which covariance `Kernels::covariances_from_sums` forms: C_N (scaled) or C_D.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FormedPart {
    Noise,
    Data,
}

/// The per-split partial sums of cov_lower for one covariance: splits × pairs tiles of 64 × 64 float64
/// and splits × tiles × 64 band sums, zeroed at the start of a pass and reduced at its end.
pub(crate) struct CovParts<'c> {
    pub bands: usize,
    pub tiles: usize,
    pub pairs: usize,
    pub splits: usize,
    pub cross: crate::backend::cuda::device::Pooled<'c, DevBuf>,
    pub sum: crate::backend::cuda::device::Pooled<'c, DevBuf>,
}

impl CovParts<'_> {
    /// (tiles, pairs, splits): one full wave of blocks (`blocks_per_sm` resident per multiprocessor:
    /// 3 for the tensor-core kernel at 80 registers per thread, 2 for the FMA kernel at 128), so that
    /// no partial second wave leaves most of the GPU idle.
    pub(crate) fn shape(bands: usize, sms: u32, blocks_per_sm: usize) -> (usize, usize, usize) {
        let tiles = bands.div_ceil(COV_TILE);
        let pairs = tiles * (tiles + 1) / 2;
        let splits = (sms as usize * blocks_per_sm / pairs).max(1);
        (tiles, pairs, splits)
    }
    /// The partial cross products and band sums.
    fn ptrs(&self) -> (DevPtr<f64>, DevPtr<f64>) {
        (DevPtr::of(&self.cross), DevPtr::of(&self.sum))
    }
    pub(crate) fn zero(&self, s: &CudaStream) -> Result<(), BackendError> {
        self.cross.zero_async(s)?;
        self.sum.zero_async(s)
    }
}

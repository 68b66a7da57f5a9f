//! Launchers of the output passes' kernels: the projection and the inverse transform.


use cudarc::driver::{CudaStream, LaunchConfig};

use crate::backend::BackendError;

use super::args::Extent;
use super::{grid_for, DevPtr, Kernels, Pixels, THREADS};

impl Kernels {
    /// The projection / inverse kernel with T in global memory (project_global in transform.cu).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn project(
        &self,
        s: &CudaStream,
        px: Pixels,
        used: DevPtr<i32>,
        n_used: i32,
        means: DevPtr<f64>,
        t_global: DevPtr<f32>,
        k: i32,
        out: DevPtr<f32>,
        out_stride: i32,
        out_col: Option<DevPtr<i32>>,
        add_mean: Option<DevPtr<f64>>,
    ) -> Result<(), BackendError> {
        let Pixels { npix, .. } = px;
        if npix == 0 {
            return Ok(());
        }
        px.check();
        used.holds(n_used as usize);
        let blocks = (npix as u64).div_ceil(32).clamp(1, self.sms as u64 * 16) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        #[rustfmt::skip]
        let args = px.args(&[used.into(), n_used.into(), means.into(), t_global.into(), k.into(), out.into(),
            out_stride.into(), out_col.into(), add_mean.into()]);
        self.launch(s, &self.project_global, cfg, &args, "launch project_global")
    }

    /// The projection with T (u × kpad, zero-padded) `kp` components per pass: from shared memory when
    /// `t_pad` (the same T in device memory) is given, else from constant memory (already filled).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn project_px(
        &self,
        s: &CudaStream,
        t_pad: Option<DevPtr<f32>>,
        kp: usize,
        px: Pixels,
        used: DevPtr<i32>,
        n_used: i32,
        means: DevPtr<f64>,
        kpad: i32,
        k: i32,
        out: DevPtr<f32>,
    ) -> Result<(), BackendError> {
        let Pixels { npix, .. } = px;
        if npix == 0 {
            return Ok(());
        }
        px.check();
        used.holds(n_used as usize);
        t_pad.holds(n_used as usize * kpad as usize);
        let list = if t_pad.is_some() {
            &self.project_pxs
        } else {
            &self.project_px
        };
        let f = &list
            .iter()
            .find(|(p, _)| *p == kp)
            .ok_or_else(|| {
                BackendError::Invalid(format!("no projection kernel for {kp} components per pass"))
            })?
            .1;
        let blocks = (npix as u64)
            .div_ceil(THREADS as u64)
            .clamp(1, self.sms as u64 * 8) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: if t_pad.is_some() {
                (n_used as u32) * (kpad as u32) * 4
            } else {
                0
            },
        };
        // project_px{KP} / project_pxs{KP}: u × kpad floats of T at t_pad (null for the constant-memory
        // kernels), that many bytes of dynamic shared memory.
        #[rustfmt::skip]
        let args = px.args(&[used.into(), n_used.into(), means.into(), kpad.into(), k.into(), out.into(), t_pad.into()]);
        self.launch(s, f, cfg, &args, "launch project_px")
    }

    /// The projection fast path (project_w16{s,u}{KP} in transform.cu): T' (bands × kp floats, T's rows
    /// at the used bands' positions, zero elsewhere), integer centres (bands) and the centring
    /// correction (kp floats), all in device memory. The caller checked [`w16_eligible`] and
    /// [`w16_project_kp`] and that `raw` is 16-byte aligned.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn project_w16(
        &self,
        s: &CudaStream,
        kp: usize,
        px: Pixels,
        t_full: DevPtr<f32>,
        centre: DevPtr<i32>,
        corr: DevPtr<f32>,
        k: i32,
        out: DevPtr<f32>,
    ) -> Result<(), BackendError> {
        let Pixels { npix, bands, t, .. } = px;
        if npix == 0 {
            return Ok(());
        }
        px.check();
        t_full.holds(bands as usize * kp);
        centre.holds(bands as usize);
        corr.holds(kp);
        out.holds(npix as usize * k as usize);
        let f = &self
            .project_w16
            .iter()
            .find(|(p, _)| *p == kp)
            .ok_or_else(|| BackendError::Invalid(format!("no projection kernel for {kp} components per pass")))?
            .1[(t.code == 2) as usize];
        let blocks = (npix as u64).div_ceil(THREADS as u64).clamp(1, self.sms as u64 * 8) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: (bands as u32) * (kp as u32 + 1) * 4,
        };
        // bands · (kp + 1) · 4 bytes of dynamic shared memory (≤ 48 KB, checked by w16_project_kp).
        #[rustfmt::skip]
        let Pixels { raw, valid, .. } = px;
        let args = [raw.into(), valid.into(), npix.into(), bands.into(), t.swap.into(), t_full.into(), centre.into(),
            corr.into(), k.into(), out.into()];
        self.launch(s, f, cfg, &args, "launch project_w16")
    }

    /// out[p, cols[j]] = float32(x) (NaN at invalid pixels).
    pub(crate) fn pass_through(
        &self,
        s: &CudaStream,
        px: Pixels,
        cols: DevPtr<i32>,
        n_cols: i32,
        out: DevPtr<f32>,
    ) -> Result<(), BackendError> {
        let Pixels { npix, .. } = px;
        if npix == 0 || n_cols == 0 {
            return Ok(());
        }
        px.check();
        cols.holds(n_cols as usize);
        let cfg = grid_for(npix as u64 * n_cols as u64, self.sms);
        #[rustfmt::skip]
        let args = px.args(&[cols.into(), n_cols.into(), out.into()]);
        self.launch(s, &self.pass_through, cfg, &args, "launch pass_through")
    }

    /// out = x_used − means (float32, npix × n_used), NaN rows at invalid pixels.
    pub(crate) fn convert_centred_used(
        &self,
        s: &CudaStream,
        px: Pixels,
        used: DevPtr<i32>,
        n_used: i32,
        means: DevPtr<f64>,
        out: DevPtr<f32>,
    ) -> Result<(), BackendError> {
        let Pixels { npix, .. } = px;
        if npix == 0 {
            return Ok(());
        }
        px.check();
        used.holds(n_used as usize);
        means.holds(n_used as usize);
        out.holds(npix as usize * n_used as usize);
        let cfg = grid_for(npix as u64 * n_used as u64, self.sms);
        #[rustfmt::skip]
        let args = px.args(&[used.into(), n_used.into(), means.into(), out.into()]);
        self.launch(s, &self.convert_centred_used, cfg, &args, "launch convert_centred_used")
    }
}

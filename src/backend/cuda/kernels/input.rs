//! Launchers of the kernels that bring raw samples into shape: BIL/BSQ to BIP, the valid-pixel mask.


use cudarc::driver::{CudaStream, LaunchConfig};

use crate::backend::BackendError;

use super::args::Extent;
use super::{grid_for, DevPtr, Kernels, RawType};

impl Kernels {
    /// Transposes `groups` matrices of `rows` x `cols` elements of `size` bytes from `src` into `dst`
    /// (kernels/reorder.cu): a block of BIL lines (rows = bands, cols = samples, a group per line) or
    /// of BSQ lines (rows = bands, cols = pixels, one group) into BIP. `src` and `dst` must not overlap.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn reorder_to_bip(
        &self,
        s: &CudaStream,
        src: DevPtr<u8>,
        dst: DevPtr<u8>,
        groups: usize,
        rows: usize,
        cols: usize,
        size: usize,
    ) -> Result<(), BackendError> {
        let bytes = groups * rows * cols * size;
        if bytes == 0 {
            return Ok(());
        }
        src.holds(bytes);
        dst.holds(bytes);
        let f = match size {
            1 => &self.reorder_to_bip[0],
            2 => &self.reorder_to_bip[1],
            4 => &self.reorder_to_bip[2],
            8 => &self.reorder_to_bip[3],
            other => return Err(BackendError::Invalid(format!("no reorder kernel for {other}-byte samples"))),
        };
        let tiles = |n: usize| n.div_ceil(32) as u64;
        let cfg = LaunchConfig {
            grid_dim: (tiles(cols).min(1 << 20) as u32, tiles(rows).min(65535) as u32, (groups as u64).min(65535) as u32),
            block_dim: (32, 8, 1),
            shared_mem_bytes: 0,
        };
        let args = [src.into(), dst.into(), (groups as i64).into(), (rows as i32).into(), (cols as i64).into()];
        self.launch(s, f, cfg, &args, "launch reorder_to_bip")
    }

    /// valid[p] for `npix` pixels from `raw`; adds the valid count to `count` (None: not counted).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn pixel_mask(
        &self,
        s: &CudaStream,
        raw: DevPtr<u8>,
        npix: i64,
        bands: i32,
        t: RawType,
        mask_bands: DevPtr<i32>,
        n_mask: i32,
        ignore: f64,
        valid: DevPtr<u8>,
        count: Option<DevPtr<u64>>,
    ) -> Result<(), BackendError> {
        if npix == 0 {
            return Ok(());
        }
        raw.holds(npix as usize * bands as usize * t.size);
        mask_bands.holds(n_mask as usize);
        valid.holds(npix as usize);
        let cfg = grid_for(npix as u64 * 32, self.sms);
        #[rustfmt::skip]
        let args = [raw.into(), npix.into(), bands.into(), t.code.into(), t.swap.into(), mask_bands.into(),
            n_mask.into(), ignore.into(), valid.into(), count.into()];
        self.launch(s, &self.pixel_mask, cfg, &args, "launch pixel_mask")
    }
}

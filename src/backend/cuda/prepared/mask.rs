//! The valid-pixel mask (ignore value over chosen bands) on the device.


use super::{CudaCube, MaskKey};
use crate::backend::cuda::device::{DevBuf, Pooled};
use crate::backend::cuda::kernels::DevPtr;
use crate::backend::BackendError;

impl<'c> CudaCube<'c> {
    /// Checks mask parameters and uploads the mask band list.
    pub(super) fn mask_setup(
        &self,
        ignore: Option<f64>,
        mask_bands: &[usize],
    ) -> Result<Option<(f64, Pooled<'c, DevBuf>, i32)>, BackendError> {
        // NaN is allowed: it equals no sample, and pixel_mask masks the non-finite ones (the pipeline
        // gives a float cube without a no-data value NaN, see mnf::pipeline::nodata).
        let Some(v) = ignore else { return Ok(None) };
        if let Some(&b) = mask_bands.iter().find(|&&b| b >= self.lay.bands) {
            return Err(BackendError::Invalid(format!(
                "mask band {b} is out of range (bands: {})",
                self.lay.bands
            )));
        }
        let list: Vec<i32> = mask_bands.iter().map(|&b| b as i32).collect();
        Ok(Some((v, self.dev_from(&list)?, list.len() as i32)))
    }

    /// Resident cube: computes the valid-pixel buffer for (ignore, mask_bands) over all chunks unless it
    /// is already there. Returns it (None: no mask, all pixels valid).
    pub(super) fn ensure_resident_mask(
        &mut self,
        ignore: Option<f64>,
        mask_bands: &[usize],
    ) -> Result<Option<DevPtr<u8>>, BackendError> {
        let key = MaskKey {
            ignore: ignore.map(f64::to_bits),
            bands: mask_bands.to_vec(),
        };
        let Some((v, list, n_mask)) = self.mask_setup(ignore, mask_bands)? else {
            return Ok(None);
        };
        if self.mask_key.as_ref() == Some(&key) {
            if let Some(valid) = &self.valid {
                return Ok(Some(DevPtr::of(valid)));
            }
        }
        if self.valid.is_none() {
            self.valid = Some(self.dev(self.lay.lines * self.lay.samples)?);
        }
        for c in 0..self.lay.chunks() {
            self.ensure_chunk(c)?;
            self.mask_chunk_resident(c, v, &list, n_mask, None)?;
        }
        self.mask_key = Some(key);
        Ok(Some(DevPtr::of(self.valid.as_ref().expect("allocated above"))))
    }

    /// valid[] for the pixels of chunk c of a resident cube (adds the valid count to `count` if given).
    pub(super) fn mask_chunk_resident(
        &self,
        c: usize,
        v: f64,
        list: &DevBuf,
        n_mask: i32,
        count: Option<DevPtr<u64>>,
    ) -> Result<(), BackendError> {
        let (l0, l1) = self.lay.chunk(c);
        let s = self.lay.samples;
        let res = self.resident.as_ref().expect("resident cube");
        let valid = self.valid.as_ref().expect("mask buffer");
        self.be.kernels.pixel_mask(
            &self.compute,
            DevPtr::at(&res.raw, l0 * self.lay.line_bytes()),
            ((l1 - l0) * s) as i64,
            self.lay.bands as i32,
            self.lay.t,
            DevPtr::of(list),
            n_mask,
            v,
            DevPtr::at(valid, l0 * s),
            count,
        )
    }


    /// Streamed cube: the valid-pixel flags of a loaded slot (`raw` into `valid`), whose `lines` are
    /// the halo above, the chunk's own and the halo below. Halo lines are masked but not counted; the
    /// chunk's own lines are counted into `count`.
    pub(super) fn mask_slot(
        &self,
        raw: DevPtr<u8>,
        valid: &DevBuf,
        lines: [usize; 3],
        (ignore, list, n_mask): (f64, &DevBuf, i32),
        count: DevPtr<u64>,
    ) -> Result<(), BackendError> {
        let (samples, lb) = (self.lay.samples, self.lay.line_bytes());
        let mut at = 0;
        for (i, n) in lines.into_iter().enumerate() {
            self.be.kernels.pixel_mask(
                &self.compute,
                raw.skip(at * lb),
                (n * samples) as i64,
                self.lay.bands as i32,
                self.lay.t,
                DevPtr::of(list),
                n_mask,
                ignore,
                DevPtr::at(valid, at * samples),
                (i == 1).then_some(count),
            )?;
            at += n;
        }
        Ok(())
    }
}

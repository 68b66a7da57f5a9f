//! Getting the cube's lines onto the device: whole (resident) or chunk by chunk into two slots, from
//! page-locked memory or through the pinned staging buffers, and BIL/BSQ files reordered on the device.


use rayon::prelude::*;

use crate::backend::cuda::device::{cuda, event, htod_async, DevBuf, Sized_, STAGING_PIECE};
use crate::backend::cuda::kernels::DevPtr;
use super::{CudaCube, Staging};
use crate::backend::BackendError;

/// Chunks in one copy of a page-locked resident cube's upload, and the last chunks sent one by one
/// (see `CudaCube::issue_all_chunks`).
///
/// A group's statistics start when all of it has landed, so the kernels fall behind the copies by
/// a group's statistics (~0.8 of its copy time), and catch up by ~0.2 of each later copy's time:
/// 4(g − 1) single chunks must follow the last group of g for the tail to stay what it was. 20
/// singles are 13–14 full chunks and the tail's pieces (at 121-line chunks); a 1× cube (13 chunks)
/// is sent one chunk a copy as before.
const UPLOAD_GROUP: usize = 4;
const UPLOAD_SINGLES: usize = 20;

impl CudaCube<'_> {
    /// Sends host bytes `range` to device address `dst` on the copy stream: directly from page-locked
    /// memory, or through the next pinned staging buffer (waiting until its previous DMA is done).
    fn send(&mut self, range: std::ops::Range<usize>, dst: u64) -> Result<(), BackendError> {
        if range.is_empty() {
            return Ok(());
        }
        if self.native.is_some() {
            return self.send_native(range, dst);
        }
        if self.registered {
            // SAFETY: the registered host memory outlives this prepared cube (borrowed for 'c) and is
            // not written; dst holds range.len() bytes (checked by the callers' layout).
            return unsafe { htod_async(dst, &self.host[range], &self.copy) };
        }
        if self.staging.is_none() {
            let ctx = &self.be.ctx;
            self.staging = Some(Staging {
                buf: [self.pinned(STAGING_PIECE)?, self.pinned(STAGING_PIECE)?],
                copied: [event(ctx, false)?, event(ctx, false)?],
                next: 0,
            });
        }
        let st = self.staging.as_mut().expect("staging allocated above");
        // Piece by piece through the two buffers: the host fills one while the DMA engine sends the other.
        let mut at = range.start;
        while at < range.end {
            let end = (at + STAGING_PIECE).min(range.end);
            let i = st.next;
            st.next ^= 1;
            st.copied[i].synchronize().map_err(cuda("cuEventSynchronize"))?;
            let src = &self.host[at..end];
            let dst_host = &mut st.buf[i].as_mut_slice()[..src.len()];
            if let Some((f, base)) = self.file {
                use std::os::unix::fs::FileExt;
                dst_host
                    .par_chunks_mut(1 << 20)
                    .enumerate()
                    .try_for_each(|(j, d)| f.read_exact_at(d, base + (at + (j << 20)) as u64))
                    .map_err(|e| BackendError::Invalid(format!("cannot read the cube's file: {e}")))?;
            } else {
                dst_host
                    .par_chunks_mut(1 << 20)
                    .zip(src.par_chunks(1 << 20))
                    .for_each(|(d, s)| d.copy_from_slice(s));
            }
            // SAFETY: the staging buffer is not touched again before `copied[i]` has passed (synchronized
            // above before each reuse, and in Drop); dst holds range.len() bytes, of which this piece is
            // the part at (at - range.start).
            unsafe { htod_async(dst + (at - range.start) as u64, &st.buf[i].as_slice()[..src.len()], &self.copy)? };
            st.copied[i].record(&self.copy).map_err(cuda("cuEventRecord"))?;
            at = end;
        }
        Ok(())
    }

    /// [`send`](Self::send) for a cube stored BIL or BSQ: `range` (whole lines, in bytes of this
    /// prepared cube's BIP lines) goes in blocks of whole lines. Each block is read from the file in
    /// the stored order with parallel positioned reads into a staging buffer (BIL: one run of bytes;
    /// BSQ: one run per band), copied to the landing buffer, and reordered into BIP at its place in
    /// `dst` on the copy stream, so a later wait on the copy stream covers the reorder too.
    fn send_native(&mut self, range: std::ops::Range<usize>, dst: u64) -> Result<(), BackendError> {
        use std::os::unix::fs::FileExt;
        let lb = self.lay.line_bytes();
        let (samples, bands, size) = (self.cube.samples(), self.cube.bands(), self.lay.t.size);
        let cube_lines = self.cube.lines();
        debug_assert!(range.start % lb == 0 && range.end % lb == 0, "whole lines");
        let piece = STAGING_PIECE.max(lb);
        let block_lines = piece / lb;
        if self.staging.is_none() {
            let ctx = &self.be.ctx;
            self.staging = Some(Staging {
                buf: [self.pinned(piece)?, self.pinned(piece)?],
                copied: [event(ctx, false)?, event(ctx, false)?],
                next: 0,
            });
        }
        if self.land.as_ref().is_none_or(|l| l.size() < piece) {
            let streams = [&self.compute, &self.copy];
            self.land = Some(self.be.dev_pool.take(piece, &streams, |n| DevBuf::alloc(&self.be.ctx, n))?);
        }
        let native = self.native.as_ref().expect("a native cube");
        let (storage, file, base) = (native.storage, native.file, native.base);
        let land = DevPtr::<u8>::of(self.land.as_ref().expect("allocated above"));
        let st = self.staging.as_mut().expect("staging allocated above");
        let read_err = |e: std::io::Error| BackendError::Invalid(format!("cannot read the cube's file: {e}"));
        let (l_first, l_end) = (self.first + range.start / lb, self.first + range.end / lb);
        let mut l0 = l_first;
        while l0 < l_end {
            let l1 = (l0 + block_lines).min(l_end);
            let n = l1 - l0;
            let bytes = n * lb;
            let i = st.next;
            st.next ^= 1;
            st.copied[i].synchronize().map_err(cuda("cuEventSynchronize"))?;
            let host = &mut st.buf[i].as_mut_slice()[..bytes];
            match storage {
                crate::cube::Interleave::Bil => host
                    .par_chunks_mut(1 << 20)
                    .enumerate()
                    .try_for_each(|(j, d)| file.read_exact_at(d, base + (l0 * lb + (j << 20)) as u64))
                    .map_err(read_err)?,
                // Band b's lines l0..l1 lie at ((b * lines) + l0) * samples samples in.
                _ => host
                    .par_chunks_mut(n * samples * size)
                    .enumerate()
                    .try_for_each(|(b, d)| file.read_exact_at(d, base + (((b * cube_lines) + l0) * samples * size) as u64))
                    .map_err(read_err)?,
            }
            // SAFETY: the staging buffer is not touched again before `copied[i]` has passed (synchronized
            // above before each reuse, and in Drop); the landing buffer holds `piece` >= bytes bytes and is
            // only read by the reorder below, on the same stream.
            unsafe { htod_async(land.addr(), &st.buf[i].as_slice()[..bytes], &self.copy)? };
            st.copied[i].record(&self.copy).map_err(cuda("cuEventRecord"))?;
            let at = dst + ((l0 - l_first) * lb) as u64;
            let out = DevPtr::<u8>::raw(at, bytes);
            let (groups, cols) = match storage {
                crate::cube::Interleave::Bil => (n, samples),
                _ => (1, n * samples),
            };
            self.be.kernels.reorder_to_bip(&self.copy, land, out, groups, bands, cols, size)?;
            l0 = l1;
        }
        Ok(())
    }

    /// Gives the staging buffers back to the backend's pool once a resident cube is wholly on the
    /// device (called at the end of a pass, with both streams idle). A cube that the device-level
    /// cache keeps held them for as long as it stayed cached, so the next job of another cube made two
    /// new ones: the 15-28 ms of `cuMemHostAlloc` before the first statistics chunk of a service job
    /// on the H100, and 32 MB of page-locked memory per cached cube.
    pub(super) fn release_staging_once_uploaded(&mut self) {
        if self.resident.as_ref().is_some_and(|r| r.uploaded.iter().all(|&u| u)) {
            self.staging = None;
        }
    }

    /// Page-locked resident cube: queues the upload of every chunk not yet uploaded, at once. Chunks
    /// go in copies of up to UPLOAD_GROUP chunks, the last UPLOAD_SINGLES one by one. Every copy costs
    /// the copy engine a few µs of its own: the 4.8 GB of a 16× cube took 87.15–87.37 ms in 121-line
    /// copies and 86.81–86.84 in 968-line copies, as in one copy (86.75–86.96), all from the same
    /// memory page-locked by cuMemHostRegister (an H200, two calls, 2026-11-29). In the whole job the
    /// gain is within the spread between runs: 97.05 and 97.17 ms at 16× pinned in and out, against
    /// 97.56 and 97.25 one chunk a copy, in the same processes.
    pub(super) fn issue_all_chunks(&mut self) -> Result<(), BackendError> {
        let n = self.lay.chunks();
        let grouped_end = n.saturating_sub(UPLOAD_SINGLES);
        let uploaded = |me: &Self, c: usize| me.resident.as_ref().expect("resident cube").uploaded[c];
        let mut c = 0;
        while c < n {
            if uploaded(self, c) {
                c += 1;
                continue;
            }
            let mut end = c + 1;
            while end < grouped_end && end - c < UPLOAD_GROUP && !uploaded(self, end) {
                end += 1;
            }
            self.send_chunks(c, end)?;
            c = end;
        }
        Ok(())
    }

    /// Resident cube: starts the upload of chunk c on the copy stream, unless already started.
    pub(super) fn issue_chunk(&mut self, c: usize) -> Result<(), BackendError> {
        if !self.resident.as_ref().expect("resident cube").uploaded[c] {
            self.send_chunks(c, c + 1)?;
        }
        Ok(())
    }

    /// Resident cube: sends chunks c..end (none of them uploaded yet) in one copy and records each
    /// one's arrival after it.
    fn send_chunks(&mut self, c: usize, end: usize) -> Result<(), BackendError> {
        let lb = self.lay.line_bytes();
        let (l0, l1) = (self.lay.chunk(c).0, self.lay.chunk(end - 1).1);
        let dst = self.resident.as_ref().expect("resident cube").raw.at(l0 * lb);
        self.send(l0 * lb..l1 * lb, dst)?;
        let res = self.resident.as_mut().expect("resident cube");
        for x in c..end {
            res.arrived[x].record(&self.copy).map_err(cuda("cuEventRecord"))?;
            res.uploaded[x] = true;
        }
        Ok(())
    }

    /// Resident cube: makes sure chunk c is (being) uploaded and that the compute stream waits for it.
    pub(super) fn ensure_chunk(&mut self, c: usize) -> Result<(), BackendError> {
        self.issue_chunk(c)?;
        let res = self.resident.as_ref().expect("resident cube");
        self.compute.wait(&res.arrived[c]).map_err(cuda("cuStreamWaitEvent"))
    }

    /// Streamed cube: uploads lines (l0 − halo)..(l1 + halo) of chunk c into slot c % 2 and makes the
    /// compute stream wait for it. Returns (slot, first line in the slot, lines in the slot).
    pub(super) fn load_slot(&mut self, c: usize, halo: usize) -> Result<(usize, usize, usize), BackendError> {
        let (l0, l1) = self.lay.chunk(c);
        let (b0, b1) = (l0.saturating_sub(halo), (l1 + halo).min(self.lay.lines));
        let slot = c % 2;
        let lb = self.lay.line_bytes();
        let slots = self.slots.as_ref().expect("streamed cube");
        // The copy may only overwrite the slot once the kernels of chunk c − 2 are done with it.
        self.copy
            .wait(&slots.released[slot])
            .map_err(cuda("cuStreamWaitEvent"))?;
        let dst = slots.raw[slot].ptr();
        self.send(b0 * lb..b1 * lb, dst)?;
        let slots = self.slots.as_ref().expect("streamed cube");
        slots.arrived[slot].record(&self.copy).map_err(cuda("cuEventRecord"))?;
        self.compute
            .wait(&slots.arrived[slot])
            .map_err(cuda("cuStreamWaitEvent"))?;
        Ok((slot, b0, b1 - b0))
    }

    pub(super) fn release_slot(&self, slot: usize) -> Result<(), BackendError> {
        let slots = self.slots.as_ref().expect("streamed cube");
        slots.released[slot]
            .record(&self.compute)
            .map_err(cuda("cuEventRecord"))
    }
}

//! Receiving uploads: bodies are streamed to a scratch file (never held whole in memory) by a blocking
//! writer that hashes them with SHA-256 on the way, within a byte budget (413 past it). Before the bulk
//! of a `.npy` body or an ENVI data part is read, the size its header claims is checked against the
//! budget, so that a header claiming 10¹² pixels is refused at once.

use std::io::Write;
use std::path::{Path, PathBuf};

use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};
use sha2::{Digest, Sha256};

use super::error::Error;
use crate::cube::model::checked_cube_bytes;
use crate::cube::DataType;

/// Bytes the writer thread receives at once: big enough that hashing and writing run in long strides.
const WRITE_CHUNK: usize = 4 << 20;
/// How much of a `.npy` body is looked at for its header (the format keeps headers small; 64 KiB is
/// the v1 maximum, v2 allows more but nothing real uses it).
const NPY_HEADER_MAX: usize = 1 << 20;

/// The request's byte budget: `--max-upload-bytes` over the whole body.
pub struct Budget {
    pub limit: u64,
    pub used: u64,
}

impl Budget {
    pub fn new(limit: u64) -> Budget {
        Budget { limit, used: 0 }
    }
    pub fn take(&mut self, n: usize) -> Result<(), Error> {
        self.used += n as u64;
        if self.used > self.limit {
            return Err(Error::too_large(format!("the upload exceeds the limit of {} bytes", self.limit)));
        }
        Ok(())
    }
}

/// A file received into scratch.
#[derive(Debug)]
pub struct Received {
    pub path: PathBuf,
    pub bytes: u64,
    pub sha256: [u8; 32],
}

/// What a header says the payload holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    /// Bytes before the samples (the .npy header, or the ENVI `header offset`).
    pub offset: u64,
    /// Bytes of samples.
    pub data: u64,
}

impl Claim {
    pub fn total(&self) -> u64 {
        self.offset + self.data
    }
}

/// Checks a claim against the limit and the cube-size sanity checks.
pub fn check_claim(lines: u64, samples: u64, bands: u64, dtype: DataType, offset: u64, limit: u64) -> Result<Claim, Error> {
    let data = checked_cube_bytes(lines, samples, bands, dtype)?;
    let claim = Claim { offset, data };
    if claim.total() > limit {
        return Err(Error::too_large(format!(
            "the header claims {lines} x {samples} x {bands} {} ({} bytes), more than the limit of {limit} bytes",
            dtype.name(),
            claim.total()
        )));
    }
    Ok(claim)
}

/// Streams `stream` into `dest`. `prefix_check` is called once with the first bytes (at least enough
/// for a `.npy` header, or all of a short body) and may refuse the upload or return a claim; when it
/// returns one, a body longer than the claim is refused early as a size mismatch.
pub async fn receive<S, E>(
    mut stream: S,
    dest: PathBuf,
    budget: &mut Budget,
    mut prefix_check: Option<&mut (dyn FnMut(&[u8]) -> Result<Option<Claim>, Error> + Send)>,
    mut claim: Option<Claim>,
) -> Result<Received, Error>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    let writer = {
        let dest = dest.clone();
        tokio::task::spawn_blocking(move || write_hashed(&dest, rx))
    };
    let mut pending = BytesMut::new();
    let mut total: u64 = 0;
    let mut prefix_done = prefix_check.is_none();
    let outcome: Result<(), Error> = async {
        loop {
            let next = stream.next().await;
            let chunk = match next {
                Some(Ok(c)) => Some(c),
                Some(Err(e)) => return Err(Error::bad_request("incomplete_body", format!("the upload was interrupted: {e}"))),
                None => None,
            };
            if let Some(c) = &chunk {
                budget.take(c.len())?;
                total += c.len() as u64;
                pending.extend_from_slice(c);
            }
            let finished = chunk.is_none();
            if !prefix_done && (pending.len() >= NPY_HEADER_MAX || finished || npy_header_complete(&pending)) {
                prefix_done = true;
                if let Some(check) = prefix_check.as_deref_mut() {
                    if let Some(c) = check(&pending)? {
                        claim = Some(c);
                    }
                }
            }
            if let Some(c) = claim {
                if total > c.total() {
                    return Err(Error::bad_request(
                        "size_mismatch",
                        format!("the data is longer than its header claims ({} bytes)", c.total()),
                    ));
                }
            }
            if prefix_done && (pending.len() >= WRITE_CHUNK || (finished && !pending.is_empty())) {
                if tx.send(pending.split().freeze()).await.is_err() {
                    break; // the writer failed; its error is reported below
                }
            }
            if finished {
                break;
            }
        }
        Ok(())
    }
    .await;
    drop(tx);
    let written = writer.await.map_err(Error::internal)?;
    outcome?;
    let (bytes, sha256) = written.map_err(Error::internal)?;
    if let Some(c) = claim {
        if bytes != c.total() {
            return Err(Error::bad_request(
                "size_mismatch",
                format!("the data holds {bytes} bytes but its header claims {}", c.total()),
            ));
        }
    }
    Ok(Received { path: dest, bytes, sha256 })
}

fn write_hashed(dest: &Path, mut rx: tokio::sync::mpsc::Receiver<Bytes>) -> std::io::Result<(u64, [u8; 32])> {
    let mut f = std::fs::File::create(dest)?;
    let mut h = Sha256::new();
    let mut n = 0u64;
    while let Some(b) = rx.blocking_recv() {
        h.update(&b);
        f.write_all(&b)?;
        n += b.len() as u64;
    }
    f.flush()?;
    // The job must survive a crash once it is accepted: the data reaches the disk before the 202.
    f.sync_data()?;
    Ok((n, h.finalize().into()))
}

/// True once `buf` holds a whole `.npy` header (or clearly is not one).
fn npy_header_complete(buf: &[u8]) -> bool {
    if buf.len() < 10 {
        return false;
    }
    if &buf[..6] != b"\x93NUMPY" {
        return true;
    }
    let (start, len) = match buf[6] {
        1 => (10usize, u16::from_le_bytes([buf[8], buf[9]]) as usize),
        2 | 3 if buf.len() >= 12 => (12, u32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]]) as usize),
        2 | 3 => return false,
        _ => return true,
    };
    buf.len() >= start.saturating_add(len)
}

/// The size a `.npy` header claims, read with the cube reader's own header parser and checked against
/// `limit` (and the 3-D shape the service needs).
pub fn npy_claim(buf: &[u8], limit: u64) -> Result<Option<Claim>, Error> {
    let h = crate::cube::npy::read_header(&mut std::io::Cursor::new(buf))?;
    let [lines, samples, bands] = h.shape[..] else {
        return Err(Error::bad_request(
            "invalid_npy",
            format!("invalid .npy: the shape must be (lines, samples, bands), got {} dimensions", h.shape.len()),
        ));
    };
    check_claim(lines, samples, bands, h.dtype, h.data_offset, limit).map(Some)
}

/// The size an ENVI header claims, read with the cube reader's own header parser and checked against
/// `limit`. An invalid header is refused here, before its data part is read.
pub fn envi_claim(text: &str, limit: u64) -> Result<Option<Claim>, Error> {
    let h = crate::cube::envi::parse_header(text)?;
    check_claim(h.lines as u64, h.samples as u64, h.bands as u64, h.data_type, h.header_offset, limit).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy_prefix(descr: &str, shape: &str) -> Vec<u8> {
        let mut h = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
        while (10 + h.len() + 1) % 64 != 0 {
            h.push(' ');
        }
        h.push('\n');
        let mut v = b"\x93NUMPY\x01\x00".to_vec();
        v.extend_from_slice(&(h.len() as u16).to_le_bytes());
        v.extend_from_slice(h.as_bytes());
        v
    }

    #[test]
    fn npy_claims() {
        let p = npy_prefix("<i2", "(3, 4, 5)");
        assert_eq!(npy_claim(&p, 1 << 20).unwrap(), Some(Claim { offset: p.len() as u64, data: 120 }));
        let e = npy_claim(&npy_prefix("<f4", "(100000, 100000, 400)"), 1 << 30).unwrap_err();
        assert_eq!(e.code(), "too_large");
        let e = npy_claim(&npy_prefix("<f8", "(18446744073709551615, 2, 2)"), u64::MAX).unwrap_err();
        assert_eq!(e.code(), "too_large");
        assert_eq!(npy_claim(&npy_prefix("<f4", "(3, 4)"), 1 << 20).unwrap_err().code(), "invalid_npy");
        assert_eq!(npy_claim(b"PK\x03\x04 not a numpy file", 1 << 20).unwrap_err().code(), "invalid_npy");
        assert_eq!(npy_claim(&p[..p.len() - 5], 1 << 20).unwrap_err().code(), "invalid_npy");
        assert!(npy_header_complete(&p));
        assert!(!npy_header_complete(&p[..p.len() - 1]));
    }

    #[test]
    fn envi_claims() {
        let h = "ENVI\ndescription = {\n lines = 99999999 }\nsamples = 4\nlines = 3\nbands = 2\ndata type = 12\nheader offset = 10\ninterleave = bsq\nbyte order = 0\n";
        assert_eq!(envi_claim(h, 1 << 20).unwrap(), Some(Claim { offset: 10, data: 48 }));
        let huge = "ENVI\nsamples = 1000000\nlines = 1000000\nbands = 1000\ndata type = 4\ninterleave = bsq\nbyte order = 0\n";
        assert_eq!(envi_claim(huge, 1 << 30).unwrap_err().code(), "too_large");
        assert_eq!(envi_claim("ENVI\nsamples = 4\n", 1 << 20).unwrap_err().code(), "invalid_header");
        assert_eq!(envi_claim("ENVI\nsamples = -4\n", 1 << 20).unwrap_err().code(), "invalid_header");
    }
}

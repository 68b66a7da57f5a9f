//! The stored form of an eigen system (the statistics level's payload).
//!
//! Binary, so that every float64 comes back bit for bit (a projection from a stored system must equal
//! the one from the system the job computed):
//!
//! ```text
//! "HMNFEIGS"                      8 bytes, magic
//! format version                  u32 LE (FORMAT_VERSION)
//! header length                   u32 LE
//! header                          JSON: bands_used, dropped_bands, noise_samples, pixels_used, pixels_masked
//! means, eigenvalues              u × f64 LE each (u = bands_used.len())
//! transform, noise covariance     u × u × f64 LE each, row-major
//! SHA-256 of all the above        32 bytes (a truncated or damaged file is refused, never used)
//! ```
//!
//! A file of another format version is refused too; the cache then recomputes.

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::mnf::bands::DroppedBand;
use crate::mnf::result::EigenSystem;

/// Bumped whenever the layout or the meaning of a stored system changes.
pub const FORMAT_VERSION: u32 = 1;

const MAGIC: &[u8; 8] = b"HMNFEIGS";
/// Far more bands than any sensor has; bounds what a damaged header could make us allocate.
const MAX_BANDS: usize = 1 << 16;

#[derive(Debug, thiserror::Error)]
pub enum EigenFileError {
    #[error("not an eigen system file")]
    NotEigenFile,
    #[error("eigen system format version {found}, this build reads version {FORMAT_VERSION}")]
    Version { found: u32 },
    #[error("damaged eigen system file: {0}")]
    Damaged(String),
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    bands_used: Vec<usize>,
    dropped_bands: Vec<DroppedBand>,
    noise_samples: u64,
    pixels_used: u64,
    pixels_masked: u64,
}

/// The bytes of `system` in the current format.
pub fn encode(system: &EigenSystem) -> Vec<u8> {
    let header = serde_json::to_vec(&Header {
        bands_used: system.bands_used.clone(),
        dropped_bands: system.dropped_bands.clone(),
        noise_samples: system.noise_samples,
        pixels_used: system.pixels_used,
        pixels_masked: system.pixels_masked,
    })
    .expect("the header serialises");
    let u = system.used();
    let floats = [&system.means, &system.eigenvalues, &system.transform, &system.noise_covariance];
    let mut out = Vec::with_capacity(16 + header.len() + 8 * (2 * u + 2 * u * u) + 32);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    out.extend_from_slice(&header);
    for v in floats.into_iter().flatten() {
        out.extend_from_slice(&v.to_le_bytes());
    }
    let sum = Sha256::digest(&out);
    out.extend_from_slice(&sum);
    out
}

/// The system stored in `bytes`, checked: checksum, version, and every length against the bands used.
pub fn decode(bytes: &[u8]) -> Result<EigenSystem, EigenFileError> {
    let damaged = |m: &str| EigenFileError::Damaged(m.to_string());
    if bytes.len() < 16 + 32 || &bytes[..8] != MAGIC {
        return Err(EigenFileError::NotEigenFile);
    }
    let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    if version != FORMAT_VERSION {
        return Err(EigenFileError::Version { found: version });
    }
    let (body, sum) = bytes.split_at(bytes.len() - 32);
    if Sha256::digest(body).as_slice() != sum {
        return Err(damaged("checksum mismatch"));
    }
    let header_len = u32::from_le_bytes(body[12..16].try_into().expect("4 bytes")) as usize;
    let header_bytes = body.get(16..16 + header_len).ok_or_else(|| damaged("header runs past the end"))?;
    let header: Header = serde_json::from_slice(header_bytes).map_err(|e| EigenFileError::Damaged(format!("header: {e}")))?;
    let u = header.bands_used.len();
    if u == 0 || u > MAX_BANDS {
        return Err(damaged("implausible number of bands used"));
    }
    let floats = &body[16 + header_len..];
    if floats.len() != 8 * (2 * u + 2 * u * u) {
        return Err(damaged("float section does not match the bands used"));
    }
    let mut values = floats.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")));
    let mut take = |n: usize| -> Vec<f64> { values.by_ref().take(n).collect() };
    Ok(EigenSystem {
        means: take(u),
        eigenvalues: take(u),
        transform: take(u * u),
        noise_covariance: take(u * u),
        bands_used: header.bands_used,
        dropped_bands: header.dropped_bands,
        noise_samples: header.noise_samples,
        pixels_used: header.pixels_used,
        pixels_masked: header.pixels_masked,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mnf::bands::DropReason;

    fn system() -> EigenSystem {
        let u = 3;
        // Values whose decimal forms would not all round-trip through a careless text format.
        let f = |i: usize| (i as f64 + 0.1) / 3.0 * if i % 2 == 0 { 1.0 } else { -1e-300 };
        EigenSystem {
            bands_used: vec![0, 2, 5],
            dropped_bands: vec![
                DroppedBand { band: 1, reason: DropReason::User },
                DroppedBand { band: 3, reason: DropReason::Constant },
            ],
            means: (0..u).map(f).collect(),
            eigenvalues: vec![9.5, 1.0 + f64::EPSILON, 0.999],
            transform: (0..u * u).map(|i| f(i + 7)).collect(),
            noise_covariance: (0..u * u).map(|i| f(i + 20)).collect(),
            noise_samples: 12345,
            pixels_used: 999,
            pixels_masked: 1,
        }
    }

    #[test]
    fn round_trips_bit_for_bit() {
        let s = system();
        let back = decode(&encode(&s)).unwrap();
        assert_eq!(back, s);
        for (a, b) in back.transform.iter().zip(&s.transform) {
            assert_eq!(a.to_bits(), b.to_bits());
        }
    }

    #[test]
    fn damaged_truncated_and_foreign_files_are_refused() {
        let good = encode(&system());
        for i in [0, 9, 20, good.len() / 2, good.len() - 1] {
            let mut bad = good.clone();
            bad[i] ^= 0x40;
            assert!(decode(&bad).is_err(), "a flipped byte at {i} went unnoticed");
        }
        assert!(decode(&good[..good.len() - 8]).is_err());
        assert!(matches!(decode(b"short"), Err(EigenFileError::NotEigenFile)));
        // Another version, with a valid checksum: refused by version.
        let mut other = good[..good.len() - 32].to_vec();
        other[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
        let sum = Sha256::digest(&other);
        other.extend_from_slice(&sum);
        assert!(matches!(decode(&other), Err(EigenFileError::Version { found }) if found == FORMAT_VERSION + 1));
    }
}

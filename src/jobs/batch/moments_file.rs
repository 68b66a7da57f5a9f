//! The stored statistics of one member of a pooled batch (`batches/<id>/moments/<position>`): its
//! cube's data and noise moments, bit for bit, and the cube's bad-band flags (the pooled system's
//! bad bands are their union).
//!
//! ```text
//! "HMNFMOMS"                      8 bytes, magic
//! format version                  u32 LE (FORMAT_VERSION)
//! header length                   u32 LE
//! header                          JSON: bands, data_n, noise_n, masked_pixels, bbl, wavelength,
//!                                 wavelength_units
//! data mean, data M2              B and B × B f64 LE
//! noise mean, noise M2            B and B × B f64 LE
//! SHA-256 of all the above        32 bytes
//! ```

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::mnf::stats::{Moments, Statistics};

pub const FORMAT_VERSION: u32 = 1;
const MAGIC: &[u8; 8] = b"HMNFMOMS";
/// Far more bands than any sensor has; bounds what a damaged header could make us allocate.
const MAX_BANDS: usize = 1 << 14;

#[derive(Debug, thiserror::Error)]
pub enum MomentsFileError {
    #[error("not a statistics file")]
    NotMomentsFile,
    #[error("statistics format version {found}, this build reads version {FORMAT_VERSION}")]
    Version { found: u32 },
    #[error("damaged statistics file: {0}")]
    Damaged(String),
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    bands: usize,
    data_n: u64,
    noise_n: u64,
    masked_pixels: u64,
    bbl: Option<Vec<bool>>,
    #[serde(default)]
    wavelength: Option<Vec<f64>>,
    #[serde(default)]
    wavelength_units: Option<String>,
}

/// One member's statistics as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct MemberStatistics {
    pub statistics: Statistics,
    pub bbl: Option<Vec<bool>>,
    /// The cube's header's wavelengths (the pooled system file names them).
    pub wavelength: Option<Vec<f64>>,
    pub wavelength_units: Option<String>,
}

pub fn encode(m: &MemberStatistics) -> Vec<u8> {
    let s = &m.statistics;
    let header = serde_json::to_vec(&Header {
        bands: s.data.bands,
        data_n: s.data.n,
        noise_n: s.noise.n,
        masked_pixels: s.masked_pixels,
        bbl: m.bbl.clone(),
        wavelength: m.wavelength.clone(),
        wavelength_units: m.wavelength_units.clone(),
    })
    .expect("the header serialises");
    let mut out = Vec::with_capacity(16 + header.len() + 16 * (s.data.bands + s.data.bands * s.data.bands) + 32);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    out.extend_from_slice(&header);
    for v in [&s.data.mean, &s.data.m2, &s.noise.mean, &s.noise.m2].into_iter().flatten() {
        out.extend_from_slice(&v.to_le_bytes());
    }
    let sum = Sha256::digest(&out);
    out.extend_from_slice(&sum);
    out
}

pub fn decode(bytes: &[u8]) -> Result<MemberStatistics, MomentsFileError> {
    let damaged = |m: &str| MomentsFileError::Damaged(m.to_string());
    if bytes.len() < 16 + 32 || &bytes[..8] != MAGIC {
        return Err(MomentsFileError::NotMomentsFile);
    }
    let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    if version != FORMAT_VERSION {
        return Err(MomentsFileError::Version { found: version });
    }
    let (body, sum) = bytes.split_at(bytes.len() - 32);
    if Sha256::digest(body).as_slice() != sum {
        return Err(damaged("checksum mismatch"));
    }
    let header_len = u32::from_le_bytes(body[12..16].try_into().expect("4 bytes")) as usize;
    let header_bytes = body.get(16..16 + header_len).ok_or_else(|| damaged("header runs past the end"))?;
    let h: Header = serde_json::from_slice(header_bytes).map_err(|e| MomentsFileError::Damaged(format!("header: {e}")))?;
    let b = h.bands;
    if b == 0 || b > MAX_BANDS || h.bbl.as_ref().is_some_and(|f| f.len() != b) || h.wavelength.as_ref().is_some_and(|w| w.len() != b) {
        return Err(damaged("implausible number of bands"));
    }
    let floats = &body[16 + header_len..];
    if floats.len() != 16 * (b + b * b) {
        return Err(damaged("float section does not match the bands"));
    }
    let mut values = floats.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")));
    let mut take = |n: usize| -> Vec<f64> { values.by_ref().take(n).collect() };
    let data = Moments { bands: b, n: h.data_n, mean: take(b), m2: take(b * b) };
    let noise = Moments { bands: b, n: h.noise_n, mean: take(b), m2: take(b * b) };
    Ok(MemberStatistics {
        statistics: Statistics { data, noise, masked_pixels: h.masked_pixels },
        bbl: h.bbl,
        wavelength: h.wavelength,
        wavelength_units: h.wavelength_units,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics_round_trip_bit_for_bit_and_damage_is_refused() {
        let b = 3;
        let f = |i: usize| (i as f64 + 0.1) / 3.0 * if i % 2 == 0 { 1.0 } else { -1e-300 };
        let m = MemberStatistics {
            statistics: Statistics {
                data: Moments { bands: b, n: 1234, mean: (0..b).map(f).collect(), m2: (0..b * b).map(|i| f(i + 5)).collect() },
                noise: Moments { bands: b, n: 999, mean: (0..b).map(|i| f(i + 1)).collect(), m2: (0..b * b).map(|i| f(i + 9)).collect() },
                masked_pixels: 7,
            },
            bbl: Some(vec![true, false, true]),
            wavelength: Some(vec![400.0, 410.5, 421.25]),
            wavelength_units: Some("Nanometers".into()),
        };
        let bytes = encode(&m);
        let back = decode(&bytes).unwrap();
        assert_eq!(back, m);
        for (a, b) in back.statistics.data.m2.iter().zip(&m.statistics.data.m2) {
            assert_eq!(a.to_bits(), b.to_bits());
        }
        let mut bad = bytes.clone();
        bad[30] ^= 1;
        assert!(matches!(decode(&bad), Err(MomentsFileError::Damaged(_))));
        assert!(matches!(decode(&bytes[..bytes.len() - 1]), Err(MomentsFileError::Damaged(_))));
        assert!(matches!(decode(b"nonsense, and long enough to pass the length check of the reader"), Err(MomentsFileError::NotMomentsFile)));
    }
}

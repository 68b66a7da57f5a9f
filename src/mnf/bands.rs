//! Which bands take part: all, minus those flagged 0 in the header's `bbl`, those the user lists, and
//! (`stats::drop_noiseless`, once the statistics are known) those whose noise variance is zero (constant bands: a zeroed water-absorption band or a saturated
//! detector makes the noise covariance singular, the failure Spectral Python crashes on).

use serde::{Deserialize, Serialize};

/// Why a band was left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DropReason {
    /// Flagged 0 in the header's `bbl`.
    BadBandList,
    /// Listed by the user (`--bad-bands`).
    User,
    /// The same value at every valid pixel.
    Constant,
    /// Varies, but its noise residual is zero everywhere (it cannot be whitened).
    ZeroNoise,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DroppedBand {
    pub band: usize,
    pub reason: DropReason,
}

/// Bands left after `bbl` and the user's list, before statistics (these are the bands checked for
/// no-data values and measured).
#[derive(Debug, Clone, PartialEq)]
pub struct BandSelection {
    pub used: Vec<usize>,
    pub dropped: Vec<DroppedBand>,
}

/// The selection known before any statistics.
pub fn preselect(bands: usize, bbl: Option<&[bool]>, user: &[usize]) -> BandSelection {
    let mut used = Vec::with_capacity(bands);
    let mut dropped = Vec::new();
    for b in 0..bands {
        if user.contains(&b) {
            dropped.push(DroppedBand { band: b, reason: DropReason::User });
        } else if bbl.is_some_and(|f| f.get(b) == Some(&false)) {
            dropped.push(DroppedBand { band: b, reason: DropReason::BadBandList });
        } else {
            used.push(b);
        }
    }
    BandSelection { used, dropped }
}

/// The sub-matrix of a B × B row-major matrix on `idx` × `idx`.
pub fn submatrix(m: &[f64], bands: usize, idx: &[usize]) -> Vec<f64> {
    let mut out = Vec::with_capacity(idx.len() * idx.len());
    for &i in idx {
        for &j in idx {
            out.push(m[i * bands + j]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preselect_applies_bbl_and_user_list() {
        let bbl = [true, false, true, true];
        let s = preselect(4, Some(&bbl), &[3]);
        assert_eq!(s.used, vec![0, 2]);
        assert_eq!(
            s.dropped,
            vec![
                DroppedBand { band: 1, reason: DropReason::BadBandList },
                DroppedBand { band: 3, reason: DropReason::User }
            ]
        );
    }
}

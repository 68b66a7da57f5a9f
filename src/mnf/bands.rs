//! Which bands take part: all, minus those flagged 0 in the header's `bbl`, those the user lists, and
//! those whose noise variance is zero (constant bands: a zeroed water-absorption band or a saturated
//! detector makes the noise covariance singular, the failure Spectral Python crashes on).

use serde::{Deserialize, Serialize};

use super::stats::Moments;

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

/// Relative threshold under which a noise variance counts as zero: integer bands that are constant give
/// exactly 0; float bands may leave rounding dust.
const ZERO_NOISE: f64 = 1e-12;

/// Drops the bands of `pre` whose noise variance is zero. `data` (when known) tells a constant band
/// from a varying one with no noise. Dropped bands come out sorted by band index.
pub fn drop_noiseless(pre: &BandSelection, noise: &Moments, data: Option<&Moments>) -> BandSelection {
    let max_var = pre.used.iter().map(|&b| noise.variance(b)).fold(0.0f64, f64::max);
    let max_data = data.map(|d| pre.used.iter().map(|&b| d.variance(b)).fold(0.0f64, f64::max));
    let mut sel = BandSelection { used: Vec::with_capacity(pre.used.len()), dropped: pre.dropped.clone() };
    for &b in &pre.used {
        let v = noise.variance(b);
        if v <= ZERO_NOISE * max_var || max_var == 0.0 {
            let constant = match (data, max_data) {
                (Some(d), Some(max)) => d.variance(b) <= ZERO_NOISE * max,
                _ => true,
            };
            let reason = if constant { DropReason::Constant } else { DropReason::ZeroNoise };
            sel.dropped.push(DroppedBand { band: b, reason });
        } else {
            sel.used.push(b);
        }
    }
    sel.dropped.sort_by_key(|d| d.band);
    sel
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

    #[test]
    fn constant_band_is_dropped() {
        let mut noise = Moments::new(3);
        let mut data = Moments::new(3);
        let rows: Vec<f64> = (0..30).flat_map(|i| [i as f64 * 0.37 % 1.0, 5.0, (i * i) as f64 % 7.0]).collect();
        data.add_rows(&rows, 30);
        let res: Vec<f64> = (0..30).flat_map(|i| [(i % 3) as f64 - 1.0, 0.0, (i % 5) as f64]).collect();
        noise.add_rows(&res, 30);
        let s = drop_noiseless(&preselect(3, None, &[]), &noise, Some(&data));
        assert_eq!(s.used, vec![0, 2]);
        assert_eq!(s.dropped, vec![DroppedBand { band: 1, reason: DropReason::Constant }]);
    }
}

//! First and second moments of a set of B-dimensional samples, accumulated per chunk and merged.
//!
//! Each chunk is centred on its own mean before its cross-products are formed, and chunks are merged
//! with the pairwise update of Chan, Golub and LeVeque, so the covariance stays accurate over millions
//! of pixels (no Σxy − ΣxΣy/n cancellation). The same merge serves CPU threads, GPU tiles, streamed
//! chunks and several GPUs.

use super::bands::{BandSelection, DropReason, DroppedBand};
use super::params::NoiseEstimator;

/// Count, mean and centred co-moment M2 = Σ (x − mean)(x − mean)ᵀ of B-dimensional samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Moments {
    pub bands: usize,
    pub n: u64,
    pub mean: Vec<f64>,
    /// B × B, row-major, symmetric (both triangles filled).
    pub m2: Vec<f64>,
}

impl Moments {
    pub fn new(bands: usize) -> Self {
        Moments { bands, n: 0, mean: vec![0.0; bands], m2: vec![0.0; bands * bands] }
    }

    /// From sums of shifted samples d = x − shift: n, Σd and the symmetric Σddᵀ, read through
    /// `lower(i, j)` for j ≤ i only. For backends that accumulate raw sums per tile (pick `shift` near
    /// the data so the subtraction below does not cancel) and hand over one triangle where it lies (in a
    /// download buffer), without first copying and mirroring it. Each co-moment is computed once, in the
    /// lower triangle, and mirrored: the bits are those of computing both triangles (cross(i, j) =
    /// cross(j, i), and the product of the sums commutes), with half the divisions and reads along
    /// rows. This runs between the device's last sums and the eigen step, twice (noise, then data):
    /// reading both triangles took ~0.2 ms at 224 bands on an H100's host.
    pub fn from_shifted_lower_sums(n: u64, shift: &[f64], sum: &[f64], lower: impl Fn(usize, usize) -> f64) -> Self {
        let b = shift.len();
        if n == 0 {
            return Moments::new(b);
        }
        let nf = n as f64;
        let mean = (0..b).map(|i| shift[i] + sum[i] / nf).collect();
        let mut m2 = vec![0.0; b * b];
        for i in 0..b {
            for j in 0..=i {
                let v = lower(i, j) - sum[i] * sum[j] / nf;
                m2[i * b + j] = v;
                m2[j * b + i] = v;
            }
        }
        Moments { bands: b, n, mean, m2 }
    }

    /// Adds `rows` samples given row-major in `x` (rows × B). Uses a centred matrix product.
    pub fn add_rows(&mut self, x: &[f64], rows: usize) {
        let mut copy = x[..rows * self.bands].to_vec();
        self.add_rows_in_place(&mut copy, rows);
    }

    /// Like `add_rows`, but centres `x` in place (its contents are consumed).
    pub fn add_rows_in_place(&mut self, x: &mut [f64], rows: usize) {
        if rows == 0 {
            return;
        }
        let b = self.bands;
        let x = &mut x[..rows * b];
        let mut mean = vec![0.0; b];
        for r in x.chunks_exact(b) {
            for (m, v) in mean.iter_mut().zip(r) {
                *m += v;
            }
        }
        for m in mean.iter_mut() {
            *m /= rows as f64;
        }
        for r in x.chunks_exact_mut(b) {
            for (v, m) in r.iter_mut().zip(&mean) {
                *v -= m;
            }
        }
        let m2 = centred_cross_products(x, rows, b);
        self.merge(&Moments { bands: b, n: rows as u64, mean, m2 });
    }

    /// Merges another set of moments into this one (Chan et al.).
    pub fn merge(&mut self, other: &Moments) {
        assert_eq!(self.bands, other.bands, "merging moments of different band counts");
        if other.n == 0 {
            return;
        }
        if self.n == 0 {
            *self = other.clone();
            return;
        }
        let b = self.bands;
        let (na, nb) = (self.n as f64, other.n as f64);
        let n = na + nb;
        let delta: Vec<f64> = other.mean.iter().zip(&self.mean).map(|(o, s)| o - s).collect();
        let f = na * nb / n;
        // By rows and zipped slices, so the compiler vectorises it (indexed, a merge of 224-band
        // moments took ~0.1 ms, on a split's critical path; rayon's threads took longer to wake than
        // that); every entry's operations in the same order as before, so the same bits.
        for ((row, orow), di) in self.m2.chunks_exact_mut(b).zip(other.m2.chunks_exact(b)).zip(&delta) {
            for ((m, o), dj) in row.iter_mut().zip(orow).zip(&delta) {
                *m += o + di * dj * f;
            }
        }
        for (m, d) in self.mean.iter_mut().zip(&delta) {
            *m += d * nb / n;
        }
        self.n += other.n;
    }

    /// Unbiased covariance (divides by n − 1), B × B row-major. None with fewer than 2 samples.
    pub fn covariance(&self) -> Option<Vec<f64>> {
        if self.n < 2 {
            return None;
        }
        let d = (self.n - 1) as f64;
        Some(self.m2.iter().map(|v| v / d).collect())
    }

    /// The covariance of the bands `idx` (in that order), each value divided by `scale` as well:
    /// `covariance`, its submatrix and the scaling in one pass, with the same values bit for bit (the
    /// eigen step waits for this on the GPU route). None with fewer than 2 samples.
    pub fn covariance_of(&self, idx: &[usize], scale: f64) -> Option<Vec<f64>> {
        if self.n < 2 {
            return None;
        }
        let (b, d) = (self.bands, (self.n - 1) as f64);
        let mut out = Vec::with_capacity(idx.len() * idx.len());
        for &i in idx {
            let row = &self.m2[i * b..(i + 1) * b];
            if scale == 1.0 {
                out.extend(idx.iter().map(|&j| row[j] / d));
            } else {
                out.extend(idx.iter().map(|&j| row[j] / d / scale));
            }
        }
        Some(out)
    }

    /// Variance of band i (unbiased); 0 with fewer than 2 samples.
    pub fn variance(&self, i: usize) -> f64 {
        if self.n < 2 {
            return 0.0;
        }
        self.m2[i * self.bands + i] / (self.n - 1) as f64
    }
}

/// Column block of the lower-triangle products (only blocks on or below the diagonal are formed: about
/// 5/8 of a full product for 224 bands).
const COL_BLOCK: usize = 64;

/// Σ xᵀx (B × B, row-major, both triangles) of centred rows `x` (rows × B, row-major), in float64:
/// block products of the lower triangle, mirrored. (Float32 products were tried: twice as fast, but
/// ~3e-6 relative error on the smaller eigenvalues is too loose for the reference backend.)
fn centred_cross_products(x: &[f64], rows: usize, b: usize) -> Vec<f64> {
    let mut m2 = vec![0.0f64; b * b];
    let col_blocks: Vec<(usize, usize)> = (0..b).step_by(COL_BLOCK).map(|c| (c, (c + COL_BLOCK).min(b))).collect();
    for (bi, &(i0, i1)) in col_blocks.iter().enumerate() {
        for &(j0, j1) in &col_blocks[..=bi] {
            // m2[i0..i1, j0..j1] = x[:, i0..i1]ᵀ · x[:, j0..j1]
            // SAFETY: x holds rows × b values and the offsets plus strides stay inside it; the output
            // block starts at (i0, j0) of the b × b matrix m2 with row stride b.
            unsafe {
                matrixmultiply::dgemm(
                    i1 - i0,
                    rows,
                    j1 - j0,
                    1.0,
                    x.as_ptr().add(i0),
                    1,
                    b as isize,
                    x.as_ptr().add(j0),
                    b as isize,
                    1,
                    0.0,
                    m2.as_mut_ptr().add(i0 * b + j0),
                    b as isize,
                    1,
                );
            }
        }
    }
    for i in 0..b {
        for j in i + 1..b {
            m2[i * b + j] = m2[j * b + i];
        }
    }
    m2
}

/// Everything the eigen step needs from one pass over the cube.
#[derive(Debug, Clone, PartialEq)]
pub struct Statistics {
    /// Moments of the valid pixels.
    pub data: Moments,
    /// Moments of the noise residuals (unscaled: divide the covariance by the estimator's scale).
    pub noise: Moments,
    /// Pixels excluded as no-data.
    pub masked_pixels: u64,
}

/// What the statistics pass must compute.
#[derive(Debug, Clone, PartialEq)]
pub struct StatsSpec {
    pub noise: NoiseEstimator,
    /// Noise residuals are taken only at pixels inside this window (their neighbours may lie outside).
    pub window: Option<super::params::Window>,
    /// No-data value: a pixel equal to it, or not finite, in any of `mask_bands` is excluded
    /// everywhere ([`is_masked`]); None: no pixel is.
    pub ignore_value: Option<f64>,
    /// Bands checked for the no-data value (the bands not already excluded by `bbl` or the user).
    pub mask_bands: Vec<usize>,
}

/// What the projection pass computes: Z = Tᵀ (x − μ) over the used bands, k components per pixel.
#[derive(Debug, Clone, PartialEq)]
pub struct Projection {
    pub bands_used: Vec<usize>,
    /// Mean of each used band.
    pub means: Vec<f64>,
    /// bands_used.len() × k, row-major (row = used band, column = component).
    pub transform: Vec<f64>,
    pub k: usize,
    /// Pixels equal to it in any of `mask_bands` are written as NaN.
    pub ignore_value: Option<f64>,
    pub mask_bands: Vec<usize>,
}

/// The inverse transform: x̂ = μ + A (x − μ) on the used bands, where A = C_N T_k T_kᵀ; other bands pass
/// through unchanged; masked pixels are NaN. Output is BIP with all input bands.
#[derive(Debug, Clone, PartialEq)]
pub struct Denoise {
    pub bands_used: Vec<usize>,
    pub means: Vec<f64>,
    /// used × used, row-major.
    pub matrix: Vec<f64>,
    pub ignore_value: Option<f64>,
    pub mask_bands: Vec<usize>,
}

/// True when pixel `px` (B values) is no-data: it holds the no-data value, or a value that is not
/// finite, in any of the mask bands. `None` turns masking off (an integer cube without a no-data
/// value: it cannot hold NaN); a float cube without one is given NaN, which equals nothing, so that
/// only its non-finite values mask (`mnf::pipeline::nodata`). The GPU's `pixel_mask` kernel applies
/// the same rule.
#[inline]
pub fn is_masked(px: &[f64], ignore: Option<f64>, mask_bands: &[usize]) -> bool {
    match ignore {
        Some(v) => mask_bands.iter().any(|&b| px[b] == v || !px[b].is_finite()),
        None => false,
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mnf::bands::preselect;

    /// From the lower triangle alone, the moments have the bits they have from both triangles.
    #[test]
    fn lower_sums_give_the_bits_of_both_triangles() {
        let b = 37;
        let mut x: u64 = 0x2545f4914f6cdd1d;
        let mut rnd = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 1_000_003) as f64 * 1.37e-3 - 600.0
        };
        let shift: Vec<f64> = (0..b).map(|_| rnd()).collect();
        let sum: Vec<f64> = (0..b).map(|_| rnd()).collect();
        let mut cross = vec![0.0; b * b];
        for i in 0..b {
            for j in 0..=i {
                cross[i * b + j] = rnd() * 1e3;
                cross[j * b + i] = cross[i * b + j];
            }
        }
        // Both triangles, each pair on its own (the form this replaced).
        let n = 123_457u64;
        let nf = n as f64;
        let both = Moments {
            bands: b,
            n,
            mean: (0..b).map(|i| shift[i] + sum[i] / nf).collect(),
            m2: (0..b * b).map(|k| cross[k] - sum[k / b] * sum[k % b] / nf).collect(),
        };
        let lower = Moments::from_shifted_lower_sums(n, &shift, &sum, |i, j| {
            assert!(j <= i, "read ({i}, {j}) above the diagonal");
            cross[i * b + j]
        });
        let bits = |v: &[f64]| v.iter().map(|f| f.to_bits()).collect::<Vec<u64>>();
        assert_eq!(bits(&both.mean), bits(&lower.mean));
        assert_eq!(bits(&both.m2), bits(&lower.m2));
        assert_eq!(Moments::from_shifted_lower_sums(0, &shift, &sum, |_, _| 1.0), Moments::new(b));
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

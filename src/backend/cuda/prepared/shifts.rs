//! Per-band shifts near the means, sampled on the host, that condition the float32 covariance sums.


use crate::cube::Cube;
use crate::mnf::stats::{is_masked, StatsSpec};
use crate::mnf::NoiseEstimator;

/// Host pixels sampled to choose the shifts, in runs of SHIFT_RUN neighbouring pixels. A shift near the
/// mean only conditions the sums (integer data stay exact whatever it is), but the sampling runs before
/// the first kernel can start: 1024 scattered samples (2,300 decoded pixels with the mean filter's
/// neighbours, each a few cache and TLB misses in a cube of hundreds of MB) took 1.4–1.6 ms on the
/// H100's host (measured with RUST_LOG=hypermnf::timing=debug).
const SHIFT_SAMPLES: usize = 256;
const SHIFT_RUN: usize = 16;

/// Index of sample i of n over 0..total: runs of SHIFT_RUN consecutive indices, spread evenly.
fn sample_index(i: usize, n: usize, total: usize) -> usize {
    let runs = n.div_ceil(SHIFT_RUN);
    let (r, o) = (i / SHIFT_RUN, i % SHIFT_RUN);
    (((r as u128 * total as u128) / runs as u128) as usize + o).min(total - 1)
}

/// Shifts near the means of the data and of the noise residuals, from a sample of pixels decoded on the
/// host (a few thousand samples: this is not a host-side conversion of the cube).
/// Lines first..first + l_n of the cube are sampled, as a cube of their own (`spec.window` in their
/// coordinates).
pub(crate) fn sample_shifts(cube: &Cube, first: usize, l_n: usize, spec: &StatsSpec) -> (Vec<f64>, Vec<f64>) {
    let (s_n, b) = (cube.samples(), cube.bands());
    let pixel = |l: usize, s: usize, out: &mut [f64]| cube.decode_pixel_f64(first + l, s, out);
    let masked = |px: &[f64]| is_masked(px, spec.ignore_value, &spec.mask_bands);
    let mut x = vec![0.0; b];
    let mut y = vec![0.0; b];
    let mut data = vec![0.0; b];
    let mut n_data = 0usize;
    let total = l_n * s_n;
    let n = SHIFT_SAMPLES.min(total);
    for i in 0..n {
        let p = sample_index(i, n, total);
        pixel(p / s_n, p % s_n, &mut x);
        if !masked(&x) {
            data.iter_mut().zip(&x).for_each(|(a, v)| *a += v);
            n_data += 1;
        }
    }
    if n_data > 0 {
        data.iter_mut().for_each(|a| *a /= n_data as f64);
    }
    // Noise: sample inside the window (or the image), where a residual can exist.
    let (x0, x1, y0, y1) = match spec.window {
        Some(w) => (w.x0, w.x1.min(s_n), w.y0, w.y1.min(l_n)),
        None => (0, s_n, 0, l_n),
    };
    let mut noise = vec![0.0; b];
    let mut n_noise = 0usize;
    if x1 > x0 && y1 > y0 {
        let (w, h) = (x1 - x0, y1 - y0);
        let area = w * h;
        // Fewer than for the data: each mean-filter sample decodes nine pixels.
        let n = (SHIFT_SAMPLES / 4).min(area);
        let mut nb = vec![0.0; b];
        for i in 0..n {
            let q = sample_index(i, n, area);
            let (l, s) = (y0 + q / w, x0 + q % w);
            let ok = match spec.noise {
                NoiseEstimator::MeanFilter => {
                    if l < 1 || l + 2 > l_n || s < 1 || s + 2 > s_n {
                        false
                    } else {
                        nb.iter_mut().for_each(|v| *v = 0.0);
                        let mut ok = true;
                        for dl in 0..3 {
                            for ds in 0..3 {
                                pixel(l + dl - 1, s + ds - 1, &mut y);
                                ok &= !masked(&y);
                                if dl == 1 && ds == 1 {
                                    x.copy_from_slice(&y);
                                } else {
                                    nb.iter_mut().zip(&y).for_each(|(a, v)| *a += v);
                                }
                            }
                        }
                        if ok {
                            x.iter_mut().zip(&nb).for_each(|(a, v)| *a -= v / 8.0);
                        }
                        ok
                    }
                }
                NoiseEstimator::ShiftDifference => {
                    if l + 2 > l_n || s + 2 > s_n {
                        false
                    } else {
                        pixel(l, s, &mut x);
                        pixel(l + 1, s + 1, &mut y);
                        let ok = !masked(&x) && !masked(&y);
                        if ok {
                            x.iter_mut().zip(&y).for_each(|(a, v)| *a -= v);
                        }
                        ok
                    }
                }
            };
            if ok {
                noise.iter_mut().zip(&x).for_each(|(a, v)| *a += v);
                n_noise += 1;
            }
        }
    }
    if n_noise > 0 {
        noise.iter_mut().for_each(|a| *a /= n_noise as f64);
    }
    // For integer data, shifts on the residuals' grid (whole numbers; eighths for the mean filter)
    // keep every shifted value exact in float32.
    if !cube.dtype().is_float() {
        data.iter_mut().for_each(|a| *a = a.round());
        let grid = if spec.noise == NoiseEstimator::MeanFilter {
            8.0
        } else {
            1.0
        };
        noise.iter_mut().for_each(|a| *a = (*a * grid).round() / grid);
    }
    (data, noise)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shift samples stay inside the cube and come in runs of neighbouring pixels.
    #[test]
    fn shift_samples_are_runs_inside_the_range() {
        for (n, total) in [(256, 667_418), (256, 10), (64, 1), (64, 1000), (3, 2)] {
            let idx: Vec<usize> = (0..n).map(|i| sample_index(i, n, total)).collect();
            assert!(idx.iter().all(|&p| p < total), "{n} of {total}");
            if total >= n * 2 {
                assert_eq!(idx[1], idx[0] + 1);
                assert!(idx[n - 1] > total / 2, "{n} of {total}: samples spread over the range");
            }
        }
    }
}

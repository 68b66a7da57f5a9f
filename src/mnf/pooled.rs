//! Pooled statistics: one eigen system for several cubes (a pooled batch, `POST /v1/batches`).
//!
//! Each cube's statistics pass runs alone ([`statistics_on`], the pass [`pipeline::analyse_on`] runs),
//! so noise residuals never cross from one cube into another; the moments are then merged in the
//! cubes' order with the pairwise update the multi-GPU split merges its shares with
//! ([`Moments::merge`]), and the band selection and eigenproblem run once on the pooled moments
//! ([`system_of`]). Bad bands are the union over the cubes. For one cube this is exactly
//! `analyse_on`: the merge into empty moments is a copy, and the same selection, whitening and
//! solve follow (the host solver; `analyse_on` may use a device's).
//!
//! [`pipeline::analyse_on`]: super::pipeline::analyse_on

use super::bands;
use super::compute::PreparedCube;
use super::eigen::{self, GeneralizedEigenSolver};
use super::pipeline::{self, nodata};
use super::result::EigenSystem;
use super::stats::{Moments, Statistics, StatsSpec};
use super::{MnfError, MnfParams, Monitor};
use crate::cube::Cube;

/// The statistics pass of one cube, its no-data pixels checked in the bands its own `bbl` and the
/// params keep (as a job on that cube alone checks them).
pub fn statistics_on(cube: &Cube, params: &MnfParams, prepared: &mut dyn PreparedCube, monitor: &Monitor) -> Result<Statistics, MnfError> {
    params.admit(cube.lines(), cube.samples(), cube.bands(), cube.meta.bbl.as_deref())?;
    let pre = bands::preselect(cube.bands(), cube.meta.bbl.as_deref(), &params.bad_bands);
    if pre.used.is_empty() {
        return Err(MnfError::InvalidParams("every band is excluded (bbl and bad bands)".into()));
    }
    let spec = StatsSpec { noise: params.noise, window: params.noise_window, ignore_value: nodata(cube, params), mask_bands: pre.used };
    Ok(prepared.statistics(&spec, &mut |_| {}, monitor)?)
}

/// The moments of several cubes merged in order: data moments of all their valid pixels, noise
/// moments of each cube's own residuals.
pub fn pool<'a>(parts: impl IntoIterator<Item = &'a Statistics>) -> Result<Statistics, MnfError> {
    let mut parts = parts.into_iter();
    let first = parts.next().ok_or_else(|| MnfError::InvalidParams("no statistics to pool".into()))?;
    let bands = first.data.bands;
    let mut pooled = Statistics { data: Moments::new(bands), noise: Moments::new(bands), masked_pixels: 0 };
    for (i, s) in std::iter::once(first).chain(parts).enumerate() {
        if s.data.bands != bands || s.noise.bands != bands {
            return Err(MnfError::InvalidParams(format!(
                "cube {i} has {} bands where the first has {bands}: pooled statistics need the same bands",
                s.data.bands
            )));
        }
        pooled.data.merge(&s.data);
        pooled.noise.merge(&s.noise);
        pooled.masked_pixels += s.masked_pixels;
    }
    Ok(pooled)
}

/// Bad-band flags of several cubes united: a band is good only where every cube that says calls it
/// good. None when no cube has a `bbl`.
pub fn union_bbl<'a>(bands: usize, each: impl IntoIterator<Item = Option<&'a [bool]>>) -> Option<Vec<bool>> {
    let mut out: Option<Vec<bool>> = None;
    for bbl in each.into_iter().flatten() {
        let acc = out.get_or_insert_with(|| vec![true; bands]);
        for (a, &b) in acc.iter_mut().zip(bbl) {
            *a &= b;
        }
    }
    out
}

/// The eigen system of (pooled) statistics of `bands`-band cubes whose united bad-band flags are
/// `bbl`: band selection, C_N whitening and the generalized eigenproblem on the host, as
/// `analyse_on` does after its statistics pass.
pub fn system_of(bands: usize, bbl: Option<&[bool]>, stats: &Statistics, params: &MnfParams) -> Result<EigenSystem, MnfError> {
    system_with(bands, bbl, stats, params, None)
}

/// [`system_of`] with the eigenproblem solved by `solver` where given (a device's: what a job on that
/// device solves with, so that a pooled batch of one cube gives that job's bits there too).
pub fn system_with(
    bands: usize,
    bbl: Option<&[bool]>,
    stats: &Statistics,
    params: &MnfParams,
    solver: Option<&dyn GeneralizedEigenSolver>,
) -> Result<EigenSystem, MnfError> {
    let pre = bands::preselect(bands, bbl, &params.bad_bands);
    if pre.used.is_empty() {
        return Err(MnfError::InvalidParams("every band is excluded (bbl and bad bands)".into()));
    }
    if stats.data.bands != bands {
        return Err(MnfError::InvalidParams(format!("statistics of {} bands for cubes of {bands}", stats.data.bands)));
    }
    pipeline::check_statistics(stats, &pre, params)?;
    // With a device solver, C_N is factored there too, as `analyse_on` leaves it to the device.
    let (sel, whitening) = pipeline::whiten(&pre, &stats.noise, Some(&stats.data), params.noise.scale(), solver.is_some())?;
    if sel.used.is_empty() {
        return Err(MnfError::Degenerate("every band is constant or noise-free".into()));
    }
    let cd = stats.data.covariance_of(&sel.used, 1.0).expect("checked n >= 2");
    let pairs = eigen::solve_with(&whitening, &cd, solver)?;
    Ok(pipeline::system_from(sel, whitening, pairs, stats))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;
    use crate::cube::synthetic::{generate, SyntheticSpec};
    use crate::mnf::compute::Backend;

    fn stats_of(cube: &Cube, params: &MnfParams) -> Statistics {
        let backend = CpuBackend;
        let monitor = Monitor::silent();
        let mut prepared = backend.prepare(cube, &monitor).unwrap();
        statistics_on(cube, params, prepared.as_mut(), &monitor).unwrap()
    }

    /// One cube pooled alone gives the system `analyse` computes, bit for bit (the CPU backend
    /// solves on the host, as `system_of` does).
    #[test]
    fn one_cube_pooled_is_the_plain_analysis() {
        let cube = generate(&SyntheticSpec::small(30, 28, 12));
        let params = MnfParams::default();
        let stats = stats_of(&cube, &params);
        let pooled = pool([&stats]).unwrap();
        let system = system_of(cube.bands(), cube.meta.bbl.as_deref(), &pooled, &params).unwrap();
        let plain = pipeline::analyse(&cube, &params, &CpuBackend, &Monitor::silent()).unwrap();
        assert_eq!(system, plain);
    }

    /// Pooled data moments are those of the concatenated pixels; pooled noise moments those of each
    /// cube's residuals (never a residual across two cubes), within float64 rounding.
    #[test]
    fn pooled_moments_are_those_of_all_pixels_and_each_cubes_residuals() {
        let params = MnfParams { noise: crate::mnf::NoiseEstimator::ShiftDifference, ..MnfParams::default() };
        let mut a_spec = SyntheticSpec::small(20, 16, 6);
        a_spec.seed = 1;
        let mut b_spec = SyntheticSpec::small(11, 16, 6);
        b_spec.seed = 2;
        let (a, b) = (generate(&a_spec), generate(&b_spec));
        let pooled = pool([&stats_of(&a, &params), &stats_of(&b, &params)]).unwrap();
        // The two cubes stacked as one (same samples): its data moments are the pooled ones...
        let stacked = crate::cube::Cube::from_raw(
            31, 16, 6, a.dtype(), a.byte_order(),
            [a.raw(), b.raw()].concat(), Default::default(),
        ).unwrap();
        let whole = stats_of(&stacked, &params);
        assert_eq!(pooled.data.n, whole.data.n);
        for (x, y) in pooled.data.m2.iter().zip(&whole.data.m2) {
            assert!((x - y).abs() <= 1e-9 * y.abs().max(1.0), "{x} vs {y}");
        }
        // ...but its noise moments have residuals across the seam, which the pooled ones do not.
        assert!(whole.noise.n > pooled.noise.n, "{} vs {}", whole.noise.n, pooled.noise.n);
        let direct = pool([&stats_of(&a, &params)]).unwrap();
        assert!(pooled.noise.n > direct.noise.n);
    }

    #[test]
    fn bad_bands_are_united_and_band_counts_must_agree() {
        assert_eq!(union_bbl(3, [Some(&[true, false, true][..]), None, Some(&[true, true, false][..])]), Some(vec![true, false, false]));
        assert_eq!(union_bbl(3, [None, None]), None);
        let a = Statistics { data: Moments::new(3), noise: Moments::new(3), masked_pixels: 0 };
        let b = Statistics { data: Moments::new(4), noise: Moments::new(4), masked_pixels: 0 };
        assert!(pool([&a, &b]).is_err());
    }
}

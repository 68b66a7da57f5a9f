//! The generalized symmetric eigenproblem C_D w = λ C_N w, in float64 on the host.
//!
//! Solved through the Cholesky factor of the noise covariance, C_N = L Lᵀ: the data covariance is
//! whitened, A = L⁻¹ C_D L⁻ᵀ, A = V Λ Vᵀ, and W = L⁻ᵀ V, so that Wᵀ C_N W = I. This is the same
//! transform as the paper's P = U D_N^(-1/2) route (both whiten the noise; the eigenvectors of the
//! whitened data covariance then agree up to sign) and as LAPACK's `sygv` used by SciPy's
//! `eigh(S, N)`, but it needs one symmetric eigen-decomposition instead of two. The noise half
//! (`NoiseWhitening::new`) depends only on C_N, so it can run while a device computes C_D.
//!
//! The linear algebra is faer's (blocked, SIMD): at 224 bands the Cholesky factor, three triangular
//! solves and the symmetric eigendecomposition take ~5 ms, where nalgebra's took ~31 ms, and on the GPU
//! path this host step was longer than all the device work. The tests check it against an independent
//! nalgebra implementation of the paper's route (tests/mnf_reference.rs).

use faer::{Mat, Side};

use super::MnfError;

/// The Cholesky factor of the (scaled) noise covariance of the bands used.
pub struct NoiseWhitening {
    l: Mat<f64>,
    n: usize,
}

impl NoiseWhitening {
    /// `cn`: n × n row-major, symmetric. Fails when it is not positive definite (bands that are linear
    /// combinations of others in their noise, e.g. duplicated bands).
    pub fn new(cn: &[f64], n: usize) -> Result<Self, MnfError> {
        let m = Mat::<f64>::from_fn(n, n, |i, j| cn[i * n + j]);
        let llt = m.llt(Side::Lower).map_err(|_| {
            MnfError::Degenerate(
                "the noise covariance is singular: some bands are exact linear combinations of others \
                 in their noise (duplicated or synthetic bands?); exclude them with bad bands"
                    .into(),
            )
        })?;
        Ok(NoiseWhitening { l: llt.L().to_owned(), n })
    }
}

/// The whitened eigenproblem solved elsewhere than in faer on this thread (the CUDA backend: cuBLAS
/// triangular solves and cuSOLVER `syevd` on the device). Given the Cholesky factor L of C_N (n × n,
/// lower, column-major) and C_D (n × n, symmetric), it returns the eigenvalues of A = L⁻¹ C_D L⁻ᵀ in any
/// order and W = L⁻ᵀ V (the eigenvectors V of A as columns; n × n column-major) in the same order.
pub trait GeneralizedEigenSolver: Send + Sync {
    fn name(&self) -> &'static str;
    fn solve(&self, l: &[f64], cd: &[f64], n: usize) -> Result<(Vec<f64>, Vec<f64>), String>;
}

/// Eigenvalues (descending) and the transform W (n × n, row-major; column c = component c).
#[derive(Debug, Clone)]
pub struct EigenPairs {
    pub eigenvalues: Vec<f64>,
    pub transform: Vec<f64>,
}

/// Solves C_D w = λ C_N w given the noise whitening and C_D (n × n, row-major, symmetric).
/// Columns are normalised so that Wᵀ C_N W = I and signed so that each column's largest-magnitude
/// loading is positive (a deterministic convention: cached and repeated results are identical).
pub fn solve(whitening: &NoiseWhitening, cd: &[f64]) -> Result<EigenPairs, MnfError> {
    solve_with(whitening, cd, None)
}

/// [`solve`], with the symmetric eigendecomposition done by `device` when given (falling back to faer,
/// with a warning, if it fails: the answer is the same within rounding either way).
pub fn solve_with(
    whitening: &NoiseWhitening,
    cd: &[f64],
    device: Option<&dyn GeneralizedEigenSolver>,
) -> Result<EigenPairs, MnfError> {
    let n = whitening.n;
    let l = whitening.l.as_ref();
    let on_device = device.and_then(|d| {
        let l_cols: Vec<f64> = (0..n)
            .flat_map(|j| (0..n).map(move |i| l[(i, j)]))
            .collect();
        match d.solve(&l_cols, cd, n) {
            Ok((values, w)) if values.len() == n && w.len() == n * n => {
                if values.iter().chain(&w).all(|v| v.is_finite()) {
                    Some((values, Mat::<f64>::from_fn(n, n, |i, j| w[j * n + i])))
                } else {
                    tracing::warn!("{}: non-finite result; solving on the host", d.name());
                    None
                }
            }
            Ok(_) => {
                tracing::warn!("{}: wrong result shape; solving on the host", d.name());
                None
            }
            Err(e) => {
                tracing::warn!("{}: {e}; solving on the host", d.name());
                None
            }
        }
    });
    let (values, w) = match on_device {
        Some(vw) => vw,
        None => {
            // Y = L⁻¹ C_D, then A = L⁻¹ Yᵀ = L⁻¹ C_D L⁻ᵀ (C_D is symmetric).
            let mut y = Mat::<f64>::from_fn(n, n, |i, j| cd[i * n + j]);
            l.solve_lower_triangular_in_place(y.as_mut());
            let mut a = y.transpose().to_owned();
            l.solve_lower_triangular_in_place(a.as_mut());
            // Symmetrise away rounding so the symmetric solver sees an exactly symmetric matrix.
            let a = Mat::<f64>::from_fn(n, n, |i, j| 0.5 * (a[(i, j)] + a[(j, i)]));
            if (0..n).any(|j| (0..n).any(|i| !a[(i, j)].is_finite())) {
                return Err(MnfError::Degenerate(
                    "the whitened data covariance is not finite".into(),
                ));
            }
            let evd = a.self_adjoint_eigen(Side::Lower).map_err(|e| {
                MnfError::Degenerate(format!(
                    "the symmetric eigendecomposition did not converge: {e:?}"
                ))
            })?;
            let mut w = evd.U().to_owned();
            l.transpose().solve_upper_triangular_in_place(w.as_mut());
            ((0..n).map(|i| evd.S()[i]).collect::<Vec<f64>>(), w)
        }
    };

    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&i, &j| values[j].total_cmp(&values[i]));
    let eigenvalues: Vec<f64> = order.iter().map(|&i| values[i]).collect();
    let mut transform = vec![0.0; n * n];
    for (c, &src) in order.iter().enumerate() {
        // Largest |loading| positive; ties go to the first band, so the choice is deterministic.
        let mut best = 0;
        for r in 1..n {
            if w[(r, src)].abs() > w[(best, src)].abs() {
                best = r;
            }
        }
        let sign = if w[(best, src)] < 0.0 { -1.0 } else { 1.0 };
        for r in 0..n {
            transform[r * n + c] = sign * w[(r, src)];
        }
    }
    if transform.iter().any(|v| !v.is_finite()) {
        return Err(MnfError::Degenerate("the noise covariance is numerically singular".into()));
    }
    Ok(EigenPairs { eigenvalues, transform })
}

#[cfg(test)]
mod tests {
    use super::*;
    use nalgebra::DMatrix;

    /// W must satisfy C_D W = C_N W Λ and Wᵀ C_N W = I on a random positive definite pair.
    #[test]
    fn solves_the_generalized_problem() {
        let n = 6;
        let mut s: u64 = 0x9e3779b97f4a7c15;
        let mut rnd = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % 10_000) as f64 / 5_000.0 - 1.0
        };
        let ga = DMatrix::from_fn(n, n + 3, |_, _| rnd());
        let gb = DMatrix::from_fn(n, n + 3, |_, _| rnd());
        let cd = &ga * ga.transpose();
        let cn = &gb * gb.transpose() + DMatrix::identity(n, n) * 0.1;
        let flat = |m: &DMatrix<f64>| m.transpose().as_slice().to_vec(); // row-major
        let wh = NoiseWhitening::new(&flat(&cn), n).unwrap();
        let ep = solve(&wh, &flat(&cd)).unwrap();
        let w = DMatrix::from_row_slice(n, n, &ep.transform);
        let lam = DMatrix::from_diagonal(&nalgebra::DVector::from_vec(ep.eigenvalues.clone()));
        let resid = (&cd * &w - &cn * &w * &lam).norm() / (cd.norm() * w.norm());
        assert!(resid < 1e-12, "residual {resid}");
        let ortho = (w.transpose() * &cn * &w - DMatrix::identity(n, n)).norm();
        assert!(ortho < 1e-10, "WᵀC_N W − I = {ortho}");
        assert!(ep.eigenvalues.windows(2).all(|p| p[0] >= p[1]), "not descending");
        for c in 0..n {
            let col = w.column(c);
            let big = col.iter().cloned().fold(0.0f64, |m, v| if v.abs() > m.abs() { v } else { m });
            assert!(big > 0.0, "column {c} largest loading is negative");
        }
    }

    #[test]
    fn singular_noise_is_a_clear_error() {
        let cn = vec![1.0, 1.0, 1.0, 1.0];
        assert!(matches!(NoiseWhitening::new(&cn, 2), Err(MnfError::Degenerate(_))));
    }
}

//! The generalized symmetric eigenproblem C_D w = λ C_N w, in float64 on the host (nalgebra).
//!
//! Solved through the Cholesky factor of the noise covariance, C_N = L Lᵀ: the data covariance is
//! whitened, A = L⁻¹ C_D L⁻ᵀ, A = V Λ Vᵀ, and W = L⁻ᵀ V, so that Wᵀ C_N W = I. This is the same
//! transform as the paper's P = U D_N^(-1/2) route (both whiten the noise; the eigenvectors of the
//! whitened data covariance then agree up to sign) and as LAPACK's `sygv` used by SciPy's
//! `eigh(S, N)`, but it needs one symmetric eigen-decomposition instead of two. The noise half
//! (`NoiseWhitening::new`) depends only on C_N, so it can run while a device computes C_D.

use nalgebra::{Cholesky, DMatrix, Dyn, SymmetricEigen};

use super::MnfError;

/// The Cholesky factor of the (scaled) noise covariance of the bands used.
pub struct NoiseWhitening {
    chol: Cholesky<f64, Dyn>,
    n: usize,
}

impl NoiseWhitening {
    /// `cn`: n × n row-major, symmetric. Fails when it is not positive definite (bands that are linear
    /// combinations of others in their noise, e.g. duplicated bands).
    pub fn new(cn: &[f64], n: usize) -> Result<Self, MnfError> {
        let m = DMatrix::from_row_slice(n, n, cn);
        let chol = Cholesky::new(m).ok_or_else(|| {
            MnfError::Degenerate(
                "the noise covariance is singular: some bands are exact linear combinations of others \
                 in their noise (duplicated or synthetic bands?); exclude them with bad bands"
                    .into(),
            )
        })?;
        Ok(NoiseWhitening { chol, n })
    }
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
    let n = whitening.n;
    let l = whitening.chol.l();
    let cd = DMatrix::from_row_slice(n, n, cd);
    // Y = L⁻¹ C_D, then A = L⁻¹ Yᵀ = L⁻¹ C_D L⁻ᵀ (C_D is symmetric).
    let y = l.solve_lower_triangular(&cd).ok_or_else(singular)?;
    let mut a = l.solve_lower_triangular(&y.transpose()).ok_or_else(singular)?;
    // Symmetrise away rounding so the symmetric solver sees an exactly symmetric matrix.
    let at = a.transpose();
    a = (a + at) * 0.5;
    if a.iter().any(|v| !v.is_finite()) {
        return Err(MnfError::Degenerate("the whitened data covariance is not finite".into()));
    }
    let eig = SymmetricEigen::new(a);
    let w = l.transpose().solve_upper_triangular(&eig.eigenvectors).ok_or_else(singular)?;

    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&i, &j| eig.eigenvalues[j].total_cmp(&eig.eigenvalues[i]));
    let eigenvalues: Vec<f64> = order.iter().map(|&i| eig.eigenvalues[i]).collect();
    let mut transform = vec![0.0; n * n];
    for (c, &src) in order.iter().enumerate() {
        let col = w.column(src);
        // Largest |loading| positive; ties go to the first band, so the choice is deterministic.
        let mut best = 0;
        for r in 1..n {
            if col[r].abs() > col[best].abs() {
                best = r;
            }
        }
        let sign = if col[best] < 0.0 { -1.0 } else { 1.0 };
        for r in 0..n {
            transform[r * n + c] = sign * col[r];
        }
    }
    Ok(EigenPairs { eigenvalues, transform })
}

fn singular() -> MnfError {
    MnfError::Degenerate("the noise covariance is numerically singular".into())
}

#[cfg(test)]
mod tests {
    use super::*;

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

//! The generalized symmetric eigenproblem C_D w = λ C_N w, in float64 on the host.
//!
//! Solved through the Cholesky factor of the noise covariance, C_N = L Lᵀ: the data covariance is
//! whitened, A = L⁻¹ C_D L⁻ᵀ, A = V Λ Vᵀ, and W = L⁻ᵀ V, so that Wᵀ C_N W = I. This is the same
//! transform as the paper's P = U D_N^(-1/2) route (both whiten the noise; the eigenvectors of the
//! whitened data covariance then agree up to sign) and as LAPACK's `sygv` used by SciPy's
//! `eigh(S, N)`, but it needs one symmetric eigen-decomposition instead of two. The noise half
//! (`NoiseWhitening::new`) depends only on C_N, so it can run while a device computes C_D; where a
//! device solves the whole problem (`GeneralizedEigenSolver`, Cholesky factor included),
//! `NoiseWhitening::deferred` leaves the factorisation to it and the host does no linear algebra.
//!
//! The linear algebra is faer's (blocked, SIMD): at 224 bands the Cholesky factor, three triangular
//! solves and the symmetric eigendecomposition take ~5 ms, where nalgebra's took ~31 ms, and on the GPU
//! path this host step was longer than all the device work. The tests check it against an independent
//! nalgebra implementation of the paper's route (tests/mnf_reference.rs).

use faer::{Mat, MatRef, Side};

use super::MnfError;

/// The noise half of the eigenproblem: the (scaled) noise covariance C_N of the bands used and, once
/// computed, its Cholesky factor L (C_N = L Lᵀ).
///
/// Two forms, with the same answers: [`NoiseWhitening::new`] factors C_N at once (the host path: the
/// factorisation then overlaps the device's data covariance), [`NoiseWhitening::deferred`] only keeps
/// C_N, for a [`GeneralizedEigenSolver`] that factors it itself (the CUDA backend, with cuSOLVER's
/// `potrf`); the host computes L from it only if it has to solve the problem after all (no solver, or
/// the solver failed), with exactly the operations `new` would have used.
pub struct NoiseWhitening {
    /// n × n row-major (symmetric, so column-major too).
    cn: Vec<f64>,
    l: Option<Mat<f64>>,
    n: usize,
}

/// The message of a noise covariance that is not positive definite.
fn not_positive_definite() -> MnfError {
    MnfError::Degenerate(
        "the noise covariance is singular: some bands are exact linear combinations of others \
         in their noise (duplicated or synthetic bands?); exclude them with bad bands"
            .into(),
    )
}

/// The lower Cholesky factor of the row-major n × n `cn`.
fn cholesky(cn: &[f64], n: usize) -> Result<Mat<f64>, MnfError> {
    let m = Mat::<f64>::from_fn(n, n, |i, j| cn[i * n + j]);
    let llt = m.llt(Side::Lower).map_err(|_| not_positive_definite())?;
    Ok(llt.L().to_owned())
}

impl NoiseWhitening {
    /// `cn`: n × n row-major, symmetric. Factors it now; fails when it is not positive definite (bands
    /// that are linear combinations of others in their noise, e.g. duplicated bands).
    pub fn new(cn: Vec<f64>, n: usize) -> Result<Self, MnfError> {
        assert_eq!(cn.len(), n * n, "C_N must be n × n");
        let l = cholesky(&cn, n)?;
        Ok(NoiseWhitening { cn, l: Some(l), n })
    }

    /// `cn` as in [`new`](Self::new), not factored yet: [`solve_with`] hands it to the device solver,
    /// or factors it on the host (reporting a C_N that is not positive definite as `new` would).
    pub fn deferred(cn: Vec<f64>, n: usize) -> Self {
        assert_eq!(cn.len(), n * n, "C_N must be n × n");
        NoiseWhitening { cn, l: None, n }
    }

    /// The number of bands.
    pub fn bands(&self) -> usize {
        self.n
    }

    /// C_N, n × n row-major.
    pub fn noise_covariance(&self) -> &[f64] {
        &self.cn
    }

    /// C_N, n × n row-major, given back.
    pub fn into_noise_covariance(self) -> Vec<f64> {
        self.cn
    }

    /// Whether L has been computed (by `new`).
    pub fn is_factored(&self) -> bool {
        self.l.is_some()
    }
}

/// Why a [`GeneralizedEigenSolver`] gave no answer. Either way [`solve_with`] solves on the host
/// instead, which reports a C_N that is not positive definite as [`MnfError::Degenerate`].
#[derive(Debug, Clone, PartialEq)]
pub enum SolverError {
    /// The Cholesky factorisation of C_N failed: its leading minor of this order (1-based, as LAPACK's
    /// `info`) is not positive definite.
    NotPositiveDefinite(usize),
    /// Anything else (a library or driver error, a non-convergence).
    Failed(String),
}

impl std::fmt::Display for SolverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SolverError::NotPositiveDefinite(k) => {
                write!(f, "the noise covariance is not positive definite (leading minor of order {k})")
            }
            SolverError::Failed(e) => f.write_str(e),
        }
    }
}

/// The generalized eigenproblem solved elsewhere than in faer on this thread (the CUDA backend:
/// cuSOLVER `potrf`, cuBLAS triangular solves and cuSOLVER `syevd` on the device).
///
/// Given the scaled noise covariance C_N and the data covariance C_D (both n × n and symmetric, so
/// their row- and column-major layouts are the same), it factors C_N = L Lᵀ (L lower) and returns the
/// eigenvalues of A = L⁻¹ C_D L⁻ᵀ in any order and W = L⁻ᵀ V (the eigenvectors V of A as columns;
/// n × n column-major) in the same order. A C_N that is not positive definite is
/// [`SolverError::NotPositiveDefinite`], never a result.
pub trait GeneralizedEigenSolver: Send + Sync {
    fn name(&self) -> &'static str;
    fn solve(&self, cn: &[f64], cd: &[f64], n: usize) -> Result<(Vec<f64>, Vec<f64>), SolverError>;
    /// [`GeneralizedEigenSolver::solve`], or the pairs already in [`EigenPairs`]' order and signs where
    /// the solver can put them so itself (the device's, which then spares the host the transposition).
    fn solve_ordered(&self, cn: &[f64], cd: &[f64], n: usize) -> Result<Solution, SolverError> {
        self.solve(cn, cd, n).map(|(values, w)| Solution::Unordered { values, w })
    }
    /// Whether [`solve_with`] gives it a problem of n bands: a solver slower than the host's at some
    /// sizes declines them (the device's, at few bands), so every path (a job, a pooled batch) picks
    /// the same solver for the same size and gives the same bits.
    fn takes(&self, _n: usize) -> bool {
        true
    }
}

/// A solver's answer to C_D w = λ C_N w.
pub enum Solution {
    /// The eigenvalues in any order and W (n × n, column-major) in the same order, as
    /// [`GeneralizedEigenSolver::solve`] returns them.
    Unordered { values: Vec<f64>, w: Vec<f64> },
    /// The eigenvalues ascending and the transform (n × n, row-major) with its columns in descending
    /// order of the eigenvalue (column c the pair of `ascending[n − 1 − c]`), each signed as
    /// [`solve`] signs them.
    Descending { ascending: Vec<f64>, transform: Vec<f64> },
}

/// What a backend's early solve gave ([`crate::mnf::compute::PreparedCube::solve_early`]).
pub struct EarlySolution {
    /// The bands it solved for: the answer holds for a job that selected exactly these.
    pub bands: Vec<usize>,
    pub answer: Result<Solution, SolverError>,
    /// The solver's name, for the warnings of [`pairs_from_device`].
    pub solver: &'static str,
    /// Host wall time the statistics pass spent waiting for the solve once its moments were done
    /// (ms): eigen-step time, not statistics time.
    pub wait_ms: f64,
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

/// [`solve`], with the whole problem (Cholesky factor included) solved by `device` when given, falling
/// back to faer if it fails: with a warning, or quietly when the device found C_N not positive definite
/// (the host then factors C_N itself and reports it as `NoiseWhitening::new` does). The answer is the
/// same within rounding either way.
pub fn solve_with(
    whitening: &NoiseWhitening,
    cd: &[f64],
    device: Option<&dyn GeneralizedEigenSolver>,
) -> Result<EigenPairs, MnfError> {
    let n = whitening.n;
    if let Some(d) = device.filter(|d| d.takes(n)) {
        let t = std::time::Instant::now();
        let answer = d.solve_ordered(&whitening.cn, cd, n);
        tracing::debug!(target: "hypermnf::timing", n, device_solve_ms = t.elapsed().as_secs_f64() * 1e3, "eigen step: device solve");
        if let Some(pairs) = pairs_from_device(answer, n, d.name()) {
            return pairs;
        }
    }
    let factored;
    let l: MatRef<'_, f64> = match &whitening.l {
        Some(l) => l.as_ref(),
        None => {
            factored = cholesky(&whitening.cn, n)?;
            factored.as_ref()
        }
    };
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
    let values: Vec<f64> = (0..n).map(|i| evd.S()[i]).collect();
    order_and_sign(n, &values, |r, c| w[(r, c)])
}

/// The pairs of a device solver's answer of n bands, after the host's checks (and the ordering and
/// signs, where the solver left them); None where there is none to use, and the host must solve: with
/// a warning, or quietly when the device found C_N not positive definite.
pub fn pairs_from_device(answer: Result<Solution, SolverError>, n: usize, solver: &str) -> Option<Result<EigenPairs, MnfError>> {
    let t = std::time::Instant::now();
    // The values and W with whether the solver ordered them already.
    let answer = answer.map(|s| match s {
        Solution::Descending { ascending, transform } => (ascending, transform, true),
        Solution::Unordered { values, w } => (values, w, false),
    });
    match answer {
        Ok((values, w, ordered)) if values.len() == n && w.len() == n * n => {
            if all_finite(&values) && all_finite(&w) {
                let pairs = if ordered { from_descending(n, values, w) } else { order_and_sign_column_major(n, &values, w) };
                tracing::debug!(
                    target: "hypermnf::timing",
                    n,
                    ordered_on_device = ordered,
                    check_order_sign_ms = t.elapsed().as_secs_f64() * 1e3,
                    "eigen step: the host's checks of the device's answer (and ordering and signs, where the device left them)"
                );
                return Some(pairs);
            }
            tracing::warn!("{solver}: non-finite result; solving on the host");
        }
        Ok(_) => tracing::warn!("{solver}: wrong result shape; solving on the host"),
        Err(e @ SolverError::NotPositiveDefinite(_)) => tracing::debug!("{solver}: {e}; solving on the host"),
        Err(e) => tracing::warn!("{solver}: {e}; solving on the host"),
    }
    None
}

/// Whether every value is finite. In blocks without an early exit, which the compiler vectorizes:
/// the device's W at 224 bands (50 176 values) is checked in ~10 µs instead of ~25 (`Iterator::all`
/// stops at the first failure, so it tests one value at a time), on the host's critical path between
/// the solve and the projection.
fn all_finite(x: &[f64]) -> bool {
    x.chunks(64).all(|block| block.iter().fold(true, |ok, v| ok & v.is_finite()))
}

/// The pairs of a [`Solution::Descending`] as [`EigenPairs`]. Where every eigenvalue is distinct (the
/// rule) its columns are already the host's; where some are equal, the host's stable sort would put
/// them in another order, so the host's ordering runs on the columns as they came: they differ from
/// the solver's W only by their order and signs, which it recomputes, so the bits are the same as
/// from W.
fn from_descending(n: usize, ascending: Vec<f64>, transform: Vec<f64>) -> Result<EigenPairs, MnfError> {
    if ascending.windows(2).all(|p| p[0] < p[1]) {
        let eigenvalues = ascending.into_iter().rev().collect();
        return Ok(EigenPairs { eigenvalues, transform });
    }
    order_and_sign(n, &ascending, |r, src| transform[r * n + (n - 1 - src)])
}

/// [`order_and_sign`] for a column-major W (the device solver's), turned into the row-major transform
/// in place. The same values bit for bit; at n = 224 it takes ~0.1 ms instead of ~0.3 ms, most of which
/// was first-touch page faults of a fresh n × n buffer and strided writes into it.
fn order_and_sign_column_major(n: usize, values: &[f64], mut w: Vec<f64>) -> Result<EigenPairs, MnfError> {
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&i, &j| values[j].total_cmp(&values[i]));
    let eigenvalues: Vec<f64> = order.iter().map(|&i| values[i]).collect();
    // Column src is w[src n .. (src + 1) n]; largest |loading| positive, ties to the first band.
    let signs: Vec<f64> = order
        .iter()
        .map(|&src| {
            let col = &w[src * n..(src + 1) * n];
            let mut best = 0;
            for r in 1..n {
                if col[r].abs() > col[best].abs() {
                    best = r;
                }
            }
            if col[best] < 0.0 { -1.0 } else { 1.0 }
        })
        .collect();
    // Transpose in place (w becomes row-major W), then put each row's columns in order with their signs.
    for r in 0..n {
        for c in r + 1..n {
            w.swap(r * n + c, c * n + r);
        }
    }
    let mut row_out = vec![0.0; n];
    for row in w.chunks_exact_mut(n) {
        for (c, (&src, &sign)) in order.iter().zip(&signs).enumerate() {
            row_out[c] = sign * row[src];
        }
        row.copy_from_slice(&row_out);
    }
    if w.iter().any(|v| !v.is_finite()) {
        return Err(MnfError::Degenerate("the noise covariance is numerically singular".into()));
    }
    Ok(EigenPairs { eigenvalues, transform: w })
}

/// Eigenpairs in descending order of the eigenvalue, each column of W (`w(row, column)`) signed so that
/// its largest-magnitude loading is positive; W row-major.
fn order_and_sign(n: usize, values: &[f64], w: impl Fn(usize, usize) -> f64) -> Result<EigenPairs, MnfError> {
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&i, &j| values[j].total_cmp(&values[i]));
    let eigenvalues: Vec<f64> = order.iter().map(|&i| values[i]).collect();
    let mut transform = vec![0.0; n * n];
    for (c, &src) in order.iter().enumerate() {
        // Largest |loading| positive; ties go to the first band, so the choice is deterministic.
        let mut best = 0;
        for r in 1..n {
            if w(r, src).abs() > w(best, src).abs() {
                best = r;
            }
        }
        let sign = if w(best, src) < 0.0 { -1.0 } else { 1.0 };
        for r in 0..n {
            transform[r * n + c] = sign * w(r, src);
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

    /// A xorshift64 stream from `seed`: the tests' small deterministic random numbers.
    fn xorshift(mut s: u64) -> impl FnMut() -> u64 {
        move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        }
    }

    /// all_finite finds one NaN or infinity anywhere, at a block's edges and in a short tail.
    #[test]
    fn all_finite_finds_a_non_finite_value_anywhere() {
        let n = 224 * 224 + 5;
        let x: Vec<f64> = (0..n).map(|i| i as f64 - 1000.0).collect();
        assert!(all_finite(&x));
        assert!(all_finite(&[]));
        for at in [0, 63, 64, 127, 4096, n - 5, n - 1] {
            for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
                let mut y = x.clone();
                y[at] = bad;
                assert!(!all_finite(&y), "{bad} at {at}");
            }
        }
    }

    /// W must satisfy C_D W = C_N W Λ and Wᵀ C_N W = I on a random positive definite pair.
    #[test]
    fn solves_the_generalized_problem() {
        let n = 6;
        let mut next = xorshift(0x9e3779b97f4a7c15);
        let mut rnd = || (next() % 10_000) as f64 / 5_000.0 - 1.0;
        let ga = DMatrix::from_fn(n, n + 3, |_, _| rnd());
        let gb = DMatrix::from_fn(n, n + 3, |_, _| rnd());
        let cd = &ga * ga.transpose();
        let cn = &gb * gb.transpose() + DMatrix::identity(n, n) * 0.1;
        let flat = |m: &DMatrix<f64>| m.transpose().as_slice().to_vec(); // row-major
        let wh = NoiseWhitening::new(flat(&cn), n).unwrap();
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

    /// The in-place column-major ordering gives the accessor version's bits, on a random W with
    /// unordered eigenvalues and columns of both signs.
    #[test]
    fn column_major_ordering_matches_the_accessor_version() {
        let n = 37;
        let mut next = xorshift(0x2545f4914f6cdd1d);
        let mut rnd = || (next() % 20_000) as f64 / 1_000.0 - 10.0;
        let values: Vec<f64> = (0..n).map(|_| rnd()).collect();
        let w: Vec<f64> = (0..n * n).map(|_| rnd()).collect();
        let a = order_and_sign(n, &values, |r, c| w[c * n + r]).unwrap();
        let b = order_and_sign_column_major(n, &values, w.clone()).unwrap();
        assert_eq!(a.eigenvalues, b.eigenvalues);
        assert_eq!(a.transform, b.transform);
    }

    /// What the device's ordering kernels give (columns reversed, each signed by its first largest
    /// loading, row-major), simulated here, comes out of `from_descending` with the bits of the host's
    /// ordering of the same W: with distinct eigenvalues, and with equal ones (where the host's order
    /// differs from the reversal).
    #[test]
    fn descending_pairs_give_the_host_ordering_bits() {
        let n = 29;
        let mut next = xorshift(0x9e3779b97f4a7c15);
        let mut rnd = || (next() % 20_000) as f64 / 1_000.0 - 10.0;
        let w: Vec<f64> = (0..n * n).map(|_| rnd()).collect();
        let distinct: Vec<f64> = (0..n).map(|i| i as f64 * 0.5 - 3.0).collect();
        let mut tied = distinct.clone();
        tied[10] = tied[11];
        tied[20] = tied[21];
        tied[22] = tied[21];
        for values in [distinct, tied] {
            let want = order_and_sign_column_major(n, &values, w.clone()).unwrap();
            let got = from_descending(n, values.clone(), device_order(n, &w)).unwrap();
            assert_eq!(bits(&want.eigenvalues), bits(&got.eigenvalues));
            assert_eq!(bits(&want.transform), bits(&got.transform));
        }
    }

    #[test]
    fn singular_noise_is_a_clear_error() {
        let cn = vec![1.0, 1.0, 1.0, 1.0];
        assert!(matches!(NoiseWhitening::new(cn.clone(), 2), Err(MnfError::Degenerate(_))));
        // Deferred, the host reports it when it factors C_N in `solve`, with the same message.
        let eager = NoiseWhitening::new(cn.clone(), 2).err().unwrap().to_string();
        let late = solve(&NoiseWhitening::deferred(cn, 2), &[2.0, 0.0, 0.0, 3.0]).unwrap_err();
        assert!(matches!(late, MnfError::Degenerate(_)));
        assert_eq!(late.to_string(), eager);
    }

    /// A random n × n positive definite pair (C_D, C_N), row-major.
    fn random_pair(n: usize, mut s: u64) -> (Vec<f64>, Vec<f64>) {
        let mut rnd = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % 1_000_003) as f64 / 500_000.0 - 1.0
        };
        let ga = DMatrix::from_fn(n, n + 5, |_, _| rnd());
        let gb = DMatrix::from_fn(n, n + 5, |_, _| rnd());
        let cd = &ga * ga.transpose();
        let cn = &gb * gb.transpose() + DMatrix::identity(n, n) * 0.01;
        (cd.transpose().as_slice().to_vec(), cn.transpose().as_slice().to_vec())
    }

    fn bits(v: &[f64]) -> Vec<u64> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// The deferred form factors C_N on the host exactly as the eager one: the same bits.
    #[test]
    fn deferred_whitening_is_bit_identical_on_the_host() {
        for (n, seed) in [(1, 3u64), (7, 0x1234_5678), (64, 0x9e37_79b9_7f4a_7c15), (224, 42)] {
            let (cd, cn) = random_pair(n, seed);
            let eager = solve(&NoiseWhitening::new(cn.clone(), n).unwrap(), &cd).unwrap();
            let deferred = NoiseWhitening::deferred(cn.clone(), n);
            assert!(!deferred.is_factored());
            let late = solve(&deferred, &cd).unwrap();
            assert_eq!(bits(&eager.eigenvalues), bits(&late.eigenvalues), "n = {n}: eigenvalues");
            assert_eq!(bits(&eager.transform), bits(&late.transform), "n = {n}: transform");
            assert_eq!(bits(deferred.noise_covariance()), bits(&cn));
        }
    }

    /// A device solver that always fails in the given way.
    struct Failing(SolverError);
    impl GeneralizedEigenSolver for Failing {
        fn name(&self) -> &'static str {
            "failing test solver"
        }
        fn solve(&self, _: &[f64], _: &[f64], _: usize) -> Result<(Vec<f64>, Vec<f64>), SolverError> {
            Err(self.0.clone())
        }
    }

    /// A device solver that solves on the host through nalgebra (column-major W, eigenvalues unordered).
    struct Nalgebra;
    impl GeneralizedEigenSolver for Nalgebra {
        fn name(&self) -> &'static str {
            "nalgebra test solver"
        }
        fn solve(&self, cn: &[f64], cd: &[f64], n: usize) -> Result<(Vec<f64>, Vec<f64>), SolverError> {
            let cn = DMatrix::from_row_slice(n, n, cn);
            let cd = DMatrix::from_row_slice(n, n, cd);
            let l = cn.cholesky().ok_or(SolverError::NotPositiveDefinite(1))?.l();
            let li = l.clone().try_inverse().unwrap();
            let a = &li * cd * li.transpose();
            let e = nalgebra::SymmetricEigen::new(0.5 * (&a + a.transpose()));
            let w = li.transpose() * e.eigenvectors;
            Ok((e.eigenvalues.as_slice().to_vec(), w.as_slice().to_vec()))
        }
    }

    /// What the device's ordering kernels do to W (column-major, eigenvalues ascending): columns
    /// reversed, each signed by its first largest loading, row-major.
    fn device_order(n: usize, w: &[f64]) -> Vec<f64> {
        let mut t = vec![0.0; n * n];
        for c in 0..n {
            let col = &w[(n - 1 - c) * n..(n - c) * n];
            let mut best = 0;
            for r in 1..n {
                if col[r].abs() > col[best].abs() {
                    best = r;
                }
            }
            let sign = if col[best] < 0.0 { -1.0 } else { 1.0 };
            for r in 0..n {
                t[r * n + c] = sign * col[r];
            }
        }
        t
    }

    /// A solver answering `Solution::Descending` (Nalgebra's pairs sorted ascending, then ordered as
    /// the device orders them) gives `solve_with` the bits it gets from the same pairs unordered.
    #[test]
    fn a_solver_that_orders_its_pairs_gives_the_same_bits() {
        struct Sorted;
        impl GeneralizedEigenSolver for Sorted {
            fn name(&self) -> &'static str {
                "sorted nalgebra test solver"
            }
            fn solve(&self, cn: &[f64], cd: &[f64], n: usize) -> Result<(Vec<f64>, Vec<f64>), SolverError> {
                let (values, w) = Nalgebra.solve(cn, cd, n)?;
                let mut order: Vec<usize> = (0..n).collect();
                order.sort_by(|&i, &j| values[i].total_cmp(&values[j]));
                Ok((order.iter().map(|&i| values[i]).collect(), order.iter().flat_map(|&i| w[i * n..(i + 1) * n].to_vec()).collect()))
            }
        }
        struct Ordering;
        impl GeneralizedEigenSolver for Ordering {
            fn name(&self) -> &'static str {
                "ordering nalgebra test solver"
            }
            fn solve(&self, cn: &[f64], cd: &[f64], n: usize) -> Result<(Vec<f64>, Vec<f64>), SolverError> {
                Sorted.solve(cn, cd, n)
            }
            fn solve_ordered(&self, cn: &[f64], cd: &[f64], n: usize) -> Result<Solution, SolverError> {
                let (ascending, w) = Sorted.solve(cn, cd, n)?;
                Ok(Solution::Descending { ascending, transform: device_order(n, &w) })
            }
        }
        let n = 11;
        let (cd, cn) = random_pair(n, 8);
        let a = solve_with(&NoiseWhitening::deferred(cn.clone(), n), &cd, Some(&Sorted)).unwrap();
        let b = solve_with(&NoiseWhitening::deferred(cn, n), &cd, Some(&Ordering)).unwrap();
        assert_eq!(bits(&a.eigenvalues), bits(&b.eigenvalues));
        assert_eq!(bits(&a.transform), bits(&b.transform));
    }

    /// A solver that declines a size is never called for it: the host solves, with the host's bits.
    #[test]
    fn a_solver_that_declines_a_size_leaves_it_to_the_host() {
        struct Declining;
        impl GeneralizedEigenSolver for Declining {
            fn name(&self) -> &'static str {
                "declining test solver"
            }
            fn solve(&self, _: &[f64], _: &[f64], n: usize) -> Result<(Vec<f64>, Vec<f64>), SolverError> {
                panic!("called for {n} bands, which it declines")
            }
            fn takes(&self, n: usize) -> bool {
                n > 16
            }
        }
        let n = 12;
        let (cd, cn) = random_pair(n, 78);
        let host = solve(&NoiseWhitening::new(cn.clone(), n).unwrap(), &cd).unwrap();
        let got = solve_with(&NoiseWhitening::deferred(cn, n), &cd, Some(&Declining)).unwrap();
        assert_eq!(bits(&host.eigenvalues), bits(&got.eigenvalues));
        assert_eq!(bits(&host.transform), bits(&got.transform));
    }

    /// A failing device solver falls back to the host: the same bits as the host path, and a C_N that
    /// is not positive definite is the host's clear error.
    #[test]
    fn failing_device_solver_falls_back_to_the_host() {
        let n = 12;
        let (cd, cn) = random_pair(n, 77);
        let host = solve(&NoiseWhitening::new(cn.clone(), n).unwrap(), &cd).unwrap();
        for e in [SolverError::Failed("boom".into()), SolverError::NotPositiveDefinite(3)] {
            let dev = Failing(e);
            let got = solve_with(&NoiseWhitening::deferred(cn.clone(), n), &cd, Some(&dev)).unwrap();
            assert_eq!(bits(&host.eigenvalues), bits(&got.eigenvalues));
            assert_eq!(bits(&host.transform), bits(&got.transform));
        }
        let singular = vec![4.0, 4.0, 0.0, 4.0, 4.0, 0.0, 0.0, 0.0, 1.0];
        let dev = Failing(SolverError::NotPositiveDefinite(2));
        let err = solve_with(&NoiseWhitening::deferred(singular, 3), &cd[..9], Some(&dev)).unwrap_err();
        assert!(matches!(err, MnfError::Degenerate(ref m) if m.contains("singular")), "{err}");
    }

    /// A device solver's column-major W and unordered eigenvalues come out ordered and signed like the
    /// host's, equal within rounding.
    #[test]
    fn device_solver_results_are_ordered_and_signed_like_the_host() {
        let n = 9;
        let (cd, cn) = random_pair(n, 5);
        let host = solve(&NoiseWhitening::new(cn.clone(), n).unwrap(), &cd).unwrap();
        let dev = solve_with(&NoiseWhitening::deferred(cn, n), &cd, Some(&Nalgebra)).unwrap();
        for (a, b) in dev.eigenvalues.iter().zip(&host.eigenvalues) {
            assert!((a - b).abs() <= 1e-9 * b.abs(), "{a} vs {b}");
        }
        let scale = host.transform.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        for (a, b) in dev.transform.iter().zip(&host.transform) {
            assert!((a - b).abs() <= 1e-8 * scale, "{a} vs {b}");
        }
    }
}

//! The whitening of the generalized eigenproblem, A = L⁻¹ C_D L⁻ᵀ, and its back-transform W = L⁻ᵀ V,
//! by the explicit inverse of the Cholesky factor L of C_N and three float64 GEMMs.
//!
//! cuBLAS's three triangular solves (`trsm`) took 0.66 ms of the eigen step at 425 bands on an H100,
//! and cuSOLVER's `trtri` alone 0.38 ms, while a 425 × 425 GEMM takes 23 µs: the triangular routines
//! walk the diagonal in many small dependent steps. Here L is padded with the identity to p = 64 · 2^m
//! rows, its 64 × 64 diagonal blocks are inverted all at once (`eig_invert_leaves`, a block each), and
//! the inverses are joined pairwise, log2(p / 64) levels of two strided-batched GEMMs:
//! `[X 0; Y Z]⁻¹ = [X⁻¹ 0; −Z⁻¹ Y X⁻¹  Z⁻¹]`. The padding keeps every level one batched call of
//! equal blocks, and its inverse is L⁻¹ padded the same way, so the leading n × n block is L⁻¹.
//!
//! Accuracy: the inverse's forward error is cond(L) · ε, as the triangular solves' is; the solver's
//! tests and `hypermnf bench eigen` compare every method's eigenpairs with the host's float64 solve.

use cudarc::driver::CudaStream;

use super::cublas::{Blas, Mat};
use super::own_eigen::{OwnEigen, INVERSE_LEAF};
use crate::backend::BackendError;

const F64: usize = std::mem::size_of::<f64>();

/// Rows of the padded factor at n bands: `INVERSE_LEAF` times a power of two.
pub(crate) fn padded(n: usize) -> usize {
    INVERSE_LEAF * n.div_ceil(INVERSE_LEAF).max(1).next_power_of_two()
}

/// float64 elements of device scratch at n bands: the padded factor (p²) and the products of the
/// widest level (p² / 4).
pub(crate) fn scratch_len(n: usize) -> usize {
    let p = padded(n);
    p * p + p * p / 4
}

/// Offset (float64 elements) in the scratch of its spare part, free once `enqueue_inverse`'s work has
/// run: at least n elements (the products of the widest level, p² / 4 ≥ p ≥ n).
pub(crate) fn spare_offset(n: usize) -> usize {
    let p = padded(n);
    p * p
}

/// Queues L⁻¹ of the lower triangle of `l` (n × n, column-major) into `scratch` (`scratch_len(n)`
/// float64) and returns it: the leading n × n block of a p × p column-major matrix.
///
/// # Safety
/// `l` and `scratch` are device allocations of the kernels' context that stay alive, and are touched
/// by nothing else, until `stream` has run the work.
pub(crate) unsafe fn enqueue_inverse(stream: &CudaStream, blas: &Blas, kernels: &OwnEigen, n: usize, l: u64, scratch: u64) -> Result<Mat, BackendError> {
    let p = padded(n);
    let lp = Mat { ptr: scratch, ld: p };
    let t = scratch + (p * p * F64) as u64;
    // SAFETY: the caller vouches for l (n²) and scratch (p² + p²/4 ≥ p²).
    unsafe { kernels.enqueue_inverted_leaves(stream, n, l, p, lp.ptr)? };
    let mut b = INVERSE_LEAF;
    while b < p {
        // Pairs of b × b inverses along the diagonal, one pair every 2b rows: X⁻¹ at (2mb, 2mb), Y at
        // (2mb + b, 2mb), Z⁻¹ at (2mb + b, 2mb + b). T_m = Y X⁻¹, then Y ← −Z⁻¹ T_m.
        let count = p / (2 * b);
        let step = 2 * b * (p + 1);
        let tm = Mat { ptr: t, ld: b };
        blas.dgemm_batched(stream, false, false, (b, b, b), 1.0, (lp.at(b, 0), step), (lp, step), 0.0, (tm, b * b), count)?;
        blas.dgemm_batched(stream, false, false, (b, b, b), -1.0, (lp.at(b, b), step), (tm, b * b), 0.0, (lp.at(b, 0), step), count)?;
        b *= 2;
    }
    Ok(lp)
}

/// Queues a = L⁻¹ cd L⁻ᵀ (n × n, column-major, ld n), through y (n² float64 of scratch).
pub(crate) fn enqueue_whiten(stream: &CudaStream, blas: &Blas, n: usize, inverse: Mat, cd: u64, y: u64, a: u64) -> Result<(), BackendError> {
    let (cd, y, a) = (Mat { ptr: cd, ld: n }, Mat { ptr: y, ld: n }, Mat { ptr: a, ld: n });
    blas.dgemm(stream, false, false, (n, n, n), 1.0, inverse, cd, 0.0, y)?;
    blas.dgemm(stream, false, true, (n, n, n), 1.0, y, inverse, 0.0, a)
}

/// Queues w = L⁻ᵀ v (n × n, column-major, ld n).
pub(crate) fn enqueue_back(stream: &CudaStream, blas: &Blas, n: usize, inverse: Mat, v: u64, w: u64) -> Result<(), BackendError> {
    blas.dgemm(stream, true, false, (n, n, n), 1.0, inverse, Mat { ptr: v, ld: n }, 0.0, Mat { ptr: w, ld: n })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_padded_size_is_a_leaf_times_a_power_of_two_at_least_n() {
        for (n, p) in [(1, 64), (64, 64), (65, 128), (128, 128), (129, 256), (224, 256), (256, 256), (285, 512), (425, 512), (1024, 1024)] {
            assert_eq!(padded(n), p, "n = {n}");
        }
        assert_eq!(scratch_len(425), 512 * 512 + 256 * 256);
    }
}

//! The cuBLAS route (the published "MNF-L"): SYRK for the covariances and SGEMM for the projection, on
//! the same device buffers as the custom kernels. The covariances use DSYRK on float64 copies of the
//! (exact) float32 values: a float32 SYRK sums thousands of products per element in float32, and the
//! generalized eigenproblem amplifies that error past 1e-4 on real cubes (see covariance.cu). On a
//! Hopper GPU DSYRK runs on the float64 tensor cores. The projection is a float32 SGEMM (no TF32).

use cudarc::cublas::sys as blas;
use cudarc::driver::CudaStream;

use crate::backend::BackendError;

pub(crate) struct Blas {
    handle: blas::cublasHandle_t,
}

// SAFETY: the handle is used by one thread at a time (the backend keeps it behind a Mutex).
unsafe impl Send for Blas {}

fn check(what: &'static str, s: blas::cublasStatus_t) -> Result<(), BackendError> {
    if s == blas::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(BackendError::Cuda(format!("{what}: {s:?}")))
    }
}

impl Blas {
    /// Creates a handle; libcublas is loaded dynamically, so a missing library is an `Unavailable`.
    pub(crate) fn new() -> Result<Blas, BackendError> {
        // SAFETY: only tries to dlopen the library.
        if !unsafe { blas::is_culib_present() } {
            return Err(BackendError::Unavailable("libcublas not found".into()));
        }
        let created = std::panic::catch_unwind(|| {
            let mut handle: blas::cublasHandle_t = std::ptr::null_mut();
            // SAFETY: out-pointer to a local.
            let s = unsafe { blas::cublasCreate_v2(&mut handle) };
            (s, handle)
        });
        match created {
            Ok((s, handle)) => {
                check("cublasCreate", s)?;
                let b = Blas { handle };
                // The default math mode: no TF32 for the SGEMM (float32 results as asked).
                // SAFETY: valid handle.
                check("cublasSetMathMode", unsafe {
                    blas::cublasSetMathMode(b.handle, blas::cublasMath_t::CUBLAS_DEFAULT_MATH)
                })?;
                Ok(b)
            }
            Err(_) => Err(BackendError::Unavailable("libcublas could not be loaded".into())),
        }
    }

    pub(crate) fn bind(&self, stream: &CudaStream) -> Result<(), BackendError> {
        // SAFETY: valid handle and stream.
        check("cublasSetStream", unsafe {
            blas::cublasSetStream_v2(self.handle, stream.cu_stream() as _)
        })
    }

    /// c (B × B float64) += Σ_p d[p] d[p]ᵀ over `npix` rows of the row-major npix × B float64 matrix
    /// `d`. Column-major, d is a B × npix matrix A (lda = B) and the update A·Aᵀ; its "upper" triangle
    /// in column-major order is the lower triangle in row-major order, the one the custom kernel fills.
    pub(crate) fn dsyrk_add(
        &self,
        stream: &CudaStream,
        d: u64,
        npix: usize,
        bands: usize,
        c: u64,
    ) -> Result<(), BackendError> {
        self.bind(stream)?;
        let (alpha, beta) = (1.0f64, 1.0f64);
        // SAFETY: d holds npix × bands doubles, c bands × bands doubles.
        check("cublasDsyrk", unsafe {
            blas::cublasDsyrk_v2(
                self.handle,
                blas::cublasFillMode_t::CUBLAS_FILL_MODE_UPPER,
                blas::cublasOperation_t::CUBLAS_OP_N,
                bands as i32,
                npix as i32,
                &alpha,
                d as *const f64,
                bands as i32,
                &beta,
                c as *mut f64,
                bands as i32,
            )
        })
    }

    /// z (npix × k, row-major) = x (npix × u, row-major) · t (u × k, row-major). Column-major this is
    /// zᵀ (k × npix) = tᵀ (k × u, lda = k) · xᵀ (u × npix, ldb = u).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gemm_project(
        &self,
        stream: &CudaStream,
        x: u64,
        npix: usize,
        u: usize,
        t: u64,
        k: usize,
        z: u64,
    ) -> Result<(), BackendError> {
        self.bind(stream)?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: sizes as documented.
        check("cublasSgemm", unsafe {
            blas::cublasSgemm_v2(
                self.handle,
                blas::cublasOperation_t::CUBLAS_OP_N,
                blas::cublasOperation_t::CUBLAS_OP_N,
                k as i32,
                npix as i32,
                u as i32,
                &alpha,
                t as *const f32,
                k as i32,
                x as *const f32,
                u as i32,
                &beta,
                z as *mut f32,
                k as i32,
            )
        })
    }
}

impl Blas {
    /// B (n × n, column-major, in place) = op(L)⁻¹ B (`left`) or B op(L)⁻¹, L lower triangular (n × n,
    /// column-major), op(L) = Lᵀ when `transpose`.
    pub(crate) fn dtrsm_lower(
        &self,
        stream: &CudaStream,
        left: bool,
        transpose: bool,
        n: usize,
        l: u64,
        b: u64,
    ) -> Result<(), BackendError> {
        self.bind(stream)?;
        let alpha = 1.0f64;
        let side = if left {
            blas::cublasSideMode_t::CUBLAS_SIDE_LEFT
        } else {
            blas::cublasSideMode_t::CUBLAS_SIDE_RIGHT
        };
        // SAFETY: l and b hold n × n doubles on the stream's device.
        check("cublasDtrsm", unsafe {
            blas::cublasDtrsm_v2(
                self.handle,
                side,
                blas::cublasFillMode_t::CUBLAS_FILL_MODE_LOWER,
                op(transpose),
                blas::cublasDiagType_t::CUBLAS_DIAG_NON_UNIT,
                n as i32,
                n as i32,
                &alpha,
                l as *const f64,
                n as i32,
                b as *mut f64,
                n as i32,
            )
        })
    }
}

/// A float64 column-major matrix operand on the device: its first element and leading dimension.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mat {
    pub ptr: u64,
    pub ld: usize,
}

impl Mat {
    /// The operand starting at row `i`, column `j` of this one.
    pub(crate) fn at(self, i: usize, j: usize) -> Mat {
        Mat { ptr: self.ptr + ((i + j * self.ld) * std::mem::size_of::<f64>()) as u64, ld: self.ld }
    }
}

fn op(transpose: bool) -> blas::cublasOperation_t {
    if transpose {
        blas::cublasOperation_t::CUBLAS_OP_T
    } else {
        blas::cublasOperation_t::CUBLAS_OP_N
    }
}

fn int(what: &'static str, v: usize) -> Result<i32, BackendError> {
    i32::try_from(v).map_err(|_| BackendError::Invalid(format!("{what} {v} is too large for cuBLAS")))
}

impl Blas {
    /// c (m × n) = alpha · op(a) · op(b) + beta · c, float64; op(x) = xᵀ where `ta`/`tb`, k the inner
    /// dimension.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn dgemm(&self, stream: &CudaStream, ta: bool, tb: bool, (m, n, k): (usize, usize, usize), alpha: f64, a: Mat, b: Mat, beta: f64, c: Mat) -> Result<(), BackendError> {
        self.dgemm_batched(stream, ta, tb, (m, n, k), alpha, (a, 0), (b, 0), beta, (c, 0), 1)
    }

    /// `count` products as [`Blas::dgemm`], the i-th with each operand advanced by i times its stride
    /// (float64 elements).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn dgemm_batched(
        &self,
        stream: &CudaStream,
        ta: bool,
        tb: bool,
        (m, n, k): (usize, usize, usize),
        alpha: f64,
        (a, sa): (Mat, usize),
        (b, sb): (Mat, usize),
        beta: f64,
        (c, sc): (Mat, usize),
        count: usize,
    ) -> Result<(), BackendError> {
        self.bind(stream)?;
        let stride = |s: usize| i64::try_from(s).map_err(|_| BackendError::Invalid(format!("stride {s} is too large for cuBLAS")));
        // SAFETY: the caller's operands hold the matrices the sizes, leading dimensions and strides
        // describe, on the stream's device; alpha and beta are host scalars (the default pointer mode).
        check("cublasDgemmStridedBatched", unsafe {
            blas::cublasDgemmStridedBatched(
                self.handle,
                op(ta),
                op(tb),
                int("m", m)?,
                int("n", n)?,
                int("k", k)?,
                &alpha,
                a.ptr as *const f64,
                int("lda", a.ld)?,
                stride(sa)?,
                b.ptr as *const f64,
                int("ldb", b.ld)?,
                stride(sb)?,
                &beta,
                c.ptr as *mut f64,
                int("ldc", c.ld)?,
                stride(sc)?,
                int("batch", count)?,
            )
        })
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: created in new(), destroyed once.
        unsafe {
            blas::cublasDestroy_v2(self.handle);
        }
    }
}

//! The symmetric eigen step's alternatives in cuSOLVER: what `hypermnf bench eigen` compares and what
//! the device solver picks from per size ([`EigenMethod::for_bands`]).
//!
//! Each method solves A = V Λ Vᵀ for the whitened n × n matrix A in place (V over A, Λ in `w`), on the
//! solver's stream, with one `info` written on the device. The steps around it (potrf, the whitening
//! and back-transform triangular solves, the copies) are the same for all of them (`solver.rs`).
//! A [`MethodPlan`] holds what one method needs at one size between solves: its workspace sizes and
//! the library objects (Jacobi parameters, the 64-bit API's params), so a solve at a size seen before
//! queries and allocates nothing.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cusolver::sys as sol;
use cudarc::driver::CudaStream;

use super::own_eigen::{OwnEigen, Tridiagonal};
use crate::backend::BackendError;

/// Band counts up to which the own kernels are the device method (`EigenMethod::for_bands`): below
/// the measured crossover with syevd (between 128 and 160 bands on an H100).
pub(crate) const OWN_FASTER_UP_TO: usize = 144;

/// Band counts up to which the own kernels with the cluster tridiagonalisation are the device method
/// where clusters launch: the largest size measured (AVIRIS-NG's 425), where they still beat syevd.
pub(crate) const OWN_CLUSTER_UP_TO: usize = 425;

/// One way of solving the symmetric eigenproblem of the whitened matrix.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum EigenMethod {
    /// `cusolverDnDsyevd`: every pair, Householder tridiagonalisation then divide and conquer.
    Syevd,
    /// `cusolverDnXsyevd`: the same through the 64-bit generic API.
    Xsyevd,
    /// `cusolverDnDsyevdx`: the `top` largest pairs only (the components a job keeps).
    Syevdx { top: usize },
    /// `cusolverDnXsyevdx`: the same through the 64-bit generic API.
    Xsyevdx { top: usize },
    /// `cusolverDnDsyevj`: cyclic Jacobi to a tolerance (relative to ‖A‖_F) within a sweep limit.
    Syevj { tol: f64, max_sweeps: i32 },
    /// `cusolverDnXsyevBatched` with a batch of one (the batched API of CUDA 12.6+).
    XsyevBatched,
    /// Our own kernels (kernels/eigen.cu, `own_eigen.rs`): one-block Householder tridiagonalisation,
    /// Sturm multisection, twisted-factorisation vectors, back-transform.
    Own,
    /// The same with the tridiagonalisation by a thread-block cluster (compute capability 9.0+).
    OwnCluster,
}

impl EigenMethod {
    /// The method the device solver uses at `n` bands, `clusters` where the device launches thread-
    /// block clusters (compute capability 9.0+). It must return every pair (a job's metadata lists
    /// every eigenvalue, and denoising needs every vector), which leaves syevd in either API, the
    /// batched API, Jacobi and our own kernels. In `hypermnf bench eigen` (BENCHMARKS.md, "Eigen"):
    /// - with clusters, the own kernels with the cluster tridiagonalisation beat syevd at every size
    ///   measured up to [`OWN_CLUSTER_UP_TO`] (AVIRIS-NG's 425);
    /// - without, the one-block kernels take the whole device step in 0.79 ms at 96 bands and 1.10 ms
    ///   at 128 on an H100, against syevd's 1.31–1.47 and 1.66–1.84 ms, tie at 160 and lose above
    ///   (their one block is bound by one SM): they take sizes up to [`OWN_FASTER_UP_TO`], syevd the
    ///   rest.
    ///
    /// Among the cuSOLVER methods the batched API was the fastest by 0.5–1.5 %, within a run's spread,
    /// and Jacobi 2–3× slower; syevd stays, since `cusolverDnXsyevBatched` needs a libcusolver of CUDA
    /// 12.6 or later (where it is missing the whole device solver would be lost to the host). Up to
    /// `HOST_FASTER_UP_TO` bands the host solves instead (`DeviceEigen::takes`).
    pub fn for_bands(n: usize, clusters: bool) -> EigenMethod {
        if clusters && n <= OWN_CLUSTER_UP_TO {
            EigenMethod::OwnCluster
        } else if n <= OWN_FASTER_UP_TO {
            EigenMethod::Own
        } else {
            EigenMethod::Syevd
        }
    }

    /// Every method with its settings, for `top` components: first the eight that reach float64
    /// accuracy (each cuSOLVER API, Jacobi to 1e-14 and our own kernels both ways), then Jacobi to two looser
    /// tolerances. `hypermnf bench
    /// eigen` times them all; the GPU eigen tests check the first [`FLOAT64_ACCURATE`](Self::FLOAT64_ACCURATE)
    /// against the host reference.
    pub fn all(top: usize) -> [EigenMethod; 10] {
        [
            EigenMethod::Syevd,
            EigenMethod::Xsyevd,
            EigenMethod::XsyevBatched,
            EigenMethod::Syevdx { top },
            EigenMethod::Xsyevdx { top },
            EigenMethod::Syevj { tol: 1e-14, max_sweeps: 30 },
            EigenMethod::Own,
            EigenMethod::OwnCluster,
            EigenMethod::Syevj { tol: 1e-10, max_sweeps: 15 },
            EigenMethod::Syevj { tol: 1e-7, max_sweeps: 10 },
        ]
    }

    /// How many of [`all`](Self::all)'s methods, the first ones, reach float64 accuracy.
    pub const FLOAT64_ACCURATE: usize = 8;

    /// A short name for tables and JSON.
    pub fn label(&self) -> String {
        match self {
            EigenMethod::Syevd => "syevd".into(),
            EigenMethod::Xsyevd => "Xsyevd (64-bit)".into(),
            EigenMethod::Syevdx { top } => format!("syevdx top {top}"),
            EigenMethod::Xsyevdx { top } => format!("Xsyevdx top {top} (64-bit)"),
            EigenMethod::Syevj { tol, max_sweeps } => format!("syevj tol {tol:.0e} sweeps {max_sweeps}"),
            EigenMethod::XsyevBatched => "XsyevBatched (batch 1)".into(),
            EigenMethod::Own => "own kernels (one-block tridiagonal)".into(),
            EigenMethod::OwnCluster => "own kernels (cluster tridiagonal)".into(),
        }
    }

    /// Pairs a solve returns at n bands, in ascending order of the eigenvalue in the leading columns of
    /// V and entries of Λ (the top-k methods: the k largest).
    pub fn pairs(&self, n: usize) -> usize {
        match self {
            EigenMethod::Syevdx { top } | EigenMethod::Xsyevdx { top } => (*top).min(n),
            _ => n,
        }
    }
}

struct Params(sol::cusolverDnParams_t);
impl Drop for Params {
    fn drop(&mut self) {
        // SAFETY: made by cusolverDnCreateParams, destroyed once.
        unsafe {
            sol::cusolverDnDestroyParams(self.0);
        }
    }
}

struct Jacobi(sol::syevjInfo_t);
impl Drop for Jacobi {
    fn drop(&mut self) {
        // SAFETY: made by cusolverDnCreateSyevjInfo, destroyed once.
        unsafe {
            sol::cusolverDnDestroySyevjInfo(self.0);
        }
    }
}

fn check(what: &'static str, s: sol::cusolverStatus_t) -> Result<(), BackendError> {
    if s == sol::cusolverStatus_t::CUSOLVER_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(BackendError::Cuda(format!("{what}: {s:?}")))
    }
}

const R64: sol::cudaDataType = sol::cudaDataType::CUDA_R_64F;
const VECTORS: sol::cusolverEigMode_t = sol::cusolverEigMode_t::CUSOLVER_EIG_MODE_VECTOR;
const LOWER: sol::cublasFillMode_t = sol::cublasFillMode_t::CUBLAS_FILL_MODE_LOWER;
const BY_INDEX: sol::cusolverEigRange_t = sol::cusolverEigRange_t::CUSOLVER_EIG_RANGE_I;

/// One method at one size: its workspace needs and library objects.
pub(crate) struct MethodPlan {
    pub(crate) method: EigenMethod,
    pub(crate) n: usize,
    /// Device workspace, bytes.
    pub(crate) device_bytes: usize,
    /// Host workspace (the 64-bit API may ask for one).
    host: Vec<u8>,
    params: Option<Params>,
    jacobi: Option<Jacobi>,
    own: Option<Arc<OwnEigen>>,
}

impl MethodPlan {
    /// Whether the plan runs the own kernels (no cuSOLVER eigensolver, nothing the host waits for):
    /// its solves can be captured in a CUDA graph.
    pub(crate) fn is_own(&self) -> bool {
        self.own.is_some()
    }
}

// SAFETY: the library objects are used by one thread at a time (the solver's Mutex).
unsafe impl Send for MethodPlan {}

impl MethodPlan {
    /// Queries the workspace of `method` at n bands. `a` and `w` are device pointers of the right
    /// sizes (the queries read neither). `own` gives the own kernels, loaded when `method` is `Own`.
    pub(crate) fn new(
        handle: sol::cusolverDnHandle_t,
        method: EigenMethod,
        n: usize,
        a: u64,
        w: u64,
        own: impl FnOnce() -> Result<Arc<OwnEigen>, BackendError>,
    ) -> Result<MethodPlan, BackendError> {
        let ni = i32::try_from(n).map_err(|_| BackendError::Invalid(format!("{n} bands is too many for cuSOLVER")))?;
        let nl = n as i64;
        let (a, w) = (a as *mut f64, w as *mut f64);
        let mut plan = MethodPlan { method, n, device_bytes: 0, host: Vec::new(), params: None, jacobi: None, own: None };
        let generic = matches!(method, EigenMethod::Xsyevd | EigenMethod::Xsyevdx { .. } | EigenMethod::XsyevBatched);
        if generic {
            let mut p: sol::cusolverDnParams_t = std::ptr::null_mut();
            // SAFETY: out-pointer to a local.
            check("cusolverDnCreateParams", unsafe { sol::cusolverDnCreateParams(&mut p) })?;
            plan.params = Some(Params(p));
        }
        let params = plan.params.as_ref().map_or(std::ptr::null_mut(), |p| p.0);
        let (il, iu) = top_range(n, method.pairs(n));
        let (mut dev, mut host) = (0usize, 0usize);
        let mut lwork = 0i32;
        // SAFETY (every query below): a valid handle; `a` and `w` are device buffers of n × n and n
        // float64 that the queries do not read; out-pointers to locals.
        match method {
            EigenMethod::Syevd => {
                check("cusolverDnDsyevd_bufferSize", unsafe { sol::cusolverDnDsyevd_bufferSize(handle, VECTORS, LOWER, ni, a, ni, w, &mut lwork) })?;
            }
            EigenMethod::Syevdx { .. } => {
                let mut meig = 0i32;
                check("cusolverDnDsyevdx_bufferSize", unsafe {
                    sol::cusolverDnDsyevdx_bufferSize(handle, VECTORS, BY_INDEX, LOWER, ni, a, ni, 0.0, 0.0, il as i32, iu as i32, &mut meig, w, &mut lwork)
                })?;
            }
            EigenMethod::Syevj { tol, max_sweeps } => {
                let mut info: sol::syevjInfo_t = std::ptr::null_mut();
                check("cusolverDnCreateSyevjInfo", unsafe { sol::cusolverDnCreateSyevjInfo(&mut info) })?;
                plan.jacobi = Some(Jacobi(info));
                check("cusolverDnXsyevjSetTolerance", unsafe { sol::cusolverDnXsyevjSetTolerance(info, tol) })?;
                check("cusolverDnXsyevjSetMaxSweeps", unsafe { sol::cusolverDnXsyevjSetMaxSweeps(info, max_sweeps) })?;
                check("cusolverDnDsyevj_bufferSize", unsafe { sol::cusolverDnDsyevj_bufferSize(handle, VECTORS, LOWER, ni, a, ni, w, &mut lwork, info) })?;
            }
            EigenMethod::Xsyevd => {
                check("cusolverDnXsyevd_bufferSize", unsafe {
                    sol::cusolverDnXsyevd_bufferSize(handle, params, VECTORS, LOWER, nl, R64, a as *const c_void, nl, R64, w as *const c_void, R64, &mut dev, &mut host)
                })?;
            }
            EigenMethod::Xsyevdx { .. } => {
                let (mut vl, mut vu, mut meig) = (0f64, 0f64, 0i64);
                check("cusolverDnXsyevdx_bufferSize", unsafe {
                    sol::cusolverDnXsyevdx_bufferSize(
                        handle, params, VECTORS, BY_INDEX, LOWER, nl, R64, a as *const c_void, nl,
                        &mut vl as *mut f64 as *mut c_void, &mut vu as *mut f64 as *mut c_void, il, iu, &mut meig,
                        R64, w as *const c_void, R64, &mut dev, &mut host,
                    )
                })?;
            }
            EigenMethod::Own | EigenMethod::OwnCluster => {
                if n > OwnEigen::MAX_BANDS {
                    return Err(BackendError::Invalid(format!("the own eigen kernels take at most {} bands, not {n}", OwnEigen::MAX_BANDS)));
                }
                let kernels = own()?;
                if method == EigenMethod::OwnCluster && kernels.cluster_size(n).is_none() {
                    return Err(BackendError::Invalid(format!("no cluster tridiagonalisation on this device at {n} bands")));
                }
                plan.own = Some(kernels);
                dev = OwnEigen::workspace_bytes(n);
            }
            EigenMethod::XsyevBatched => {
                check("cusolverDnXsyevBatched_bufferSize", unsafe {
                    sol::cusolverDnXsyevBatched_bufferSize(handle, params, VECTORS, LOWER, nl, R64, a as *const c_void, nl, R64, w as *const c_void, R64, &mut dev, &mut host, 1)
                })?;
            }
        }
        if lwork < 0 {
            return Err(BackendError::Cuda(format!("cuSOLVER asked for a negative workspace ({lwork})")));
        }
        plan.device_bytes = dev.max(lwork as usize * std::mem::size_of::<f64>());
        plan.host = vec![0u8; host];
        Ok(plan)
    }

    /// Queues the eigensolve of the n × n matrix at `a` (overwritten by V), eigenvalues to `w`,
    /// `info` (one i32) on the device, `work` of at least `device_bytes`. `stream` is the handle's
    /// (the own kernels are launched on it; they never fail, and leave `info` as it was set: 0).
    ///
    /// # Safety
    /// `a`, `w`, `work` and `info` are device allocations of the sizes above, on the handle's stream,
    /// alive until the stream has run this call.
    pub(crate) unsafe fn enqueue(&mut self, handle: sol::cusolverDnHandle_t, stream: &CudaStream, a: u64, w: u64, work: u64, info: u64) -> Result<(), BackendError> {
        let n = self.n;
        if let Some(own) = &self.own {
            // SAFETY: as the caller vouches; `work` holds `device_bytes` = the kernels' workspace.
            let how = if self.method == EigenMethod::OwnCluster { Tridiagonal::Cluster } else { Tridiagonal::OneBlock };
            return unsafe { own.enqueue(stream, n, a, w, work, how) };
        }
        let (ni, nl) = (n as i32, n as i64);
        let (a, w, info) = (a as *mut f64, w as *mut f64, info as *mut i32);
        let params = self.params.as_ref().map_or(std::ptr::null_mut(), |p| p.0);
        let (il, iu) = top_range(n, self.method.pairs(n));
        let lwork_f64 = (self.device_bytes / std::mem::size_of::<f64>()) as i32;
        let (host_ptr, host_len) = (self.host.as_mut_ptr() as *mut c_void, self.host.len());
        match self.method {
            EigenMethod::Syevd => check("cusolverDnDsyevd", sol::cusolverDnDsyevd(handle, VECTORS, LOWER, ni, a, ni, w, work as *mut f64, lwork_f64, info)),
            EigenMethod::Syevdx { .. } => {
                // meig is written on the host: this call waits for the device.
                let mut meig = 0i32;
                check("cusolverDnDsyevdx", sol::cusolverDnDsyevdx(handle, VECTORS, BY_INDEX, LOWER, ni, a, ni, 0.0, 0.0, il as i32, iu as i32, &mut meig, w, work as *mut f64, lwork_f64, info))
            }
            EigenMethod::Syevj { .. } => {
                let jacobi = self.jacobi.as_ref().expect("made with the plan").0;
                check("cusolverDnDsyevj", sol::cusolverDnDsyevj(handle, VECTORS, LOWER, ni, a, ni, w, work as *mut f64, lwork_f64, info, jacobi))
            }
            EigenMethod::Xsyevd => check(
                "cusolverDnXsyevd",
                sol::cusolverDnXsyevd(handle, params, VECTORS, LOWER, nl, R64, a as *mut c_void, nl, R64, w as *mut c_void, R64, work as *mut c_void, self.device_bytes, host_ptr, host_len, info),
            ),
            EigenMethod::Xsyevdx { .. } => {
                let (mut vl, mut vu, mut meig) = (0f64, 0f64, 0i64);
                check(
                    "cusolverDnXsyevdx",
                    sol::cusolverDnXsyevdx(
                        handle, params, VECTORS, BY_INDEX, LOWER, nl, R64, a as *mut c_void, nl,
                        &mut vl as *mut f64 as *mut c_void, &mut vu as *mut f64 as *mut c_void, il, iu, &mut meig,
                        R64, w as *mut c_void, R64, work as *mut c_void, self.device_bytes, host_ptr, host_len, info,
                    ),
                )
            }
            EigenMethod::Own | EigenMethod::OwnCluster => unreachable!("the own kernels were launched above"),
            EigenMethod::XsyevBatched => check(
                "cusolverDnXsyevBatched",
                sol::cusolverDnXsyevBatched(handle, params, VECTORS, LOWER, nl, R64, a as *mut c_void, nl, R64, w as *mut c_void, R64, work as *mut c_void, self.device_bytes, host_ptr, host_len, info, 1),
            ),
        }
    }

    /// The number of Jacobi sweeps the last solve ran (Jacobi only).
    pub(crate) fn sweeps(&self, handle: sol::cusolverDnHandle_t) -> Option<i32> {
        let jacobi = self.jacobi.as_ref()?;
        let mut s = 0i32;
        // SAFETY: a valid handle and info; out-pointer to a local.
        let ok = unsafe { sol::cusolverDnXsyevjGetSweeps(handle, jacobi.0, &mut s) } == sol::cusolverStatus_t::CUSOLVER_STATUS_SUCCESS;
        ok.then_some(s)
    }
}

/// The 1-based ascending index range of the `k` largest of n eigenvalues.
fn top_range(n: usize, k: usize) -> (i64, i64) {
    ((n - k.min(n)) as i64 + 1, n as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_top_range_selects_the_largest_eigenvalues() {
        assert_eq!(top_range(224, 10), (215, 224));
        assert_eq!(top_range(5, 5), (1, 5));
        assert_eq!(top_range(5, 9), (1, 5));
        assert_eq!(EigenMethod::Syevdx { top: 10 }.pairs(224), 10);
        assert_eq!(EigenMethod::Syevd.pairs(224), 224);
        assert_eq!(EigenMethod::for_bands(120, false), EigenMethod::Own);
        assert_eq!(EigenMethod::for_bands(224, false), EigenMethod::Syevd);
        assert_eq!(EigenMethod::for_bands(224, true), EigenMethod::OwnCluster);
        assert_eq!(EigenMethod::for_bands(425, true), EigenMethod::OwnCluster);
        assert_eq!(EigenMethod::for_bands(426, true), EigenMethod::Syevd);
    }
}

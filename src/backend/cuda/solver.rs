//! The whitened eigenproblem of the MNF on the device: A = L⁻¹ C_D L⁻ᵀ by two cuBLAS triangular
//! solves, A = V Λ Vᵀ by cuSOLVER's `syevd` (float64, divide and conquer), W = L⁻ᵀ V by a third.
//!
//! Why on the device: at 224 bands this host step (faer, one core) took ~9 ms on the H100's host,
//! longer than all the device work of a 299 MB cube, and nothing can overlap it (the projection needs
//! its result). The Cholesky factor L of the noise covariance is still computed on the host, early,
//! while the device finishes the data covariance; ordering and signs stay in `mnf::eigen`, so both
//! backends share one convention. libcusolver and libcublas are loaded dynamically like the other CUDA
//! libraries; where either is missing or fails, the host solver is used and nothing else changes.

use std::sync::{Arc, Mutex};

use cudarc::cusolver::sys as sol;
use cudarc::driver::{CudaContext, CudaStream, DevicePtrMut};

use crate::backend::BackendError;
use crate::mnf::eigen::GeneralizedEigenSolver;

use super::cublas::Blas;

pub(crate) struct DeviceEigen {
    /// cuSOLVER and cuBLAS handles, used by one solve at a time.
    handles: Mutex<(Handle, Blas)>,
    stream: Arc<CudaStream>,
}

struct Handle(sol::cusolverDnHandle_t);
// SAFETY: the handle is used by one thread at a time (behind the Mutex).
unsafe impl Send for Handle {}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: a handle created by cusolverDnCreate, destroyed once.
        unsafe {
            sol::cusolverDnDestroy(self.0);
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

impl DeviceEigen {
    /// A solver on its own stream of `ctx`, or `Unavailable` where libcusolver cannot be loaded.
    pub(crate) fn new(ctx: &Arc<CudaContext>) -> Result<DeviceEigen, BackendError> {
        // SAFETY: only tries to dlopen the library.
        if !unsafe { sol::is_culib_present() } {
            return Err(BackendError::Unavailable("libcusolver not found".into()));
        }
        ctx.bind_to_thread()
            .map_err(super::device::cuda("cuCtxSetCurrent"))?;
        let stream = ctx
            .new_stream()
            .map_err(super::device::cuda("cuStreamCreate"))?;
        let created = std::panic::catch_unwind(|| {
            let mut h: sol::cusolverDnHandle_t = std::ptr::null_mut();
            // SAFETY: out-pointer to a local.
            let s = unsafe { sol::cusolverDnCreate(&mut h) };
            (s, h)
        });
        let (s, h) = created
            .map_err(|_| BackendError::Unavailable("libcusolver could not be loaded".into()))?;
        check("cusolverDnCreate", s)?;
        let handle = Handle(h);
        // SAFETY: valid handle and stream.
        check("cusolverDnSetStream", unsafe {
            sol::cusolverDnSetStream(handle.0, stream.cu_stream() as _)
        })?;
        let blas = Blas::new()?;
        let solver = DeviceEigen {
            handles: Mutex::new((handle, blas)),
            stream,
        };
        // One tiny solve now: cuBLAS allocates its workspace (32 MiB on sm_90) and cuSOLVER loads its
        // kernels at first use, which would otherwise land on the first job's time and device memory.
        solver.solve(&[1.0, 0.0, 0.0, 1.0], &[2.0, 0.0, 0.0, 3.0], 2)?;
        Ok(solver)
    }

    fn solve(&self, l: &[f64], cd: &[f64], n: usize) -> Result<(Vec<f64>, Vec<f64>), BackendError> {
        let cuda = super::device::cuda;
        let started = std::time::Instant::now();
        let guard = self.handles.lock().unwrap_or_else(|e| e.into_inner());
        let (handle, blas) = (&guard.0, &guard.1);
        self.stream
            .context()
            .bind_to_thread()
            .map_err(cuda("cuCtxSetCurrent"))?;
        let ni = i32::try_from(n)
            .map_err(|_| BackendError::Invalid(format!("{n} bands is too many for cuSOLVER")))?;
        let mut dl = self.stream.clone_htod(l).map_err(cuda("cuMemcpyHtoD"))?;
        // C_D is symmetric: its row-major and column-major layouts are the same.
        let mut da = self.stream.clone_htod(cd).map_err(cuda("cuMemcpyHtoD"))?;
        let mut dw = self
            .stream
            .alloc_zeros::<f64>(n)
            .map_err(cuda("cuMemAlloc"))?;
        let mut info = self
            .stream
            .alloc_zeros::<i32>(1)
            .map_err(cuda("cuMemAlloc"))?;
        let jobz = sol::cusolverEigMode_t::CUSOLVER_EIG_MODE_VECTOR;
        let uplo = sol::cublasFillMode_t::CUBLAS_FILL_MODE_LOWER;
        let mut lwork: i32 = 0;
        {
            let (pl, _gl) = dl.device_ptr_mut(&self.stream);
            let (pa, _ga) = da.device_ptr_mut(&self.stream);
            let (pw, _gw) = dw.device_ptr_mut(&self.stream);
            // A = L⁻¹ C_D, then A L⁻ᵀ.
            blas.dtrsm_lower(&self.stream, true, false, n, pl, pa)?;
            blas.dtrsm_lower(&self.stream, false, true, n, pl, pa)?;
            // SAFETY: n × n and n float64 buffers on this stream; out-pointer to a local.
            check("cusolverDnDsyevd_bufferSize", unsafe {
                sol::cusolverDnDsyevd_bufferSize(
                    handle.0,
                    jobz,
                    uplo,
                    ni,
                    pa as *const f64,
                    ni,
                    pw as *const f64,
                    &mut lwork,
                )
            })?;
        }
        let mut work = self
            .stream
            .alloc_zeros::<f64>(lwork.max(1) as usize)
            .map_err(cuda("cuMemAlloc"))?;
        {
            let (pl, _gl) = dl.device_ptr_mut(&self.stream);
            let (pa, _ga) = da.device_ptr_mut(&self.stream);
            let (pw, _gw) = dw.device_ptr_mut(&self.stream);
            let (pk, _gk) = work.device_ptr_mut(&self.stream);
            let (pi, _gi) = info.device_ptr_mut(&self.stream);
            // SAFETY: buffers of the sizes cuSOLVER asked for, all on the handle's stream. syevd reads
            // the lower triangle only, so A needs no symmetrising.
            check("cusolverDnDsyevd", unsafe {
                sol::cusolverDnDsyevd(
                    handle.0,
                    jobz,
                    uplo,
                    ni,
                    pa as *mut f64,
                    ni,
                    pw as *mut f64,
                    pk as *mut f64,
                    lwork,
                    pi as *mut i32,
                )
            })?;
            // W = L⁻ᵀ V.
            blas.dtrsm_lower(&self.stream, true, true, n, pl, pa)?;
        }
        let w = self.stream.clone_dtoh(&da).map_err(cuda("cuMemcpyDtoH"))?;
        let values = self.stream.clone_dtoh(&dw).map_err(cuda("cuMemcpyDtoH"))?;
        let info = self
            .stream
            .clone_dtoh(&info)
            .map_err(cuda("cuMemcpyDtoH"))?;
        self.stream
            .synchronize()
            .map_err(cuda("cuStreamSynchronize"))?;
        tracing::debug!(target: "hypermnf::timing", n, device_solve_ms = started.elapsed().as_secs_f64() * 1e3, "eigen step on the device");
        if info[0] != 0 {
            return Err(BackendError::Cuda(format!(
                "cusolverDnDsyevd: info = {} (did not converge)",
                info[0]
            )));
        }
        Ok((values, w))
    }
}

impl GeneralizedEigenSolver for DeviceEigen {
    fn name(&self) -> &'static str {
        "cuBLAS trsm + cuSOLVER syevd (device)"
    }
    fn solve(&self, l: &[f64], cd: &[f64], n: usize) -> Result<(Vec<f64>, Vec<f64>), String> {
        DeviceEigen::solve(self, l, cd, n).map_err(|e| e.to_string())
    }
}

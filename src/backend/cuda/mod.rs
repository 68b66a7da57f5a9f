//! CUDA backend through cudarc: the published MNF-C design (custom kernels, `Route::Kernels`) and the
//! MNF-L design (cuBLAS SYRK / SGEMM, `Route::Cublas`).
//!
//! - `device`: context creation that never panics where there is no driver, device and pinned memory.
//! - `compile`: kernels/*.cu embedded in the binary, compiled by NVRTC for the device's architecture
//!   at first use, the PTX cached on disk by source hash and architecture.
//! - `kernels`: the loaded module and one typed launcher per kernel.
//! - `cublas`: the SYRK / SGEMM route.
//! - `prepared`: a cube on the device (resident, or streamed in chunks when it does not fit), and the
//!   statistics, projection and inverse passes with chunked, double-buffered, overlapped transfers.

pub(crate) mod compile;
mod cublas;
mod device;
mod kernels;
mod prepared;
mod eigen_methods;
mod own_eigen;
mod solver;
mod whitening;

use std::sync::{Arc, Mutex};

use cudarc::driver::CudaContext;

use super::{Backend, BackendError, PreparedCube};
use crate::cube::Cube;
use crate::mnf::Monitor;

pub use device::HostRegistration;

/// The per-band shifts (data, noise) the statistics pass of the whole cube would sample: the shares
/// of a split cube are given these, so that each forms the float32 values one device would (host
/// code only, no device needed).
pub(crate) fn whole_cube_shifts(cube: &Cube, spec: &crate::mnf::stats::StatsSpec) -> (Vec<f64>, Vec<f64>) {
    prepared::sample_shifts(cube, 0, cube.lines(), spec)
}

/// Number of CUDA devices; `Err(Unavailable)` where there is no driver (never a panic).
pub fn device_count() -> Result<usize, BackendError> {
    device::device_count()
}
pub use prepared::{CudaCube, Timeline};
pub use eigen_methods::EigenMethod;
pub use solver::{Solved as EigenSolved, Whitening};

/// The device's eigen step on its own (`hypermnf bench eigen`, the GPU tests): a context on one device
/// and its cuSOLVER solver, made now, solving with any [`EigenMethod`].
pub struct EigenBench {
    solver: solver::DeviceEigen,
    device_name: String,
}

impl EigenBench {
    pub fn open(ordinal: usize) -> Result<EigenBench, BackendError> {
        let ctx = device::open_context(ordinal)?;
        let device_name = ctx.name().unwrap_or_else(|_| format!("CUDA device {ordinal}"));
        Ok(EigenBench { solver: solver::DeviceEigen::new(&ctx)?, device_name })
    }

    pub fn device_name(&self) -> &str {
        &self.device_name
    }

    /// One solve of C_D w = λ C_N w (n × n each) by `method` and the job's whitening, with each step's
    /// device time when `timed`.
    pub fn solve(&self, method: EigenMethod, cn: &[f64], cd: &[f64], n: usize, timed: bool) -> Result<EigenSolved, crate::mnf::eigen::SolverError> {
        self.solver.solve_using(method, self.solver.whitening(n), cn, cd, n, timed)
    }

    /// As [`EigenBench::solve`], whitening by `whitening`.
    pub fn solve_whitened(&self, method: EigenMethod, whitening: Whitening, cn: &[f64], cd: &[f64], n: usize, timed: bool) -> Result<EigenSolved, crate::mnf::eigen::SolverError> {
        self.solver.solve_using(method, whitening, cn, cd, n, timed)
    }
}

/// Which GPU implementation runs the passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The custom kernels of kernels/*.cu (the published MNF-C design).
    Kernels,
    /// cuBLAS SYRK / GEMM (the published MNF-L design).
    Cublas,
}

/// Environment variable: the device memory (bytes) the backend may use for a cube before it streams
/// the cube in chunks instead of keeping it on the device. Tests set a small value to force streaming.
pub const MEMORY_BUDGET_ENV: &str = "HYPERMNF_GPU_MEMORY_BUDGET";
/// `host` keeps the eigen step in faer on the host (the default solves it with cuSOLVER on the device).
pub const EIGEN_ENV: &str = "HYPERMNF_EIGEN";

/// Idle device buffers kept for the next pass or cube (a resident cube of the benchmark's 16× size
/// is 4.8 GB).
const DEVICE_POOL_BYTES: usize = 6 << 30;
/// Idle pinned host buffers kept (staging and output chunks).
const PINNED_POOL_BYTES: usize = 512 << 20;

pub struct CudaBackend {
    route: Route,
    /// The CUDA device ordinal this backend's context is on.
    ordinal: usize,
    ctx: Arc<CudaContext>,
    kernels: kernels::Kernels,
    device_name: String,
    budget: Option<usize>,
    /// Bytes of a statistics chunk's float32 work matrix (None: prepared::CHUNK_WORK_BYTES).
    chunk_work_bytes: Option<usize>,
    registry: device::Registry,
    blas: Option<Mutex<cublas::Blas>>,
    /// cuSOLVER for the eigen step (none: libcusolver missing, or HYPERMNF_EIGEN=host).
    eigen: solver::EigenOnDevice,
    /// Project with T in constant memory (the published v3) instead of shared memory.
    constant_projection: bool,
    /// Whether a job's eigen step starts on the device from the statistics' device sums
    /// (`PreparedCube::solve_early`); off only to measure the round trip through the host it saves.
    early_solve: bool,
    /// The constant-memory T is one per module: projections that use it take turns.
    const_lock: Mutex<()>,
    last_timeline: Mutex<Option<Timeline>>,
    dev_pool: device::Pool<device::DevBuf>,
    pinned_pool: device::Pool<device::PinnedBuf>,
}

impl CudaBackend {
    /// Opens device 0; see [`CudaBackend::on_device`].
    pub fn new(route: Route) -> Result<Self, BackendError> {
        Self::on_device(0, route)
    }

    /// Opens device `ordinal`, compiles (or loads cached) kernels, and for `Route::Cublas` creates the
    /// cuBLAS handle. `Err(Unavailable)` where there is no driver, no such device, no NVRTC or cuBLAS.
    pub fn on_device(ordinal: usize, route: Route) -> Result<Self, BackendError> {
        let t = std::time::Instant::now();
        let ctx = device::open_context(ordinal)?;
        let context_ms = t.elapsed().as_secs_f64() * 1e3;
        let device_name = ctx.name().unwrap_or_else(|_| format!("CUDA device {ordinal}"));
        let kernels = kernels::Kernels::load(&ctx)?;
        let kernels_ms = t.elapsed().as_secs_f64() * 1e3 - context_ms;
        let blas = match route {
            Route::Cublas => {
                ctx.bind_to_thread()
                    .map_err(device::cuda("cuCtxSetCurrent"))?;
                Some(Mutex::new(cublas::Blas::new()?))
            }
            Route::Kernels => None,
        };
        let budget = match std::env::var(MEMORY_BUDGET_ENV) {
            Ok(v) => Some(v.trim().parse::<usize>().map_err(|_| {
                BackendError::Invalid(format!(
                    "{MEMORY_BUDGET_ENV} must be a number of bytes, not {v:?}"
                ))
            })?),
            Err(_) => None,
        };
        let eigen = match std::env::var(EIGEN_ENV).as_deref().map(str::trim) {
            Ok("host") => solver::EigenOnDevice::none(),
            // Made beside the first statistics pass (see `EigenOnDevice`).
            Ok("device") | Ok("") | Err(_) => solver::EigenOnDevice::start(&ctx),
            Ok(other) => {
                return Err(BackendError::Invalid(format!(
                    "{EIGEN_ENV} must be `device` or `host`, not {other:?}"
                )))
            }
        };
        tracing::debug!(device = %device_name, ptx = ?kernels.origin, "CUDA backend ready");
        let backend = CudaBackend {
            route,
            ordinal,
            ctx,
            kernels,
            device_name,
            budget,
            chunk_work_bytes: None,
            registry: Arc::new(Mutex::new(Vec::new())),
            blas,
            eigen,
            constant_projection: false,
            early_solve: true,
            const_lock: Mutex::new(()),
            last_timeline: Mutex::new(None),
            dev_pool: device::Pool::new(DEVICE_POOL_BYTES),
            pinned_pool: device::Pool::new(PINNED_POOL_BYTES),
        };
        let t_pinned = std::time::Instant::now();
        backend.warm_pinned_pool();
        tracing::debug!(
            target: "hypermnf::timing",
            context_ms,
            kernels_ms,
            pinned_ms = t_pinned.elapsed().as_secs_f64() * 1e3,
            total_ms = t.elapsed().as_secs_f64() * 1e3,
            "CUDA device opened (cuSOLVER is made beside the first pass)"
        );
        Ok(backend)
    }

    /// Makes the pinned host buffers that every pass over a cube takes (two staging pieces, two output
    /// chunks, the statistics' results) now and leaves them in the pool, so that the first job does not
    /// wait for them: cuMemHostAlloc takes milliseconds per 16 MB. A failure here only means they are
    /// made later, when a pass needs them.
    fn warm_pinned_pool(&self) {
        let sizes = [
            device::STAGING_PIECE,
            device::STAGING_PIECE,
            device::pinned_class(8 << 20),
            device::pinned_class(8 << 20),
            device::pinned_class(1),
        ];
        let t = std::time::Instant::now();
        let made: Result<Vec<_>, _> = sizes
            .iter()
            .map(|&n| self.pinned_pool.take(n, &[], |n| device::PinnedBuf::alloc(&self.ctx, n)))
            .collect();
        match made {
            Ok(bufs) => tracing::debug!(
                bytes = sizes.iter().sum::<usize>(),
                ms = t.elapsed().as_secs_f64() * 1e3,
                buffers = bufs.len(),
                "pinned host buffers made"
            ),
            Err(e) => tracing::debug!("pinned host buffers not made in advance: {e}"),
        }
    }

    /// The CUDA device ordinal this backend runs on.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    pub fn route(&self) -> Route {
        self.route
    }

    /// Caps the device memory a cube may take before it is streamed (overrides the environment).
    pub fn with_memory_budget(mut self, bytes: usize) -> Self {
        self.budget = Some(bytes);
        self
    }

    /// Cuts cubes into statistics chunks of about `bytes` of float32 work matrix instead of 64 MiB, so
    /// that tests reach many chunks with a small cube.
    pub fn with_chunk_work_bytes(mut self, bytes: usize) -> Self {
        self.chunk_work_bytes = Some(bytes);
        self
    }

    /// Uses the float64-FMA covariance kernel instead of the tensor-core one (tests compare both).
    pub fn with_fma_covariance(mut self) -> Self {
        self.kernels.use_dmma = false;
        self.kernels.cov_lower_m16 = None;
        self
    }

    /// Uses the sm_80 tensor-core covariance kernel (mma.m8n8k4) even where the faster sm_90 one
    /// exists (tests compare both).
    pub fn with_m8_covariance(mut self) -> Self {
        self.kernels.cov_lower_m16 = None;
        self
    }

    /// Solves the eigen step on the host even where cuSOLVER is available (tests and the benchmark
    /// compare both).
    pub fn with_host_eigen(mut self) -> Self {
        self.eigen = solver::EigenOnDevice::none();
        self
    }

    /// Forms C_N and C_D on the host from the downloaded moments, and uploads them, as before the
    /// early solve (the benchmark compares both).
    pub fn without_early_solve(mut self) -> Self {
        self.early_solve = false;
        self
    }

    /// Projects with T in constant memory (the published v3 kernel) instead of shared memory (tests and
    /// the benchmark compare both).
    pub fn with_constant_projection(mut self) -> Self {
        self.constant_projection = true;
        self
    }

    /// Runs the generic kernels only, never the 2-byte integer fast paths (noise_mean_filter_w16,
    /// project_w16), so that tests can compare the two on the same cube.
    pub fn with_generic_kernels(mut self) -> Self {
        self.kernels.wide = false;
        self
    }

    /// Whether the eigen step runs on the device (cuSOLVER).
    pub fn eigen_on_device(&self) -> bool {
        self.eigen.get().is_some()
    }

    /// Which covariance kernel the custom route runs.
    pub fn covariance_kernel(&self) -> &'static str {
        if self.kernels.cov_lower_m16.is_some() {
            "cov_lower_m16"
        } else if self.kernels.use_dmma {
            "cov_lower_dmma"
        } else {
            "cov_lower"
        }
    }

    /// Device memory available for a cube: the free memory less a margin, capped by the budget.
    fn memory_budget(&self) -> Result<usize, BackendError> {
        self.ctx
            .bind_to_thread()
            .map_err(device::cuda("cuCtxSetCurrent"))?;
        let (free, _total) = self
            .ctx
            .mem_get_info()
            .map_err(device::cuda("cuMemGetInfo"))?;
        // Idle pooled buffers count as free: the pool hands them out again.
        let free = free + self.dev_pool.idle_bytes();
        let usable = free.saturating_sub(free / 10 + (256 << 20));
        Ok(self.budget.map_or(usable, |b| b.min(usable)))
    }

    /// Page-locks `bytes` (normally `cube.raw()`) for as long as the returned value lives, so that the
    /// passes copy from it directly instead of through pinned staging buffers.
    pub fn register_host<'a>(&self, bytes: &'a [u8]) -> Result<HostRegistration<'a>, BackendError> {
        HostRegistration::new(&self.ctx, &self.registry, bytes)
    }

    /// Page-locks `bytes` for every device of `backends` at once (portable registration, made in the
    /// first one's context): a cube split over them, whose shares each device copies directly.
    pub fn register_host_shared<'a>(backends: &[&CudaBackend], bytes: &'a [u8]) -> Result<HostRegistration<'a>, BackendError> {
        let first = backends
            .first()
            .ok_or_else(|| BackendError::Invalid("no device to page-lock the memory for".into()))?;
        let registries: Vec<_> = backends.iter().map(|b| b.registry.clone()).collect();
        HostRegistration::new_portable(&first.ctx, &registries, bytes)
    }

    /// Page-locks an output buffer the caller keeps writing through the returned slice (the benchmark's
    /// components, as PyTorch's pinned output): projections into it download straight into it.
    pub fn register_host_mut<'a>(&self, bytes: &'a mut [u8]) -> Result<(HostRegistration<'a>, &'a mut [u8]), BackendError> {
        HostRegistration::new_mut(&self.ctx, &self.registry, bytes)
    }

    /// [`register_host_mut`](Self::register_host_mut) for every device of `backends` (portable): the
    /// output of a cube split over them, each device downloading its share straight into it.
    pub fn register_host_shared_mut<'a>(
        backends: &[&CudaBackend],
        bytes: &'a mut [u8],
    ) -> Result<(HostRegistration<'a>, &'a mut [u8]), BackendError> {
        let first = backends
            .first()
            .ok_or_else(|| BackendError::Invalid("no device to page-lock the memory for".into()))?;
        let registries: Vec<_> = backends.iter().map(|b| b.registry.clone()).collect();
        HostRegistration::new_portable_mut(&first.ctx, &registries, bytes)
    }

    /// Page-locked host memory idle in the backend's pool: what the next passes can take without a
    /// `cuMemHostAlloc`.
    pub fn idle_pinned_bytes(&self) -> usize {
        self.pinned_pool.idle_bytes()
    }

    /// Prepares a cube and returns the concrete type (the benchmark reads its timeline).
    pub fn prepare_cuda<'c>(&'c self, cube: &'c Cube) -> Result<CudaCube<'c>, BackendError> {
        CudaCube::new(self, cube, 0..cube.lines())
    }

    /// Device times of the last statistics and projection passes (for the benchmark).
    pub fn last_timeline(&self) -> Option<Timeline> {
        self.last_timeline
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Median and minimum milliseconds of copying `bytes` host → device from page-locked memory, alone
    /// (the PCIe floor of an end-to-end run). The bytes are first copied into a pinned buffer
    /// (cuMemHostAlloc, as PyTorch's pinned tensors).
    pub fn time_upload(
        &self,
        bytes: &[u8],
        warmup: usize,
        runs: usize,
    ) -> Result<(f64, f64), BackendError> {
        let mut src = device::PinnedBuf::alloc(&self.ctx, bytes.len())?;
        src.as_mut_slice()[..bytes.len()].copy_from_slice(bytes);
        self.time_upload_from(&src.as_slice()[..bytes.len()], warmup, runs)
    }

    /// [`time_upload`](Self::time_upload) from `bytes` where they lie, which must be page-locked
    /// (allocated so, or registered with this backend). Memory pinned by cuMemHostRegister, as the
    /// benchmark's cube is, copied 0.5–0.9 % slower than cuMemHostAlloc's in every run (16×: 86.7–87.3
    /// against 86.2–86.5 ms; an H200, 2026-11-29).
    pub fn time_upload_registered(&self, bytes: &[u8], warmup: usize, runs: usize) -> Result<(f64, f64), BackendError> {
        if !device::is_registered(&self.registry, bytes) {
            return Err(BackendError::Invalid("time_upload_registered: the bytes are not registered with this backend".into()));
        }
        self.time_upload_from(bytes, warmup, runs)
    }

    /// Times the copy of the page-locked `src` (see `time_upload`).
    fn time_upload_from(&self, src: &[u8], warmup: usize, runs: usize) -> Result<(f64, f64), BackendError> {
        let dst = device::DevBuf::alloc(&self.ctx, src.len())?;
        let stream = self
            .ctx
            .new_stream()
            .map_err(device::cuda("cuStreamCreate"))?;
        let (a, b) = (
            device::event(&self.ctx, true)?,
            device::event(&self.ctx, true)?,
        );
        let mut times = Vec::with_capacity(runs);
        for i in 0..warmup + runs {
            a.record(&stream).map_err(device::cuda("cuEventRecord"))?;
            // SAFETY: `src` lives through the loop and each copy is synchronized before the next.
            unsafe { device::htod_async(dst.ptr(), src, &stream)? };
            b.record(&stream).map_err(device::cuda("cuEventRecord"))?;
            b.synchronize()
                .map_err(device::cuda("cuEventSynchronize"))?;
            if i >= warmup {
                times.push(
                    a.elapsed_ms(&b)
                        .map_err(device::cuda("cuEventElapsedTime"))? as f64,
                );
            }
        }
        times.sort_by(|x, y| x.total_cmp(y));
        let med = if times.is_empty() {
            f64::NAN
        } else {
            times[times.len() / 2]
        };
        Ok((med, times.first().copied().unwrap_or(f64::NAN)))
    }

    /// The floor of a cube split over `backends`: `bytes` cut into one contiguous share of whole
    /// `unit`s (lines) per device, as the split cuts a cube, every device copying its share at once
    /// from the same page-locked memory (`bytes` must be registered for all of them:
    /// [`CudaBackend::register_host_shared`]). With `output` (page-locked for all of them too), each
    /// device then copies the same lines' share of it back, on the same stream: a split job's
    /// components can only be downloaded after every share's statistics, so its floor is the two
    /// copies in turn. Host clock from the first copy queued to the last one done; (median, min) ms
    /// of `runs` after `warmup`.
    pub fn time_shared_upload(
        backends: &[&CudaBackend],
        bytes: &[u8],
        unit: usize,
        mut output: Option<&mut [u8]>,
        warmup: usize,
        runs: usize,
    ) -> Result<(f64, f64), BackendError> {
        if backends.is_empty() || unit == 0 || bytes.len() % unit != 0 {
            return Err(BackendError::Invalid(format!("{} devices, {} bytes in units of {unit}", backends.len(), bytes.len())));
        }
        let units = bytes.len() / unit;
        if let Some(o) = output.as_deref() {
            if o.len() % units != 0 {
                return Err(BackendError::Invalid(format!("an output of {} bytes for {units} lines", o.len())));
            }
        }
        for b in backends {
            let out_locked = output.as_deref().is_none_or(|o| device::is_registered(&b.registry, o));
            if !device::is_registered(&b.registry, bytes) || !out_locked {
                return Err(BackendError::Invalid(format!("the cube or its output is not page-locked for device {}", b.ordinal)));
            }
        }
        let d = backends.len();
        let out_unit = output.as_deref().map_or(0, |o| o.len() / units);
        // Each device's share of the output, split off the one buffer (disjoint, so each lane owns its own).
        let mut out_shares: Vec<Option<&mut [u8]>> = Vec::with_capacity(d);
        let mut rest = output.take();
        for i in 0..d {
            out_shares.push(rest.take().map(|r| {
                let (mine, tail) = r.split_at_mut((units * (i + 1) / d - units * i / d) * out_unit);
                rest = Some(tail);
                mine
            }));
        }
        let mut lanes = Vec::with_capacity(d);
        for ((i, b), out) in backends.iter().enumerate().zip(out_shares) {
            let share = &bytes[units * i / d * unit..units * (i + 1) / d * unit];
            b.ctx.bind_to_thread().map_err(device::cuda("cuCtxSetCurrent"))?;
            let dst = device::DevBuf::alloc(&b.ctx, share.len().max(1))?;
            let back = match &out {
                Some(o) => Some(device::DevBuf::alloc(&b.ctx, o.len().max(1))?),
                None => None,
            };
            let stream = b.ctx.new_stream().map_err(device::cuda("cuStreamCreate"))?;
            lanes.push((b, share, dst, out, back, stream));
        }
        let mut times = Vec::with_capacity(runs);
        for i in 0..warmup + runs {
            let t = std::time::Instant::now();
            for (b, share, dst, out, back, stream) in lanes.iter_mut() {
                b.ctx.bind_to_thread().map_err(device::cuda("cuCtxSetCurrent"))?;
                // SAFETY: `bytes` and `output` (page-locked for this context) outlive the copies, which
                // are synchronized below before the next run or the return; `back` holds `out.len()`.
                unsafe {
                    device::htod_async(dst.ptr(), share, stream)?;
                    if let (Some(o), Some(src)) = (out.as_deref_mut(), back.as_ref()) {
                        device::dtoh_async(o, src.ptr(), stream)?;
                    }
                }
            }
            for (_, _, _, _, _, stream) in &lanes {
                stream.synchronize().map_err(device::cuda("cuStreamSynchronize"))?;
            }
            if i >= warmup {
                times.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        times.sort_by(|x, y| x.total_cmp(y));
        let med = times.get(times.len() / 2).copied().unwrap_or(f64::NAN);
        Ok((med, times.first().copied().unwrap_or(f64::NAN)))
    }

    /// Whether the kernels came from the on-disk PTX cache (true) or were compiled now.
    pub fn ptx_from_cache(&self) -> bool {
        self.kernels.origin == compile::PtxOrigin::Cache
    }
}

impl Backend for CudaBackend {
    fn eigen_solver(&self) -> Option<&dyn crate::mnf::eigen::GeneralizedEigenSolver> {
        self.eigen.get().map(|e| e as &dyn crate::mnf::eigen::GeneralizedEigenSolver)
    }
    fn name(&self) -> &'static str {
        match self.route {
            Route::Kernels => "cuda",
            Route::Cublas => "cuda-cublas",
        }
    }
    fn device(&self) -> String {
        self.device_name.clone()
    }
    /// Used = total − free on the device (every process's allocations, this one's pooled buffers too).
    fn memory_in_use(&self) -> Option<(u64, u64)> {
        self.ctx.bind_to_thread().ok()?;
        let (free, total) = self.ctx.mem_get_info().ok()?;
        Some(((total - free) as u64, total as u64))
    }
    /// Frees the idle pooled device buffers (the pool refills on the next passes).
    fn release_idle_memory(&self) {
        self.dev_pool.clear();
    }
    fn prepare<'c>(&'c self, cube: &'c Cube, _monitor: &Monitor) -> Result<Box<dyn PreparedCube + Send + 'c>, BackendError> {
        Ok(Box::new(CudaCube::new(self, cube, 0..cube.lines())?))
    }
    fn prepare_lines<'c>(
        &'c self,
        cube: &'c Cube,
        lines: std::ops::Range<usize>,
        _monitor: &Monitor,
    ) -> Result<Box<dyn PreparedCube + Send + 'c>, BackendError> {
        crate::backend::check_line_range(cube, &lines)?;
        Ok(Box::new(CudaCube::new(self, cube, lines)?))
    }
    fn ordinal(&self) -> Option<usize> {
        Some(self.ordinal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This machine (and CI) has no GPU: creating the backend must be a clean Unavailable, not a panic,
    /// so that `--backend auto` falls back to the CPU. Skipped where a driver is present.
    #[test]
    fn no_driver_is_unavailable_not_a_panic() {
        // SAFETY: only tries to dlopen libcuda.
        if unsafe { cudarc::driver::sys::is_culib_present() } {
            eprintln!("a CUDA driver is present; the no-driver path is not exercised here");
            return;
        }
        for route in [Route::Kernels, Route::Cublas] {
            match CudaBackend::new(route) {
                Err(BackendError::Unavailable(msg)) => assert!(msg.contains("driver"), "{msg}"),
                Err(e) => panic!("expected Unavailable, got {e}"),
                Ok(_) => panic!("expected Unavailable without a driver"),
            }
        }
    }
}

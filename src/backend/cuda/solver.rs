//! The generalized eigenproblem of the MNF on the device: C_N = L Lᵀ by cuSOLVER's `potrf`,
//! A = L⁻¹ C_D L⁻ᵀ, A = V Λ Vᵀ by our own kernels (`own_eigen.rs`: up to 425 bands on devices that
//! launch thread-block clusters, up to 144 elsewhere) or cuSOLVER's `syevd` (float64, divide and
//! conquer; `EigenMethod::for_bands`), and W = L⁻ᵀ V. The whitening and the back-transform use L⁻¹,
//! formed by our kernels and cuBLAS GEMMs (`whitening.rs`), wherever the own kernels load; else (or
//! once they have failed) cuBLAS's triangular solves.
//!
//! Why on the device: at 224 bands this host step (faer, one core) took ~9 ms on the H100's host,
//! longer than all the device work of a 299 MB cube, and nothing can overlap it (the projection needs
//! its result). The Cholesky factor is computed here too, so that the host's `on_noise` callback (on
//! the critical path: the device finishes C_D ~0.1 ms after the noise moments) only selects bands and
//! scales C_N. The order and signs of the pairs are `mnf::eigen`'s convention, which both backends
//! share: where the own kernels whiten, the device applies it (`OwnEigen::enqueue_ordered`, bit for bit
//! the host's, tested on the GPU), else `mnf::eigen` does after the download.
//!
//! A job's solve starts before the host has the statistics (`DeviceEigen::solve_formed_on_device`,
//! asked for by `PreparedCube::solve_early`): a kernel forms C_N and C_D from the statistics pass's
//! device sums with the host's arithmetic (the same bits), on the solver's stream: C_N once the noise
//! sums are done, and potrf runs while the data's are finished; C_D once they are. Meanwhile the host
//! forms its moments, selects bands and scales C_N (it needs them for the result
//! and the checks). Where the host then selects other bands (one without noise), its answer is
//! dropped and the job solves from the host's matrices as below.
//!
//! One solve is two host → device copies from page-locked staging (C_N, then C_D, staged and uploaded
//! on a second stream while potrf runs), the library calls and kernels, one device → host copy (W, the
//! eigenvalues and both `info`s, adjacent on the device) and one synchronize. The device buffers, the
//! `syevd`/`potrf` workspace and the staging are kept between solves (behind the Mutex) and grow when
//! more bands arrive: no allocation, zero-fill or workspace query per solve at a size seen before.
//!
//! libcusolver and libcublas are loaded dynamically like the other CUDA libraries; where either is
//! missing or fails, the host solver is used and nothing else changes. A C_N that `potrf` finds not
//! positive definite is `SolverError::NotPositiveDefinite`: the caller then factors C_N on the host,
//! which reports it with the host path's message.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use cudarc::cusolver::sys as sol;
use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaGraph, CudaStream};

use crate::backend::BackendError;
use crate::mnf::eigen::{GeneralizedEigenSolver, Solution, SolverError};

use super::cublas::Blas;
use super::device::{cuda, dtoh_async, htod_async, DevBuf, PinnedBuf};
use super::eigen_methods::{EigenMethod, MethodPlan};
use super::kernels::FormedPart;
use super::own_eigen::OwnEigen;
use super::whitening;

/// Bands the workspace is sized for (and the warm-up solve run at) when the solver is created: more
/// than the 224 of AVIRIS, so the first job neither allocates nor loads kernels the warm-up missed.
const WARM_BANDS: usize = 256;

/// Device events of one timed solve (`hypermnf::timing` at debug level): before the upload, after the
/// upload, potrf, the whitening (L⁻¹ and two GEMMs, or two triangular solves), the eigensolver, the
/// back-transform (with the own kernels, and the ordering of the pairs), and the download.
pub(crate) const TIMED_STEPS: [&str; 6] = ["h2d", "potrf", "whiten", "eigen", "back", "d2h"];

/// One solve's answer with what the benchmark reports of it.
pub struct Solved {
    /// Eigenvalues (ascending; the method's `pairs(n)` of them, the rest unset) and W = L⁻ᵀ V (n × n,
    /// column-major; its first `pairs` columns set), or, where `ordered`, the transform in the job's
    /// order and signs (row-major, columns in descending order of the eigenvalue; every pair).
    pub values: Vec<f64>,
    pub w: Vec<f64>,
    pub ordered: bool,
    /// Device time of each of [`TIMED_STEPS`] (ms), when asked for.
    pub steps_ms: Option<Vec<f32>>,
    /// Sweeps a Jacobi solve ran.
    pub sweeps: Option<i32>,
}

pub(crate) struct DeviceEigen {
    /// The library handles and the workspace, used by one solve at a time.
    inner: Mutex<Inner>,
    stream: Arc<CudaStream>,
    /// C_D's upload from the host, beside potrf on `stream`.
    upload: Arc<CudaStream>,
    /// Cleared when the own eigen kernels fail to load or run: the sizes they would take then go to
    /// syevd. They load at their first solve: on a device with clusters that is the warm-up (256
    /// bands, on the solver's own thread, beside the statistics); elsewhere a process that never
    /// meets their sizes (up to 144 bands) never pays for their compile and load.
    own_usable: std::sync::atomic::AtomicBool,
    /// Whether the device launches thread-block clusters (compute capability 9.0+): the own kernels'
    /// cluster tridiagonalisation.
    clusters: bool,
    /// Cleared when a solve chain could not be captured in a CUDA graph: it is queued launch by
    /// launch from then on.
    graphs_usable: std::sync::atomic::AtomicBool,
}

struct Inner {
    handle: Handle,
    blas: Blas,
    ws: Workspace,
    /// Recorded on the upload stream after C_D's upload (`DeviceEigen::enqueue`).
    cd_uploaded: CudaEvent,
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

/// Offsets (in float64 elements) of one solve of n bands in the device buffer `mats` and the
/// page-locked `staging`.
///
/// `mats`: C_N, factored in place into L (n², column-major) | C_D, whitened into A, then overwritten
/// by V (n²) | W, and before it the whitening's intermediate L⁻¹ C_D (n²) | the eigenvalues (n) |
/// potrf's and the eigensolver's `info` (two i32 in one float64 slot). `staging`: the inputs as
/// uploaded (2 n²) | the outputs as downloaded (n² + n + 1: the tail of `mats` from W on, in one
/// copy).
#[derive(Clone, Copy)]
struct Layout {
    n: usize,
}

impl Layout {
    fn nn(self) -> usize {
        self.n * self.n
    }
    fn l(self) -> usize {
        0
    }
    fn a(self) -> usize {
        self.nn()
    }
    fn w(self) -> usize {
        2 * self.nn()
    }
    fn values(self) -> usize {
        3 * self.nn()
    }
    fn info(self) -> usize {
        3 * self.nn() + self.n
    }
    /// float64 elements of `mats`.
    fn mats_len(self) -> usize {
        3 * self.nn() + self.n + 1
    }
    /// Elements uploaded (C_N, C_D), from `mats` offset 0 and staging offset 0.
    fn upload_len(self) -> usize {
        2 * self.nn()
    }
    /// Elements downloaded (W, the eigenvalues, the infos), from `mats` offset `w()` to staging offset
    /// `upload_len()`.
    fn download_len(self) -> usize {
        self.nn() + self.n + 1
    }
    /// float64 elements of `staging`.
    fn staging_len(self) -> usize {
        self.upload_len() + self.download_len()
    }
}

/// What the solver keeps between solves.
#[derive(Default)]
struct Workspace {
    /// Bands `mats` and `staging` are sized for.
    capacity: usize,
    mats: Option<DevBuf>,
    staging: Option<PinnedBuf>,
    /// The potrf/eigensolver workspace, `work_len` float64.
    work: Option<DevBuf>,
    work_len: usize,
    /// (n, potrf lwork) of the last size queried.
    lwork: Option<(usize, i32)>,
    /// The eigensolvers' plans for the sizes and methods seen (a few: one per method and size).
    plans: Vec<MethodPlan>,
    /// Timing events, made at the first timed solve.
    events: Vec<CudaEvent>,
    /// The own eigen kernels, loaded at the first `EigenMethod::Own` or `OwnCluster` solve or the first
    /// whitening by the inverse.
    own: Option<Arc<OwnEigen>>,
    /// The whitening's scratch (`whitening::scratch_len` float64 of it), `inverse_len` long.
    inverse: Option<DevBuf>,
    inverse_len: usize,
    /// The solve chains captured so far (see `DeviceEigen::enqueue`): they hold the addresses of the
    /// buffers above, so they go whenever one of those is reallocated.
    graphs: Vec<ChainGraph>,
    /// The chains solved at least once (queued or replayed): only these are captured.
    solved: Vec<GraphKey>,
}

/// What a captured solve chain was captured for.
#[derive(Clone, Copy, PartialEq)]
struct GraphKey {
    n: usize,
    method: EigenMethod,
    inverse: bool,
    ordered: bool,
}

/// One captured solve chain, replayed by two launches: potrf (`DeviceEigen::enqueue_factor`) and the
/// rest (`DeviceEigen::enqueue_rest`), between which C_D goes up.
struct ChainGraph {
    key: GraphKey,
    factor: CudaGraph,
    rest: CudaGraph,
}

// SAFETY: a graph and its executable are driver objects that any thread of the context may launch;
// the solver launches them from one thread at a time (behind its Mutex).
unsafe impl Send for ChainGraph {}

const F64: usize = std::mem::size_of::<f64>();

impl Workspace {
    /// Buffers for n bands (grown if needed), potrf's workspace size, the index of `method`'s plan at
    /// n in `plans`, and the kernels of the whitening by the inverse where `inverse` asks for it.
    fn ensure(&mut self, ctx: &Arc<CudaContext>, handle: sol::cusolverDnHandle_t, n: usize, method: EigenMethod, inverse: bool) -> Result<(i32, usize, Option<Arc<OwnEigen>>), BackendError> {
        let lay = Layout { n };
        if n > self.capacity || self.mats.is_none() || self.staging.is_none() {
            let cap = Layout { n: n.max(self.capacity) };
            // Free the old buffers first (the previous solve has synchronized).
            self.graphs.clear();
            self.mats = None;
            self.staging = None;
            self.lwork = None;
            self.plans.clear();
            self.mats = Some(DevBuf::alloc(ctx, cap.mats_len() * F64)?);
            self.staging = Some(PinnedBuf::alloc(ctx, cap.staging_len() * F64)?);
            self.capacity = cap.n;
        }
        let lp = match self.lwork {
            Some((m, lp)) if m == n => lp,
            _ => {
                let ni = i32::try_from(n).map_err(|_| BackendError::Invalid(format!("{n} bands is too many for cuSOLVER")))?;
                let mats = self.mats.as_ref().expect("allocated above");
                let pl = mats.at(lay.l() * F64) as *mut f64;
                let mut lp = 0i32;
                // SAFETY: a valid handle; the matrices lie in `mats` (n × n, lda = n), which the queries
                // do not read; out-pointers to locals.
                check("cusolverDnDpotrf_bufferSize", unsafe {
                    sol::cusolverDnDpotrf_bufferSize(handle, sol::cublasFillMode_t::CUBLAS_FILL_MODE_LOWER, ni, pl, ni, &mut lp)
                })?;
                if lp < 0 {
                    return Err(BackendError::Cuda(format!("cuSOLVER asked for a negative workspace ({lp})")));
                }
                self.lwork = Some((n, lp));
                lp
            }
        };
        let plan = match self.plans.iter().position(|p| p.n == n && p.method == method) {
            Some(i) => i,
            None => {
                let mats = self.mats.as_ref().expect("allocated above");
                let own = &mut self.own;
                let load = || -> Result<Arc<OwnEigen>, BackendError> {
                    if own.is_none() {
                        *own = Some(Arc::new(OwnEigen::load(ctx)?));
                    }
                    Ok(own.clone().expect("loaded above"))
                };
                self.plans.push(MethodPlan::new(handle, method, n, mats.at(lay.a() * F64), mats.at(lay.values() * F64), load)?);
                self.plans.len() - 1
            }
        };
        let need = (lp as usize).max(self.plans[plan].device_bytes.div_ceil(F64)).max(1);
        if self.work.is_none() || need > self.work_len {
            self.graphs.clear();
            self.work = None;
            self.work = Some(DevBuf::alloc(ctx, need * F64)?);
            self.work_len = need;
        }
        let kernels = if inverse {
            if self.own.is_none() {
                self.own = Some(Arc::new(OwnEigen::load(ctx)?));
            }
            let len = whitening::scratch_len(n);
            if self.inverse.is_none() || len > self.inverse_len {
                self.graphs.clear();
                self.inverse = None;
                self.inverse = Some(DevBuf::alloc(ctx, len * F64)?);
                self.inverse_len = len;
            }
            self.own.clone()
        } else {
            None
        };
        Ok((lp, plan, kernels))
    }
}

/// The page-locked staging as float64 (cuMemHostAlloc returns page-aligned memory).
fn as_f64_mut(bytes: &mut [u8]) -> &mut [f64] {
    // SAFETY: every bit pattern is a valid f64; the alignment is checked.
    let (head, body, _) = unsafe { bytes.align_to_mut::<f64>() };
    assert!(head.is_empty(), "pinned staging is not 8-byte aligned");
    body
}

fn as_bytes(v: &[f64]) -> &[u8] {
    // SAFETY: plain data, u8 has no alignment requirement.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

fn as_bytes_mut(v: &mut [f64]) -> &mut [u8] {
    // SAFETY: as above; any bytes written form valid f64s.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, std::mem::size_of_val(v)) }
}

/// The device's eigen solver, made on a thread of its own when the backend is opened and waited for
/// at its first use. Loading cuSOLVER and cuBLAS (hundreds of MB of libraries), creating their
/// handles and the warm-up solve were the larger part of opening a device, and `hypermnf run` opens
/// one for each cube: made beside the statistics pass, which needs none of it, they leave its time.
pub(crate) struct EigenOnDevice {
    ready: std::sync::OnceLock<Option<DeviceEigen>>,
    making: Mutex<Option<std::thread::JoinHandle<Option<DeviceEigen>>>>,
}

impl EigenOnDevice {
    /// No solver: the eigen step runs on the host.
    pub(crate) fn none() -> EigenOnDevice {
        let ready = std::sync::OnceLock::new();
        let _ = ready.set(None);
        EigenOnDevice { ready, making: Mutex::new(None) }
    }

    /// Starts making the solver for `ctx`; where it cannot be made (no libcusolver), the eigen step
    /// runs on the host, as it always did then.
    pub(crate) fn start(ctx: &Arc<CudaContext>) -> EigenOnDevice {
        let ctx = ctx.clone();
        let making = std::thread::Builder::new().name("hypermnf-cusolver".into()).spawn(move || match DeviceEigen::new(&ctx) {
            Ok(e) => Some(e),
            Err(e) => {
                tracing::info!("eigen step on the host: {e}");
                None
            }
        });
        match making {
            Ok(handle) => EigenOnDevice { ready: std::sync::OnceLock::new(), making: Mutex::new(Some(handle)) },
            Err(e) => {
                tracing::info!("eigen step on the host: cannot start a thread for cuSOLVER ({e})");
                EigenOnDevice::none()
            }
        }
    }

    /// The solver, once made (waits for it the first time); None when there is none.
    pub(crate) fn get(&self) -> Option<&DeviceEigen> {
        self.ready
            .get_or_init(|| {
                let handle = self.making.lock().unwrap_or_else(|p| p.into_inner()).take();
                handle.and_then(|h| h.join().ok().flatten())
            })
            .as_ref()
    }
}

impl DeviceEigen {
    /// A solver on its own stream of `ctx`, or `Unavailable` where libcusolver cannot be loaded.
    pub(crate) fn new(ctx: &Arc<CudaContext>) -> Result<DeviceEigen, BackendError> {
        // SAFETY: only tries to dlopen the library.
        if !unsafe { sol::is_culib_present() } {
            return Err(BackendError::Unavailable("libcusolver not found".into()));
        }
        ctx.bind_to_thread().map_err(cuda("cuCtxSetCurrent"))?;
        let stream = ctx.new_stream().map_err(cuda("cuStreamCreate"))?;
        let upload = ctx.new_stream().map_err(cuda("cuStreamCreate"))?;
        let cd_uploaded = super::device::event(ctx, false)?;
        let created = std::panic::catch_unwind(|| {
            let mut h: sol::cusolverDnHandle_t = std::ptr::null_mut();
            // SAFETY: out-pointer to a local.
            let s = unsafe { sol::cusolverDnCreate(&mut h) };
            (s, h)
        });
        let (s, h) = created.map_err(|_| BackendError::Unavailable("libcusolver could not be loaded".into()))?;
        check("cusolverDnCreate", s)?;
        let handle = Handle(h);
        // SAFETY: valid handle and stream.
        check("cusolverDnSetStream", unsafe { sol::cusolverDnSetStream(handle.0, stream.cu_stream() as _) })?;
        let blas = Blas::new()?;
        let (major, _) = ctx.compute_capability().map_err(cuda("cuDeviceGetAttribute"))?;
        let solver = DeviceEigen {
            inner: Mutex::new(Inner {
                handle,
                blas,
                ws: Workspace::default(),
                cd_uploaded,
            }),
            stream,
            upload,
            own_usable: std::sync::atomic::AtomicBool::new(true),
            clusters: major >= 9,
            graphs_usable: std::sync::atomic::AtomicBool::new(true),
        };
        // One solve now, at more bands than most cubes have: the workspace is allocated, cuBLAS
        // allocates its own (32 MiB on sm_90) and cuSOLVER loads its kernels at first use (lazy module
        // loading), which would otherwise land on the first job's time and device memory.
        let n = WARM_BANDS;
        // C_N: a positive definite Toeplitz matrix; C_D: distinct eigenvalues, all coupled (a diagonal
        // matrix would let syevd's divide and conquer deflate everything and skip kernels).
        let cn: Vec<f64> = (0..n * n).map(|k| {
            let d = (k / n).abs_diff(k % n) as f64;
            if d == 0.0 { 2.0 } else { 0.5f64.powf(d) * 0.5 }
        }).collect();
        let cd: Vec<f64> = (0..n * n).map(|k| {
            let (i, j) = (k / n, k % n);
            1.0 / (1.0 + i.abs_diff(j) as f64) + if i == j { i as f64 } else { 0.0 }
        }).collect();
        // cudarc resolves each library function at its first call and panics where one is missing.
        let warm = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| solver.solve(&cn, &cd, n)))
            .map_err(|_| BackendError::Unavailable("libcusolver lacks a function the eigen step needs".into()))?;
        warm.map_err(|e| match e {
            SolverError::NotPositiveDefinite(k) => BackendError::Cuda(format!("warm-up solve: potrf info = {k}")),
            SolverError::Failed(m) => BackendError::Cuda(format!("warm-up solve: {m}")),
        })?;
        Ok(solver)
    }

    /// The job's solve: its method, whitening and (with the own kernels) the pairs ordered on the
    /// device.
    fn solve_job(&self, cn: &[f64], cd: &[f64], n: usize) -> Result<Solved, SolverError> {
        let timed = tracing::enabled!(target: "hypermnf::timing", tracing::Level::DEBUG);
        use std::sync::atomic::Ordering;
        if self.own_usable.load(Ordering::Relaxed) {
            match self.solve_using(self.job_method(n), self.whitening(n), cn, cd, n, timed) {
                // A C_N that is not positive definite is the input's fault, whichever method runs.
                Ok(s) => return Ok(s),
                Err(e @ SolverError::NotPositiveDefinite(_)) => return Err(e),
                Err(SolverError::Failed(e)) => {
                    tracing::warn!("own eigen kernels failed ({e}); cuSOLVER's syevd and cuBLAS's triangular solves take every size from now on");
                    self.own_usable.store(false, Ordering::Relaxed);
                }
            }
        }
        self.solve_using(EigenMethod::Syevd, Whitening::Triangular, cn, cd, n, timed)
    }

    fn solve(&self, cn: &[f64], cd: &[f64], n: usize) -> Result<(Vec<f64>, Vec<f64>), SolverError> {
        self.solve_job(cn, cd, n).map(|s| {
            let w = s.w_column_major(n);
            (s.values, w)
        })
    }

    /// The job's eigensolver at n bands: the own kernels' pick while they are usable, else syevd.
    fn job_method(&self, n: usize) -> EigenMethod {
        if self.own_usable.load(std::sync::atomic::Ordering::Relaxed) {
            EigenMethod::for_bands(n, self.clusters)
        } else {
            EigenMethod::Syevd
        }
    }

    /// The job's whitening at n bands: by the inverse while the own kernels are usable and take n.
    pub(crate) fn whitening(&self, n: usize) -> Whitening {
        if self.own_usable.load(std::sync::atomic::Ordering::Relaxed) && n <= OwnEigen::MAX_BANDS {
            Whitening::Inverse
        } else {
            Whitening::Triangular
        }
    }

    /// One solve by `method` and `whitening`, with the device time of each step when `timed`.
    pub(crate) fn solve_using(&self, method: EigenMethod, whitening: Whitening, cn: &[f64], cd: &[f64], n: usize, timed: bool) -> Result<Solved, SolverError> {
        if n == 0 || cn.len() != n * n || cd.len() != n * n {
            return Err(SolverError::Failed(format!("bad shapes: n = {n}, C_N {} and C_D {} values", cn.len(), cd.len())));
        }
        self.run(method, whitening, Inputs::Host { cn, cd }, n, timed, &mut || {})
    }

    /// The job's solve (its method and whitening, as [`DeviceEigen::solve_ordered`] picks them) of a
    /// problem whose C_N and C_D are formed on the device: `fill` queues their forming on the solver's
    /// stream, which first waits for `after` (recorded on another stream of the same context, where
    /// their sources are finished). `meanwhile` runs on the host while the device solves. Where the
    /// own kernels fail, this does not retry: the caller solves again from host matrices
    /// ([`GeneralizedEigenSolver::solve_ordered`]), which falls back to syevd.
    pub(crate) fn solve_formed_on_device(
        &self,
        n: usize,
        (after_noise, after): (&CudaEvent, &CudaEvent),
        fill: &dyn Fn(&CudaStream, FormedPart, u64) -> Result<(), BackendError>,
        meanwhile: &mut dyn FnMut(),
    ) -> Result<Solution, SolverError> {
        let timed = tracing::enabled!(target: "hypermnf::timing", tracing::Level::DEBUG);
        if n == 0 {
            meanwhile();
            return Err(SolverError::Failed("no bands".into()));
        }
        let inputs = Inputs::Device(Formed { after_noise, after, fill });
        self.run(self.job_method(n), self.whitening(n), inputs, n, timed, meanwhile).map(Solved::into_solution)
    }

    /// One solve, from `inputs`; `meanwhile` runs once, on the host, while the device solves (also
    /// when the solve fails before reaching the device).
    fn run(&self, method: EigenMethod, whitening: Whitening, inputs: Inputs<'_>, n: usize, timed: bool, meanwhile: &mut dyn FnMut()) -> Result<Solved, SolverError> {
        // `meanwhile` must run whatever happens: the caller's statistics are in it.
        let mut pending = Some(meanwhile);
        let mut run_meanwhile = || {
            if let Some(m) = pending.take() {
                m();
            }
        };
        let result = self.run_inner(method, whitening, inputs, n, timed, &mut run_meanwhile);
        run_meanwhile();
        result
    }

    fn run_inner(&self, method: EigenMethod, whitening: Whitening, inputs: Inputs<'_>, n: usize, timed: bool, meanwhile: &mut dyn FnMut()) -> Result<Solved, SolverError> {
        let failed = |e: BackendError| SolverError::Failed(e.to_string());
        let t0 = Instant::now();
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Inner { handle, blas, ws, cd_uploaded } = &mut *guard;
        let ctx = self.stream.context();
        ctx.bind_to_thread().map_err(cuda("cuCtxSetCurrent")).map_err(failed)?;
        let inverse = whitening == Whitening::Inverse;
        let (lwork_potrf, plan, kernels) = ws.ensure(ctx, handle.0, n, method, inverse).map_err(failed)?;
        if timed && ws.events.len() < TIMED_STEPS.len() + 1 {
            ws.events.clear();
            for _ in 0..=TIMED_STEPS.len() {
                ws.events.push(super::device::event(ctx, true).map_err(failed)?);
            }
        }
        let t_ready = Instant::now();

        let lay = Layout { n };
        let nn = lay.nn();
        let staging = as_f64_mut(ws.staging.as_mut().expect("ensured").as_mut_slice());
        let (up, down) = staging[..lay.staging_len()].split_at_mut(lay.upload_len());
        let source = match inputs {
            Inputs::Host { cn, cd } => Source::Host { cn, cd, up },
            Inputs::Device(formed) => Source::Formed(formed),
        };

        let mats = ws.mats.as_ref().expect("ensured");
        let work = ws.work.as_ref().expect("ensured");
        let events = if timed { &ws.events[..] } else { &[][..] };
        let plan = &mut ws.plans[plan];
        let whiten = match (&kernels, &ws.inverse) {
            (Some(k), Some(scratch)) => Whiten::Inverse(k, scratch),
            _ => Whiten::Triangular,
        };
        // The own kernels order the pairs too where the method gives every pair.
        let ordered = matches!(whiten, Whiten::Inverse(..)) && method.pairs(n) == n;
        let mut chain = Chain { handle: handle.0, blas, mats, work, lwork_potrf, plan, whiten, ordered, lay };
        let enqueued = self.enqueue(&mut chain, source, down, events, (&mut ws.graphs, &mut ws.solved), cd_uploaded);
        let t_enqueued = Instant::now();
        meanwhile();
        let t_meanwhile = Instant::now();
        // The answer's buffer, its pages touched now, while the device works: a fresh 1.4 MB
        // allocation (425 bands) was otherwise faulted in page by page by the copy after the wait,
        // which made that copy take ~0.2 ms. NaN, not zero, so that the fill cannot become a calloc.
        let mut w = Vec::new();
        if enqueued.is_ok() {
            w.resize(nn, f64::NAN);
        }
        // Synchronize even after a failed enqueue: copies already queued must not outlive this call's
        // use of the staging. (C_D's, on the upload stream, is waited for by the solver's stream once
        // the enqueue got that far; where it failed, the upload stream is synchronized too.)
        let synced = self.stream.synchronize().map_err(cuda("cuStreamSynchronize"));
        if enqueued.is_err() {
            let _ = self.upload.synchronize();
        }
        enqueued.map_err(failed)?;
        synced.map_err(failed)?;
        let t_done = Instant::now();

        // down: W (n², column-major) | eigenvalues (n) | infos.
        let info_bits = down[nn + n].to_ne_bytes();
        let potrf_info = i32::from_ne_bytes(info_bits[..4].try_into().expect("4 bytes"));
        let eigen_info = i32::from_ne_bytes(info_bits[4..].try_into().expect("4 bytes"));
        let sweeps = chain.plan.sweeps(handle.0);
        let result = if potrf_info > 0 {
            Err(SolverError::NotPositiveDefinite(potrf_info as usize))
        } else if potrf_info < 0 {
            Err(SolverError::Failed(format!("cusolverDnDpotrf: info = {potrf_info} (invalid argument)")))
        } else if eigen_info != 0 {
            Err(SolverError::Failed(format!("{}: info = {eigen_info} (did not converge or invalid argument)", method.label())))
        } else {
            w.copy_from_slice(&down[..nn]);
            Ok((down[nn..nn + n].to_vec(), w))
        };
        let t_end = Instant::now();
        let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
        tracing::debug!(
            target: "hypermnf::timing",
            n,
            total_ms = ms(t0, t_end),
            lock_and_workspace_ms = ms(t0, t_ready),
            stage_and_enqueue_ms = ms(t_ready, t_enqueued),
            meanwhile_ms = ms(t_enqueued, t_meanwhile),
            wait_ms = ms(t_meanwhile, t_done),
            unpack_ms = ms(t_done, t_end),
            "eigen step on the device (host clock)"
        );
        let mut steps_ms = None;
        if timed && events.len() > TIMED_STEPS.len() {
            let ms: Vec<f32> = (0..TIMED_STEPS.len()).map(|i| events[i].elapsed_ms(&events[i + 1]).unwrap_or(f32::NAN)).collect();
            let steps: Vec<String> = TIMED_STEPS.iter().zip(&ms).map(|(name, t)| format!("{name}={t:.3}")).collect();
            tracing::debug!(target: "hypermnf::timing", n, method = %method.label(), device_ms = %steps.join(" "), "eigen step on the device (device clock, ms)");
            steps_ms = Some(ms);
        }
        result.map(|(values, w)| Solved { values, w, ordered, steps_ms, sweeps })
    }

    /// Queues the upload (or the forming on the device), potrf, the whitening, the eigensolver, the
    /// back-transform and the download on the solver's stream. `events`
    /// (empty or `TIMED_STEPS.len() + 1`) are recorded between the steps.
    ///
    /// From the host, untimed, C_N is staged and uploaded first and potrf queued; C_D is staged while
    /// potrf runs and uploaded on the upload stream, which the rest of the chain waits for
    /// (`cd_uploaded`). Staged side by side before one upload, both copies and all 2.9 MB of the
    /// upload at 425 bands were on the critical path (bench eigen 3.07 → 2.90 ms there, an H200).
    fn enqueue(
        &self,
        c: &mut Chain<'_>,
        source: Source<'_>,
        down: &mut [f64],
        events: &[CudaEvent],
        (graphs, solved): (&mut Vec<ChainGraph>, &mut Vec<GraphKey>),
        cd_uploaded: &CudaEvent,
    ) -> Result<(), BackendError> {
        let stream = &*self.stream;
        let (lay, mats) = (c.lay, c.mats);
        let nn = lay.nn();
        let mark = |i: usize| mark_step(events, i, stream);
        let (pl, pa) = (mats.at(lay.l() * F64), mats.at(lay.a() * F64));
        let key = GraphKey { n: lay.n, method: c.plan.method, inverse: matches!(c.whiten, Whiten::Inverse(..)), ordered: c.ordered };

        mark(0)?;
        // C_D and where it is staged, when it goes up during potrf; or how it is formed then.
        let mut later = None;
        let mut later_formed = None;
        match source {
            // Both are symmetric: row-major is column-major.
            Source::Host { cn, cd, up } => {
                let (up_cn, up_cd) = up.split_at_mut(nn);
                up_cn.copy_from_slice(cn);
                // SAFETY (both copies): `up` is page-locked staging that outlives the copy (the caller
                // synchronizes both streams' work before releasing it: the solver's stream waits for
                // the upload stream's); mats holds C_N at pl and C_D at pa, n² float64 each.
                unsafe { htod_async(pl, as_bytes(up_cn), stream)? };
                if events.is_empty() {
                    later = Some((cd, up_cd));
                } else {
                    // Timed: the upload is one step, before potrf.
                    up_cd.copy_from_slice(cd);
                    unsafe { htod_async(pa, as_bytes(up_cd), stream)? };
                }
            }
            // C_N as soon as the noise sums are done, so that potrf runs while the data's are finished
            // (the last piece's data sums come after its noise sums): C_D between potrf and the rest.
            // Timed, both are formed in the first step.
            Source::Formed(Formed { after_noise, after, fill }) => {
                stream.wait(after_noise).map_err(cuda("cuStreamWaitEvent"))?;
                fill(stream, FormedPart::Noise, pl)?;
                if events.is_empty() {
                    later_formed = Some((after, fill));
                } else {
                    stream.wait(after).map_err(cuda("cuStreamWaitEvent"))?;
                    fill(stream, FormedPart::Data, pa)?;
                }
            }
        }
        mark(1)?;
        // The rest reads and writes only the workspace, at addresses fixed until it is reallocated,
        // so graphs captured once replay it (untimed solves of the own kernels): the ~25 launches,
        // cuSOLVER's and cuBLAS's host work among them, cost the host 0.3-0.45 ms a solve on the
        // H100's host, during which the device ran ahead of the host only in part. Two graphs, potrf
        // and what follows, so that C_D can go up between them.
        //
        // A chain is captured at its second solve, never its first. Twice in `bench gpu` runs (H200,
        // 2026-11-29), a capture at a fresh backend's first solve failed at the chain's first cuBLAS
        // call (cublasDgemmStridedBatched: EXECUTION_FAILED, the capture invalidated) while other
        // threads ran the statistics pass; the solve fell back to queued launches. What a first call
        // does that later ones do not is one-time set-up: the driver loads a kernel's module at its
        // first launch in a context, and a new cuBLAS handle sets up its workspace at its first call
        // on a stream. The first solve, queued launch by launch, now does all of it outside any
        // capture. (The cause was not reproduced at will; see BENCHMARKS.md, "Eigen".)
        let first = !solved.contains(&key);
        if first {
            solved.push(key);
        }
        let graph = if events.is_empty() && !first && c.plan.is_own() && self.graphs_usable.load(std::sync::atomic::Ordering::Relaxed) {
            match graphs.iter().position(|g| g.key == key) {
                Some(i) => Some(i),
                None => self.capture(c, down)?.map(|(factor, rest)| {
                    graphs.push(ChainGraph { key, factor, rest });
                    graphs.len() - 1
                }),
            }
        } else {
            None
        };
        match graph {
            Some(i) => graphs[i].factor.launch().map_err(cuda("cuGraphLaunch"))?,
            None => self.enqueue_factor(c, events)?,
        }
        if let Some((cd, up_cd)) = later {
            up_cd.copy_from_slice(cd);
            // SAFETY: as above.
            unsafe { htod_async(pa, as_bytes(up_cd), &self.upload)? };
            cd_uploaded.record(&self.upload).map_err(cuda("cuEventRecord"))?;
            stream.wait(cd_uploaded).map_err(cuda("cuStreamWaitEvent"))?;
        }
        if let Some((after, fill)) = later_formed {
            stream.wait(after).map_err(cuda("cuStreamWaitEvent"))?;
            fill(stream, FormedPart::Data, pa)?;
        }
        match graph {
            Some(i) => graphs[i].rest.launch().map_err(cuda("cuGraphLaunch")),
            None => self.enqueue_rest(c, down, events),
        }
    }

    /// The solve chain (untimed) captured as two graphs, potrf's and the rest's; None, and the solver
    /// queues launch by launch from then on, where a call of it cannot be captured here.
    fn capture(&self, c: &mut Chain<'_>, down: &mut [f64]) -> Result<Option<(CudaGraph, CudaGraph)>, BackendError> {
        let stream = &*self.stream;
        let one = |part: &mut dyn FnMut() -> Result<(), BackendError>| -> Result<Option<CudaGraph>, BackendError> {
            stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).map_err(cuda("cuStreamBeginCapture"))?;
            let captured = part();
            let ended = self.stream.end_capture(sys::CUgraphInstantiate_flags(0));
            match (captured, ended) {
                (Ok(()), Ok(Some(graph))) => Ok(Some(graph)),
                (captured, ended) => {
                    tracing::info!(
                        "eigen step: the solve's launches could not be captured in a CUDA graph ({:?}, {:?}); they are queued one by one",
                        captured.err(),
                        ended.err()
                    );
                    self.graphs_usable.store(false, std::sync::atomic::Ordering::Relaxed);
                    Ok(None)
                }
            }
        };
        let Some(factor) = one(&mut || self.enqueue_factor(c, &[]))? else { return Ok(None) };
        let Some(rest) = one(&mut || self.enqueue_rest(c, down, &[]))? else { return Ok(None) };
        Ok(Some((factor, rest)))
    }

    /// potrf of the solve whose C_N is in place (and both infos set to 0), `events` 2 recorded after it.
    fn enqueue_factor(&self, c: &mut Chain<'_>, events: &[CudaEvent]) -> Result<(), BackendError> {
        let stream = &*self.stream;
        let (handle, mats, work, lwork_potrf, lay) = (c.handle, c.mats, c.work, c.lwork_potrf, c.lay);
        let n = lay.n;
        let ni = i32::try_from(n).map_err(|_| BackendError::Invalid(format!("{n} bands is too many for cuSOLVER")))?;
        let pl = mats.at(lay.l() * F64);
        let pinfo = mats.at(lay.info() * F64);
        let lower = sol::cublasFillMode_t::CUBLAS_FILL_MODE_LOWER;
        // Both infos to 0, so a stale value can never be read (potrf and the eigensolver overwrite them).
        // SAFETY: 8 bytes at the info slot, inside mats.
        unsafe { result::memset_d8_async(pinfo, 0, F64, stream.cu_stream()) }.map_err(cuda("cuMemsetD8Async"))?;
        // C_N = L Lᵀ, L in the lower triangle (column-major) of the first n × n block; the strict upper
        // triangle keeps C_N's values, which the triangular solves below never read (FILL_MODE_LOWER).
        // SAFETY: n × n float64 at pl (lda = n), lwork_potrf float64 of workspace, one i32 info, all on
        // the handle's stream (set in new()).
        check("cusolverDnDpotrf", unsafe {
            sol::cusolverDnDpotrf(handle, lower, ni, pl as *mut f64, ni, work.ptr() as *mut f64, lwork_potrf, pinfo as *mut i32)
        })?;
        mark_step(events, 2, stream)
    }

    /// The rest of the solve once potrf is queued and C_D is in place: the whitening, the eigensolver,
    /// the back-transform (and the ordering) and the download, with `events` 3.. recorded between them.
    fn enqueue_rest(&self, c: &mut Chain<'_>, down: &mut [f64], events: &[CudaEvent]) -> Result<(), BackendError> {
        let stream = &*self.stream;
        let (handle, blas, mats, work, ordered, lay) = (c.handle, c.blas, c.mats, c.work, c.ordered, c.lay);
        let (plan, whiten) = (&mut *c.plan, &c.whiten);
        let n = lay.n;
        let mark = |i: usize| mark_step(events, i, stream);
        let (pl, pa, pw) = (mats.at(lay.l() * F64), mats.at(lay.a() * F64), mats.at(lay.values() * F64));
        let pv = mats.at(lay.w() * F64);
        let pinfo = mats.at(lay.info() * F64);
        // A = L⁻¹ C_D L⁻ᵀ in place of C_D. (After a failed potrf these compute garbage that is never
        // read: potrf's info is checked first.)
        let inverse = match &whiten {
            Whiten::Inverse(kernels, scratch) => {
                // SAFETY: L (n²) in mats, the scratch sized by whitening::scratch_len(n) in `ensure`;
                // both stay alive until the caller's synchronize.
                let li = unsafe { whitening::enqueue_inverse(stream, blas, kernels, n, pl, scratch.ptr())? };
                // Through W's slot, which the back-transform overwrites.
                whitening::enqueue_whiten(stream, blas, n, li, pa, pv, pa)?;
                Some(li)
            }
            Whiten::Triangular => {
                blas.dtrsm_lower(stream, true, false, n, pl, pa)?;
                blas.dtrsm_lower(stream, false, true, n, pl, pa)?;
                None
            }
        };
        mark(3)?;
        // SAFETY: n × n float64 at pa (lda = n), n eigenvalues at pw, the plan's device workspace (the
        // work buffer is sized for it in `ensure`), the second i32 of the info slot; all on the handle's
        // stream. Every method reads the lower triangle only, so A needs no symmetrising.
        unsafe { plan.enqueue(handle, stream, pa, pw, work.ptr(), pinfo + 4)? };
        mark(4)?;
        // W = L⁻ᵀ V, into W's slot; or into L's (no longer read: L⁻¹ is in the scratch) and from there
        // into W's slot in the job's order and signs.
        match (inverse, &whiten) {
            (Some(li), Whiten::Inverse(kernels, scratch)) if ordered => {
                whitening::enqueue_back(stream, blas, n, li, pa, pl)?;
                let signs = scratch.ptr() + (whitening::spare_offset(n) * F64) as u64;
                // SAFETY: W (n²) at pl and the ordered copy at pv, both in mats, apart; n signs in the
                // scratch's spare part (whitening::spare_offset); alive until the caller's synchronize.
                unsafe { kernels.enqueue_ordered(stream, n, pl, signs, pv)? };
            }
            (Some(li), _) => whitening::enqueue_back(stream, blas, n, li, pa, pv)?,
            (None, _) => {
                blas.dtrsm_lower(stream, true, true, n, pl, pa)?;
                // SAFETY: n² float64 at pa and at pv, both inside mats, not overlapping.
                unsafe { result::memcpy_dtod_async(pv, pa, lay.nn() * F64, stream.cu_stream()) }.map_err(cuda("cuMemcpyDtoDAsync"))?;
            }
        }
        mark(5)?;
        // W, the eigenvalues and the infos are adjacent: one copy.
        // SAFETY: `down` is page-locked staging that outlives the copy (the caller synchronizes);
        // download_len float64 from offset w() lie inside mats.
        unsafe { dtoh_async(as_bytes_mut(&mut down[..lay.download_len()]), pv, stream)? };
        mark(6)?;
        Ok(())
    }
}

/// Records event `i` of a timed solve's `events` on `stream` (nothing when the solve is untimed).
fn mark_step(events: &[CudaEvent], i: usize, stream: &CudaStream) -> Result<(), BackendError> {
    match events.get(i) {
        Some(e) => e.record(stream).map_err(cuda("cuEventRecord")),
        None => Ok(()),
    }
}

/// What one solve's chain (`DeviceEigen::enqueue_factor` and `enqueue_rest`) works on: the library
/// handles, the workspace's buffers and potrf's workspace size, the eigensolver's plan, the whitening,
/// whether the pairs are ordered on the device, and the layout of n bands.
struct Chain<'a> {
    handle: sol::cusolverDnHandle_t,
    blas: &'a Blas,
    mats: &'a DevBuf,
    work: &'a DevBuf,
    lwork_potrf: i32,
    plan: &'a mut MethodPlan,
    whiten: Whiten<'a>,
    ordered: bool,
    lay: Layout,
}

/// Where a solve's C_N and C_D come from.
enum Inputs<'a> {
    /// The host's (n × n each, symmetric), staged and uploaded.
    Host { cn: &'a [f64], cd: &'a [f64] },
    Device(Formed<'a>),
}

/// C_N and C_D formed on the device by `fill(stream, part, its address)`: C_N once `after_noise` has
/// fired, C_D once `after` has.
struct Formed<'a> {
    after_noise: &'a CudaEvent,
    after: &'a CudaEvent,
    fill: &'a dyn Fn(&CudaStream, FormedPart, u64) -> Result<(), BackendError>,
}

/// [`Inputs`] as `enqueue` takes them: the host's with the page-locked staging they go up from
/// (2 n² float64).
enum Source<'a> {
    Host { cn: &'a [f64], cd: &'a [f64], up: &'a mut [f64] },
    Formed(Formed<'a>),
}

/// How the whitening A = L⁻¹ C_D L⁻ᵀ and the back-transform W = L⁻ᵀ V are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Whitening {
    /// L⁻¹ by our kernels and batched GEMMs, then three GEMMs (`whitening.rs`; up to
    /// `OwnEigen::MAX_BANDS` bands).
    Inverse,
    /// Three cuBLAS triangular solves.
    Triangular,
}

impl Whitening {
    pub fn label(self) -> &'static str {
        match self {
            Whitening::Inverse => "L⁻¹ and GEMMs",
            Whitening::Triangular => "triangular solves",
        }
    }
}

/// A solve's whitening with what it needs: L⁻¹'s kernels and scratch, or nothing.
enum Whiten<'a> {
    Inverse(&'a OwnEigen, &'a DevBuf),
    Triangular,
}

impl Solved {
    /// The answer as `mnf::eigen` takes it.
    fn into_solution(self) -> Solution {
        match self.ordered {
            true => Solution::Descending { ascending: self.values, transform: self.w },
            false => Solution::Unordered { values: self.values, w: self.w },
        }
    }

    /// W column-major with the eigenvalues ascending, as the solvers give it: `w` itself, or the
    /// ordered transform's columns put back (up to their signs).
    pub fn w_column_major(&self, n: usize) -> Vec<f64> {
        if !self.ordered {
            return self.w.clone();
        }
        let mut w = vec![0.0; n * n];
        for (r, row) in self.w.chunks_exact(n).enumerate() {
            for (c, &v) in row.iter().enumerate() {
                w[(n - 1 - c) * n + r] = v;
            }
        }
        w
    }
}

impl GeneralizedEigenSolver for DeviceEigen {
    fn name(&self) -> &'static str {
        "cuSOLVER potrf, whitening by L⁻¹ and cuBLAS GEMMs, the own kernels or syevd (device)"
    }
    fn solve(&self, cn: &[f64], cd: &[f64], n: usize) -> Result<(Vec<f64>, Vec<f64>), SolverError> {
        DeviceEigen::solve(self, cn, cd, n)
    }
    fn solve_ordered(&self, cn: &[f64], cd: &[f64], n: usize) -> Result<Solution, SolverError> {
        self.solve_job(cn, cd, n).map(Solved::into_solution)
    }
    fn takes(&self, n: usize) -> bool {
        n > HOST_FASTER_UP_TO
    }
}

/// Band counts up to which the host's faer solves the whole eigen step about as fast as the device
/// round trip or faster (`hypermnf bench eigen` on an H100, BENCHMARKS.md "Eigen": at 64 bands faer
/// took 0.26–0.63 ms over two calls and the device step with the cluster kernels 0.38–0.42; at 96
/// bands faer 0.67–1.65 ms and the device 0.55–0.64). Above 64 the device wins in every call measured.
const HOST_FASTER_UP_TO: usize = 64;

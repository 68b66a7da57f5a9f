//! The symmetric eigen step by kernels of our own (kernels/eigen.cu): Householder tridiagonalisation,
//! every eigenvalue by Sturm multisection, every eigenvector of the tridiagonal matrix by one twisted
//! factorisation, and the reflectors applied back, a panel of them at a time.
//!
//! The tridiagonalisation runs one of two ways ([`Tridiagonal`]):
//! - `OneBlock` (`EigenMethod::Own`): one thread block, the packed matrix in its shared memory up to
//!   238 bands on an H100 (an L2-resident scratch above); bound by one SM.
//! - `Cluster` (`EigenMethod::OwnCluster`, Hopper and later): a thread-block cluster of 16 blocks (8
//!   where 16 cannot be scheduled) with the matrix spread over their shared memory by columns; a step's
//!   vectors go to every block by asynchronous stores counted on the receiver's mbarrier.
//!
//! `EigenMethod::for_bands` picks between them and syevd per size and device, from `hypermnf bench
//! eigen` (BENCHMARKS.md, "Eigen").

use std::sync::Arc;

use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, LaunchConfig, PushKernelArg};

use super::compile;
use super::device::cuda;
use crate::backend::BackendError;

/// Threads of the tridiagonalisation's one block, warps (columns) a back-transform block takes and
/// reflectors it stages at a time: as `EIG_THREADS`, `EIG_BT_COLS` and `EIG_BT_PANEL` in
/// kernels/eigen.cu.
const TRIDIAG_THREADS: u32 = 1024;
const BACK_COLS: u32 = 8;
const BACK_PANEL: usize = 16;
/// Threads of each block of the cluster tridiagonalisation (`EIG_CL_THREADS`).
const CLUSTER_THREADS: u32 = 512;
/// Entries of a panel's Gram matrix that `eig_bt_gram` forms, a warp each (`EIG_BT_PAIRS`).
const GRAM_PAIRS: usize = BACK_PANEL * (BACK_PANEL - 1) / 2;
/// Threads of a block of the eigenvector kernel, two per vector (`EIG_VEC_THREADS`).
const VECTOR_THREADS: u32 = 8;

/// Dynamic shared memory of each vector of the eigenvector kernel at n bands: its pivots and
/// multipliers both ways, and five doubles (`eig_vec_stride`).
fn vector_shared_bytes(n: usize) -> usize {
    (4 * n + 5) * std::mem::size_of::<f64>()
}

/// Rows and columns of the diagonal blocks `eig_invert_leaves` inverts (`EIG_INV_LEAF`), its threads a
/// block (`EIG_INV_THREADS`) and its dynamic shared memory (`EIG_INV_SMEM`: the block and its inverse
/// with rows padded by one, the reciprocal diagonal).
pub(crate) const INVERSE_LEAF: usize = 64;
const INVERSE_THREADS: u32 = 256;
const INVERSE_SHARED: usize = (2 * INVERSE_LEAF * (INVERSE_LEAF + 1) + INVERSE_LEAF) * std::mem::size_of::<f64>();

/// How the tridiagonalisation runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tridiagonal {
    /// One block of 1024 threads (any device).
    OneBlock,
    /// One thread-block cluster (compute capability 9.0 and later).
    Cluster,
}

/// The kernels, loaded on one context.
pub(crate) struct OwnEigen {
    _module: Arc<CudaModule>,
    tridiagonalize: CudaFunction,
    /// The cluster tridiagonalisation, on devices that launch clusters.
    tridiagonalize_cluster: Option<CudaFunction>,
    gram: CudaFunction,
    bisect: CudaFunction,
    vectors: CudaFunction,
    back_transform: CudaFunction,
    /// The back-transform staging the next panel while it applies one, where its shared memory fits.
    back_transform_prefetch: CudaFunction,
    /// The whitening's triangular inverse (whitening.rs): L padded, its diagonal blocks inverted.
    lower_padded: CudaFunction,
    invert_leaves: CudaFunction,
    /// The pairs in the job's order and signs, row-major.
    column_signs: CudaFunction,
    order_transpose: CudaFunction,
    /// Dynamic shared memory a block may opt in to (bytes).
    smem_optin: usize,
    /// Whether the device schedules the cluster tridiagonalisation as clusters of 16 blocks.
    sixteen: bool,
}

/// Where one solve's scratch lies in the workspace (float64 offsets).
struct Scratch {
    packed: usize,
    d: usize,
    e: usize,
    tau: usize,
    gram: usize,
    len: usize,
}

impl Scratch {
    fn of(n: usize) -> Scratch {
        let packed = 0;
        let d = packed + n * (n + 1) / 2;
        let e = d + n;
        let tau = e + n;
        let gram = tau + n;
        Scratch { packed, d, e, tau, gram, len: gram + panels(n) * BACK_PANEL * BACK_PANEL }
    }
}

/// The back-transform's panels of reflectors at n bands.
fn panels(n: usize) -> usize {
    n.saturating_sub(2).div_ceil(BACK_PANEL)
}

impl OwnEigen {
    /// The largest problem the kernels take: the back-transform keeps 24 rows of n float64 in shared
    /// memory (194 KB at 1024 bands), the packed scratch's 32-bit indices stay far from overflow, and
    /// `eig_bisect` copies T into static shared memory of `EIG_MAX_N` = 1024 rows.
    pub(crate) const MAX_BANDS: usize = 1024;

    /// Compiles (or loads from the PTX cache) and loads kernels/eigen.cu on `ctx`.
    pub(crate) fn load(ctx: &Arc<CudaContext>) -> Result<OwnEigen, BackendError> {
        let (module, _) = compile::load_module(ctx, compile::Program::Eigen)?;
        let f = |name: &str| module.load_function(name).map_err(|e| BackendError::Cuda(format!("kernel {name}: {e}")));
        let smem_optin = ctx
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .map_err(cuda("cuDeviceGetAttribute"))?
            .max(0) as usize;
        // These kernels may take more than the default 48 KB of dynamic shared memory (all of the
        // opt-in: they have no static shared memory, which would count against it).
        let opt_in = |name: &str| -> Result<CudaFunction, BackendError> {
            let func = f(name)?;
            func.set_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem_optin as i32,
            )
            .map_err(cuda("cuFuncSetAttribute"))?;
            Ok(func)
        };
        let tridiagonalize = opt_in("eig_tridiagonalize")?;
        let back_transform = opt_in("eig_back_transform")?;
        let back_transform_prefetch = opt_in("eig_back_transform_prefetch")?;
        let invert_leaves = opt_in("eig_invert_leaves")?;
        let vectors = opt_in("eig_vectors")?;
        let (major, _) = ctx.compute_capability().map_err(cuda("cuDeviceGetAttribute"))?;
        let tridiagonalize_cluster = if major >= 9 {
            let func = opt_in("eig_tridiagonalize_cluster")?;
            // Clusters of 16 are beyond the portable size (8): the attribute allows them.
            func.set_attribute(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
                .map_err(cuda("cuFuncSetAttribute"))?;
            Some(func)
        } else {
            None
        };
        // Clusters of 16 at the largest size the job's pick gives them (425 bands: 106 KB a block).
        let sixteen = tridiagonalize_cluster.as_ref().is_some_and(|func| {
            // SAFETY: a loaded function; the query launches nothing.
            unsafe { clusters_fit(ctx, func, 16, CLUSTER_THREADS, Self::cluster_shared_bytes(425, 16)) }
        });
        Ok(OwnEigen {
            tridiagonalize,
            tridiagonalize_cluster,
            sixteen,
            gram: f("eig_bt_gram")?,
            bisect: f("eig_bisect")?,
            vectors,
            back_transform,
            back_transform_prefetch,
            lower_padded: f("eig_lower_padded")?,
            invert_leaves,
            column_signs: f("eig_column_signs")?,
            order_transpose: f("eig_order_transpose")?,
            smem_optin,
            _module: module,
        })
    }

    /// Device workspace of a solve at n bands, in bytes.
    pub(crate) fn workspace_bytes(n: usize) -> usize {
        Scratch::of(n).len * std::mem::size_of::<f64>()
    }

    /// Whether the packed matrix of n bands fits the tridiagonalisation block's shared memory (with
    /// the reflector, the product and two scalars beside it).
    fn in_shared(&self, n: usize) -> bool {
        Self::shared_bytes(n, true) <= self.smem_optin
    }

    fn shared_bytes(n: usize, packed: bool) -> usize {
        (2 * n + 2 + if packed { n * (n + 1) / 2 } else { 0 }) * std::mem::size_of::<f64>()
    }

    /// Shared memory of each block of a cluster of `c` at n bands: its columns, the two vectors the
    /// blocks write into each other (p and the next column, two slots each), the reflectors of two
    /// steps, two taus, and an mbarrier (8 bytes) for each slot.
    fn cluster_shared_bytes(n: usize, c: usize) -> usize {
        let cols = n.div_ceil(c);
        (cols * n + 6 * n + 2 + 2) * std::mem::size_of::<f64>()
    }

    /// The cluster size the cluster tridiagonalisation takes at n bands: 16 blocks where the device
    /// schedules clusters of 16 (beyond the portable 8; on an H200 16 were 4–8 % faster than 8 at 224
    /// and 425 bands, and equal at 128), else 8; None where their shared memory cannot hold the
    /// matrix or the device launches no clusters.
    pub(crate) fn cluster_size(&self, n: usize) -> Option<usize> {
        self.tridiagonalize_cluster.as_ref()?;
        let sizes: &[usize] = if self.sixteen { &[16, 8] } else { &[8] };
        sizes.iter().copied().find(|&c| Self::cluster_shared_bytes(n, c) <= self.smem_optin)
    }

    /// Queues the solve of the n × n matrix at `a` (lower triangle read; overwritten by V, column-
    /// major), the eigenvalues ascending to `w`, on `stream`.
    ///
    /// # Safety
    /// `a` (n² float64), `w` (n) and `work` (`workspace_bytes(n)`) are device allocations of this
    /// module's context that stay alive, and are touched by nothing else, until `stream` has run
    /// the kernels.
    pub(crate) unsafe fn enqueue(&self, stream: &CudaStream, n: usize, a: u64, w: u64, work: u64, how: Tridiagonal) -> Result<(), BackendError> {
        if n == 0 || n > Self::MAX_BANDS {
            return Err(BackendError::Invalid(format!("the own eigen kernels take 1 to {} bands, not {n}", Self::MAX_BANDS)));
        }
        let s = Scratch::of(n);
        let at = |off: usize| work + (off * std::mem::size_of::<f64>()) as u64;
        let (packed, d, e, tau, gram) = (at(s.packed), at(s.d), at(s.e), at(s.tau), at(s.gram));
        // Four vectors a block (VECTOR_THREADS), fewer where their shared memory does not fit (1024
        // bands: 131 KB for four).
        let per_vector = vector_shared_bytes(n);
        let vectors_a_block = (VECTOR_THREADS as usize / 2).min(self.smem_optin / per_vector);
        if vectors_a_block == 0 {
            return Err(BackendError::Invalid(format!("the own eigenvector kernel needs {per_vector} bytes of shared memory at {n} bands")));
        }
        let ni = n as i32;
        let shared = self.in_shared(n);
        let in_shared = i32::from(shared);
        let cfg = |blocks: usize, threads: u32, smem: usize| LaunchConfig {
            grid_dim: (blocks.max(1) as u32, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        // The cluster kernel takes n ≥ 3, the one block any n: a guard for smaller n inside the
        // cluster kernel, ahead of its barriers, made an nvcc build of it 6–16 % slower a step (40
        // registers and a stack frame instead of 60 registers; H200, 2026-11-29).
        let how = if n < 3 { Tridiagonal::OneBlock } else { how };
        // SAFETY (each launch): the parameters are those of the kernel in kernels/eigen.cu, in order
        // (device pointers as u64, int as i32); every pointer lies in the allocations the caller
        // vouches for, sized by `Scratch::of(n)`; the dynamic shared memory is what the kernel indexes
        // (the tridiagonalisation's and the eigenvectors' within the opt-in set at load).
        match how {
            Tridiagonal::OneBlock => {
                let mut b = stream.launch_builder(&self.tridiagonalize);
                b.arg(&a).arg(&ni).arg(&packed).arg(&in_shared).arg(&d).arg(&e).arg(&tau);
                unsafe { b.launch(cfg(1, TRIDIAG_THREADS, Self::shared_bytes(n, shared))) }.map_err(cuda("eig_tridiagonalize"))?;
            }
            Tridiagonal::Cluster => {
                let (Some(func), Some(c)) = (&self.tridiagonalize_cluster, self.cluster_size(n)) else {
                    return Err(BackendError::Invalid(format!("no cluster tridiagonalisation on this device at {n} bands")));
                };
                // SAFETY: as above; the arguments are eig_tridiagonalize_cluster's, in order.
                unsafe { launch_cluster(stream, func, c as u32, CLUSTER_THREADS, Self::cluster_shared_bytes(n, c), &[a, packed, d, e, tau], ni) }
                    .map_err(cuda("eig_tridiagonalize_cluster"))?;
            }
        }
        let mut b = stream.launch_builder(&self.bisect);
        b.arg(&d).arg(&e).arg(&ni).arg(&w);
        unsafe { b.launch(cfg((n * 32).div_ceil(128), 128, 0)) }.map_err(cuda("eig_bisect"))?;
        let mut b = stream.launch_builder(&self.vectors);
        b.arg(&d).arg(&e).arg(&w).arg(&ni).arg(&a);
        unsafe { b.launch(cfg(n.div_ceil(vectors_a_block), 2 * vectors_a_block as u32, vectors_a_block * per_vector)) }
            .map_err(cuda("eig_vectors"))?;
        if panels(n) == 0 {
            return Ok(()); // n ≤ 2: T is A, no reflectors to apply
        }
        let mut b = stream.launch_builder(&self.gram);
        b.arg(&packed).arg(&ni).arg(&gram);
        unsafe { b.launch(cfg((panels(n) * GRAM_PAIRS * 32).div_ceil(128), 128, 0)) }.map_err(cuda("eig_bt_gram"))?;
        // Two panel buffers where they fit (up to ~700 bands on an H100), else one.
        let back_smem = |buffers: usize| (BACK_COLS as usize * n + buffers * (BACK_PANEL * n + BACK_PANEL * BACK_PANEL + BACK_PANEL)) * std::mem::size_of::<f64>();
        let (func, back_smem) = match (back_smem(2), back_smem(1)) {
            (two, _) if two <= self.smem_optin => (&self.back_transform_prefetch, two),
            (_, one) if one <= self.smem_optin => (&self.back_transform, one),
            (_, one) => return Err(BackendError::Invalid(format!("the own eigen back-transform needs {one} bytes of shared memory at {n} bands"))),
        };
        let mut b = stream.launch_builder(func);
        b.arg(&packed).arg(&tau).arg(&gram).arg(&ni).arg(&a);
        unsafe { b.launch(cfg(n.div_ceil(BACK_COLS as usize), BACK_COLS * 32, back_smem)) }.map_err(cuda("eig_back_transform"))?;
        Ok(())
    }
}

impl OwnEigen {
    /// Queues lp (p × p, column-major) = L's lower triangle (l: n × n, column-major) padded with the
    /// identity to p, then each `INVERSE_LEAF`² diagonal block of lp inverted in place.
    ///
    /// # Safety
    /// `l` (n² float64) and `lp` (p² float64) are device allocations of this module's context that
    /// stay alive, and are touched by nothing else, until `stream` has run the kernels.
    pub(crate) unsafe fn enqueue_inverted_leaves(&self, stream: &CudaStream, n: usize, l: u64, p: usize, lp: u64) -> Result<(), BackendError> {
        if n == 0 || n > p || p % INVERSE_LEAF != 0 || p > Self::MAX_BANDS * 2 {
            return Err(BackendError::Invalid(format!("cannot pad {n} bands to {p}")));
        }
        if INVERSE_SHARED > self.smem_optin {
            return Err(BackendError::Invalid(format!("the triangular inverse needs {INVERSE_SHARED} bytes of shared memory a block")));
        }
        let (ni, pi) = (n as i32, p as i32);
        let cfg = |blocks: usize, threads: u32, smem: usize| LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        // SAFETY (both): the parameters are those of the kernels in kernels/eigen.cu, in order; the
        // pointers lie in the allocations the caller vouches for; eig_invert_leaves's dynamic shared
        // memory is INVERSE_SHARED (within the opt-in set at load).
        let mut b = stream.launch_builder(&self.lower_padded);
        b.arg(&l).arg(&ni).arg(&pi).arg(&lp);
        unsafe { b.launch(cfg((p * p).div_ceil(256), 256, 0)) }.map_err(cuda("eig_lower_padded"))?;
        let mut b = stream.launch_builder(&self.invert_leaves);
        b.arg(&lp).arg(&pi);
        unsafe { b.launch(cfg(p / INVERSE_LEAF, INVERSE_THREADS, INVERSE_SHARED)) }.map_err(cuda("eig_invert_leaves"))?;
        Ok(())
    }
}

impl OwnEigen {
    /// Queues `out` (n × n, row-major) = W's columns (`w`: n × n, column-major, the eigenvalues
    /// ascending) in descending order of the eigenvalue, each signed so that its largest-magnitude
    /// loading is positive (mnf::eigen's convention), through `signs` (n float64 of scratch).
    ///
    /// # Safety
    /// `w`, `out` (n² float64, not overlapping) and `signs` (n) are device allocations of this module's
    /// context that stay alive, and are touched by nothing else, until `stream` has run the kernels.
    pub(crate) unsafe fn enqueue_ordered(&self, stream: &CudaStream, n: usize, w: u64, signs: u64, out: u64) -> Result<(), BackendError> {
        if n == 0 || n > Self::MAX_BANDS {
            return Err(BackendError::Invalid(format!("the ordering kernels take 1 to {} bands, not {n}", Self::MAX_BANDS)));
        }
        let ni = n as i32;
        let tiles = n.div_ceil(32) as u32;
        // SAFETY (both): the parameters are those of the kernels in kernels/eigen.cu, in order; the
        // pointers lie in the allocations the caller vouches for.
        let mut b = stream.launch_builder(&self.column_signs);
        b.arg(&w).arg(&ni).arg(&signs);
        let cfg = LaunchConfig { grid_dim: ((n * 32).div_ceil(128) as u32, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
        unsafe { b.launch(cfg) }.map_err(cuda("eig_column_signs"))?;
        let mut b = stream.launch_builder(&self.order_transpose);
        b.arg(&w).arg(&signs).arg(&ni).arg(&out);
        let cfg = LaunchConfig { grid_dim: (tiles, tiles, 1), block_dim: (32, 8, 1), shared_mem_bytes: 0 };
        unsafe { b.launch(cfg) }.map_err(cuda("eig_order_transpose"))?;
        Ok(())
    }
}

/// Launches `func` as one cluster of `blocks` blocks (cuLaunchKernelEx with a cluster dimension) with
/// the kernel arguments (a, n, then the other pointers): `ptrs` = [a, packed, d, e, tau].
///
/// # Safety
/// As for any launch: the arguments match the kernel's parameters and the pointers stay valid until
/// `stream` has run it.
unsafe fn launch_cluster(stream: &CudaStream, func: &CudaFunction, blocks: u32, threads: u32, smem: usize, ptrs: &[u64; 5], n: i32) -> Result<(), cudarc::driver::DriverError> {
    let mut attr = cluster_dimension(blocks);
    let cfg = cluster_config(blocks, threads, smem, stream.cu_stream(), &mut attr);
    let [mut a, mut packed, mut d, mut e, mut tau] = *ptrs;
    let mut n = n;
    let mut params: [*mut std::ffi::c_void; 6] = [
        &mut a as *mut u64 as *mut _,
        &mut n as *mut i32 as *mut _,
        &mut packed as *mut u64 as *mut _,
        &mut d as *mut u64 as *mut _,
        &mut e as *mut u64 as *mut _,
        &mut tau as *mut u64 as *mut _,
    ];
    // SAFETY: cfg and params point to locals alive for the call; the driver copies the arguments.
    unsafe { sys::cuLaunchKernelEx(&cfg, func.cu_function(), params.as_mut_ptr(), std::ptr::null_mut()) }.result()
}

/// Whether the device can run at least one cluster of `blocks` blocks of `func` at once
/// (cuOccupancyMaxActiveClusters; false where the query fails).
///
/// # Safety
/// `func` is a function of a module loaded on `ctx`.
unsafe fn clusters_fit(ctx: &Arc<CudaContext>, func: &CudaFunction, blocks: u32, threads: u32, smem: usize) -> bool {
    if ctx.bind_to_thread().is_err() {
        return false;
    }
    let mut attr = cluster_dimension(blocks);
    let cfg = cluster_config(blocks, threads, smem, std::ptr::null_mut(), &mut attr);
    let mut clusters = 0i32;
    // SAFETY: cfg and its attribute are locals alive for the call; out-pointer to a local.
    let ok = unsafe { sys::cuOccupancyMaxActiveClusters(&mut clusters, func.cu_function(), &cfg) } == sys::CUresult::CUDA_SUCCESS;
    ok && clusters > 0
}

/// The launch attribute of a cluster of `blocks` blocks in x.
fn cluster_dimension(blocks: u32) -> sys::CUlaunchAttribute {
    // SAFETY: the attribute value is a plain C union; all zeros is a valid bit pattern for it.
    let mut value: sys::CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
    value.clusterDim = sys::CUlaunchAttributeValue_union__bindgen_ty_1 { x: blocks, y: 1, z: 1 };
    sys::CUlaunchAttribute { id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, pad: [0; 4], value }
}

/// A one-dimensional launch of one cluster of `blocks` blocks on `stream`; the configuration points to
/// `attr`, which must outlive its use.
fn cluster_config(blocks: u32, threads: u32, smem: usize, stream: sys::CUstream, attr: &mut sys::CUlaunchAttribute) -> sys::CUlaunchConfig {
    sys::CUlaunchConfig {
        gridDimX: blocks,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: threads,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: smem as u32,
        hStream: stream,
        attrs: attr,
        numAttrs: 1,
    }
}

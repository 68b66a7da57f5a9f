//! The GPU table: owns its CUDA context handle and the kernels of `kernels/hashtable/`, compiled
//! once per process with NVRTC for compute capability 9.0 (the 128-bit atomicCAS needs sm_90).
//!
//! Creating a table on a machine without a usable GPU returns [`HashTableError::NoDevice`] (or
//! `OldDevice`); it never panics: cudarc loads libcuda/libnvrtc dynamically and panics when they
//! are missing, so their presence is checked first and the whole start is run under
//! `catch_unwind`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, OnceLock};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, CudaView, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::{CompileOptions, Ptx};

use super::{
    check_insert_batch, check_key, status, EraseOutcome, Geometry, HashTableError, InsertOutcome, Op, OpResult,
    BUCKET_CELLS,
};

/// The table's kernels; `hypermnf bench hashtable` compiles its own kernels appended to it
/// (src/bench/hashtable/kernels.rs).
pub(crate) const SOURCE: &str = concat!(
    include_str!("../../kernels/hashtable/table.cuh"),
    include_str!("../../kernels/hashtable/group_ops.cuh"),
    include_str!("../../kernels/hashtable/batch.cu"),
);

/// Threads per block of every launch (a multiple of the 32-lane warp, which the groups of 4 need).
pub(crate) const BLOCK: u32 = 256;

/// Mixed-kernel operation codes (kernels/hashtable/table.cuh `OP_*`).
pub(crate) const OP_FIND: u32 = 0;
pub(crate) const OP_INSERT: u32 = 1;
pub(crate) const OP_ERASE: u32 = 2;

pub(crate) fn drv<E: std::fmt::Debug>(e: E) -> HashTableError {
    HashTableError::Driver(format!("{e:?}"))
}

/// Most operations per thread in a tile of `ht_insert_rest` (kernels/hashtable/batch.cu
/// `REST_MAX_PER_THREAD`).
const REST_MAX_PER_THREAD: u64 = 32;
/// Blocks that `ht_insert_rest` aims for: tiles grow (up to 32 operations per thread) only once a
/// batch has more than this many blocks' worth, so small batches still spread over every SM.
const REST_BLOCKS: u64 = 1024;

/// Launches an insert-only batch of `keys.len()` operations on `stream`: `ht_insert` (every insert
/// that needs no lock) and then `ht_insert_rest` (what it left, found by status: lost CAS races and
/// evictions). The caller has checked the batch (lengths, reserved keys).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_insert_only(
    dev: &Device,
    stream: &Arc<CudaStream>,
    cells: &mut CudaSlice<u64>,
    bucket_mask: u64,
    keys: &CudaView<u64>,
    vals: &CudaView<u64>,
    clk: u32,
    status: &mut CudaSlice<u32>,
    out_key: &mut CudaSlice<u64>,
    out_val: &mut CudaSlice<u64>,
) -> Result<(), HashTableError> {
    let n = keys.len() as u64;
    let mut b = stream.launch_builder(&dev.k.ht_insert);
    b.arg(&mut *cells)
        .arg(&bucket_mask)
        .arg(keys)
        .arg(vals)
        .arg(&n)
        .arg(&clk)
        .arg(&mut *status)
        .arg(&mut *out_key)
        .arg(&mut *out_val);
    // SAFETY: arguments match ht_insert's signature; keys, vals, status, out_key and out_val hold n
    // elements.
    unsafe { b.launch(cfg(n)) }.map_err(drv)?;
    let per_thread = n.div_ceil(BLOCK as u64 * REST_BLOCKS).clamp(1, REST_MAX_PER_THREAD);
    let tile = BLOCK as u64 * per_thread;
    let per_thread = per_thread as u32;
    let mut b = stream.launch_builder(&dev.k.ht_insert_rest);
    b.arg(&mut *cells)
        .arg(&bucket_mask)
        .arg(keys)
        .arg(vals)
        .arg(&n)
        .arg(&clk)
        .arg(&mut *status)
        .arg(&mut *out_key)
        .arg(&mut *out_val)
        .arg(&per_thread);
    let mut c = cfg(n);
    c.grid_dim.0 = n.div_ceil(tile).clamp(1, 2 * REST_BLOCKS) as u32;
    // SAFETY: as above (the kernel needs BLOCK = 256 threads per block, which cfg gives).
    unsafe { b.launch(c) }.map_err(drv)?;
    Ok(())
}

/// One thread per item.
pub(crate) fn cfg(n: u64) -> LaunchConfig {
    let blocks = n.div_ceil(BLOCK as u64).max(1);
    LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The CUDA context, stream and kernels shared by every table of the process.
pub struct Device {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    _module: Arc<CudaModule>,
    pub(crate) k: Kernels,
    /// The NVRTC options `kernels/hashtable/` was compiled with (development knobs included).
    pub(crate) options: Vec<String>,
    name: String,
}

pub(crate) struct Kernels {
    pub ht_insert: CudaFunction,
    pub ht_insert_rest: CudaFunction,
    pub ht_find: CudaFunction,
    pub ht_erase: CudaFunction,
    pub ht_mixed: CudaFunction,
    pub ht_audit: CudaFunction,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device").field("name", &self.name).finish()
    }
}

impl Device {
    /// The process-wide device 0 with the kernels loaded; the first call compiles them.
    pub fn shared() -> Result<Arc<Device>, HashTableError> {
        static SHARED: OnceLock<Result<Arc<Device>, String>> = OnceLock::new();
        SHARED
            .get_or_init(|| match catch_unwind(AssertUnwindSafe(Self::open)) {
                Ok(Ok(d)) => Ok(Arc::new(d)),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => {
                    Err("no usable CUDA device: the CUDA libraries could not be loaded".into())
                }
            })
            .clone()
            .map_err(HashTableError::NoDevice)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    fn open() -> Result<Device, HashTableError> {
        // SAFETY: only tries to dlopen the libraries.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(HashTableError::NoDevice(
                "libcuda (the NVIDIA driver) is not installed".into(),
            ));
        }
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(HashTableError::NoDevice(
                "libnvrtc (CUDA's run-time compiler) is not installed".into(),
            ));
        }
        let count =
            CudaContext::device_count().map_err(|e| HashTableError::NoDevice(format!("{e:?}")))?;
        if count < 1 {
            return Err(HashTableError::NoDevice(
                "the driver reports no CUDA device".into(),
            ));
        }
        let ctx = CudaContext::new(0).map_err(|e| HashTableError::NoDevice(format!("{e:?}")))?;
        let (major, minor) = ctx.compute_capability().map_err(drv)?;
        if major < 9 {
            return Err(HashTableError::OldDevice(major, minor));
        }
        let options = {
            let mut o = base_options();
            // Development knob: resident blocks per SM the batch kernels ask for (HT_BOUNDS).
            if let Some(n) = std::env::var("HYPERMNF_HT_MIN_BLOCKS").ok().and_then(|v| v.trim().parse::<u32>().ok()).filter(|&n| (1..=8).contains(&n)) {
                o.push(format!("-DHT_MIN_BLOCKS={n}"));
            }
            // Development knob: extra `-DNAME[=VALUE]` switches for kernel experiments on the GPU
            // host, which has no Rust toolchain to rebuild with (anything else is left out, loudly).
            if let Ok(v) = std::env::var("HYPERMNF_HT_DEFINES") {
                for d in v.split_whitespace() {
                    if is_define(d) {
                        tracing::warn!("hash-table kernels compiled with {d} (HYPERMNF_HT_DEFINES)");
                        o.push(d.to_string());
                    } else {
                        tracing::warn!("HYPERMNF_HT_DEFINES: {d:?} left out (only -DNAME or -DNAME=VALUE)");
                    }
                }
            }
            o
        };
        let ptx = compile(SOURCE, "hashtable.cu", options.clone()).map_err(HashTableError::Compile)?;
        let module = ctx.load_module(ptx).map_err(drv)?;
        let f = |name: &str| module.load_function(name).map_err(drv);
        let k = Kernels {
            ht_insert: f("ht_insert")?,
            ht_insert_rest: f("ht_insert_rest")?,
            ht_find: f("ht_find")?,
            ht_erase: f("ht_erase")?,
            ht_mixed: f("ht_mixed")?,
            ht_audit: f("ht_audit")?,
        };
        let name = ctx.name().unwrap_or_else(|_| "unknown CUDA device".into());
        let stream = ctx.default_stream();
        Ok(Device {
            ctx,
            stream,
            _module: module,
            k,
            options,
            name,
        })
    }

    /// Free and total device memory in bytes.
    pub fn mem_info(&self) -> Result<(u64, u64), HashTableError> {
        let (free, total) = self.ctx.mem_get_info().map_err(drv)?;
        Ok((free as u64, total as u64))
    }
}

/// NVRTC options of `kernels/hashtable/` without the development knobs: the 128-bit integers of
/// the 128-bit atomicCAS, C++17.
pub(crate) fn base_options() -> Vec<String> {
    vec!["--device-int128".to_string(), "-std=c++17".to_string()]
}

/// PTX of `source` (called `name` in NVRTC's messages) for compute capability 9.0; an error is
/// NVRTC's log.
pub(crate) fn compile(source: &str, name: &str, options: Vec<String>) -> Result<Ptx, String> {
    let opts = CompileOptions {
        arch: Some("compute_90"),
        options,
        name: Some(name.into()),
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(source, opts).map_err(|e| match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
        other => format!("{other:?}"),
    })
}

/// `-DNAME` or `-DNAME=VALUE` with a C identifier and a plain value: what HYPERMNF_HT_DEFINES may pass on.
fn is_define(d: &str) -> bool {
    let Some(body) = d.strip_prefix("-D") else { return false };
    let (name, value) = body.split_once('=').unwrap_or((body, "0"));
    let ident = |s: &str| {
        s.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    ident(name) && !value.is_empty() && value.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Results of a batch as the kernels write them.
pub(crate) struct RawResults {
    pub status: Vec<u32>,
    pub out_key: Vec<u64>,
    pub out_val: Vec<u64>,
}

/// The GPU hash table (see the module doc of [`crate::hashtable`]).
pub struct GpuHashTable {
    dev: Arc<Device>,
    geometry: Geometry,
    /// Two `u64` per 16-byte cell.
    cells: CudaSlice<u64>,
    clock: u32,
}

impl std::fmt::Debug for GpuHashTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuHashTable")
            .field("device", &self.dev.name)
            .field("geometry", &self.geometry)
            .finish()
    }
}

impl GpuHashTable {
    /// A table of `cells` 16-byte cells on device 0.
    pub fn new(cells: u64) -> Result<Self, HashTableError> {
        Self::with_device(Device::shared()?, cells)
    }

    pub fn with_device(dev: Arc<Device>, cells: u64) -> Result<Self, HashTableError> {
        let geometry = Geometry::new(cells)?;
        let (free, _) = dev.mem_info()?;
        if geometry.bytes() > free {
            return Err(HashTableError::OutOfDeviceMemory {
                need: geometry.bytes(),
                free,
            });
        }
        let cells = dev
            .stream
            .alloc_zeros::<u64>(2 * cells as usize)
            .map_err(drv)?;
        Ok(Self {
            dev,
            geometry,
            cells,
            clock: 0,
        })
    }

    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    pub fn device(&self) -> &Arc<Device> {
        &self.dev
    }

    pub fn clock(&self) -> u32 {
        self.clock
    }

    pub(crate) fn cells_mut(&mut self) -> &mut CudaSlice<u64> {
        &mut self.cells
    }

    /// Advances the LRU clock by one batch and returns it.
    pub(crate) fn next_clock(&mut self) -> u32 {
        self.clock = self.clock.wrapping_add(1);
        self.clock
    }

    /// Empties the table (overflow bits and stamps included); the clock keeps running.
    pub fn clear(&mut self) -> Result<(), HashTableError> {
        self.dev.stream.memset_zeros(&mut self.cells).map_err(drv)?;
        self.dev.stream.synchronize().map_err(drv)
    }

    /// All cells as `[key, value]` (cell 0 of each bucket is the metadata).
    pub fn dump(&self) -> Result<Vec<[u64; 2]>, HashTableError> {
        let raw = self.dev.stream.clone_dtoh(&self.cells).map_err(drv)?;
        Ok(raw.chunks_exact(2).map(|c| [c[0], c[1]]).collect())
    }

    /// (keys stored twice or outside their buckets, occupied slots), counted on the device.
    pub fn audit(&self) -> Result<(u64, u64), HashTableError> {
        let s = &self.dev.stream;
        let mut counters = s.alloc_zeros::<u64>(2).map_err(drv)?;
        let mask = self.geometry.bucket_mask();
        let nb = self.geometry.buckets();
        let mut b = s.launch_builder(&self.dev.k.ht_audit);
        b.arg(&self.cells).arg(&mask).arg(&nb).arg(&mut counters);
        // SAFETY: arguments match ht_audit's signature; counters has 2 elements.
        unsafe { b.launch(cfg(self.geometry.cells())) }.map_err(drv)?;
        let c = s.clone_dtoh(&counters).map_err(drv)?;
        Ok((c[0], c[1]))
    }

    pub fn insert(&mut self, key: u64, value: u64) -> Result<InsertOutcome, HashTableError> {
        Ok(self.insert_batch(&[key], &[value])?[0])
    }

    pub fn find(&mut self, key: u64, touch: bool) -> Result<Option<u64>, HashTableError> {
        Ok(self.find_batch(&[key], touch)?[0])
    }

    pub fn erase(&mut self, key: u64) -> Result<EraseOutcome, HashTableError> {
        Ok(self.erase_batch(&[key])?[0])
    }

    /// Insert-or-assign a batch, concurrently on the device (one clock tick).
    pub fn insert_batch(
        &mut self,
        keys: &[u64],
        values: &[u64],
    ) -> Result<Vec<InsertOutcome>, HashTableError> {
        if keys.len() != values.len() {
            return Err(HashTableError::LengthMismatch {
                keys: keys.len(),
                values: values.len(),
            });
        }
        let ops: Vec<Op> = keys
            .iter()
            .zip(values)
            .map(|(&k, &v)| Op::Insert(k, v))
            .collect();
        self.mixed(&ops, false)?
            .into_iter()
            .map(|r| match r {
                OpResult::Insert(o) => Ok(o),
                _ => Err(HashTableError::BadStatus(u32::MAX)),
            })
            .collect()
    }

    /// Insert-or-assign a batch through the insert-only kernels (one clock tick, [`launch_insert_only`]):
    /// lock-free for keys that are present or fit into one of their buckets, the lock only for
    /// evictions and lost races. Same outcomes as [`Self::insert_batch`] (sequentially the same as the
    /// CPU twin's); the lock-free paths rely on no erase running during the kernels, which holds
    /// because every kernel of a table is launched on the device's one stream.
    pub fn insert_only_batch(
        &mut self,
        keys: &[u64],
        values: &[u64],
    ) -> Result<Vec<InsertOutcome>, HashTableError> {
        check_insert_batch(keys, values)?;
        let clk = self.next_clock();
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let s = self.dev.stream.clone();
        let d_keys = s.clone_htod(keys).map_err(drv)?;
        let d_vals = s.clone_htod(values).map_err(drv)?;
        let mut d_status = s.alloc_zeros::<u32>(keys.len()).map_err(drv)?;
        let mut d_okey = s.alloc_zeros::<u64>(keys.len()).map_err(drv)?;
        let mut d_oval = s.alloc_zeros::<u64>(keys.len()).map_err(drv)?;
        launch_insert_only(
            &self.dev,
            &s,
            &mut self.cells,
            self.geometry.bucket_mask(),
            &d_keys.as_view(),
            &d_vals.as_view(),
            clk,
            &mut d_status,
            &mut d_okey,
            &mut d_oval,
        )?;
        let st = s.clone_dtoh(&d_status).map_err(drv)?;
        let okey = s.clone_dtoh(&d_okey).map_err(drv)?;
        let oval = s.clone_dtoh(&d_oval).map_err(drv)?;
        keys.iter()
            .zip(values)
            .enumerate()
            .map(|(i, (&k, &v))| match decode(&Op::Insert(k, v), st[i], okey[i], oval[i])? {
                OpResult::Insert(o) => Ok(o),
                _ => Err(HashTableError::BadStatus(st[i])),
            })
            .collect()
    }

    /// Insert-or-assign one key through `ht_insert` (see [`Self::insert_only_batch`]).
    pub fn insert_only(&mut self, key: u64, value: u64) -> Result<InsertOutcome, HashTableError> {
        Ok(self.insert_only_batch(&[key], &[value])?[0])
    }

    /// Look up a batch; `touch` refreshes the LRU stamps of hits (cache lookups).
    pub fn find_batch(
        &mut self,
        keys: &[u64],
        touch: bool,
    ) -> Result<Vec<Option<u64>>, HashTableError> {
        keys.iter()
            .enumerate()
            .try_for_each(|(i, &k)| check_key(i, k))?;
        if keys.is_empty() {
            self.next_clock();
            return Ok(Vec::new());
        }
        let clk = self.next_clock();
        let s = self.dev.stream.clone();
        let n = keys.len() as u64;
        let d_keys = s.clone_htod(keys).map_err(drv)?;
        let mut d_status = s.alloc_zeros::<u32>(keys.len()).map_err(drv)?;
        let mut d_val = s.alloc_zeros::<u64>(keys.len()).map_err(drv)?;
        let mask = self.geometry.bucket_mask();
        let touch = touch as u32;
        let mut b = s.launch_builder(&self.dev.k.ht_find);
        b.arg(&mut self.cells)
            .arg(&mask)
            .arg(&d_keys)
            .arg(&n)
            .arg(&clk)
            .arg(&touch)
            .arg(&mut d_status)
            .arg(&mut d_val);
        // SAFETY: arguments match ht_find's signature; every array holds n elements.
        unsafe { b.launch(cfg(n)) }.map_err(drv)?;
        let st = s.clone_dtoh(&d_status).map_err(drv)?;
        let val = s.clone_dtoh(&d_val).map_err(drv)?;
        st.iter()
            .zip(val)
            .map(|(&st, v)| match st {
                status::FOUND => Ok(Some(v)),
                status::MISS => Ok(None),
                other => Err(HashTableError::BadStatus(other)),
            })
            .collect()
    }

    pub fn erase_batch(&mut self, keys: &[u64]) -> Result<Vec<EraseOutcome>, HashTableError> {
        let ops: Vec<Op> = keys.iter().map(|&k| Op::Erase(k)).collect();
        self.mixed(&ops, false)?
            .into_iter()
            .map(|r| match r {
                OpResult::Erase(o) => Ok(o),
                _ => Err(HashTableError::BadStatus(u32::MAX)),
            })
            .collect()
    }

    /// A batch of interleaved finds, inserts and erases, run concurrently on the device.
    pub fn mixed(&mut self, ops: &[Op], touch: bool) -> Result<Vec<OpResult>, HashTableError> {
        ops.iter()
            .enumerate()
            .try_for_each(|(i, op)| check_key(i, op.key()))?;
        let clk = self.next_clock();
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        let codes: Vec<u32> = ops
            .iter()
            .map(|op| match op {
                Op::Find(_) => OP_FIND,
                Op::Insert(..) => OP_INSERT,
                Op::Erase(_) => OP_ERASE,
            })
            .collect();
        let keys: Vec<u64> = ops.iter().map(Op::key).collect();
        let vals: Vec<u64> = ops
            .iter()
            .map(|op| if let Op::Insert(_, v) = op { *v } else { 0 })
            .collect();
        let raw = self.launch_mixed(&codes, &keys, &vals, clk, touch)?;
        ops.iter()
            .enumerate()
            .map(|(i, op)| decode(op, raw.status[i], raw.out_key[i], raw.out_val[i]))
            .collect()
    }

    fn launch_mixed(
        &mut self,
        codes: &[u32],
        keys: &[u64],
        vals: &[u64],
        clk: u32,
        touch: bool,
    ) -> Result<RawResults, HashTableError> {
        let s = self.dev.stream.clone();
        let n = keys.len() as u64;
        let d_ops = s.clone_htod(codes).map_err(drv)?;
        let d_keys = s.clone_htod(keys).map_err(drv)?;
        let d_vals = s.clone_htod(vals).map_err(drv)?;
        let mut d_status = s.alloc_zeros::<u32>(keys.len()).map_err(drv)?;
        let mut d_okey = s.alloc_zeros::<u64>(keys.len()).map_err(drv)?;
        let mut d_oval = s.alloc_zeros::<u64>(keys.len()).map_err(drv)?;
        let mask = self.geometry.bucket_mask();
        let touch = touch as u32;
        let mut b = s.launch_builder(&self.dev.k.ht_mixed);
        b.arg(&mut self.cells)
            .arg(&mask)
            .arg(&d_ops)
            .arg(&d_keys)
            .arg(&d_vals)
            .arg(&n)
            .arg(&clk)
            .arg(&touch)
            .arg(&mut d_status)
            .arg(&mut d_okey)
            .arg(&mut d_oval);
        // SAFETY: arguments match ht_mixed's signature; every array holds n elements.
        unsafe { b.launch(cfg(n)) }.map_err(drv)?;
        Ok(RawResults {
            status: s.clone_dtoh(&d_status).map_err(drv)?,
            out_key: s.clone_dtoh(&d_okey).map_err(drv)?,
            out_val: s.clone_dtoh(&d_oval).map_err(drv)?,
        })
    }
}

fn decode(op: &Op, st: u32, okey: u64, oval: u64) -> Result<OpResult, HashTableError> {
    Ok(match (op, st) {
        (Op::Find(_), status::FOUND) => OpResult::Find(Some(oval)),
        (Op::Find(_), status::MISS) => OpResult::Find(None),
        (Op::Insert(..), status::INSERTED) => OpResult::Insert(InsertOutcome::Inserted),
        (Op::Insert(..), status::UPDATED) => OpResult::Insert(InsertOutcome::Updated { old: oval }),
        (Op::Insert(..), status::EVICTED) => OpResult::Insert(InsertOutcome::Evicted {
            key: okey,
            value: oval,
        }),
        (Op::Insert(..), status::FAILED) => OpResult::Insert(InsertOutcome::Failed),
        (Op::Erase(_), status::ERASED) => OpResult::Erase(EraseOutcome::Erased { value: oval }),
        (Op::Erase(_), status::MISS) => OpResult::Erase(EraseOutcome::Missing),
        (Op::Erase(_), status::FAILED) => OpResult::Erase(EraseOutcome::Failed),
        // The host rejects reserved keys before launching; the kernels' own check is a second line.
        (_, status::REJECTED) => {
            return Err(HashTableError::ReservedKey {
                index: usize::MAX,
                key: op.key(),
            })
        }
        (_, other) => return Err(HashTableError::BadStatus(other)),
    })
}

/// Cells per bucket as the kernels see them (compile-time check that the layouts agree).
const _: () = assert!(BUCKET_CELLS == 4);

/// For the tests that compile a program as the table's are compiled (`compile` with `base_options`):
/// panics if NVRTC rejects `source` (called `file`) or gives PTX without a kernel. Returns false,
/// skipped, where libnvrtc cannot be loaded, unless `HYPERMNF_REQUIRE_NVRTC=1` makes that a failure
/// (`backend::cuda::compile::nvrtc_required`). CI has no GPU to show a kernel that does not compile.
#[cfg(test)]
pub(crate) fn assert_compiles(source: &str, file: &str) -> bool {
    match std::panic::catch_unwind(|| compile(source, file, base_options())) {
        Ok(Ok(ptx)) => {
            assert!(ptx.to_src().contains(".entry"), "{file}: no kernel in the PTX");
            true
        }
        Ok(Err(log)) => panic!("{file} does not compile: {log}"),
        Err(_) if !crate::backend::cuda::compile::nvrtc_required() => {
            eprintln!("skipped: libnvrtc could not be loaded");
            false
        }
        Err(_) => panic!("libnvrtc could not be loaded, and HYPERMNF_REQUIRE_NVRTC=1"),
    }
}

#[cfg(test)]
mod tests {
    use super::{assert_compiles, is_define, SOURCE};

    #[test]
    fn the_table_kernels_compile_with_nvrtc() {
        assert_compiles(SOURCE, "hashtable.cu");
    }

    #[test]
    fn only_plain_defines_reach_the_compiler() {
        for ok in ["-DHT_X", "-DHT_X=1", "-D_A9=b_2"] {
            assert!(is_define(ok), "{ok}");
        }
        for bad in ["-D", "-D9X", "-DX=", "-DX=\"a\"", "-I/tmp", "--x", "-DX;Y", "DX"] {
            assert!(!is_define(bad), "{bad}");
        }
    }
}

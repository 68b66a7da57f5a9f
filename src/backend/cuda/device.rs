//! The CUDA context and the memory the backend manages itself: device buffers, pinned host buffers,
//! streams and events. Raw device pointers (u64) are used instead of cudarc's `CudaSlice` because the
//! backend orders its two streams itself with events (cudarc's automatic per-buffer event tracking is
//! switched off for our context).

use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaStream};

use crate::backend::BackendError;

/// Maps a driver error to the backend's error, saying what was being done.
pub(crate) fn cuda<E: std::fmt::Display>(what: &'static str) -> impl FnOnce(E) -> BackendError {
    move |e| BackendError::Cuda(format!("{what}: {e}"))
}

/// Number of CUDA devices the driver reports; `Err(Unavailable)` where there is no driver (never a
/// panic: cudarc loads libcuda dynamically and panics where it is missing, so look for the library
/// first and catch any panic of the first driver call).
pub(crate) fn device_count() -> Result<usize, BackendError> {
    // SAFETY: only tries to dlopen the library names cudarc would use.
    if !unsafe { sys::is_culib_present() } {
        return Err(BackendError::Unavailable("no CUDA driver (libcuda.so) found".into()));
    }
    match std::panic::catch_unwind(|| CudaContext::device_count().map_err(cuda("cuDeviceGetCount"))) {
        Ok(r) => Ok(r?.max(0) as usize),
        Err(_) => Err(BackendError::Unavailable("the CUDA driver could not be loaded".into())),
    }
}

/// Creates the context of device `ordinal` without ever panicking (see `device_count`). An ordinal the
/// driver does not have is `Unavailable`, with the number of devices it does have.
pub(crate) fn open_context(ordinal: usize) -> Result<Arc<CudaContext>, BackendError> {
    let n = device_count()?;
    if n < 1 {
        return Err(BackendError::Unavailable("the CUDA driver reports no device".into()));
    }
    if ordinal >= n {
        return Err(BackendError::Unavailable(format!(
            "there is no CUDA device {ordinal}: the driver reports {n} (0..={})",
            n - 1
        )));
    }
    let attempt = std::panic::catch_unwind(|| {
        CudaContext::new(ordinal)
            .map_err(|e| BackendError::Unavailable(format!("cannot create a CUDA context on device {ordinal}: {e}")))
    });
    let ctx = match attempt {
        Ok(r) => r?,
        Err(_) => return Err(BackendError::Unavailable("the CUDA driver could not be loaded".into())),
    };
    // SAFETY: this backend never uses CudaSlice across streams; it orders its streams with its own events.
    unsafe { ctx.disable_event_tracking() };
    Ok(ctx)
}

/// Device memory, freed on drop.
pub(crate) struct DevBuf {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    ctx: Arc<CudaContext>,
}

impl DevBuf {
    pub(crate) fn alloc(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Self, BackendError> {
        ctx.bind_to_thread().map_err(cuda("cuCtxSetCurrent"))?;
        // SAFETY: plain allocation; the pointer is owned by the returned value.
        let ptr = unsafe { result::malloc_sync(bytes.max(16)) }
            .map_err(|e| BackendError::Cuda(format!("cannot allocate {bytes} bytes on the device: {e}")))?;
        Ok(DevBuf {
            ptr,
            bytes,
            ctx: ctx.clone(),
        })
    }
    pub(crate) fn ptr(&self) -> u64 {
        self.ptr
    }
    pub(crate) fn at(&self, byte_offset: usize) -> u64 {
        debug_assert!(byte_offset <= self.bytes);
        self.ptr + byte_offset as u64
    }
    pub(crate) fn zero_async(&self, stream: &CudaStream) -> Result<(), BackendError> {
        // SAFETY: the whole buffer belongs to us.
        unsafe { result::memset_d8_async(self.ptr, 0, self.bytes, stream.cu_stream()) }.map_err(cuda("cuMemsetD8Async"))
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by malloc_sync and freed once; cuMemFree waits for work that uses it.
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

/// Page-locked host memory (the DMA engines copy it at full PCIe speed), freed on drop.
pub(crate) struct PinnedBuf {
    ptr: *mut u8,
    bytes: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: the buffer is plain memory owned by this value; access goes through &self / &mut self.
unsafe impl Send for PinnedBuf {}

impl PinnedBuf {
    pub(crate) fn alloc(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Self, BackendError> {
        ctx.bind_to_thread().map_err(cuda("cuCtxSetCurrent"))?;
        // SAFETY: plain allocation; freed in Drop.
        let ptr = unsafe { result::malloc_host(bytes.max(16), 0) }
            .map_err(|e| BackendError::Cuda(format!("cannot allocate {bytes} bytes of pinned host memory: {e}")))?;
        Ok(PinnedBuf {
            ptr: ptr as *mut u8,
            bytes,
            ctx: ctx.clone(),
        })
    }
    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for `bytes` bytes for the life of self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.bytes) }
    }
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.bytes) }
    }
}

impl Drop for PinnedBuf {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by malloc_host, freed once.
        let _ = unsafe { result::free_host(self.ptr as *mut std::ffi::c_void) };
    }
}

/// Asynchronous host → device copy of `src` into device address `dst` on `stream`.
///
/// # Safety
/// `src` must stay alive and unchanged until the stream has passed the copy, and `dst` must hold
/// `src.len()` bytes.
pub(crate) unsafe fn htod_async(dst: u64, src: &[u8], stream: &CudaStream) -> Result<(), BackendError> {
    result::memcpy_htod_async(dst, src, stream.cu_stream()).map_err(cuda("cuMemcpyHtoDAsync"))
}

/// Asynchronous device → host copy.
///
/// # Safety
/// `dst` must stay alive and untouched until the stream has passed the copy.
pub(crate) unsafe fn dtoh_async(dst: &mut [u8], src: u64, stream: &CudaStream) -> Result<(), BackendError> {
    result::memcpy_dtoh_async(dst, src, stream.cu_stream()).map_err(cuda("cuMemcpyDtoHAsync"))
}

/// Page-locks existing host memory (cuMemHostRegister) so the DMA engines read it directly; undone on
/// drop. Registering costs time (the pages are pinned one by one), so callers that run several passes
/// over the same cube, like the benchmark, do it once up front. The backend keeps a list of the
/// registered ranges so that `prepare` knows it may skip the pinned staging buffers.
pub struct HostRegistration<'a> {
    ptr: *mut std::ffi::c_void,
    ctx: Arc<CudaContext>,
    /// The registries of the backends that treat the range as page-locked (several for a portable one).
    registries: Vec<Registry>,
    _borrow: std::marker::PhantomData<&'a [u8]>,
}

// SAFETY: only the address is kept; unregistering is thread-safe in the driver.
unsafe impl Send for HostRegistration<'_> {}
unsafe impl Sync for HostRegistration<'_> {}

impl<'a> HostRegistration<'a> {
    pub(crate) fn new(
        ctx: &Arc<CudaContext>,
        registry: &Registry,
        bytes: &'a [u8],
    ) -> Result<Self, BackendError> {
        Self::pin(ctx, std::slice::from_ref(registry), bytes.as_ptr() as *mut std::ffi::c_void, bytes.len(), 0)
    }

    /// Page-locked for every context (CU_MEMHOSTREGISTER_PORTABLE), registered in `ctx` and listed in
    /// each of `registries`: one range that several devices copy from (a cube split over them; its
    /// shares cannot be registered one per device, as neighbouring shares share a page).
    pub(crate) fn new_portable(
        ctx: &Arc<CudaContext>,
        registries: &[Registry],
        bytes: &'a [u8],
    ) -> Result<Self, BackendError> {
        Self::pin(ctx, registries, bytes.as_ptr() as *mut std::ffi::c_void, bytes.len(), sys::CU_MEMHOSTREGISTER_PORTABLE)
    }

    /// A writable buffer (an output): the registration holds no borrow of the bytes, only their
    /// lifetime, so the caller keeps writing through the slice it gets back.
    pub(crate) fn new_mut(
        ctx: &Arc<CudaContext>,
        registry: &Registry,
        bytes: &'a mut [u8],
    ) -> Result<(Self, &'a mut [u8]), BackendError> {
        let reg = Self::pin(ctx, std::slice::from_ref(registry), bytes.as_mut_ptr() as *mut std::ffi::c_void, bytes.len(), 0)?;
        Ok((reg, bytes))
    }

    /// [`new_mut`](Self::new_mut), page-locked for every context and listed in each of `registries`
    /// (the output of a split cube, see [`new_portable`](Self::new_portable)).
    pub(crate) fn new_portable_mut(
        ctx: &Arc<CudaContext>,
        registries: &[Registry],
        bytes: &'a mut [u8],
    ) -> Result<(Self, &'a mut [u8]), BackendError> {
        let ptr = bytes.as_mut_ptr() as *mut std::ffi::c_void;
        let reg = Self::pin(ctx, registries, ptr, bytes.len(), sys::CU_MEMHOSTREGISTER_PORTABLE)?;
        Ok((reg, bytes))
    }

    fn pin(
        ctx: &Arc<CudaContext>,
        registries: &[Registry],
        ptr: *mut std::ffi::c_void,
        len: usize,
        flags: u32,
    ) -> Result<Self, BackendError> {
        ctx.bind_to_thread().map_err(cuda("cuCtxSetCurrent"))?;
        // SAFETY: the caller's borrow (lifetime 'a) keeps the memory alive while it is registered; the
        // driver only pins the pages.
        unsafe { sys::cuMemHostRegister_v2(ptr, len, flags) }
            .result()
            .map_err(|e| BackendError::Cuda(format!("cuMemHostRegister of {len} bytes: {e}")))?;
        for registry in registries {
            registry
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((ptr as usize, len));
        }
        Ok(HostRegistration {
            ptr,
            ctx: ctx.clone(),
            registries: registries.to_vec(),
            _borrow: std::marker::PhantomData,
        })
    }
}

impl Drop for HostRegistration<'_> {
    fn drop(&mut self) {
        for registry in &self.registries {
            registry
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|&(p, _)| p != self.ptr as usize);
        }
        let _ = self.ctx.bind_to_thread();
        // SAFETY: registered in new().
        let _ = unsafe { sys::cuMemHostUnregister(self.ptr) }.result();
    }
}

/// The host ranges (start, length) page-locked in one backend's context.
pub(crate) type Registry = Arc<std::sync::Mutex<Vec<(usize, usize)>>>;

/// True when `bytes` lies inside a registered range.
pub(crate) fn is_registered(registry: &std::sync::Mutex<Vec<(usize, usize)>>, bytes: &[u8]) -> bool {
    let (a, n) = (bytes.as_ptr() as usize, bytes.len());
    registry
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .any(|&(p, len)| a >= p && a + n <= p + len)
}

/// An event that can be recorded many times (timing disabled unless asked for).
pub(crate) fn event(ctx: &Arc<CudaContext>, timing: bool) -> Result<CudaEvent, BackendError> {
    let flags = if timing {
        sys::CUevent_flags::CU_EVENT_DEFAULT
    } else {
        sys::CUevent_flags::CU_EVENT_DISABLE_TIMING
    };
    ctx.new_event(Some(flags)).map_err(cuda("cuEventCreate"))
}

/// Bytes of one pinned staging buffer: chunks are sent in pieces of this size, so that the buffers are
/// the same for every cube and the backend's pool hands the same two to every job. Sized by the chunk
/// before, they differed with each cube's shape and a service's job waited for a fresh cuMemHostAlloc
/// (46 ms of a 299 MB cube's statistics pass on the H100, after a smaller cube's job).
pub(super) const STAGING_PIECE: usize = 16 << 20;
/// Pinned requests are rounded up to a power of two of at least this, so that outputs of nearby sizes
/// (another k, another width) reuse the pool's buffers instead of allocating their own.
const PINNED_MIN: usize = 1 << 20;

/// The size a pinned request is served at: a power of two, at least PINNED_MIN.
pub(super) fn pinned_class(bytes: usize) -> usize {
    bytes.max(PINNED_MIN).next_power_of_two()
}

/// Something a `Pool` can hold.
pub(crate) trait Sized_ {
    fn size(&self) -> usize;
}
impl Sized_ for DevBuf {
    fn size(&self) -> usize {
        self.bytes
    }
}
impl Sized_ for PinnedBuf {
    fn size(&self) -> usize {
        self.bytes
    }
}

/// Buffers kept by the backend between passes and runs: cuMemAlloc / cuMemFree (which synchronizes the
/// device) and above all cuMemHostAlloc (milliseconds for tens of MB) would otherwise cost more than
/// the arithmetic of a whole MNF. Holds at most `cap` bytes of idle buffers.
pub(crate) struct Pool<T: Sized_> {
    free: std::sync::Mutex<Vec<T>>,
    cap: usize,
}

impl<T: Sized_> Pool<T> {
    pub(crate) fn new(cap: usize) -> Self {
        Pool {
            free: std::sync::Mutex::new(Vec::new()),
            cap,
        }
    }

    /// A buffer of at least `bytes` (at most 4 × + 1 MiB larger, so small requests do not pin big
    /// buffers), reused or made by `alloc`. It comes back to the pool when the returned value drops,
    /// after `streams` have finished what they were doing with it.
    pub(crate) fn take<'p>(
        &'p self,
        bytes: usize,
        streams: &[&Arc<CudaStream>],
        alloc: impl Fn(usize) -> Result<T, BackendError>,
    ) -> Result<Pooled<'p, T>, BackendError> {
        let found = {
            let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            let best = free
                .iter()
                .enumerate()
                .filter(|(_, b)| b.size() >= bytes && b.size() <= bytes * 4 + (1 << 20))
                .min_by_key(|(_, b)| b.size())
                .map(|(i, _)| i);
            best.map(|i| free.swap_remove(i))
        };
        let item = match found {
            Some(b) => b,
            // Out of memory with idle buffers around: free them and try once more.
            None => match alloc(bytes) {
                Ok(b) => b,
                Err(e) => {
                    let idle = std::mem::take(&mut *self.free.lock().unwrap_or_else(|e| e.into_inner()));
                    if idle.is_empty() {
                        return Err(e);
                    }
                    drop(idle);
                    alloc(bytes)?
                }
            },
        };
        Ok(Pooled {
            item: Some(item),
            pool: self,
            streams: streams.iter().map(|s| (*s).clone()).collect(),
        })
    }

    /// Bytes held by idle buffers.
    pub(crate) fn idle_bytes(&self) -> usize {
        self.free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|b| b.size())
            .sum()
    }

    /// Drops every idle buffer (device memory goes back to the driver).
    pub(crate) fn clear(&self) {
        let idle = std::mem::take(&mut *self.free.lock().unwrap_or_else(|e| e.into_inner()));
        drop(idle);
    }

    fn put(&self, item: T) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        free.push(item);
        let mut total: usize = free.iter().map(|b| b.size()).sum();
        while total > self.cap && !free.is_empty() {
            total -= free.remove(0).size();
        }
    }
}

/// A pooled buffer; see `Pool::take`.
pub(crate) struct Pooled<'p, T: Sized_> {
    item: Option<T>,
    pool: &'p Pool<T>,
    streams: Vec<Arc<CudaStream>>,
}

impl<T: Sized_> std::ops::Deref for Pooled<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.item.as_ref().expect("present until drop")
    }
}
impl<T: Sized_> std::ops::DerefMut for Pooled<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.item.as_mut().expect("present until drop")
    }
}

impl<T: Sized_> Drop for Pooled<'_, T> {
    fn drop(&mut self) {
        // A pass that ends early (an error, a cancellation) may leave work in flight that still uses the
        // buffer: wait for it before anyone else can get the buffer. Idle streams return at once.
        let mut clean = true;
        for s in &self.streams {
            clean &= s.synchronize().is_ok();
        }
        if let Some(item) = self.item.take() {
            if clean {
                self.pool.put(item);
            }
        }
    }
}

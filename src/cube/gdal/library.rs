//! The GDAL library's process-wide state: its error handler, the lock every read through it holds,
//! and HDF5's error printing (kept apart from the readers, which all use it).

use std::sync::{Mutex, MutexGuard, Once};

/// GDAL prints its errors to stderr by default; they reach the caller as `CubeError`s instead, and its
/// warnings go to the log.
pub(super) fn quiet_gdal() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        gdal::config::set_error_handler(|class, _code, msg| {
            if class == gdal::errors::CplErrType::Warning {
                tracing::debug!("GDAL: {msg}");
            }
        });
    });
}

/// Debian's HDF5 and netCDF-C libraries are built without thread safety, and GDAL 3.6 does not
/// serialise every call into them: two jobs reading HDF5 or NetCDF at once could corrupt their state.
/// Every read through GDAL holds this lock (decoding is I/O and decompression; the MNF that follows, the
/// long part of a job, runs outside it).
static LIBRARY_LOCK: Mutex<()> = Mutex::new(());

/// [`LIBRARY_LOCK`], held: GDAL, netCDF-C and HDF5 may be called on this thread while it lives.
pub(super) struct Library {
    guard: Option<MutexGuard<'static, ()>>,
}

impl Library {
    /// Runs `f` with the lock released, so that other reads go on while this thread does work that
    /// needs no library (decompressing chunks: `hdf5_chunks`); `f` takes [`library`] itself for any
    /// call into GDAL, netCDF-C or HDF5. The lock is held again when it returns.
    pub fn unlocked<R>(&mut self, f: impl FnOnce() -> R) -> R {
        self.guard = None;
        let r = f();
        self.guard = Some(lock());
        r
    }
}

/// Takes [`LIBRARY_LOCK`] (see [`lock`]).
pub(super) fn library() -> Library {
    Library { guard: Some(lock()) }
}

/// Takes [`LIBRARY_LOCK`] and silences HDF5's error stack printing on this thread (HDF5 keeps that
/// setting per thread, and prints the attributes netCDF-C probes for and does not find as errors; the
/// errors that matter reach the caller through GDAL).
fn lock() -> MutexGuard<'static, ()> {
    let guard = LIBRARY_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    quiet_gdal();
    thread_local!(static HDF5_QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });
    HDF5_QUIET.with(|q| {
        if !q.get() {
            silence_hdf5_errors();
            q.set(true);
        }
    });
    guard
}

/// `H5Eset_auto2(H5E_DEFAULT, NULL, NULL)`, looked up in the process (libgdal loaded libhdf5), so that the
/// crate links nothing more than GDAL; nothing when HDF5 is not there.
fn silence_hdf5_errors() {
    type SetAuto = unsafe extern "C" fn(i64, *const std::ffi::c_void, *mut std::ffi::c_void) -> i32;
    // SAFETY: dlsym with a NUL-terminated name; the symbol, when found, is HDF5's H5Eset_auto2, whose
    // signature (hid_t, H5E_auto2_t, void *) -> herr_t is SetAuto's (hid_t is int64_t since HDF5 1.10).
    unsafe {
        let f = libc::dlsym(libc::RTLD_DEFAULT, c"H5Eset_auto2".as_ptr());
        if !f.is_null() {
            let f: SetAuto = std::mem::transmute::<*mut std::ffi::c_void, SetAuto>(f);
            f(0, std::ptr::null(), std::ptr::null_mut());
        }
    }
}

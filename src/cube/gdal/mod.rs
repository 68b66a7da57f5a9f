//! The formats of today's missions, read through GDAL (feature `gdal`): EMIT NetCDF-4 granules
//! ([`emit`]), NEON AOP reflectance HDF5 ([`neon`]), PRISMA HDF-EOS5 ([`prisma`]), EnMAP / DESIS and any
//! multi-band GeoTIFF ([`geotiff`]); and Cloud-Optimized GeoTIFF results ([`cog`]).
//!
//! Each reader gives the [`Cube`] and [`CubeMeta`](crate::cube::CubeMeta) the ENVI reader gives: BIP
//! samples in the file's own type (float32 when the product defines a scale or offset, applied as it
//! defines them, its fill value kept as the no-data value), wavelengths in nm, fwhm, bad bands, and the
//! georeferencing as ENVI's `map info` + `coordinate system string` ([`georef`]).
//!
//! GDAL parses the files: nothing here reads NetCDF, HDF5 or TIFF bytes by hand.

pub mod cog;
pub mod emit;
pub mod georef;
mod geotiff;
mod md;
mod neon;
mod prisma;
mod probe;
mod samples;

use std::path::Path;
use std::sync::{Mutex, MutexGuard, Once};

pub use probe::claimed_bytes;

use super::sniff::GdalFormat;
use super::{Cube, CubeError};

/// GDAL prints its errors to stderr by default; they reach the caller as `CubeError`s instead, and its
/// warnings go to the log.
fn quiet_gdal() {
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

/// Takes [`LIBRARY_LOCK`] and silences HDF5's error stack printing on this thread (HDF5 keeps that
/// setting per thread, and prints the attributes netCDF-C probes for and does not find as errors; the
/// errors that matter reach the caller through GDAL).
fn library() -> MutexGuard<'static, ()> {
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

/// Reads the cube in `path`, a file of `format` (by its extension or signature): the product is told by
/// its layout (EMIT's root variables, NEON's site group, PRISMA's swath), else any multi-band raster.
pub fn read(path: &Path, format: GdalFormat) -> Result<Cube, CubeError> {
    let _library = library();
    if !path.is_file() {
        return Err(CubeError::io(path, std::io::Error::new(std::io::ErrorKind::NotFound, "no such file")));
    }
    match format {
        GdalFormat::NetCdf => {
            if emit::looks_like(path)? {
                emit::read(path)
            } else {
                Err(CubeError::Unsupported(format!(
                    "{}: a NetCDF file without EMIT's layout (a root variable radiance, reflectance, obs or mask \
                     with dims downtrack, crosstrack, bands)",
                    path.display()
                )))
            }
        }
        GdalFormat::Hdf5 => {
            if neon::looks_like(path) {
                neon::read(path)
            } else if prisma::looks_like(path) {
                prisma::read(path)
            } else if emit::looks_like(path).unwrap_or(false) {
                // A NetCDF-4 granule stored without its extension (an upload) is HDF5 by its signature.
                emit::read(path)
            } else {
                // Opening it at all tells a truncated or foreign file from a valid HDF5 of another layout.
                md::open(path, &["HDF5", "netCDF"], "HDF5")?;
                Err(CubeError::Unsupported(format!(
                    "{}: an HDF5 file in none of the layouts hypermnf reads (NEON SITE/Reflectance/Reflectance_Data, \
                     PRISMA HDFEOS/SWATHS/PRS_*_HCO, EMIT NetCDF-4)",
                    path.display()
                )))
            }
        }
        GdalFormat::Tiff => geotiff::read(path),
    }
}

/// The GDAL format of `path` (extension or signature), or an error saying it is none.
fn sniff_format(path: &Path) -> Result<GdalFormat, CubeError> {
    super::sniff::gdal_format(path)
        .ok_or_else(|| CubeError::Unsupported(format!("{}: not a NetCDF, HDF5 or TIFF file", path.display())))
}

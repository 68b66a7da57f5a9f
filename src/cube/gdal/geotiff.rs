//! Multi-band GDAL rasters: EnMAP and DESIS GeoTIFFs, and any GeoTIFF of two or more bands (a file that
//! GDAL's raster drivers open otherwise is read the same way).
//!
//! Band metadata, as EnMAP-Box, GDAL's ENVI driver and the sensors' processors write it:
//! - per band, in the default domain: `wavelength`, `wavelength_units`, `fwhm`, `bbl` (EnMAP-Box, GDAL
//!   3.6's ENVI driver);
//! - or ENVI-style lists in the `ENVI` domain: `wavelength = {...}`, `fwhm`, `bbl`, `wavelength_units`;
//! - or GDAL ≥ 3.10's `IMAGERY` domain: `CENTRAL_WAVELENGTH_UM`, `FWHM_UM` (micrometres).
//! - nodata, scale and offset per band (physical = stored × scale + offset);
//! - or, where the TIFF itself gives no wavelengths, an ENVI header beside it (`X.hdr` beside `X.tif`):
//!   DESIS products (L1B/L1C radiance, L2A reflectance; 235 bands, int16, pixel-interleaved) keep their
//!   `wavelength`, `fwhm` and `data gain values` / `data offset values` there, as DLR's product
//!   specification describes and EnMAP-Box's DESIS import reads them. Its gains and offsets apply where
//!   the TIFF's bands have no scale and offset of their own, its `data ignore value` where they have no
//!   nodata. Checked against that description, not against a real DESIS granule.

use std::path::Path;

use gdal::raster::RasterBand;
use gdal::{Dataset, Metadata as _};

use super::md::{gdal_error, one_line};
use super::samples::{converted_type, data_type_of, with_sample_type, BlockOrder, CubeBuilder, Linear, Sample};
use crate::cube::{Cube, CubeError, CubeMeta, Interleave};

/// GDAL's GTiff options that read an uncompressed TIFF without its block cache: through a mapping of
/// the file (`GTIFF_VIRTUAL_MEM_IO`, as `cube::map` maps ENVI and `.npy` files), else with positioned
/// reads (`GTIFF_DIRECT_IO`); a compressed one is read as without them. The driver takes them when it
/// opens the file. Why: the block cache handles a strip of two lines of one band at a time, and put
/// ~0.65 GB/s through it reading band by band, against ~4.7 GB/s mapped (python3-gdal, the 1 GB cube of
/// `bench formats`).
const UNCACHED_IO: [&str; 2] = ["GTIFF_VIRTUAL_MEM_IO", "GTIFF_DIRECT_IO"];

pub(super) fn open(path: &Path) -> Result<Dataset, CubeError> {
    let opts = gdal::DatasetOptions {
        open_flags: gdal::GdalOpenFlags::GDAL_OF_RASTER | gdal::GdalOpenFlags::GDAL_OF_READONLY | gdal::GdalOpenFlags::GDAL_OF_VERBOSE_ERROR,
        ..Default::default()
    };
    // Thread-local, and cleared again, so that no other GDAL use of this process sees them.
    for key in UNCACHED_IO {
        let _ = gdal::config::set_thread_local_config_option(key, "YES");
    }
    let ds = Dataset::open_ex(path, opts);
    for key in UNCACHED_IO {
        let _ = gdal::config::clear_thread_local_config_option(key);
    }
    ds.map_err(|e| CubeError::Header(format!("{}: not a raster GDAL can read ({})", path.display(), super::md::message(&e))))
}

pub(super) fn read(path: &Path) -> Result<Cube, CubeError> {
    read_dataset(path, &open(path)?)
}

/// Reads an open raster dataset (a GeoTIFF, or a subdataset another reader chose).
pub(super) fn read_dataset(path: &Path, ds: &Dataset) -> Result<Cube, CubeError> {
    let bands = ds.raster_count();
    let (samples, lines) = ds.raster_size();
    if bands < 2 {
        let subdatasets = ds.metadata_domain("SUBDATASETS").unwrap_or_default();
        if bands == 0 && !subdatasets.is_empty() {
            return Err(CubeError::Unsupported(format!(
                "{}: holds no raster of its own, only subdatasets ({}); hypermnf reads EMIT, NEON and PRISMA layouts of it",
                path.display(),
                subdatasets.iter().filter(|s| s.contains("_NAME=")).count()
            )));
        }
        return Err(CubeError::Unsupported(format!(
            "{}: a raster of {bands} band{}: MNF needs a multi-band (hyperspectral) cube",
            path.display(),
            if bands == 1 { "" } else { "s" }
        )));
    }
    let band = |i: usize| ds.rasterband(i + 1).map_err(gdal_error(path, &format!("band {}", i + 1)));
    let first = band(0)?;
    let gdal_type = first.band_type() as gdal_sys::GDALDataType::Type;
    let source_type = data_type_of(gdal_type, &format!("{}: band 1", path.display()))?;
    let mut linear = Vec::with_capacity(bands);
    let mut fill = None;
    for i in 0..bands {
        let b = band(i)?;
        if b.band_type() as gdal_sys::GDALDataType::Type != gdal_type {
            return Err(CubeError::Unsupported(format!("{}: band {} differs in data type from band 1", path.display(), i + 1)));
        }
        let nd = b.no_data_value();
        if i == 0 {
            fill = nd;
        } else if nd.map(f64::to_bits) != fill.map(f64::to_bits) {
            return Err(CubeError::Unsupported(format!(
                "{}: band {} has nodata {nd:?}, band 1 {fill:?}: hypermnf takes one no-data value per cube",
                path.display(),
                i + 1
            )));
        }
        let (scale, offset) = (b.scale().unwrap_or(1.0), b.offset().unwrap_or(0.0));
        if !scale.is_finite() || !offset.is_finite() || scale == 0.0 {
            return Err(CubeError::Header(format!("{}: band {} has scale {scale}, offset {offset}", path.display(), i + 1)));
        }
        linear.push(Linear { scale, offset });
    }
    let source_interleave = match ds.metadata_item("INTERLEAVE", "IMAGE_STRUCTURE").as_deref() {
        Some("BAND") => Some(Interleave::Bsq),
        Some("LINE") => Some(Interleave::Bil),
        Some("PIXEL") => Some(Interleave::Bip),
        _ => None,
    };
    let mut meta = CubeMeta { source_interleave, ..Default::default() };
    spectral(ds, bands, &mut meta, path)?;
    if meta.wavelength.is_none() {
        if let Some(header) = sidecar_header(path, lines, samples, bands)? {
            beside(&header, &mut meta, &mut linear, &mut fill, path)?;
        }
    }
    meta.ignore_value = fill.filter(|f| !f.is_nan());
    let dtype = converted_type(source_type, &linear);
    if linear.iter().any(|l| !l.is_identity()) {
        let s: Vec<String> = linear.iter().map(|l| format!("{}", l.scale)).collect();
        let o: Vec<String> = linear.iter().map(|l| format!("{}", l.offset)).collect();
        meta.extra.push(("gdal scale".into(), format!("{{{}}}", s.join(", "))));
        meta.extra.push(("gdal offset".into(), format!("{{{}}}", o.join(", "))));
    }
    if let Ok(gt) = ds.geo_transform() {
        let wkt = ds.projection();
        let georef = super::georef::Georef { geotransform: gt, wkt: (!wkt.is_empty()).then_some(wkt) };
        super::georef::put_into(&mut meta, &georef)?;
    }

    let mut cube = CubeBuilder::new(lines, samples, bands, dtype)?;
    let band_map: Vec<Option<usize>> = (0..bands).map(Some).collect();
    // A band-interleaved file (PLANARCONFIG separate: EnMAP's layout) is read the way it is stored,
    // band by band; a pixel-interleaved one (DESIS) pixel by pixel, which is then a plain copy.
    let order = if source_interleave == Some(Interleave::Bsq) { ReadOrder::Planes } else { ReadOrder::Pixels };
    with_sample_type!(source_type, T => read_blocks::<T>(path, ds, &mut cube, order, &band_map, &linear, fill))?;
    cube.finish(meta)
}

/// The order GDAL hands a block of lines over in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadOrder {
    /// Pixel-interleaved (BIP), straight into the cube's order.
    Pixels,
    /// Band by band (each band's lines together), transposed by [`CubeBuilder::put_planes`].
    Planes,
}

/// Reads all bands a block of lines at a time, in `order`.
#[allow(clippy::too_many_arguments)] // the dataset, the cube, and how the blocks are read and placed
fn read_blocks<T: Sample>(
    path: &Path,
    ds: &Dataset,
    cube: &mut CubeBuilder,
    order: ReadOrder,
    band_map: &[Option<usize>],
    linear: &[Linear],
    fill: Option<f64>,
) -> Result<(), CubeError> {
    let (samples, lines) = ds.raster_size();
    let bands = ds.raster_count();
    let size = std::mem::size_of::<T>();
    // Whole blocks of the file's tiles or strips, so that no block is decoded twice.
    let block_h = ds.rasterband(1).map(|b| b.block_size().1).unwrap_or(1).max(1);
    let per = super::samples::block_lines(samples, bands, size);
    let per = if per >= block_h { per - per % block_h } else { per };
    let mut buf: Vec<T> = Vec::new();
    let mut first = 0;
    while first < lines {
        let count = per.min(lines - first);
        buf.resize(count * samples * bands, T::default());
        let rv = match order {
            // SAFETY: `buf` holds count × samples × bands values of T, which the spacings address: a
            // pixel = bands values, a line = samples pixels, a band = one value.
            ReadOrder::Pixels => unsafe {
                gdal_sys::GDALDatasetRasterIOEx(
                    ds.c_dataset(),
                    gdal_sys::GDALRWFlag::GF_Read,
                    0,
                    first as i32,
                    samples as i32,
                    count as i32,
                    buf.as_mut_ptr() as *mut std::ffi::c_void,
                    samples as i32,
                    count as i32,
                    T::gdal_ordinal(),
                    bands as i32,
                    std::ptr::null_mut(),
                    (bands * size) as i64,
                    (samples * bands * size) as i64,
                    size as i64,
                    std::ptr::null_mut(),
                )
            },
            // One call per band: the dataset-level call for all bands at once takes GDAL's generic
            // path, block by block, even with the uncached options (0.86 against 4.7 GB/s).
            ReadOrder::Planes => read_planes(ds, first, count, &mut buf),
        };
        if rv != gdal_sys::CPLErr::CE_None {
            return Err(CubeError::Header(format!("{}: reading lines {first}..{}: {}", path.display(), first + count, last_error())));
        }
        match order {
            ReadOrder::Pixels => cube.put(first, count, &buf, BlockOrder::Bip, bands, band_map, linear, fill),
            ReadOrder::Planes => cube.put_planes(first, count, &buf, linear, fill),
        }
        first += count;
    }
    Ok(())
}

/// Reads lines `first..first + count` of every band of `ds` into `buf`, band after band (each band's
/// `count` × samples values together); GDAL's error code.
fn read_planes<T: Sample>(ds: &Dataset, first: usize, count: usize, buf: &mut [T]) -> gdal_sys::CPLErr::Type {
    let (samples, _) = ds.raster_size();
    let size = std::mem::size_of::<T>();
    for (i, plane) in buf.chunks_exact_mut(count * samples).enumerate() {
        // SAFETY: the band exists (i < raster count: `buf` holds count × samples × bands values), and
        // `plane` holds count lines of samples values of T, which the spacings address.
        let rv = unsafe {
            let band = gdal_sys::GDALGetRasterBand(ds.c_dataset(), i as i32 + 1);
            if band.is_null() {
                return gdal_sys::CPLErr::CE_Failure;
            }
            gdal_sys::GDALRasterIOEx(
                band,
                gdal_sys::GDALRWFlag::GF_Read,
                0,
                first as i32,
                samples as i32,
                count as i32,
                plane.as_mut_ptr() as *mut std::ffi::c_void,
                samples as i32,
                count as i32,
                T::gdal_ordinal(),
                size as i64,
                (samples * size) as i64,
                std::ptr::null_mut(),
            )
        };
        if rv != gdal_sys::CPLErr::CE_None {
            return rv;
        }
    }
    gdal_sys::CPLErr::CE_None
}

/// GDAL's last error message.
pub(super) fn last_error() -> String {
    // SAFETY: CPLGetLastErrorMsg returns a pointer to a thread-local, NUL-terminated string.
    let msg = unsafe { std::ffi::CStr::from_ptr(gdal_sys::CPLGetLastErrorMsg()) };
    one_line(&msg.to_string_lossy())
}

/// Wavelengths, fwhm, bbl and band names from the band metadata (see the module doc).
fn spectral(ds: &Dataset, bands: usize, meta: &mut CubeMeta, path: &Path) -> Result<(), CubeError> {
    let bs: Vec<RasterBand> = (1..=bands).map(|i| ds.rasterband(i)).collect::<Result<_, _>>().map_err(gdal_error(path, "bands"))?;
    let per_band = |key: &str, domain: &str| -> Option<Vec<f64>> {
        bs.iter().map(|b| b.metadata_item(key, domain).and_then(|v| v.trim().parse::<f64>().ok())).collect()
    };
    let envi_list = |key: &str| -> Option<Vec<f64>> {
        let v = ds.metadata_item(key, "ENVI")?;
        let v: Result<Vec<f64>, _> = v.trim().trim_start_matches('{').trim_end_matches('}').split(',').map(|x| x.trim().parse::<f64>()).collect();
        v.ok().filter(|v| v.len() == bands)
    };
    if let Some(w) = per_band("wavelength", "") {
        meta.wavelength = Some(w);
        meta.wavelength_units = bs[0].metadata_item("wavelength_units", "").or_else(|| ds.metadata_item("wavelength_units", ""));
        meta.fwhm = per_band("fwhm", "");
    } else if let Some(w) = envi_list("wavelength") {
        meta.wavelength = Some(w);
        meta.wavelength_units = ds.metadata_item("wavelength_units", "ENVI").map(|u| u.trim_matches(['{', '}', ' ']).to_string());
        meta.fwhm = envi_list("fwhm");
    } else if let Some(w) = per_band("CENTRAL_WAVELENGTH_UM", "IMAGERY") {
        meta.wavelength = Some(w);
        meta.wavelength_units = Some("Micrometers".into());
        meta.fwhm = per_band("FWHM_UM", "IMAGERY");
    }
    let bbl = per_band("bbl", "").or_else(|| envi_list("bbl"));
    meta.bbl = bbl.map(|v| v.iter().map(|&g| g != 0.0).collect());
    let names: Vec<String> = bs.iter().map(|b| b.description().unwrap_or_default()).collect();
    if names.iter().all(|n| !n.is_empty()) {
        meta.band_names = Some(names);
    }
    if let Some(d) = ds.description().ok().filter(|d| !d.is_empty() && d != &path.display().to_string()) {
        meta.description = Some(d);
    }
    Ok(())
}

/// The ENVI header beside the raster `path` (`X.hdr` or `X.HDR` beside `X.tif`), if there is one; it
/// must describe a raster of the TIFF's size.
fn sidecar_header(path: &Path, lines: usize, samples: usize, bands: usize) -> Result<Option<crate::cube::envi::EnviHeader>, CubeError> {
    let Some(hdr) = ["hdr", "HDR"].into_iter().map(|e| path.with_extension(e)).find(|p| p.is_file()) else {
        return Ok(None);
    };
    let text = std::fs::read(&hdr).map_err(|e| CubeError::io(&hdr, e))?;
    let header = crate::cube::envi::parse_header(&String::from_utf8_lossy(&text))
        .map_err(|e| CubeError::Header(format!("{}: the ENVI header beside the raster: {e}", hdr.display())))?;
    if (header.lines, header.samples, header.bands) != (lines, samples, bands) {
        return Err(CubeError::Header(format!(
            "{}: describes {} x {} x {}, but the raster beside it is {lines} x {samples} x {bands}",
            hdr.display(),
            header.lines,
            header.samples,
            header.bands
        )));
    }
    Ok(Some(header))
}

/// Takes the spectral metadata, gains and offsets, and no-data value of the ENVI header beside the
/// raster (DESIS) where the TIFF gave none of its own.
fn beside(
    header: &crate::cube::envi::EnviHeader,
    meta: &mut CubeMeta,
    linear: &mut [Linear],
    fill: &mut Option<f64>,
    path: &Path,
) -> Result<(), CubeError> {
    let h = &header.meta;
    meta.wavelength = h.wavelength.clone();
    meta.wavelength_units = h.wavelength_units.clone();
    meta.fwhm = h.fwhm.clone();
    if meta.bbl.is_none() {
        meta.bbl = h.bbl.clone();
    }
    if meta.band_names.is_none() {
        meta.band_names = h.band_names.clone();
    }
    if fill.is_none() {
        *fill = h.ignore_value;
    }
    let list = |key: &str| -> Result<Option<Vec<f64>>, CubeError> {
        let Some(v) = h.extra_value(key) else { return Ok(None) };
        let values: Result<Vec<f64>, _> = v.trim().trim_start_matches('{').trim_end_matches('}').split(',').map(|x| x.trim().parse::<f64>()).collect();
        match values {
            Ok(values) if values.len() == linear.len() && values.iter().all(|x| x.is_finite()) => Ok(Some(values)),
            _ => Err(CubeError::Header(format!("{}: the ENVI header beside it has {key} that are not {} numbers", path.display(), linear.len()))),
        }
    };
    let (gains, offsets) = (list("data gain values")?, list("data offset values")?);
    if (gains.is_some() || offsets.is_some()) && linear.iter().all(|l| l.is_identity()) {
        for (i, l) in linear.iter_mut().enumerate() {
            let scale = gains.as_ref().map_or(1.0, |g| g[i]);
            if scale == 0.0 {
                return Err(CubeError::Header(format!("{}: the ENVI header beside it gives band {} a gain of 0", path.display(), i + 1)));
            }
            *l = Linear { scale, offset: offsets.as_ref().map_or(0.0, |o| o[i]) };
        }
    }
    Ok(())
}

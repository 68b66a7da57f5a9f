//! Cloud-Optimized GeoTIFF results: float32, one band per MNF component (`MNF k`) or per input band (the
//! denoised cube), the eigenvalues and SNR in the metadata, the source's CRS and geotransform, written by
//! GDAL's COG driver (tiles, overviews, the layout `LAYOUT=COG` that GDAL's validator checks).
//!
//! The values are handed to GDAL in place (a MEM dataset over the result's BIP buffer), so a large
//! result is not copied before the driver tiles and compresses it.

use std::path::{Path, PathBuf};

use gdal::raster::RasterCreationOptions;
use gdal::{Dataset, DriverManager, Metadata as _};

use super::georef::Georef;
use super::md::one_line;
use crate::cube::CubeError;

/// What goes into one COG besides its values.
#[derive(Debug, Clone, Default)]
pub struct CogMeta {
    pub description: String,
    /// One per band.
    pub band_names: Vec<String>,
    /// Dataset metadata items (MNF_EIGENVALUES, MNF_SNR, ...).
    pub items: Vec<(String, String)>,
    /// Per-band metadata items (band i: items[i]).
    pub band_items: Vec<Vec<(String, String)>>,
    /// None: sensor geometry, no CRS (and an item says so).
    pub georef: Option<Georef>,
}

fn err(path: &Path) -> impl Fn(gdal::errors::GdalError) -> CubeError + '_ {
    move |e| CubeError::io(path, std::io::Error::other(format!("writing the COG: {}", one_line(&e.to_string()))))
}

/// Writes `values` (lines × samples × bands float32, BIP) as a COG at `path`. The file appears whole
/// or not at all: it is written beside `path` and renamed.
pub fn write(path: &Path, lines: usize, samples: usize, bands: usize, values: &[f32], meta: &CogMeta) -> Result<(), CubeError> {
    super::library::quiet_gdal();
    if values.len() != lines * samples * bands || bands == 0 {
        return Err(CubeError::SizeMismatch(format!("{} values for a {lines} x {samples} x {bands} COG", values.len())));
    }
    if lines > i32::MAX as usize || samples > i32::MAX as usize || bands > i32::MAX as usize {
        return Err(CubeError::TooLarge(format!("{lines} x {samples} x {bands} is beyond GeoTIFF's dimensions")));
    }
    let tmp = partial_name(path);
    let result = write_to(&tmp, lines, samples, bands, values, meta);
    let result = result.and_then(|()| std::fs::rename(&tmp, path).map_err(|e| CubeError::io(path, e)));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

fn partial_name(path: &Path) -> PathBuf {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".partial");
    path.with_file_name(name)
}

fn write_to(path: &Path, lines: usize, samples: usize, bands: usize, values: &[f32], meta: &CogMeta) -> Result<(), CubeError> {
    let e = err(path);
    let mem = mem_over(values, lines, samples, bands).map_err(&e)?;
    let mut mem = mem;
    mem.set_description(&meta.description).map_err(&e)?;
    for (k, v) in &meta.items {
        mem.set_metadata_item(k, v, "").map_err(&e)?;
    }
    for i in 0..bands {
        let mut b = mem.rasterband(i + 1).map_err(&e)?;
        if let Some(n) = meta.band_names.get(i) {
            b.set_description(n).map_err(&e)?;
        }
        b.set_no_data_value(Some(f64::NAN)).map_err(&e)?;
        for (k, v) in meta.band_items.get(i).map(Vec::as_slice).unwrap_or(&[]) {
            b.set_metadata_item(k, v, "").map_err(&e)?;
        }
    }
    if let Some(g) = &meta.georef {
        mem.set_geo_transform(&g.geotransform).map_err(&e)?;
        if let Some(wkt) = &g.wkt {
            mem.set_projection(wkt).map_err(&e)?;
        }
    }
    let driver = DriverManager::get_driver_by_name("COG").map_err(&e)?;
    // Lossless: DEFLATE with the floating-point predictor keeps every bit of the float32 values.
    let options = RasterCreationOptions::from_iter(["COMPRESS=DEFLATE", "PREDICTOR=YES", "BLOCKSIZE=512", "OVERVIEWS=AUTO", "BIGTIFF=IF_SAFER", "NUM_THREADS=ALL_CPUS"]);
    let out = mem.create_copy(&driver, path, &options).map_err(&e)?;
    out.close().map_err(&e)?;
    Ok(())
}

/// A MEM dataset whose bands are views of `values` (BIP: pixel offset = bands floats, band offset = one).
fn mem_over(values: &[f32], lines: usize, samples: usize, bands: usize) -> gdal::errors::Result<Dataset> {
    // GDAL ≥ 3.10 refuses to open MEM:::DATAPOINTER unless told to; 3.6 ignores the option.
    gdal::config::set_config_option("GDAL_MEM_ENABLE_OPEN", "YES")?;
    let name = format!(
        "MEM:::DATAPOINTER={:p},PIXELS={samples},LINES={lines},BANDS={bands},DATATYPE=Float32,PIXELOFFSET={},LINEOFFSET={},BANDOFFSET=4",
        values.as_ptr(),
        4 * bands,
        4 * bands * samples
    );
    // The dataset only reads `values` (the COG driver copies from it) and is dropped before `values`
    // can be: `write_to` holds both for the length of the call.
    Dataset::open_ex(&name, gdal::DatasetOptions { open_flags: gdal::GdalOpenFlags::GDAL_OF_RASTER | gdal::GdalOpenFlags::GDAL_OF_UPDATE, ..Default::default() })
}

/// Applies an EMIT granule's GLT to BIP values (lines × samples × bands of the sensor geometry): the
/// north-up grid (rows × cols × bands) of the granule's geotransform, NaN where no sensor pixel falls.
pub fn orthorectify(glt: &super::emit::Glt, samples: usize, bands: usize, values: &[f32]) -> Vec<f32> {
    let mut out = vec![f32::NAN; glt.rows * glt.cols * bands];
    for (cell, src) in glt.cells.iter().enumerate() {
        if let Some((line, sample)) = *src {
            let at = (line as usize * samples + sample as usize) * bands;
            out[cell * bands..(cell + 1) * bands].copy_from_slice(&values[at..at + bands]);
        }
    }
    out
}

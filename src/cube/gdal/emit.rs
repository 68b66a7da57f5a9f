//! EMIT L1B radiance / L2A reflectance granules (NetCDF-4), and EMIT's other granules of the same
//! layout (observation geometry `obs`, masks `mask`).
//!
//! Layout (EMIT's product specification, as the LP DAAC distributes it):
//! - the root variable `radiance` or `reflectance`, dims (downtrack, crosstrack, bands), float32, fill
//!   -9999 (`_FillValue`);
//! - group `sensor_band_parameters`: `wavelengths` and `fwhm` (nm), `good_wavelengths` (1 good, 0 in the
//!   water-vapour absorption bands: the bad bands), or per-band names (`observation_bands`, `mask_bands`);
//! - group `location`: per-pixel `lat`, `lon`, `elev`, and the geometry lookup table `glt_x`, `glt_y`
//!   (ortho_y, ortho_x), whose values are 1-based (crosstrack, downtrack) indices, 0 where no pixel falls;
//! - global attributes `geotransform` (6 numbers) and `spatial_ref` (WKT) of the GLT's north-up grid.
//!
//! The cube stays in sensor geometry: it carries no `map info`, since its pixels are not on the
//! geotransform's grid. The grid and the GLT are recorded in the metadata (`emit ...` keys) and applied
//! to results by `--ortho` ([`read_glt`], `cog::orthorectify`).

use std::path::Path;

use super::library::Library;
use super::md::{self, Placement};
use super::samples::{BlockOrder, CubeBuilder, Linear};
use crate::cube::{Cube, CubeError, CubeMeta, Interleave};

/// The root variables of EMIT products, in the order they are looked for.
const VARIABLES: [&str; 4] = ["radiance", "reflectance", "obs", "mask"];
const DIMS: [&str; 3] = ["downtrack", "crosstrack", "bands"];

/// Metadata keys the cube carries the granule's grid under (kept verbatim into ENVI outputs too).
pub const GEOTRANSFORM_KEY: &str = "emit geotransform";
pub const SPATIAL_REF_KEY: &str = "emit spatial ref";
pub const GLT_KEY: &str = "emit glt";

/// Whether a NetCDF file is an EMIT granule (one of EMIT's root variables); an error when GDAL cannot
/// open it as NetCDF at all (truncated, not NetCDF).
pub(super) fn looks_like(path: &Path) -> Result<bool, CubeError> {
    let ds = md::open(path, &["netCDF"], "NetCDF")?;
    let root = ds.root_group().map_err(md::gdal_error(path, "root group"))?;
    let names = root.array_names(md::no_options());
    Ok(VARIABLES.iter().any(|v| names.iter().any(|n| n == v)))
}

pub(super) fn read(path: &Path, library: &mut Library) -> Result<Cube, CubeError> {
    let ds = md::open(path, &["netCDF"], "NetCDF")?;
    let root = ds.root_group().map_err(md::gdal_error(path, "root group"))?;
    let names = root.array_names(md::no_options());
    let Some(var) = VARIABLES.iter().find(|v| names.iter().any(|n| n == *v)) else {
        return Err(CubeError::Header(format!(
            "{}: no EMIT variable (radiance, reflectance, obs or mask) at the root (it has {})",
            path.display(),
            if names.is_empty() { "none".to_string() } else { names.join(", ") }
        )));
    };
    let a = md::array(&root, var).ok_or_else(|| CubeError::Header(format!("{}: cannot open {var}", path.display())))?;
    let dims = md::dims(path, &a, var)?;
    let names_found: Vec<&str> = dims.iter().map(|(n, _)| n.as_str()).collect();
    if dims.len() != 3 || names_found != DIMS {
        return Err(CubeError::Header(format!(
            "{}: {var} has dims ({}), EMIT's are (downtrack, crosstrack, bands)",
            path.display(),
            names_found.join(", ")
        )));
    }
    let (lines, samples, bands) = (dims[0].1, dims[1].1, dims[2].1);
    let dtype = md::numeric_type(path, &a, var)?;
    let fill = a.no_data_value_as_double();

    let mut meta = CubeMeta { source_interleave: Some(Interleave::Bip), ignore_value: fill, ..Default::default() };
    meta.description = root.attribute("title").ok().and_then(|t| md::attr_text(&t)).or_else(|| Some(format!("EMIT {var}")));
    if let Some(sbp) = md::group(&root, "sensor_band_parameters") {
        band_parameters(path, &sbp, bands, &mut meta)?;
    }
    if let Some(gt) = root.attribute("geotransform").ok().and_then(|a| md::attr_f64s(&a)).filter(|g| g.len() == 6) {
        let gt: Vec<String> = gt.iter().map(|v| format!("{v}")).collect();
        meta.extra.push((GEOTRANSFORM_KEY.into(), format!("{{{}}}", gt.join(", "))));
    }
    if let Some(wkt) = root.attribute("spatial_ref").ok().and_then(|a| md::attr_text(&a)) {
        meta.extra.push((SPATIAL_REF_KEY.into(), format!("{{{}}}", wkt.replace(['{', '}'], " "))));
    }
    if let Some(loc) = md::group(&root, "location") {
        if let (Some(gx), Some(_)) = (md::array(&loc, "glt_x"), md::array(&loc, "glt_y")) {
            let d = md::dims(path, &gx, "location/glt_x")?;
            if let [(_, rows), (_, cols)] = d.as_slice() {
                meta.extra.push((GLT_KEY.into(), format!("{{{rows}, {cols}}}")));
            }
        }
    }

    let mut cube = CubeBuilder::new(lines, samples, bands, dtype)?;
    let band_map: Vec<Option<usize>> = (0..bands).map(Some).collect();
    let linear = vec![Linear::IDENTITY; bands];
    let full_name = format!("/{var}");
    let chunk_lines = md::chunk_lines(&ds, &full_name);
    let place = Placement { order: BlockOrder::Bip, band_map: &band_map, linear: &linear, fill, chunk_lines, full_name: &full_name };
    md::read_cube(path, &a, var, dtype, &mut cube, &place, library)?;
    cube.finish(meta)
}

/// Wavelengths, fwhm, bad bands and band names from `sensor_band_parameters`.
fn band_parameters(path: &Path, sbp: &gdal::raster::Group, bands: usize, meta: &mut CubeMeta) -> Result<(), CubeError> {
    let per_band = |name: &str, v: Vec<f64>| -> Result<Vec<f64>, CubeError> {
        if v.len() != bands {
            return Err(CubeError::Header(format!(
                "{}: sensor_band_parameters/{name} has {} values for {bands} bands",
                path.display(),
                v.len()
            )));
        }
        Ok(v)
    };
    if let Some(a) = md::array(sbp, "wavelengths") {
        meta.wavelength = Some(per_band("wavelengths", md::read_f64s(path, &a, "wavelengths")?)?);
        meta.wavelength_units = Some("Nanometers".into());
    }
    if let Some(a) = md::array(sbp, "fwhm") {
        meta.fwhm = Some(per_band("fwhm", md::read_f64s(path, &a, "fwhm")?)?);
    }
    if let Some(a) = md::array(sbp, "good_wavelengths") {
        let good = per_band("good_wavelengths", md::read_f64s(path, &a, "good_wavelengths")?)?;
        meta.bbl = Some(good.iter().map(|&g| g != 0.0).collect());
    }
    for name in ["observation_bands", "mask_bands"] {
        if let Some(a) = md::array(sbp, name) {
            let names = md::read_strings(path, &a, name)?;
            if names.len() == bands {
                meta.band_names = Some(names);
            }
        }
    }
    Ok(())
}

/// An EMIT granule's geometry lookup table: for each cell of the north-up grid (rows × cols), the
/// 0-based (line, sample) of the sensor pixel that falls there, or None.
pub struct Glt {
    pub rows: usize,
    pub cols: usize,
    pub cells: Vec<Option<(u32, u32)>>,
    pub geotransform: [f64; 6],
    pub wkt: String,
}

/// Reads the GLT and the grid of the EMIT granule `path`, checked against its sensor geometry
/// (`lines` × `samples`).
pub fn read_glt(path: &Path, lines: usize, samples: usize) -> Result<Glt, CubeError> {
    let _library = super::library::library();
    let ds = md::open(path, &["netCDF"], "NetCDF")?;
    let root = ds.root_group().map_err(md::gdal_error(path, "root group"))?;
    let missing = |what: &str| CubeError::Unsupported(format!("{}: --ortho needs the EMIT granule's {what}, which it lacks", path.display()));
    let loc = md::group(&root, "location").ok_or_else(|| missing("location group"))?;
    let gx = md::array(&loc, "glt_x").ok_or_else(|| missing("location/glt_x"))?;
    let gy = md::array(&loc, "glt_y").ok_or_else(|| missing("location/glt_y"))?;
    let geotransform: [f64; 6] = root
        .attribute("geotransform")
        .ok()
        .and_then(|a| md::attr_f64s(&a))
        .and_then(|g| g.try_into().ok())
        .ok_or_else(|| missing("geotransform attribute"))?;
    let wkt = root.attribute("spatial_ref").ok().and_then(|a| md::attr_text(&a)).ok_or_else(|| missing("spatial_ref attribute"))?;
    let d = md::dims(path, &gx, "location/glt_x")?;
    let [(_, rows), (_, cols)] = d.as_slice() else {
        return Err(CubeError::Header(format!("{}: location/glt_x is not 2-D", path.display())));
    };
    let (rows, cols) = (*rows, *cols);
    if md::dims(path, &gy, "location/glt_y")?.iter().map(|d| d.1).collect::<Vec<_>>() != [rows, cols] {
        return Err(CubeError::Header(format!("{}: glt_x and glt_y differ in shape", path.display())));
    }
    let n = rows.checked_mul(cols).filter(|&n| n <= 1 << 32).ok_or_else(|| CubeError::TooLarge(format!("{}: a {rows} x {cols} GLT", path.display())))?;
    let read = |a: &gdal::raster::MDArray, name: &str| a.read_as::<i64>(vec![0, 0], vec![rows, cols]).map_err(md::gdal_error(path, name));
    let (xs, ys) = (read(&gx, "location/glt_x")?, read(&gy, "location/glt_y")?);
    let mut cells = Vec::with_capacity(n);
    for (&x, &y) in xs.iter().zip(&ys) {
        // 1-based; 0 (and EMIT's fill) where no sensor pixel falls in the cell.
        if x <= 0 || y <= 0 {
            cells.push(None);
            continue;
        }
        let (sample, line) = ((x - 1) as usize, (y - 1) as usize);
        if sample >= samples || line >= lines {
            return Err(CubeError::Header(format!(
                "{}: the GLT points at sample {x}, line {y} (1-based) outside the {lines} x {samples} granule",
                path.display()
            )));
        }
        cells.push(Some((line as u32, sample as u32)));
    }
    Ok(Glt { rows, cols, cells, geotransform, wkt })
}

/// The metadata item of a GLT file that keeps the granule's WKT as the granule gave it.
const WKT_ITEM: &str = "EMIT_SPATIAL_REF";

/// The GLT as a file of its own: a two-band Int32 GeoTIFF (band 1 glt_x, band 2 glt_y, EMIT's 1-based
/// values, 0 where no pixel falls) on the grid's geotransform and CRS. The service keeps it beside a
/// job whose EMIT upload it decoded to ENVI (`ortho=true`): the decoded pair has no place for it, and
/// the upload itself is gone once the job has run.
pub fn write_glt_file(glt: &Glt, path: &Path) -> Result<(), CubeError> {
    use gdal::Metadata as _;
    let e = |e: gdal::errors::GdalError| CubeError::io(path, std::io::Error::other(format!("writing the GLT: {}", md::one_line(&e.to_string()))));
    let driver = gdal::DriverManager::get_driver_by_name("GTiff").map_err(e)?;
    let mut ds = driver.create_with_band_type::<i32, _>(path, glt.cols, glt.rows, 2).map_err(e)?;
    ds.set_geo_transform(&glt.geotransform).map_err(e)?;
    ds.set_projection(&glt.wkt).map_err(e)?;
    // The granule's WKT verbatim (GeoTIFF's keys would give an equivalent CRS in other words).
    ds.set_metadata_item(WKT_ITEM, &glt.wkt, "").map_err(e)?;
    for band in 0..2 {
        let values: Vec<i32> = glt
            .cells
            .iter()
            .map(|c| match c {
                Some((line, sample)) => 1 + if band == 0 { *sample as i32 } else { *line as i32 },
                None => 0,
            })
            .collect();
        let mut b = ds.rasterband(band + 1).map_err(e)?;
        b.write((0, 0), (glt.cols, glt.rows), &mut gdal::raster::Buffer::new((glt.cols, glt.rows), values)).map_err(e)?;
    }
    ds.close().map_err(e)?;
    Ok(())
}

/// Reads a GLT written by [`write_glt_file`], checked against the sensor geometry it indexes.
pub fn read_glt_file(path: &Path, lines: usize, samples: usize) -> Result<Glt, CubeError> {
    use gdal::Metadata as _;
    let e = |e: gdal::errors::GdalError| CubeError::io(path, std::io::Error::other(format!("reading the GLT: {}", md::one_line(&e.to_string()))));
    let ds = gdal::Dataset::open(path).map_err(e)?;
    let (cols, rows) = ds.raster_size();
    if ds.raster_count() != 2 {
        return Err(CubeError::Header(format!("{}: a GLT file has 2 bands, not {}", path.display(), ds.raster_count())));
    }
    let read = |band: usize| -> Result<Vec<i32>, CubeError> {
        let b = ds.rasterband(band).map_err(e)?;
        Ok(b.read_as::<i32>((0, 0), (cols, rows), (cols, rows), None).map_err(e)?.into_shape_and_vec().1)
    };
    let (xs, ys) = (read(1)?, read(2)?);
    let mut cells = Vec::with_capacity(rows * cols);
    for (&x, &y) in xs.iter().zip(&ys) {
        if x <= 0 || y <= 0 {
            cells.push(None);
            continue;
        }
        let (sample, line) = ((x - 1) as usize, (y - 1) as usize);
        if sample >= samples || line >= lines {
            return Err(CubeError::Header(format!("{}: the GLT points outside the {lines} x {samples} granule", path.display())));
        }
        cells.push(Some((line as u32, sample as u32)));
    }
    let wkt = ds.metadata_item(WKT_ITEM, "").unwrap_or_else(|| ds.projection());
    Ok(Glt { rows, cols, cells, geotransform: ds.geo_transform().map_err(e)?, wkt })
}

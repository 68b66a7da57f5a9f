//! Georeferencing between the forms the readers meet and the form a cube carries: a cube carries ENVI's
//! `map info` and `coordinate system string` (WKT), as an ENVI cube does, so that every output (ENVI,
//! COG) carries its source's place on the ground the same way whatever the input format was.
//!
//! Both directions go through GDAL's own ENVI driver on a one-pixel file in memory (`/vsimem/`), so
//! that a `map info` (UTM zones, datums, `rotation=`, pixel reference points) means here exactly what
//! it means to GDAL, QGIS and rasterio, and no second interpretation of it is written by hand.

use std::path::PathBuf;

use gdal::{Dataset, DriverManager, GeoTransform};

use crate::cube::{CubeError, CubeMeta};

/// A place on the ground: the affine geotransform (GDAL's order) and the CRS as WKT when known.
#[derive(Debug, Clone, PartialEq)]
pub struct Georef {
    pub geotransform: GeoTransform,
    pub wkt: Option<String>,
}

/// ENVI's key for WKT.
pub const CS_KEY: &str = "coordinate system string";

/// A directory of its own in GDAL's memory file system, removed on drop.
struct MemDir(String);

impl MemDir {
    fn new() -> Self {
        MemDir(format!("/vsimem/hypermnf-georef-{}", uuid::Uuid::new_v4()))
    }
    fn path(&self, name: &str) -> PathBuf {
        PathBuf::from(format!("{}/{name}", self.0))
    }
}

impl Drop for MemDir {
    fn drop(&mut self) {
        for name in ["g", "g.hdr", "g.aux.xml", "h", "h.hdr", "h.aux.xml"] {
            let _ = gdal::vsi::unlink_mem_file(self.path(name));
        }
    }
}

/// The georeferencing of a cube's metadata (its `map info`, and `coordinate system string` when
/// present), as GDAL reads it from an ENVI header; None without a `map info`.
pub fn of_meta(meta: &CubeMeta) -> Result<Option<Georef>, CubeError> {
    let Some(map_info) = meta.map_info.as_deref() else { return Ok(None) };
    from_envi(map_info, meta.extra_value(CS_KEY))
}

/// [`of_meta`] from the two header values.
pub fn from_envi(map_info: &str, cs: Option<&str>) -> Result<Option<Georef>, CubeError> {
    let clean = |s: &str| s.replace(['{', '}', '\n', '\r'], " ");
    let mut header = String::from(
        "ENVI\nsamples = 1\nlines = 1\nbands = 1\nheader offset = 0\nfile type = ENVI Standard\ndata type = 1\n\
         interleave = bsq\nbyte order = 0\n",
    );
    header.push_str(&format!("map info = {{{}}}\n", clean(map_info)));
    if let Some(cs) = cs.filter(|c| !c.trim().is_empty()) {
        header.push_str(&format!("{CS_KEY} = {{{}}}\n", clean(cs)));
    }
    let dir = MemDir::new();
    let err = |e: gdal::errors::GdalError| CubeError::Header(format!("map info {map_info:?}: {}", super::md::one_line(&e.to_string())));
    gdal::vsi::create_mem_file(dir.path("g.hdr"), header.into_bytes()).map_err(err)?;
    // GDAL identifies a file by its first bytes: the ENVI driver wants at least two.
    gdal::vsi::create_mem_file(dir.path("g"), vec![0u8; 16]).map_err(err)?;
    let ds = Dataset::open_ex(
        dir.path("g"),
        gdal::DatasetOptions { allowed_drivers: Some(&["ENVI"]), ..Default::default() },
    )
    .map_err(err)?;
    let Ok(geotransform) = ds.geo_transform() else { return Ok(None) };
    if geotransform == [0.0, 1.0, 0.0, 0.0, 0.0, 1.0] {
        // GDAL's answer for a map info it could not use.
        return Ok(None);
    }
    let wkt = ds.projection();
    Ok(Some(Georef { geotransform, wkt: (!wkt.is_empty()).then_some(wkt) }))
}

/// ENVI's `map info` and `coordinate system string` for a geotransform and CRS, as GDAL's ENVI driver
/// writes them.
pub fn to_envi(georef: &Georef) -> Result<(String, Option<String>), CubeError> {
    let dir = MemDir::new();
    let err = |e: gdal::errors::GdalError| CubeError::Header(format!("georeferencing: {}", super::md::one_line(&e.to_string())));
    {
        let driver = DriverManager::get_driver_by_name("ENVI").map_err(err)?;
        let mut ds = driver.create_with_band_type::<u8, _>(dir.path("h"), 1, 1, 1).map_err(err)?;
        ds.set_geo_transform(&georef.geotransform).map_err(err)?;
        if let Some(wkt) = &georef.wkt {
            ds.set_projection(wkt).map_err(err)?;
        }
        // The header is written when the dataset closes.
        ds.close().map_err(err)?;
    }
    let bytes = gdal::vsi::get_vsi_mem_file_bytes_owned(dir.path("h.hdr")).map_err(err)?;
    let text = String::from_utf8_lossy(&bytes);
    let value = |key: &str| {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim().eq_ignore_ascii_case(key)).then(|| v.trim().trim_start_matches('{').trim_end_matches('}').trim().to_string())
        })
    };
    let map_info = value("map info")
        .ok_or_else(|| CubeError::Header("georeferencing: GDAL's ENVI driver wrote no map info for it".into()))?;
    Ok((map_info, value(CS_KEY)))
}

/// Puts a geotransform and CRS into a cube's metadata as ENVI carries them.
pub fn put_into(meta: &mut CubeMeta, georef: &Georef) -> Result<(), CubeError> {
    let (map_info, cs) = to_envi(georef)?;
    meta.map_info = Some(map_info);
    if let Some(cs) = cs.or_else(|| georef.wkt.clone()) {
        meta.extra.retain(|(k, _)| crate::cube::model::normalize_key(k) != crate::cube::model::normalize_key(CS_KEY));
        meta.extra.push((CS_KEY.to_string(), format!("{{{cs}}}")));
    }
    Ok(())
}

/// WKT of an EPSG code.
pub fn wkt_of_epsg(code: u32) -> Result<String, CubeError> {
    gdal::spatial_ref::SpatialRef::from_epsg(code)
        .and_then(|s| s.to_wkt())
        .map_err(|e| CubeError::Header(format!("EPSG code {code}: {}", super::md::one_line(&e.to_string()))))
}


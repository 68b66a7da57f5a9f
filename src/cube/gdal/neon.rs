//! NEON AOP surface reflectance (HDF5), as NEON's data product specification (DP3.30006) lays it out:
//! - `SITE/Reflectance/Reflectance_Data` (lines, samples, bands), int16 in NEON's products, with
//!   attributes `Scale_Factor` (reflectance = stored / Scale_Factor) and `Data_Ignore_Value` (-9999),
//!   and in full products `Band_Window_1_Nanometers` / `Band_Window_2_Nanometers`, the water-vapour
//!   absorption windows (the bad bands);
//! - `SITE/Reflectance/Metadata/Spectral_Data/Wavelength` and `FWHM` (nm);
//! - `SITE/Reflectance/Metadata/Coordinate_System/Map_Info` (an ENVI map info) and `EPSG Code`.

use std::path::Path;

use gdal::raster::Group;

use super::library::Library;
use super::md::{self, Placement};
use super::samples::{converted_type, BlockOrder, CubeBuilder, Linear};
use crate::cube::{Cube, CubeError, CubeMeta, Interleave};

/// The site group (`SJER`, `HARV`, ...) holding `Reflectance/Reflectance_Data`, if any.
fn site<'a>(root: &'a Group<'a>) -> Option<String> {
    root.group_names(md::no_options()).into_iter().find(|g| {
        md::group(root, g).and_then(|s| md::group(&s, "Reflectance").map(|r| md::array(&r, "Reflectance_Data").is_some())).unwrap_or(false)
    })
}

/// Whether an HDF5 file is a NEON reflectance product.
pub(super) fn looks_like(path: &Path) -> bool {
    let Ok(ds) = md::open(path, &["HDF5"], "HDF5") else { return false };
    ds.root_group().ok().is_some_and(|root| site(&root).is_some())
}

pub(super) fn read(path: &Path, library: &mut Library) -> Result<Cube, CubeError> {
    let ds = md::open(path, &["HDF5"], "HDF5")?;
    let root = ds.root_group().map_err(md::gdal_error(path, "root group"))?;
    let site_name = site(&root).ok_or_else(|| CubeError::Header(format!("{}: no SITE/Reflectance/Reflectance_Data (not a NEON reflectance file)", path.display())))?;
    let site = md::group(&root, &site_name).expect("found above");
    let refl = md::group(&site, "Reflectance").expect("found above");
    let name = format!("{site_name}/Reflectance/Reflectance_Data");
    let a = md::array(&refl, "Reflectance_Data").expect("found above");
    let dims = md::dims(path, &a, &name)?;
    let [(_, lines), (_, samples), (_, bands)] = dims.as_slice() else {
        return Err(CubeError::Header(format!("{}: {name} has {} dimensions, not 3 (lines, samples, bands)", path.display(), dims.len())));
    };
    let (lines, samples, bands) = (*lines, *samples, *bands);
    let source_type = md::numeric_type(path, &a, &name)?;

    let attr = |key: &str| a.attribute(key).ok().and_then(|v| md::attr_f64(&v));
    let fill = attr("Data_Ignore_Value").or_else(|| a.no_data_value_as_double());
    let linear = match attr("Scale_Factor") {
        Some(s) if s == 0.0 || !s.is_finite() => {
            return Err(CubeError::Header(format!("{}: {name} has Scale_Factor {s}", path.display())))
        }
        Some(s) => Linear { scale: 1.0 / s, offset: 0.0 },
        None => Linear::IDENTITY,
    };
    let linear = vec![linear; bands];
    let dtype = converted_type(source_type, &linear);

    let mut meta = CubeMeta { source_interleave: Some(Interleave::Bip), ignore_value: fill, ..Default::default() };
    meta.description = Some(format!("NEON AOP reflectance, site {site_name}"));
    if let Some(s) = attr("Scale_Factor") {
        meta.extra.push(("reflectance scale factor".into(), format!("{s}")));
    }
    let metadata = md::group(&refl, "Metadata");
    if let Some(spectral) = metadata.as_ref().and_then(|m| md::group(m, "Spectral_Data")) {
        for (key, target) in [("Wavelength", &mut meta.wavelength), ("FWHM", &mut meta.fwhm)] {
            if let Some(w) = md::array(&spectral, key) {
                let v = md::read_f64s(path, &w, key)?;
                if v.len() != bands {
                    return Err(CubeError::Header(format!("{}: Spectral_Data/{key} has {} values for {bands} bands", path.display(), v.len())));
                }
                *target = Some(v);
            }
        }
        if meta.wavelength.is_some() {
            meta.wavelength_units = Some("Nanometers".into());
        }
    }
    meta.bbl = absorption_windows(&a, meta.wavelength.as_deref());
    if let Some(cs) = metadata.as_ref().and_then(|m| md::group(m, "Coordinate_System")) {
        if let Some(mi) = md::array(&cs, "Map_Info") {
            meta.map_info = md::read_strings(path, &mi, "Map_Info")?.into_iter().next().map(|s| s.trim().to_string());
        }
        if let Some(e) = md::array(&cs, "EPSG Code") {
            let text = md::read_strings(path, &e, "EPSG Code")?.join("");
            let code: u32 = text.trim().parse().map_err(|_| CubeError::Header(format!("{}: EPSG Code {text:?} is not a number", path.display())))?;
            meta.extra.push(("epsg code".into(), code.to_string()));
            meta.extra.push((super::georef::CS_KEY.into(), format!("{{{}}}", super::georef::wkt_of_epsg(code)?)));
        }
    }

    let mut cube = CubeBuilder::new(lines, samples, bands, dtype)?;
    let band_map: Vec<Option<usize>> = (0..bands).map(Some).collect();
    let full_name = format!("/{name}");
    let chunk_lines = md::chunk_lines(&ds, &full_name);
    let place = Placement { order: BlockOrder::Bip, band_map: &band_map, linear: &linear, fill, chunk_lines, full_name: &full_name };
    md::read_cube(path, &a, &name, source_type, &mut cube, &place, library)?;
    cube.finish(meta)
}

/// Bad bands from NEON's absorption windows (`Band_Window_1_Nanometers = [1340, 1445]`, ...): a band whose
/// wavelength falls in a window is bad. None when the file gives no windows or no wavelengths.
fn absorption_windows(a: &gdal::raster::MDArray, wavelengths: Option<&[f64]>) -> Option<Vec<bool>> {
    let wl = wavelengths?;
    let windows: Vec<(f64, f64)> = (1..=4)
        .filter_map(|i| a.attribute(&format!("Band_Window_{i}_Nanometers")).ok())
        .filter_map(|v| md::attr_f64s(&v))
        .filter(|v| v.len() == 2)
        .map(|v| (v[0].min(v[1]), v[0].max(v[1])))
        .collect();
    if windows.is_empty() {
        return None;
    }
    Some(wl.iter().map(|&w| !windows.iter().any(|&(lo, hi)| w >= lo && w <= hi)).collect())
}

//! PRISMA L1 / L2B / L2C / L2D hyperspectral products (HDF-EOS5), built from ASI's published product
//! specification (PRISMA Products Specification Document, Issue 2.3) alone: no real PRISMA granule was
//! available to check it against, only files written to that layout (the README says so).
//!
//! Layout:
//! - swath `HDFEOS/SWATHS/PRS_<level>_HCO/Data Fields/` with `VNIR_Cube` and `SWIR_Cube`, dims
//!   (lines, bands, samples) — BIL —, uint16 (L1: radiance DN; L2: reflectance DN);
//! - root attributes `List_Cw_Vnir` / `List_Cw_Swir` (centre wavelengths, nm), `List_Fwhm_Vnir` /
//!   `List_Fwhm_Swir`, `List_Cw_Vnir_Flags` / `List_Cw_Swir_Flags` (1 = band in use; unused bands have
//!   wavelength 0). The cubes' bands run in *decreasing* wavelength;
//! - scale: L1 `ScaleFactor_Vnir`, `Offset_Vnir` (…`_Swir`): radiance = DN / ScaleFactor − Offset;
//!   L2 `L2ScaleVnirMin`, `L2ScaleVnirMax` (…`Swir`): value = Min + DN × (Max − Min) / 65535;
//! - L2D (geocoded): `Epsg_Code`, `Product_ULcorner_easting`, `Product_ULcorner_northing`, 30 m pixels.
//!
//! The two cubes are joined in increasing wavelength. VNIR (400–1010 nm) and SWIR (920–2505 nm) overlap:
//! the overlap is resolved by keeping the VNIR bands and dropping the SWIR bands at or below the last VNIR
//! wavelength, so that every wavelength appears once, in order.

use std::path::Path;

use gdal::raster::Group;

use super::library::Library;
use super::md::{self, Placement};
use super::samples::{BlockOrder, CubeBuilder, Linear};
use crate::cube::{Cube, CubeError, CubeMeta, DataType, Interleave};

/// The PRISMA swath group of a file (`PRS_L2D_HCO`, ...), if any.
fn swath_name(root: &Group) -> Option<String> {
    let hdfeos = md::group(root, "HDFEOS")?;
    let swaths = md::group(&hdfeos, "SWATHS")?;
    let names = swaths.group_names(md::no_options());
    names.into_iter().find(|n| n.starts_with("PRS_") && n.ends_with("_HCO"))
}

pub(super) fn looks_like(path: &Path) -> bool {
    let Ok(ds) = md::open(path, &["HDF5"], "HDF5") else { return false };
    ds.root_group().ok().is_some_and(|root| swath_name(&root).is_some())
}

/// One of the two cubes: its array, which of its bands are used, in which order, and their scale.
struct Part {
    name: &'static str,
    wavelength: Vec<f64>,
    fwhm: Vec<f64>,
    used: Vec<bool>,
    linear: Linear,
}

pub(super) fn read(path: &Path, library: &mut Library) -> Result<Cube, CubeError> {
    let ds = md::open(path, &["HDF5"], "HDF5")?;
    let root = ds.root_group().map_err(md::gdal_error(path, "root group"))?;
    let swath = swath_name(&root).ok_or_else(|| CubeError::Header(format!("{}: no HDFEOS/SWATHS/PRS_*_HCO swath (not a PRISMA product)", path.display())))?;
    let level = swath.trim_start_matches("PRS_").trim_end_matches("_HCO").to_string();
    let fields = md::group(&root, "HDFEOS")
        .and_then(|h| md::group(&h, "SWATHS"))
        .and_then(|s| md::group(&s, &swath))
        .and_then(|s| md::group(&s, "Data Fields"))
        .ok_or_else(|| CubeError::Header(format!("{}: {swath} has no 'Data Fields'", path.display())))?;
    let attr = |key: &str| root.attribute(key).ok().and_then(|a| md::attr_f64s(&a));
    let need = |key: &str| attr(key).ok_or_else(|| CubeError::Header(format!("{}: PRISMA attribute {key} is missing", path.display())));
    let scalar = |key: &str| -> Result<f64, CubeError> {
        need(key)?.first().copied().ok_or_else(|| CubeError::Header(format!("{}: PRISMA attribute {key} is empty", path.display())))
    };

    let mut parts = Vec::new();
    for (name, suffix) in [("VNIR_Cube", "Vnir"), ("SWIR_Cube", "Swir")] {
        let wavelength = need(&format!("List_Cw_{suffix}"))?;
        let fwhm = attr(&format!("List_Fwhm_{suffix}")).unwrap_or_default();
        let flags = attr(&format!("List_Cw_{suffix}_Flags"));
        let used: Vec<bool> = (0..wavelength.len())
            .map(|i| wavelength[i] > 0.0 && flags.as_ref().is_none_or(|f| f.get(i).is_some_and(|&v| v != 0.0)))
            .collect();
        let linear = if level == "L1" {
            let (s, o) = (scalar(&format!("ScaleFactor_{suffix}"))?, scalar(&format!("Offset_{suffix}"))?);
            if s == 0.0 || !s.is_finite() {
                return Err(CubeError::Header(format!("{}: ScaleFactor_{suffix} is {s}", path.display())));
            }
            Linear { scale: 1.0 / s, offset: -o }
        } else {
            let (lo, hi) = (scalar(&format!("L2Scale{suffix}Min"))?, scalar(&format!("L2Scale{suffix}Max"))?);
            Linear { scale: (hi - lo) / 65535.0, offset: lo }
        };
        parts.push(Part { name, wavelength, fwhm, used, linear });
    }
    // Overlap: SWIR bands at or below the longest VNIR wavelength are left out.
    let vnir_max = parts[0].wavelength.iter().zip(&parts[0].used).filter(|(_, &u)| u).map(|(&w, _)| w).fold(f64::MIN, f64::max);
    let swir = &mut parts[1];
    for (u, &w) in swir.used.iter_mut().zip(&swir.wavelength) {
        if w <= vnir_max {
            *u = false;
        }
    }
    // Cube band of each (part, band), in increasing wavelength.
    let mut order: Vec<(f64, usize, usize)> = Vec::new();
    for (p, part) in parts.iter().enumerate() {
        for (b, (&w, &u)) in part.wavelength.iter().zip(&part.used).enumerate() {
            if u {
                order.push((w, p, b));
            }
        }
    }
    order.sort_by(|a, b| a.0.total_cmp(&b.0));
    let bands = order.len();
    if bands < 2 {
        return Err(CubeError::Header(format!("{}: PRISMA lists {bands} usable band(s)", path.display())));
    }
    let mut maps: Vec<Vec<Option<usize>>> = parts.iter().map(|p| vec![None; p.wavelength.len()]).collect();
    for (cube_band, &(_, p, b)) in order.iter().enumerate() {
        maps[p][b] = Some(cube_band);
    }

    // Both cubes must share the lines and samples.
    let mut shape = None;
    let mut arrays = Vec::new();
    for part in &parts {
        let a = md::array(&fields, part.name).ok_or_else(|| CubeError::Header(format!("{}: {swath} has no {}", path.display(), part.name)))?;
        let d = md::dims(path, &a, part.name)?;
        let [(_, lines), (_, nb), (_, samples)] = d.as_slice() else {
            return Err(CubeError::Header(format!("{}: {} has {} dimensions, not 3 (lines, bands, samples)", path.display(), part.name, d.len())));
        };
        if *nb != part.wavelength.len() {
            return Err(CubeError::Header(format!(
                "{}: {} has {nb} bands, List_Cw lists {}",
                path.display(),
                part.name,
                part.wavelength.len()
            )));
        }
        if shape.is_some_and(|s| s != (*lines, *samples)) {
            return Err(CubeError::Header(format!("{}: VNIR_Cube and SWIR_Cube differ in lines or samples", path.display())));
        }
        shape = Some((*lines, *samples));
        arrays.push(a);
    }
    let (lines, samples) = shape.expect("two parts");

    let mut meta = CubeMeta { source_interleave: Some(Interleave::Bil), ..Default::default() };
    meta.description = Some(format!("PRISMA {level} VNIR + SWIR (SWIR bands within the VNIR range left out)"));
    meta.wavelength = Some(order.iter().map(|&(w, _, _)| w).collect());
    meta.wavelength_units = Some("Nanometers".into());
    if parts.iter().all(|p| p.fwhm.len() == p.wavelength.len()) {
        meta.fwhm = Some(order.iter().map(|&(_, p, b)| parts[p].fwhm[b]).collect());
    }
    if level == "L2D" {
        if let (Some(code), Some(e), Some(n)) = (attr("Epsg_Code"), attr("Product_ULcorner_easting"), attr("Product_ULcorner_northing")) {
            let georef = super::georef::Georef {
                geotransform: [e[0], 30.0, 0.0, n[0], 0.0, -30.0],
                wkt: Some(super::georef::wkt_of_epsg(code[0] as u32)?),
            };
            super::georef::put_into(&mut meta, &georef)?;
        }
    }

    let mut cube = CubeBuilder::new(lines, samples, bands, DataType::F32)?;
    for (p, a) in arrays.iter().enumerate() {
        let source_type = md::numeric_type(path, a, parts[p].name)?;
        let linear = vec![parts[p].linear; parts[p].wavelength.len()];
        let full_name = format!("/HDFEOS/SWATHS/{swath}/Data Fields/{}", parts[p].name);
        let chunk_lines = md::chunk_lines(&ds, &full_name);
        let place = Placement { order: BlockOrder::Bil, band_map: &maps[p], linear: &linear, fill: None, chunk_lines, full_name: &full_name };
        md::read_cube(path, a, parts[p].name, source_type, &mut cube, &place, library)?;
    }
    cube.finish(meta)
}

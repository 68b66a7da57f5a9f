//! Results as Cloud-Optimized GeoTIFFs (`--out X.tif`, the service's `?format=cog`; feature `gdal`):
//! the components (`MNF k`) and the denoised cube, with the eigenvalues and SNR in the metadata and the
//! source's place on the ground — its ENVI `map info` (rotation included) or WKT, NEON's EPSG code, a
//! GeoTIFF's own — or, for an EMIT granule with `--ortho`, its GLT applied onto its north-up grid.

use std::path::Path;

use crate::cube::gdal::cog::{self, CogMeta};
use crate::cube::gdal::emit::{self, Glt};
use crate::cube::gdal::georef::{self, Georef};
use crate::cube::{CubeError, CubeMeta};
use crate::mnf::result::Metadata;

/// What a COG says of a result left in sensor geometry.
const SENSOR_GEOMETRY: &str = "sensor geometry (no CRS): the EMIT granule's pixels are not on a map grid; \
                               `--ortho` (ortho=true) applies its GLT";

/// The grid results are written on: the source's own (lines × samples, its georeferencing if any), or
/// an EMIT GLT's north-up grid.
pub enum Grid<'g> {
    Source,
    Ortho(&'g Glt),
}

/// Reads the GLT of the EMIT granule `input` for `--ortho`, or says why the input has none.
pub fn ortho_grid(input: &Path, source: &CubeMeta, lines: usize, samples: usize) -> Result<Glt, CubeError> {
    if source.extra_value(emit::GLT_KEY).is_none() {
        return Err(CubeError::Unsupported(format!(
            "{}: --ortho applies an EMIT granule's geometry lookup table (location/glt_x, glt_y), which this input lacks",
            input.display()
        )));
    }
    emit::read_glt(input, lines, samples)
}

/// Writes `values` (BIP, lines × samples × bands of the source geometry) on `grid` as a COG at `out`.
#[allow(clippy::too_many_arguments)] // the values, their shape, and what the file says of them
pub fn write(
    out: &Path,
    values: &[f32],
    lines: usize,
    samples: usize,
    bands: usize,
    mut meta: CogMeta,
    source: &CubeMeta,
    grid: &Grid,
) -> Result<(), CubeError> {
    match grid {
        Grid::Ortho(glt) => {
            meta.georef = Some(Georef { geotransform: glt.geotransform, wkt: Some(glt.wkt.clone()) });
            meta.items.push(("HYPERMNF_GEOMETRY".into(), "orthorectified with the EMIT granule's GLT".into()));
            let ortho = cog::orthorectify(glt, samples, bands, values);
            cog::write(out, glt.rows, glt.cols, bands, &ortho, &meta)
        }
        Grid::Source => {
            meta.georef = georef::of_meta(source)?;
            if meta.georef.is_none() && source.extra_value(emit::GLT_KEY).is_some() {
                meta.items.push(("HYPERMNF_GEOMETRY".into(), SENSOR_GEOMETRY.into()));
            }
            cog::write(out, lines, samples, bands, values, &meta)
        }
    }
}

fn list(v: &[f64]) -> String {
    v.iter().map(|x| format!("{x}")).collect::<Vec<_>>().join(",")
}

/// The components' COG metadata: band `MNF k`, the `k` kept eigenvalues and their SNR.
pub fn components_meta(md: &Metadata, k: usize) -> CogMeta {
    let eig = &md.eigenvalues[..k.min(md.eigenvalues.len())];
    let snr = &md.snr[..k.min(md.snr.len())];
    CogMeta {
        description: "hypermnf MNF components (Z = T^T (x - mean), float32, NaN = no data)".into(),
        band_names: (1..=k).map(|i| format!("MNF {i}")).collect(),
        items: vec![
            ("MNF_EIGENVALUES".into(), list(eig)),
            ("MNF_SNR".into(), list(snr)),
            ("MNF_NOISE_ESTIMATOR".into(), md.noise.estimator.clone()),
            ("HYPERMNF_VERSION".into(), md.hypermnf_version.clone()),
        ],
        band_items: (0..k)
            .map(|i| {
                let mut v = Vec::new();
                if let Some(e) = eig.get(i) {
                    v.push(("MNF_EIGENVALUE".into(), format!("{e}")));
                }
                if let Some(s) = snr.get(i) {
                    v.push(("MNF_SNR".into(), format!("{s}")));
                }
                v
            })
            .collect(),
        georef: None,
    }
}

/// The denoised cube's COG metadata: the source's band names, and per band its wavelength and fwhm as
/// GDAL's ENVI driver and EnMAP-Box write them (so that the file reads back with its spectra).
pub fn denoised_meta(md: &Metadata, k: usize, source: &CubeMeta) -> CogMeta {
    let bands = md.input.bands;
    let wl = source.wavelengths_nm();
    CogMeta {
        description: format!("hypermnf inverse MNF (denoised) with {k} components, float32"),
        band_names: source.band_names.clone().unwrap_or_else(|| (1..=bands).map(|i| format!("Band {i}")).collect()),
        items: vec![("MNF_EIGENVALUES".into(), list(&md.eigenvalues)), ("MNF_SNR".into(), list(&md.snr))],
        band_items: (0..bands)
            .map(|i| {
                let mut v = Vec::new();
                if let Some(w) = wl.as_ref().and_then(|w| w.get(i)) {
                    v.push(("wavelength".into(), format!("{w}")));
                    v.push(("wavelength_units".into(), "Nanometers".into()));
                }
                if let Some(f) = source.fwhm.as_ref().and_then(|f| f.get(i)) {
                    v.push(("fwhm".into(), format!("{f}")));
                }
                if let Some(b) = source.bbl.as_ref().and_then(|b| b.get(i)) {
                    v.push(("bbl".into(), format!("{}", *b as u8)));
                }
                v
            })
            .collect(),
        georef: None,
    }
}

/// The source metadata a stored result's JSON keeps (`source`): enough for its COG's CRS and spectra.
pub fn source_meta(md: &Metadata) -> CubeMeta {
    let s = &md.source;
    let mut meta = CubeMeta {
        wavelength: s.wavelength.clone(),
        wavelength_units: s.wavelength_units.clone(),
        fwhm: s.fwhm.clone(),
        band_names: s.band_names.clone(),
        description: s.description.clone(),
        map_info: s.map_info.clone(),
        ..Default::default()
    };
    if let Some(cs) = &s.coordinate_system_string {
        meta.extra.push((georef::CS_KEY.into(), format!("{{{cs}}}")));
    }
    if let Some(glt) = &s.emit_glt {
        meta.extra.push((emit::GLT_KEY.into(), format!("{{{glt}}}")));
    }
    meta
}

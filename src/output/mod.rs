//! Writing a result to disk, the same way for `hypermnf run` and the service (so both give the same
//! bytes): the components, the denoised cube when there is one, and the metadata JSON.

#[cfg(feature = "gdal")]
pub mod cog;
pub mod components_file;

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::cube::{envi, npy, CubeError, CubeMeta};
use crate::mnf::MnfOutput;

/// The files one result was written to.
#[derive(Debug, Clone)]
pub struct WrittenFiles {
    /// OUT itself (.npy, or the ENVI .hdr)
    pub components: PathBuf,
    /// The ENVI .img beside OUT when OUT is .hdr.
    pub components_data: Option<PathBuf>,
    /// OUT-stem.json
    pub metadata: PathBuf,
    /// OUT-stem-denoised.npy (or .hdr) when the inverse was computed.
    pub denoised: Option<PathBuf>,
    pub denoised_data: Option<PathBuf>,
}

#[derive(Clone, Copy, PartialEq)]
enum Format {
    Npy,
    Envi,
    /// Cloud-Optimized GeoTIFF (feature `gdal`, [`cog`]).
    Cog,
}

fn format_of(out: &Path) -> Result<Format, CubeError> {
    match out.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
        Some("npy") => Ok(Format::Npy),
        Some("hdr") => Ok(Format::Envi),
        Some("tif" | "tiff") if cfg!(feature = "gdal") => Ok(Format::Cog),
        Some("tif" | "tiff") => Err(crate::cube::needs_gdal(out, crate::cube::sniff::GdalFormat::Tiff)),
        _ => Err(CubeError::Unsupported(format!(
            "{}: the output must end in .npy (NumPy float32), .hdr (ENVI float32 BSQ) or .tif (Cloud-Optimized GeoTIFF, feature `gdal`)",
            out.display()
        ))),
    }
}

/// `dir/stem{suffix}.{ext}` for OUT = `dir/stem.x`.
fn sibling(out: &Path, suffix: &str, ext: &str) -> PathBuf {
    let stem = out.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    out.with_file_name(format!("{stem}{suffix}.{ext}"))
}

/// Writes `result` to `out` (.npy: float32 (lines, samples, k) C order; .hdr: ENVI float32 BSQ + .img),
/// its metadata to OUT-stem.json, and the denoised cube (if any) to OUT-stem-denoised.(npy|hdr).
/// `source` is the input's metadata (carried into ENVI headers).
pub fn write_result(out: &Path, result: &MnfOutput, source: &CubeMeta) -> Result<WrittenFiles, CubeError> {
    write_result_with(out, result, source, false)
}

/// [`write_result`], but for the components when `components_written`: a `.npy` OUT that already
/// holds them (the service writes them during the projection, `output::components_file`).
pub fn write_result_with(out: &Path, result: &MnfOutput, source: &CubeMeta, components_written: bool) -> Result<WrittenFiles, CubeError> {
    write_result_on(out, result, source, components_written, None)
}

/// [`write_result_with`], for a COG OUT on the north-up grid of an EMIT granule's GLT when `ortho`
/// (`hypermnf run --ortho`; `output::cog::ortho_grid` reads it).
#[cfg(feature = "gdal")]
pub fn write_result_ortho(out: &Path, result: &MnfOutput, source: &CubeMeta, ortho: Option<&crate::cube::gdal::emit::Glt>) -> Result<WrittenFiles, CubeError> {
    write_result_on(out, result, source, false, ortho)
}

#[cfg(feature = "gdal")]
type Ortho<'a> = Option<&'a crate::cube::gdal::emit::Glt>;
#[cfg(not(feature = "gdal"))]
type Ortho<'a> = Option<&'a std::convert::Infallible>;

fn write_result_on(out: &Path, result: &MnfOutput, source: &CubeMeta, components_written: bool, ortho: Ortho) -> Result<WrittenFiles, CubeError> {
    let format = format_of(out)?;
    if ortho.is_some() && format != Format::Cog {
        return Err(CubeError::Unsupported(format!("{}: --ortho writes a GeoTIFF: OUT must end in .tif", out.display())));
    }
    if components_written && format != Format::Npy {
        return Err(CubeError::Unsupported(format!("{}: components written ahead must be a .npy", out.display())));
    }
    let t = Instant::now();
    let md = &result.metadata;
    let (lines, samples, bands) = (md.input.lines, md.input.samples, md.input.bands);
    let k = result.k;
    let mut files = WrittenFiles {
        components: out.to_path_buf(),
        components_data: None,
        metadata: sibling(out, "", "json"),
        denoised: None,
        denoised_data: None,
    };
    match format {
        Format::Npy if components_written => {}
        _ if result.components.len() != lines * samples * k => {
            return Err(CubeError::Unsupported(format!(
                "the result holds {} component values, not {lines} x {samples} x {k}",
                result.components.len()
            )))
        }
        Format::Npy => npy::write_f32(out, &[lines, samples, k], &result.components)?,
        Format::Envi => {
            envi::write_f32_bsq(out, lines, samples, k, &result.components, &components_header(result, source))?;
            files.components_data = Some(out.with_extension("img"));
        }
        Format::Cog => write_cog(out, &result.components, (lines, samples, k), result, source, ortho, false)?,
    }
    if let Some(den) = &result.denoised {
        match format {
            Format::Npy => {
                let p = sibling(out, "-denoised", "npy");
                npy::write_f32(&p, &[lines, samples, bands], den)?;
                files.denoised = Some(p);
            }
            Format::Envi => {
                let p = sibling(out, "-denoised", "hdr");
                envi::write_f32_bsq(&p, lines, samples, bands, den, &denoised_header(result, source))?;
                files.denoised_data = Some(p.with_extension("img"));
                files.denoised = Some(p);
            }
            Format::Cog => {
                let p = sibling(out, "-denoised", "tif");
                write_cog(&p, den, (lines, samples, bands), result, source, ortho, true)?;
                files.denoised = Some(p);
            }
        }
    }
    let mut md = md.clone();
    md.timings_ms.insert("write".into(), t.elapsed().as_secs_f64() * 1e3);
    let f = File::create(&files.metadata).map_err(|e| CubeError::io(&files.metadata, e))?;
    let mut w = BufWriter::new(f);
    serde_json::to_writer_pretty(&mut w, &md)
        .map_err(|e| CubeError::io(&files.metadata, std::io::Error::other(e)))?;
    w.write_all(b"\n").and_then(|_| w.flush()).map_err(|e| CubeError::io(&files.metadata, e))?;
    Ok(files)
}

/// One COG of `result`: its components, or its denoised cube when `denoised`.
#[cfg(feature = "gdal")]
fn write_cog(
    path: &Path,
    values: &[f32],
    (lines, samples, bands): (usize, usize, usize),
    result: &MnfOutput,
    source: &CubeMeta,
    ortho: Ortho,
    denoised: bool,
) -> Result<(), CubeError> {
    use crate::output::cog::{components_meta, denoised_meta, write, Grid};
    let meta = if denoised { denoised_meta(&result.metadata, result.k, source) } else { components_meta(&result.metadata, result.k) };
    let grid = match ortho {
        Some(glt) => Grid::Ortho(glt),
        None => Grid::Source,
    };
    write(path, values, lines, samples, bands, meta, source, &grid)
}

#[cfg(not(feature = "gdal"))]
fn write_cog(path: &Path, _: &[f32], _: (usize, usize, usize), _: &MnfOutput, _: &CubeMeta, _: Ortho, _: bool) -> Result<(), CubeError> {
    Err(crate::cube::needs_gdal(path, crate::cube::sniff::GdalFormat::Tiff))
}

/// Writes only the ENVI headers of `result` (the components at `hdr`, the denoised cube beside it),
/// whose data files the service makes from the `.npy` results on the first request for them
/// (`envi::write_f32_bsq_data_from_npy`): the headers carry what only the job knows (the source's
/// metadata), the data are the `.npy` values transposed. Returns the components' header and the
/// denoised cube's, if any.
pub fn write_envi_headers(hdr: &Path, result: &MnfOutput, source: &CubeMeta) -> Result<(PathBuf, Option<PathBuf>), CubeError> {
    let md = &result.metadata;
    let (lines, samples, bands) = (md.input.lines, md.input.samples, md.input.bands);
    envi::write_f32_bsq_header(hdr, lines, samples, result.k, &components_header(result, source))?;
    let denoised = match &result.denoised {
        Some(_) => {
            let p = sibling(hdr, "-denoised", "hdr");
            envi::write_f32_bsq_header(&p, lines, samples, bands, &denoised_header(result, source))?;
            Some(p)
        }
        None => None,
    };
    Ok((hdr.to_path_buf(), denoised))
}

fn components_header(result: &MnfOutput, source: &CubeMeta) -> envi::OutputHeader {
    let k = result.k;
    envi::OutputHeader {
        description: "hypermnf MNF components (Z = T^T (x - mean), float32, NaN = no data)".to_string(),
        band_names: (1..=k).map(|i| format!("MNF {i}")).collect(),
        eigenvalues: Some(result.metadata.eigenvalues[..k].to_vec()),
        source: source.clone(),
        keep_spectral: false,
    }
}

fn denoised_header(result: &MnfOutput, source: &CubeMeta) -> envi::OutputHeader {
    let bands = result.metadata.input.bands;
    envi::OutputHeader {
        description: format!("hypermnf inverse MNF (denoised) with {} components, float32", result.k),
        band_names: source.band_names.clone().unwrap_or_else(|| (1..=bands).map(|i| format!("Band {i}")).collect()),
        eigenvalues: None,
        source: source.clone(),
        keep_spectral: true,
    }
}

//! Writing a result to disk, the same way for `hypermnf run` and the service (so both give the same
//! bytes): the components, the denoised cube when there is one, and the metadata JSON.

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
}

fn format_of(out: &Path) -> Result<Format, CubeError> {
    match out.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
        Some("npy") => Ok(Format::Npy),
        Some("hdr") => Ok(Format::Envi),
        _ => Err(CubeError::Unsupported(format!(
            "{}: the output must end in .npy (NumPy float32) or .hdr (ENVI float32 BSQ)",
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
    let format = format_of(out)?;
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

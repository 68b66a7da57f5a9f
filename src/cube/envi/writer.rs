//! Writing ENVI cubes: the header text and the data file beside it (`x.hdr` → `x.img`).
//!
//! The data file is written first and the header last, so a header on disk means its data is complete.

use std::fs::File;
use std::path::{Path, PathBuf};

use super::header::{is_empty_value, normalize_key, GEOMETRY_KEYS, META_KEYS};
use crate::cube::layout::{write_from_bip, Dims, FileOrder};
use crate::cube::sample_type::checked_cube_bytes;
use crate::cube::{ByteOrder, Cube, CubeError, CubeMeta, DataType, Interleave};

/// What an ENVI float32 BSQ output header carries besides the geometry.
#[derive(Debug, Clone, Default)]
pub struct OutputHeader {
    pub description: String,
    /// One per output band (`MNF 1`, ...). When empty and `keep_spectral`, the source's band names.
    pub band_names: Vec<String>,
    /// Written as `mnf eigenvalues = {...}` when present.
    pub eigenvalues: Option<Vec<f64>>,
    /// Source metadata carried over (map info, extra keys; wavelength/fwhm only when `keep_spectral`).
    pub source: CubeMeta,
    /// The output's bands are the input's (a denoised cube): carry wavelength, fwhm, wavelength units,
    /// bbl, data ignore value and the band-keyed extras too.
    pub keep_spectral: bool,
}

/// Entries that describe the input's bands or the encoding of its samples: wrong for MNF components
/// (whose bands are not the input's), so dropped from the extras unless the output keeps the spectral
/// bands (a denoised cube).
const BAND_KEYED: [&str; 7] = [
    "default bands",
    "data gain values",
    "data offset values",
    "data reflectance gain values",
    "data reflectance offset values",
    "reflectance scale factor",
    "solar irradiance",
];

/// Entries hypermnf writes itself, never copied from the extras.
const WRITTEN_KEYS: [&str; 1] = ["mnf eigenvalues"];

/// `x.hdr` → `x.img`; the header must end in `.hdr` so that the two never collide.
fn data_path(hdr: &Path) -> Result<PathBuf, CubeError> {
    match hdr.extension().and_then(|e| e.to_str()) {
        Some(e) if e.eq_ignore_ascii_case("hdr") => Ok(hdr.with_extension("img")),
        _ => Err(CubeError::Unsupported(format!("{}: an ENVI output header must end in .hdr", hdr.display()))),
    }
}

/// A number as ENVI readers (and Python's `float`) parse it, round-tripping exactly: plain notation
/// for everyday magnitudes, scientific otherwise.
pub(crate) fn fmt_f64(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 || (1e-4..1e15).contains(&a) || !v.is_finite() {
        format!("{v}")
    } else {
        format!("{v:e}")
    }
}

/// ENVI has no escaping: braces would end a value early and commas would split a list item.
fn sanitize(text: &str, in_list: bool) -> String {
    text.chars()
        .map(|c| match c {
            '{' => '(',
            '}' => ')',
            ',' if in_list => ';',
            '\r' | '\n' if in_list => ' ',
            c => c,
        })
        .collect()
}

/// Builds header text entry by entry.
struct HeaderText(String);

impl HeaderText {
    fn new() -> Self {
        HeaderText("ENVI\n".to_string())
    }
    fn entry(&mut self, key: &str, value: impl std::fmt::Display) {
        self.0.push_str(&format!("{key} = {value}\n"));
    }
    fn braced(&mut self, key: &str, text: &str) {
        self.entry(key, format!("{{{}}}", sanitize(text, false)));
    }
    fn list<S: AsRef<str>>(&mut self, key: &str, items: impl IntoIterator<Item = S>) {
        let items: Vec<String> = items.into_iter().map(|s| sanitize(s.as_ref(), true)).collect();
        self.0.push_str(&format!("{key} = {{\n {}}}\n", items.join(",\n ")));
    }
    fn geometry(&mut self, dims: Dims, dtype: DataType, interleave: Interleave, order: ByteOrder) {
        self.entry("samples", dims.samples);
        self.entry("lines", dims.lines);
        self.entry("bands", dims.bands);
        self.entry("header offset", 0);
        self.entry("file type", "ENVI Standard");
        self.entry("data type", dtype.envi_code());
        self.entry("interleave", interleave.name());
        self.entry("byte order", order.envi_code());
    }
    /// Map info (verbatim, `rotation=` included) and the uninterpreted entries of the source, the
    /// `coordinate system string` (WKT) among them; entries with an empty value (`{}`) are left out.
    fn carried(&mut self, meta: &CubeMeta, keep_spectral: bool) {
        if let Some(map) = &meta.map_info {
            self.braced("map info", map);
        }
        for (key, value) in &meta.extra {
            let norm = normalize_key(key);
            let ours = [&GEOMETRY_KEYS[..], &META_KEYS[..], &WRITTEN_KEYS[..]].concat().contains(&norm.as_str());
            if ours || is_empty_value(value) || (!keep_spectral && BAND_KEYED.contains(&norm.as_str())) {
                continue;
            }
            self.entry(key, value);
        }
    }
    /// Wavelengths, fwhm, bbl and the ignore value, each checked against the band count.
    fn spectral(&mut self, meta: &CubeMeta, bands: usize) -> Result<(), CubeError> {
        let check = |key: &str, n: usize| {
            if n == bands {
                Ok(())
            } else {
                Err(CubeError::SizeMismatch(format!("{key} has {n} values for {bands} output bands")))
            }
        };
        if let Some(units) = &meta.wavelength_units {
            self.entry("wavelength units", sanitize(units, false));
        }
        if let Some(w) = &meta.wavelength {
            check("wavelength", w.len())?;
            self.list("wavelength", w.iter().map(|&v| fmt_f64(v)));
        }
        if let Some(f) = &meta.fwhm {
            check("fwhm", f.len())?;
            self.list("fwhm", f.iter().map(|&v| fmt_f64(v)));
        }
        if let Some(bbl) = &meta.bbl {
            check("bbl", bbl.len())?;
            self.list("bbl", bbl.iter().map(|&g| if g { "1" } else { "0" }));
        }
        if let Some(v) = meta.ignore_value {
            self.entry("data ignore value", fmt_f64(v));
        }
        Ok(())
    }
}

/// The data file. Unbuffered: `layout` stages whole blocks and BSQ output uses positioned writes.
fn create(path: &Path) -> Result<File, CubeError> {
    File::create(path).map_err(|e| CubeError::io(path, e))
}

fn write_text(path: &Path, text: &str) -> Result<(), CubeError> {
    std::fs::write(path, text).map_err(|e| CubeError::io(path, e))
}

/// See [`super::write_f32_bsq`].
pub(super) fn write_f32_bsq(
    hdr: &Path,
    lines: usize,
    samples: usize,
    bands: usize,
    values_bip: &[f32],
    header: &OutputHeader,
) -> Result<(), CubeError> {
    let bytes = checked_cube_bytes(lines as u64, samples as u64, bands as u64, DataType::F32)?;
    if values_bip.len() as u64 * 4 != bytes {
        return Err(CubeError::SizeMismatch(format!(
            "{} values for {lines} lines x {samples} samples x {bands} bands",
            values_bip.len()
        )));
    }
    let text = f32_bsq_header_text(lines, samples, bands, header)?;
    let data = data_path(hdr)?;
    let w = create(&data)?;
    write_planes(&w, lines * samples, bands, &le_bytes(values_bip)).map_err(|e| CubeError::io(&data, e))?;
    write_text(hdr, &text)
}

/// See [`super::write_f32_bsq_header`].
pub(super) fn write_f32_bsq_header(hdr: &Path, lines: usize, samples: usize, bands: usize, header: &OutputHeader) -> Result<(), CubeError> {
    checked_cube_bytes(lines as u64, samples as u64, bands as u64, DataType::F32)?;
    let text = f32_bsq_header_text(lines, samples, bands, header)?;
    data_path(hdr)?;
    write_text(hdr, &text)
}

/// See [`super::write_f32_bsq_data_from_npy`].
pub(super) fn write_f32_bsq_data_from_npy(npy: &Path, img: &Path) -> Result<(), CubeError> {
    let cube = crate::cube::npy::map(npy)?;
    if cube.dtype() != DataType::F32 || cube.byte_order() != ByteOrder::Little {
        return Err(CubeError::Unsupported(format!("{} is not a little-endian float32 .npy", npy.display())));
    }
    let w = create(img)?;
    write_planes(&w, cube.lines() * cube.samples(), cube.bands(), cube.raw()).map_err(|e| CubeError::io(img, e))
}

/// The header text of a float32 little-endian BSQ output.
fn f32_bsq_header_text(lines: usize, samples: usize, bands: usize, header: &OutputHeader) -> Result<String, CubeError> {
    let band_names: &[String] = match (&header.source.band_names, header.band_names.is_empty()) {
        (Some(names), true) if header.keep_spectral => names,
        _ => &header.band_names,
    };
    if !band_names.is_empty() && band_names.len() != bands {
        return Err(CubeError::SizeMismatch(format!("{} band names for {bands} bands", band_names.len())));
    }
    let mut text = HeaderText::new();
    text.braced("description", &header.description);
    text.geometry(Dims::new(lines, samples, bands), DataType::F32, Interleave::Bsq, ByteOrder::Little);
    text.carried(&header.source, header.keep_spectral);
    if !band_names.is_empty() {
        text.list("band names", band_names);
    }
    if let Some(eig) = &header.eigenvalues {
        text.list("mnf eigenvalues", eig.iter().map(|v| format!("{v:e}")));
    }
    if header.keep_spectral {
        text.spectral(&header.source, bands)?;
    }
    Ok(text.0)
}

/// Float32 values as their little-endian bytes: a view on a little-endian host, a copy elsewhere.
fn le_bytes(values: &[f32]) -> std::borrow::Cow<'_, [u8]> {
    match crate::cube::npy::f32_le_view(values) {
        Some(bytes) => std::borrow::Cow::Borrowed(bytes),
        None => std::borrow::Cow::Owned(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
    }
}

/// Pixels one task of `write_planes` transposes at a time (32 K pixels × k bands × 4 bytes: a
/// block of the BIP input that stays in the core's cache while it is read k times).
const PLANE_BLOCK: usize = 1 << 15;

/// Writes BIP 4-byte elements (`pixels` × `bands`, as bytes) to `w` as band planes (BSQ), blocks of
/// pixels transposed in parallel and written at their places. One thread walking the whole result
/// element by element took 20–30 ms of a job's 27 MB result on the H100 host, more than
/// the projection that made it.
fn write_planes(w: &File, pixels: usize, bands: usize, bip: &[u8]) -> std::io::Result<()> {
    use rayon::prelude::*;
    use std::os::unix::fs::FileExt;
    debug_assert_eq!(bip.len(), pixels * bands * 4);
    if pixels == 0 || bands == 0 {
        return Ok(());
    }
    bip.par_chunks(PLANE_BLOCK * bands * 4).enumerate().try_for_each_init(Vec::new, |buf: &mut Vec<u8>, (block, bytes)| {
        let (p0, n) = (block * PLANE_BLOCK, bytes.len() / (bands * 4));
        buf.clear();
        buf.reserve(bytes.len());
        for b in 0..bands {
            for e in bytes.chunks_exact(4).skip(b).step_by(bands) {
                buf.extend_from_slice(e);
            }
        }
        for (b, plane) in buf.chunks_exact(n * 4).enumerate() {
            w.write_all_at(plane, ((b * pixels + p0) * 4) as u64)?;
        }
        Ok(())
    })
}

/// See [`super::write_cube`].
pub(super) fn write_cube(hdr: &Path, cube: &Cube, interleave: Interleave, order: ByteOrder) -> Result<(), CubeError> {
    let dims = Dims::new(cube.lines(), cube.samples(), cube.bands());
    let meta = &cube.meta;
    if let Some(names) = &meta.band_names {
        if names.len() != dims.bands {
            return Err(CubeError::SizeMismatch(format!("{} band names for {} bands", names.len(), dims.bands)));
        }
    }

    let mut text = HeaderText::new();
    if let Some(d) = &meta.description {
        text.braced("description", d);
    }
    text.geometry(dims, cube.dtype(), interleave, order);
    text.carried(meta, true);
    if let Some(names) = &meta.band_names {
        text.list("band names", names);
    }
    text.spectral(meta, dims.bands)?;

    let data = data_path(hdr)?;
    let mut w = create(&data)?;
    let swap = order != cube.byte_order();
    write_from_bip(&mut w, 0, FileOrder::of(interleave), dims, cube.dtype().size(), cube.raw(), swap)
        .map_err(|e| CubeError::io(&data, e))?;
    write_text(hdr, &text.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The parallel plane writer gives the bytes of the generic element writer, over several blocks
    /// and a partial last one.
    #[test]
    fn planes_match_the_element_writer() {
        let dir = tempfile::tempdir().unwrap();
        let (lines, samples, bands) = (2 * PLANE_BLOCK / 64 + 1, 64 + 3, 5);
        let pixels = lines * samples;
        let values: Vec<f32> = (0..pixels * bands).map(|i| ((i as u64 * 2654435761) % 100_003) as f32 * 0.37 - 1e4).collect();
        let fast = dir.path().join("fast.img");
        write_planes(&File::create(&fast).unwrap(), pixels, bands, &le_bytes(&values)).unwrap();
        let mut reference = std::io::Cursor::new(Vec::new());
        crate::cube::layout::write_elements::<_, 4>(&mut reference, 0, FileOrder::BSQ, Dims::new(lines, samples, bands), |i| {
            values[i].to_le_bytes()
        })
        .unwrap();
        assert!(pixels > 2 * PLANE_BLOCK && pixels % PLANE_BLOCK != 0);
        assert!(std::fs::read(&fast).unwrap() == reference.into_inner());
    }
}

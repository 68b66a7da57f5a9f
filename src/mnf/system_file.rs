//! The system file: an eigen system as a documented JSON file that a user can keep, send to another
//! service, read with numpy, and apply to other cubes (`GET /v1/jobs/{id}/system`, `POST /v1/systems`,
//! `hypermnf run --system` / `--export-system`, `MnfFit::from_system`). README § "Reuse a system"
//! documents the format for users.
//!
//! ```text
//! {"format": "hypermnf-system", "version": 1, "hypermnf_version": "...",
//!  "source": {"job": id} | {"system": id} | {"batch": id} | {"run": path},
//!  "input": {"bands": B, "wavelengths": [...] | null, "wavelength_units": ... | null, "fwhm": [...] | null},
//!  "bands_used": [...], "dropped_bands": [{"band", "reason"}], "noise": {"estimator", "scale", "window"},
//!  "ignore_value": ..., "params": {...}, "pixels": {"used", "masked"}, "noise_samples": n,
//!  "arrays": {"means": A, "eigenvalues": A, "transform": A, "noise_covariance": A, ...}}
//! ```
//!
//! Every A is `{"npy": "<base64 of a .npy file of '<f8'>"}`: the float64 values travel as their bytes,
//! so they come back bit for bit (a projection with an imported system equals one with the system the
//! job computed), and numpy reads them as they are. Arrays this version does not know (a batch's
//! pooled statistics) are kept as they came and otherwise ignored.
//!
//! Reading checks everything before it is used: sizes are bounded before anything is decoded or
//! allocated, every shape against the bands used, every value finite, every band index below B. A
//! damaged or hostile file gets a [`SystemFileError`] saying what is wrong, never a panic.

use std::collections::BTreeMap;
use std::io::Cursor;
use std::path::Path;

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest as _, Sha256};

use super::bands::DroppedBand;
use super::params::{nodata_json, MnfParams, NoiseEstimator, Window};
use super::result::{EigenSystem, Metadata};
use crate::cube::{ByteOrder, DataType};

/// The `format` member of every system file.
pub const FORMAT: &str = "hypermnf-system";
/// Bumped whenever the layout or the meaning of the file changes.
pub const VERSION: u32 = 1;
/// The largest file read: a 2 048-band system is about 90 MB of JSON (two 2 048² float64 matrices in
/// base64), far more bands than any imaging spectrometer has.
pub const MAX_FILE_BYTES: usize = 128 << 20;
/// The most input bands a file may declare (bounds the lists read before the arrays are checked).
pub const MAX_INPUT_BANDS: usize = 1 << 16;
/// The most bands used: bounds the u × u arrays (2 × 32 MiB at this size).
pub const MAX_BANDS_USED: usize = 2048;

/// Why a system file was refused (or could not be read or written).
#[derive(Debug, thiserror::Error)]
pub enum SystemFileError {
    #[error("not a hypermnf system file: {0}")]
    NotSystemFile(String),
    #[error("system file version {found}; this build reads version {VERSION}")]
    Version { found: u64 },
    #[error("invalid system file: {0}")]
    Invalid(String),
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
}

impl SystemFileError {
    /// The stable code the service and the CLI answer with.
    pub fn code(&self) -> &'static str {
        match self {
            SystemFileError::Io { .. } => "io_error",
            _ => "invalid_system",
        }
    }
}

fn invalid(m: impl Into<String>) -> SystemFileError {
    SystemFileError::Invalid(m.into())
}

/// Where the system in a file was computed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// A service job (`GET /v1/jobs/{id}/system`).
    Job(String),
    /// A system imported into a service (`GET /v1/systems/{id}`).
    System(String),
    /// A batch's pooled statistics.
    Batch(String),
    /// `hypermnf run --export-system`: the input's path.
    Run(String),
}

/// The cube the system was computed from, as far as its bands go: what a cube must match to be
/// projected with it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InputBands {
    /// Every band of the input (B), used or not: a cube projected with the system has B bands.
    pub bands: usize,
    /// One per input band, when the input's header gave them.
    pub wavelengths: Option<Vec<f64>>,
    pub wavelength_units: Option<String>,
    #[serde(default)]
    pub fwhm: Option<Vec<f64>>,
}

/// The noise model the system was computed with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NoiseModel {
    pub estimator: NoiseEstimator,
    /// The noise covariance was divided by this (9/8 or 2).
    pub scale: f64,
    pub window: Option<Window>,
}

/// Pixels that entered the data statistics, and no-data pixels left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PixelCounts {
    pub used: u64,
    pub masked: u64,
}

/// A parsed, checked system file.
#[derive(Debug, Clone, PartialEq)]
pub struct SystemFile {
    pub hypermnf_version: String,
    pub source: Source,
    pub input: InputBands,
    pub noise: NoiseModel,
    /// The no-data value the statistics were computed with (NaN for a float cube without one).
    pub ignore_value: Option<f64>,
    /// The parameters of the fit that computed the system.
    pub params: MnfParams,
    /// The eigen system: bands used and dropped, means, eigenvalues, full transform (u × u, rows
    /// follow `bands_used`), noise covariance, counts.
    pub system: EigenSystem,
    /// Arrays this version does not know, as they came (`{"npy": ...}` objects).
    pub extra_arrays: BTreeMap<String, Value>,
}

/// The members of the file besides the arrays, as they are read (`format` and `version` are checked
/// first, on the JSON value; members this version does not know are ignored).
#[derive(Deserialize)]
struct Wire {
    #[serde(default)]
    hypermnf_version: String,
    source: Source,
    input: InputBands,
    bands_used: Vec<usize>,
    #[serde(default)]
    dropped_bands: Vec<DroppedBand>,
    noise: NoiseModel,
    #[serde(default, with = "nodata_json")]
    ignore_value: Option<f64>,
    #[serde(default)]
    params: MnfParams,
    pixels: PixelCounts,
    noise_samples: u64,
    arrays: BTreeMap<String, Value>,
}

impl SystemFile {
    /// The file of a run's eigen system: `metadata` is the run's (`Metadata` of the job, or of
    /// `hypermnf run`), `system` the eigen system it projected with.
    pub fn of_run(source: Source, metadata: &Metadata, system: &EigenSystem) -> SystemFile {
        let params = MnfParams { statistics_from: None, statistics_sha256: None, ..metadata.params.clone() };
        SystemFile {
            hypermnf_version: env!("CARGO_PKG_VERSION").to_string(),
            source,
            input: InputBands {
                bands: metadata.input.bands,
                wavelengths: metadata.source.wavelength.clone(),
                wavelength_units: metadata.source.wavelength_units.clone(),
                fwhm: metadata.source.fwhm.clone(),
            },
            noise: NoiseModel { estimator: params.noise, scale: params.noise.scale(), window: params.noise_window },
            ignore_value: metadata.pixels.ignore_value,
            params,
            system: system.clone(),
            extra_arrays: BTreeMap::new(),
        }
    }

    /// The parameters to project a cube with this system: the user's (`components`, `snr`,
    /// `inverse`, `bad_bands` and `ignore_value` act per pixel), with the noise estimator of the
    /// system, which the projection does not use but the metadata reports. (Not its noise window,
    /// which is checked against the cube and need not fit another one.)
    pub fn apply_params(&self, user: &MnfParams) -> MnfParams {
        MnfParams { noise: self.noise.estimator, noise_window: None, ..user.clone() }
    }

    /// The number of bands used (u): the most components a projection with it can keep.
    pub fn used(&self) -> usize {
        self.system.used()
    }

    /// The JSON bytes of the file.
    pub fn to_json(&self) -> Vec<u8> {
        let s = &self.system;
        let u = s.used();
        let mut arrays = serde_json::Map::new();
        for (name, value) in &self.extra_arrays {
            arrays.insert(name.clone(), value.clone());
        }
        arrays.insert("means".into(), npy_member(&[u], &s.means));
        arrays.insert("eigenvalues".into(), npy_member(&[u], &s.eigenvalues));
        arrays.insert("transform".into(), npy_member(&[u, u], &s.transform));
        arrays.insert("noise_covariance".into(), npy_member(&[u, u], &s.noise_covariance));
        let ignore = match self.ignore_value {
            Some(v) if v.is_nan() => json!("nan"),
            Some(v) => json!(v),
            None => Value::Null,
        };
        let doc = json!({
            "format": FORMAT,
            "version": VERSION,
            "hypermnf_version": self.hypermnf_version,
            "source": self.source,
            "input": self.input,
            "bands_used": s.bands_used,
            "dropped_bands": s.dropped_bands,
            "noise": self.noise,
            "ignore_value": ignore,
            "params": self.params,
            "pixels": PixelCounts { used: s.pixels_used, masked: s.pixels_masked },
            "noise_samples": s.noise_samples,
            "arrays": arrays,
        });
        serde_json::to_vec_pretty(&doc).expect("a system file serialises")
    }

    /// Parses and checks a system file (see the module doc).
    pub fn from_json(bytes: &[u8]) -> Result<SystemFile, SystemFileError> {
        if bytes.len() > MAX_FILE_BYTES {
            return Err(invalid(format!("{} bytes, more than the {MAX_FILE_BYTES} a system file may have", bytes.len())));
        }
        let value: Value = serde_json::from_slice(bytes).map_err(|e| SystemFileError::NotSystemFile(format!("not JSON: {e}")))?;
        match value.get("format") {
            Some(Value::String(f)) if f == FORMAT => {}
            _ => return Err(SystemFileError::NotSystemFile(format!("its \"format\" is not {FORMAT:?}"))),
        }
        match value.get("version").and_then(Value::as_u64) {
            Some(v) if v == VERSION as u64 => {}
            Some(found) => return Err(SystemFileError::Version { found }),
            None => return Err(invalid("\"version\" is missing or not an integer")),
        }
        let wire: Wire = serde_json::from_value(value).map_err(|e| invalid(e.to_string()))?;
        let b = wire.input.bands;
        if b == 0 || b > MAX_INPUT_BANDS {
            return Err(invalid(format!("input.bands is {b}; it must be 1 to {MAX_INPUT_BANDS}")));
        }
        for (name, list) in [("wavelengths", &wire.input.wavelengths), ("fwhm", &wire.input.fwhm)] {
            if let Some(l) = list {
                if l.len() != b {
                    return Err(invalid(format!("input.{name} has {} values for {b} bands", l.len())));
                }
                if l.iter().any(|v| !v.is_finite()) {
                    return Err(invalid(format!("input.{name} holds a value that is not finite")));
                }
            }
        }
        let used = &wire.bands_used;
        let u = used.len();
        if u == 0 || u > MAX_BANDS_USED.min(b) {
            return Err(invalid(format!("{u} bands used; there must be 1 to {} (the input has {b} bands)", MAX_BANDS_USED.min(b))));
        }
        if let Some(&bad) = used.iter().find(|&&x| x >= b) {
            return Err(invalid(format!("bands_used names band {bad}, but the input has bands 0..{}", b - 1)));
        }
        if used.windows(2).any(|w| w[0] >= w[1]) {
            return Err(invalid("bands_used must be strictly ascending"));
        }
        for d in &wire.dropped_bands {
            if d.band >= b || used.binary_search(&d.band).is_ok() {
                return Err(invalid(format!("dropped band {} is out of range or also used", d.band)));
            }
        }
        if !wire.noise.scale.is_finite() || wire.noise.scale <= 0.0 {
            return Err(invalid("noise.scale must be a positive number"));
        }
        let mut arrays = wire.arrays;
        let mut take = |name: &str, shape: &[usize]| -> Result<Vec<f64>, SystemFileError> {
            let member = arrays.remove(name).ok_or_else(|| invalid(format!("arrays.{name} is missing")))?;
            read_npy_member(name, &member, shape)
        };
        let means = take("means", &[u])?;
        let eigenvalues = take("eigenvalues", &[u])?;
        let transform = take("transform", &[u, u])?;
        let noise_covariance = take("noise_covariance", &[u, u])?;
        Ok(SystemFile {
            hypermnf_version: wire.hypermnf_version,
            source: wire.source,
            input: wire.input,
            noise: wire.noise,
            ignore_value: wire.ignore_value,
            params: MnfParams { statistics_from: None, statistics_sha256: None, ..wire.params },
            system: EigenSystem {
                bands_used: wire.bands_used,
                dropped_bands: wire.dropped_bands,
                means,
                eigenvalues,
                transform,
                noise_covariance,
                noise_samples: wire.noise_samples,
                pixels_used: wire.pixels.used,
                pixels_masked: wire.pixels.masked,
            },
            extra_arrays: arrays,
        })
    }

    /// Reads and checks the file at `path` (its size bounded before it is read).
    pub fn load(path: &Path) -> Result<SystemFile, SystemFileError> {
        let io = |e: std::io::Error| SystemFileError::Io { path: path.display().to_string(), source: e };
        let len = std::fs::metadata(path).map_err(io)?.len();
        if len > MAX_FILE_BYTES as u64 {
            return Err(invalid(format!("{len} bytes, more than the {MAX_FILE_BYTES} a system file may have")));
        }
        SystemFile::from_json(&std::fs::read(path).map_err(io)?)
    }

    /// Writes the file to `path`.
    pub fn save(&self, path: &Path) -> Result<(), SystemFileError> {
        std::fs::write(path, self.to_json()).map_err(|e| SystemFileError::Io { path: path.display().to_string(), source: e })
    }

    /// The system's identity: a SHA-256 over exactly what a projection with it depends on (the bands
    /// used, the means and the transform, bit for bit) and what its inverse uses (the noise
    /// covariance), plus the input's band count. Two files of the same system have the same identity
    /// whatever their source or formatting; a job's cache digest includes it.
    pub fn identity(&self) -> String {
        let s = &self.system;
        let mut h = Sha256::new();
        h.update(b"hypermnf-system-v1");
        h.update((self.input.bands as u64).to_le_bytes());
        h.update((s.used() as u64).to_le_bytes());
        for &b in &s.bands_used {
            h.update((b as u64).to_le_bytes());
        }
        for v in [&s.means, &s.eigenvalues, &s.transform, &s.noise_covariance].into_iter().flatten() {
            h.update(v.to_le_bytes());
        }
        hex::encode(h.finalize())
    }

    /// Why a cube of `bands` bands (and `wavelengths`, when its header gives them) cannot be
    /// projected with this system, keeping `components` (when asked): None when it can.
    pub fn mismatch(&self, bands: usize, wavelengths: Option<&[f64]>, components: Option<usize>) -> Option<String> {
        if bands != self.input.bands {
            return Some(format!("the cube has {bands} bands, the system was computed on a cube of {} bands", self.input.bands));
        }
        if let (Some(cube), Some(system)) = (wavelengths, self.input.wavelengths.as_deref()) {
            // The same numbers, not within a tolerance: the same sensor's headers write the same text.
            if let Some(i) = (0..bands).find(|&i| cube.get(i) != system.get(i)) {
                return Some(format!(
                    "the cube's wavelengths differ from the system's (band {i}: {} against {})",
                    cube.get(i).map_or("none".into(), f64::to_string),
                    system.get(i).map_or("none".into(), f64::to_string)
                ));
            }
        }
        match components {
            Some(k) if k > self.used() => {
                Some(format!("components ({k}) exceeds the {} components of the system (its bands used)", self.used()))
            }
            _ => None,
        }
    }
}

/// `{"npy": base64}` of a float64 array of `shape`.
fn npy_member(shape: &[usize], values: &[f64]) -> Value {
    json!({ "npy": base64::engine::general_purpose::STANDARD.encode(npy_f64(shape, values)) })
}

/// A `.npy` (version 1.0) of little-endian float64 in C order, as `numpy.save` writes one.
pub fn npy_f64(shape: &[usize], values: &[f64]) -> Vec<u8> {
    let shape_text = match shape {
        [n] => format!("({n},)"),
        _ => format!("({})", shape.iter().map(usize::to_string).collect::<Vec<_>>().join(", ")),
    };
    let mut header = format!("{{'descr': '<f8', 'fortran_order': False, 'shape': {shape_text}, }}").into_bytes();
    // Magic (6) + version (2) + length (2) + header + newline, padded to a multiple of 64.
    let unpadded = 10 + header.len() + 1;
    header.resize(header.len() + (64 - unpadded % 64) % 64, b' ');
    header.push(b'\n');
    let mut out = Vec::with_capacity(10 + header.len() + 8 * values.len());
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(&header);
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

/// The values of member `name` (`{"npy": base64}`), which must be a float64 array of exactly `shape`
/// with finite values. Its size is checked before it is decoded.
fn read_npy_member(name: &str, member: &Value, shape: &[usize]) -> Result<Vec<f64>, SystemFileError> {
    let text = member
        .get("npy")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid(format!("arrays.{name} must be {{\"npy\": \"<base64>\"}}")))?;
    let count: usize = shape.iter().product();
    // The header is at most a few hundred bytes; anything far longer than the values is refused undecoded.
    let most = (8 * count + 4096).div_ceil(3) * 4;
    if text.len() > most {
        return Err(invalid(format!("arrays.{name} is larger than a float64 array of shape {shape:?}")));
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| invalid(format!("arrays.{name} is not base64: {e}")))?;
    let mut cursor = Cursor::new(bytes.as_slice());
    let header = crate::cube::npy::read_header(&mut cursor).map_err(|e| invalid(format!("arrays.{name}: {e}")))?;
    let got: Vec<usize> = header.shape.iter().map(|&d| d as usize).collect();
    if header.dtype != DataType::F64 || header.byte_order != ByteOrder::Little || header.fortran_order {
        return Err(invalid(format!("arrays.{name} must be little-endian float64 ('<f8') in C order")));
    }
    if got != shape {
        return Err(invalid(format!("arrays.{name} has shape {got:?}, expected {shape:?}")));
    }
    let data = &bytes[header.data_offset as usize..];
    if data.len() != 8 * count {
        return Err(invalid(format!("arrays.{name} holds {} bytes of values, expected {}", data.len(), 8 * count)));
    }
    let values: Vec<f64> = data.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
    if values.iter().any(|v| !v.is_finite()) {
        return Err(invalid(format!("arrays.{name} holds a value that is not finite")));
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mnf::bands::DropReason;

    pub(crate) fn sample() -> SystemFile {
        let u = 3;
        let f = |i: usize| (i as f64 + 0.1) / 3.0 * if i % 2 == 0 { 1.0 } else { -1e-300 };
        SystemFile {
            hypermnf_version: "test".into(),
            source: Source::Job("j".into()),
            input: InputBands { bands: 5, wavelengths: Some(vec![400.0, 410.5, 420.0, 430.0, 440.0]), wavelength_units: Some("Nanometers".into()), fwhm: None },
            noise: NoiseModel { estimator: NoiseEstimator::MeanFilter, scale: 9.0 / 8.0, window: None },
            ignore_value: Some(f64::NAN),
            params: MnfParams { components: Some(2), ..MnfParams::default() },
            system: EigenSystem {
                bands_used: vec![0, 2, 4],
                dropped_bands: vec![DroppedBand { band: 1, reason: DropReason::User }],
                means: (0..u).map(f).collect(),
                eigenvalues: vec![9.5, 1.0 + f64::EPSILON, 0.999],
                transform: (0..u * u).map(|i| f(i + 7)).collect(),
                noise_covariance: (0..u * u).map(|i| f(i + 20)).collect(),
                noise_samples: 77,
                pixels_used: 99,
                pixels_masked: 1,
            },
            extra_arrays: BTreeMap::new(),
        }
    }

    fn bits(v: &[f64]) -> Vec<u64> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn round_trips_bit_for_bit_and_keeps_unknown_arrays() {
        let mut s = sample();
        s.extra_arrays.insert("pooled_counts".into(), npy_member(&[2], &[1.0, 2.0]));
        let back = SystemFile::from_json(&s.to_json()).unwrap();
        assert_eq!(bits(&back.system.transform), bits(&s.system.transform));
        assert_eq!(bits(&back.system.means), bits(&s.system.means));
        assert!(back.ignore_value.unwrap().is_nan());
        assert_eq!(back.extra_arrays, s.extra_arrays);
        assert_eq!(back.system, s.system);
        assert_eq!(back.identity(), s.identity());
        assert_eq!(back.to_json(), s.to_json());
    }

    #[test]
    fn the_npy_arrays_are_what_numpy_writes() {
        let bytes = npy_f64(&[2, 3], &[1.0; 6]);
        assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00");
        let header_len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
        assert_eq!((10 + header_len) % 64, 0);
        let header = std::str::from_utf8(&bytes[10..10 + header_len]).unwrap();
        assert!(header.starts_with("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }") && header.ends_with('\n'), "{header}");
        assert_eq!(bytes.len(), 10 + header_len + 48);
    }

    /// Replaces `path` (a JSON pointer) in the sample's JSON and parses it again.
    fn edited(path: &str, value: Value) -> Result<SystemFile, SystemFileError> {
        let mut doc: Value = serde_json::from_slice(&sample().to_json()).unwrap();
        *doc.pointer_mut(path).unwrap_or_else(|| panic!("no {path}")) = value;
        SystemFile::from_json(&serde_json::to_vec(&doc).unwrap())
    }

    #[test]
    fn damaged_and_hostile_files_are_refused_with_a_reason() {
        let cases: Vec<(&str, Value, &str)> = vec![
            ("/format", json!("other"), "not a hypermnf system file"),
            ("/version", json!(2), "version 2"),
            ("/input/bands", json!(0), "input.bands"),
            ("/input/bands", json!(1u64 << 40), "input.bands"),
            ("/input/wavelengths", json!([1.0]), "wavelengths has 1 values"),
            ("/bands_used", json!([0, 2, 9]), "band 9"),
            ("/bands_used", json!([2, 0, 4]), "ascending"),
            ("/bands_used", json!([]), "0 bands used"),
            ("/dropped_bands", json!([{"band": 2, "reason": "user"}]), "also used"),
            ("/arrays/means", json!({"npy": "!!"}), "not base64"),
            ("/arrays/means", npy_member(&[4], &[0.0; 4]), "shape [4]"),
            ("/arrays/transform", npy_member(&[9], &[0.0; 9]), "shape [9]"),
            ("/arrays/eigenvalues", npy_member(&[3], &[1.0, f64::NAN, 0.0]), "not finite"),
            ("/arrays/noise_covariance", json!({"npy": "A".repeat(1 << 20)}), "larger than"),
            ("/arrays/means", json!({"npy": base64::engine::general_purpose::STANDARD.encode(b"\x93NUMPY\x01\x00\xff\xff")}), "arrays.means"),
            ("/noise/scale", json!(-1.0), "noise.scale"),
        ];
        for (path, value, says) in cases {
            let e = edited(path, value).expect_err(path);
            assert!(e.to_string().contains(says), "{path}: {e}");
            assert_eq!(e.code(), "invalid_system");
        }
        let mut doc: Value = serde_json::from_slice(&sample().to_json()).unwrap();
        doc["arrays"].as_object_mut().unwrap().remove("transform");
        assert!(SystemFile::from_json(&serde_json::to_vec(&doc).unwrap()).unwrap_err().to_string().contains("arrays.transform is missing"));
        // A float32 array in place of float64.
        let mut f4 = npy_f64(&[3], &[0.0; 3]);
        let at = f4.windows(3).position(|w| w == b"<f8").unwrap();
        f4[at..at + 3].copy_from_slice(b"<f4");
        let e = edited("/arrays/means", json!({"npy": base64::engine::general_purpose::STANDARD.encode(&f4)})).unwrap_err();
        assert!(e.to_string().contains("float64"), "{e}");
        assert!(matches!(SystemFile::from_json(b"[1, 2"), Err(SystemFileError::NotSystemFile(_))));
        assert!(SystemFile::from_json(&vec![b' '; MAX_FILE_BYTES + 1]).is_err());
    }

    #[test]
    fn mismatches_say_what_differs() {
        let s = sample();
        assert_eq!(s.mismatch(5, None, Some(3)), None);
        assert!(s.mismatch(6, None, None).unwrap().contains("6 bands"));
        let mut w = s.input.wavelengths.clone().unwrap();
        assert_eq!(s.mismatch(5, Some(&w), None), None);
        w[3] = 431.0;
        assert!(s.mismatch(5, Some(&w), None).unwrap().contains("band 3"));
        assert!(s.mismatch(5, None, Some(4)).unwrap().contains("components (4)"));
    }
}

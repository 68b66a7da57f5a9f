//! The synthetic flight line of `hypermnf bench flightline`: an ENVI file shaped like an AVIRIS-NG
//! radiance line (598 samples, 425 bands from 377 to 2501 nm), written a block of lines at a time by
//! every core, never held whole in memory.
//!
//! The signal: a top-of-atmosphere-like radiance curve (a smooth solar-like shape times an
//! atmospheric transmission with the 940, 1135, 1380 and 1880 nm absorptions) over a reflectance of
//! a few smooth spatial fields (sums of plane waves) times random smooth spectra, so that a handful
//! of MNF components carry it; plus white noise whose level differs from band to band. The first two
//! lines and the last one are no-data (-9999 in every band), the water-vapour bands are marked bad
//! in `bbl`, and the header carries a wavelength list in nm, fwhm, map info (with a rotation) and a
//! coordinate system string, as real tools write them.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use anyhow::Context;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Layout {
    Bil,
    Bsq,
    Bip,
}

impl Layout {
    pub(super) fn envi_name(self) -> &'static str {
        match self {
            Layout::Bil => "bil",
            Layout::Bsq => "bsq",
            Layout::Bip => "bip",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Dtype {
    F32,
    I16,
}

impl Dtype {
    pub(super) fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::I16 => 2,
        }
    }
    pub(super) fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::I16 => "i16",
        }
    }
}

/// The no-data value of the file (`data ignore value`).
pub const NODATA: f32 = -9999.0;
/// Spatial fields carrying the signal (the MNF's signal subspace has this dimension).
const FIELDS: usize = 6;
/// Plane waves summed into each field.
const WAVES: usize = 3;
/// Lines generated (and written) by one task.
const BLOCK_LINES: usize = 16;

/// The file's shape and encoding.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    pub lines: usize,
    pub samples: usize,
    pub bands: usize,
    pub layout: Layout,
    pub dtype: Dtype,
}

impl Spec {
    pub fn file_bytes(&self) -> u64 {
        (self.lines * self.samples * self.bands * self.dtype.size()) as u64
    }
}

/// Band centre in nm: AVIRIS-NG's grid, about 5 nm apart from 376.86 nm.
fn wavelength(b: usize) -> f64 {
    376.86 + 5.0089 * b as f64
}

/// The water-vapour bands (1340–1445 nm and 1790–1955 nm) are bad.
fn good_band(b: usize) -> bool {
    let w = wavelength(b);
    !((1340.0..=1445.0).contains(&w) || (1790.0..=1955.0).contains(&w))
}

/// Whether line `l` of `lines` is no-data: the first two and the last one, as the edges of an
/// orthorectified line are (only where enough lines are left for the MNF).
fn nodata_line(l: usize, lines: usize) -> bool {
    lines >= 16 && (l < 2 || l + 1 == lines)
}

/// The ENVI header of the file.
pub fn header_text(spec: &Spec) -> String {
    let list = |f: &dyn Fn(usize) -> String| (0..spec.bands).map(f).collect::<Vec<_>>().join(", ");
    let wavelengths = list(&|b| format!("{:.2}", wavelength(b)));
    let fwhm = list(&|b| format!("{:.2}", 5.5 + 0.3 * (b as f64 / spec.bands as f64)));
    let bbl = list(&|b| if good_band(b) { "1".into() } else { "0".into() });
    let data_type = match spec.dtype {
        Dtype::F32 => 4,
        Dtype::I16 => 2,
    };
    format!(
        "ENVI\n\
         description = {{hypermnf bench flightline: synthetic AVIRIS-NG-shaped radiance ({} spatial fields + noise)}}\n\
         samples = {}\nlines = {}\nbands = {}\nheader offset = 0\nfile type = ENVI Standard\n\
         data type = {data_type}\ninterleave = {}\nsensor type = AVIRIS-NG (synthetic)\nbyte order = 0\n\
         map info = {{UTM, 1.000, 1.000, 724522.127, 4074620.759, 5.0000000000e+00, 5.0000000000e+00, 11, North, WGS-84, units=Meters, rotation=75.00000000}}\n\
         coordinate system string = {{PROJCS[\"WGS_1984_UTM_Zone_11N\",GEOGCS[\"GCS_WGS_1984\",DATUM[\"D_WGS_1984\",SPHEROID[\"WGS_1984\",6378137.0,298.257223563]],PRIMEM[\"Greenwich\",0.0],UNIT[\"Degree\",0.0174532925199433]],PROJECTION[\"Transverse_Mercator\"],PARAMETER[\"False_Easting\",500000.0],PARAMETER[\"False_Northing\",0.0],PARAMETER[\"Central_Meridian\",-117.0],PARAMETER[\"Scale_Factor\",0.9996],PARAMETER[\"Latitude_Of_Origin\",0.0],UNIT[\"Meter\",1.0]]}}\n\
         wavelength units = Nanometers\nwavelength = {{{wavelengths}}}\nfwhm = {{{fwhm}}}\nbbl = {{{bbl}}}\n\
         data ignore value = -9999\n",
        FIELDS,
        spec.samples,
        spec.lines,
        spec.bands,
        spec.layout.envi_name(),
    )
}

/// The scene's model: per band, the mean radiance, the loading of each field and the noise level;
/// per field, its plane waves.
struct Model {
    base: Vec<f32>,
    /// `load[b * FIELDS + j]`: radiance per unit of field j in band b.
    load: Vec<f32>,
    sigma: Vec<f32>,
    /// (amplitude, cycles across the samples, cycles per 600 lines, phase) of each wave of each field.
    waves: Vec<[f64; 4]>,
}

impl Model {
    fn new(bands: usize) -> Model {
        let mut rng = rand::rngs::StdRng::seed_from_u64(29);
        // Smooth random "reflectance" spectra: a level, a slope and three broad features each.
        let spectra: Vec<Vec<f64>> = (0..FIELDS)
            .map(|_| {
                let level = rng.random_range(-1.0..1.0);
                let slope = rng.random_range(-1.0..1.0);
                let bumps: Vec<(f64, f64, f64)> = (0..3)
                    .map(|_| {
                        (
                            rng.random_range(-1.5..1.5),
                            rng.random_range(400.0..2450.0),
                            rng.random_range(40.0..300.0),
                        )
                    })
                    .collect();
                (0..bands)
                    .map(|b| {
                        let w = wavelength(b);
                        level
                            + slope * (w - 1400.0) / 1000.0
                            + bumps.iter().map(|(a, c, s)| a * (-((w - c) / s).powi(2)).exp()).sum::<f64>()
                    })
                    .collect()
            })
            .collect();
        let mut base = Vec::with_capacity(bands);
        let mut load = Vec::with_capacity(bands * FIELDS);
        let mut sigma = Vec::with_capacity(bands);
        for b in 0..bands {
            let w = wavelength(b);
            let solar = 14.0 * (-((w - 500.0) / 900.0).powi(2)).exp() + 0.6;
            let dip = |c: f64, width: f64, depth: f64| depth * (-((w - c) / width).powi(2)).exp();
            let transmission =
                (1.0 - dip(940.0, 20.0, 0.5) - dip(1135.0, 22.0, 0.4) - dip(1380.0, 40.0, 0.97) - dip(1880.0, 60.0, 0.98)).max(0.01);
            let l = solar * transmission;
            base.push((0.3 * l) as f32);
            load.extend(spectra.iter().map(|s| (0.08 * l * s[b]) as f32));
            sigma.push((0.01 + 0.004 * l + 0.01 * (b % 7) as f64 / 7.0) as f32);
        }
        let waves = (0..FIELDS * WAVES)
            .map(|_| {
                [
                    rng.random_range(0.3..1.0),
                    rng.random_range(0.5..6.0),
                    rng.random_range(0.5..6.0),
                    rng.random_range(0.0..std::f64::consts::TAU),
                ]
            })
            .collect();
        Model { base, load, sigma, waves }
    }

    /// One line in BIP order (`out[s * bands + b]`), deterministic for a given line.
    fn line(&self, l: usize, lines: usize, samples: usize, out: &mut [f32]) {
        let bands = self.base.len();
        if nodata_line(l, lines) {
            out.fill(NODATA);
            return;
        }
        let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ (l as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
        let mut fields = [0f32; FIELDS];
        for s in 0..samples {
            for (j, f) in fields.iter_mut().enumerate() {
                *f = self.waves[j * WAVES..(j + 1) * WAVES]
                    .iter()
                    .map(|[a, kx, ky, p]| a * (std::f64::consts::TAU * (kx * s as f64 / samples as f64 + ky * l as f64 / 600.0) + p).sin())
                    .sum::<f64>() as f32;
            }
            let px = &mut out[s * bands..(s + 1) * bands];
            for (b, v) in px.iter_mut().enumerate() {
                let load = &self.load[b * FIELDS..(b + 1) * FIELDS];
                let signal: f32 = fields.iter().zip(load).map(|(f, w)| f * w).sum();
                *v = self.base[b] + signal + self.sigma[b] * gauss(&mut state);
            }
        }
    }
}

/// An approximately normal deviate (the sum of four uniforms, unit variance) from a splitmix64 state.
fn gauss(state: &mut u64) -> f32 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    let sum = (z & 0xFFFF) + ((z >> 16) & 0xFFFF) + ((z >> 32) & 0xFFFF) + (z >> 48);
    // Four uniforms on [0, 65535]: mean 2 × 65535, variance 4 × 65536² / 12.
    ((sum as f32) - 131070.0) * (3.0f32.sqrt() / 65536.0)
}

/// Encodes one sample value in the file's type (little-endian; int16 as radiance × 100).
fn encode(v: f32, dtype: Dtype, out: &mut [u8]) {
    match dtype {
        Dtype::F32 => out.copy_from_slice(&v.to_le_bytes()),
        Dtype::I16 => {
            let q = if v == NODATA {
                -9999
            } else {
                (v * 100.0).round().clamp(-9998.0, i16::MAX as f32) as i16
            };
            out.copy_from_slice(&q.to_le_bytes())
        }
    }
}

/// Writes the header to `hdr` and the data to `img`, a block of lines per task on every core.
pub fn write(spec: &Spec, hdr: &Path, img: &Path) -> anyhow::Result<()> {
    std::fs::write(hdr, header_text(spec)).with_context(|| format!("writing {}", hdr.display()))?;
    let file = File::create(img).with_context(|| format!("creating {}", img.display()))?;
    file.set_len(spec.file_bytes())?;
    let model = Model::new(spec.bands);
    let (samples, bands, sz) = (spec.samples, spec.bands, spec.dtype.size());
    let line_bytes = samples * bands * sz;
    let blocks = spec.lines.div_ceil(BLOCK_LINES);
    (0..blocks).into_par_iter().try_for_each_init(
        || (vec![0f32; samples * bands], vec![0u8; BLOCK_LINES * line_bytes]),
        |(vals, bytes), k| -> anyhow::Result<()> {
            let (l0, l1) = (k * BLOCK_LINES, ((k + 1) * BLOCK_LINES).min(spec.lines));
            let n = l1 - l0;
            // The block in the file's order: BIP and BIL lines one after the other, BSQ band by band
            // (each band's n lines, written where that band's slab holds them).
            for l in l0..l1 {
                model.line(l, spec.lines, samples, vals);
                for s in 0..samples {
                    for b in 0..bands {
                        let at = match spec.layout {
                            Layout::Bip => (l - l0) * line_bytes + (s * bands + b) * sz,
                            Layout::Bil => (l - l0) * line_bytes + (b * samples + s) * sz,
                            Layout::Bsq => ((b * n + (l - l0)) * samples + s) * sz,
                        };
                        encode(vals[s * bands + b], spec.dtype, &mut bytes[at..at + sz]);
                    }
                }
            }
            match spec.layout {
                Layout::Bip | Layout::Bil => file.write_all_at(&bytes[..n * line_bytes], (l0 * line_bytes) as u64)?,
                Layout::Bsq => {
                    let seg = n * samples * sz;
                    for b in 0..bands {
                        let at = ((b * spec.lines + l0) * samples * sz) as u64;
                        file.write_all_at(&bytes[b * seg..(b + 1) * seg], at)?;
                    }
                }
            }
            Ok(())
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_parses_with_its_bad_bands_and_no_data() {
        let spec = Spec {
            lines: 40,
            samples: 598,
            bands: 425,
            layout: Layout::Bil,
            dtype: Dtype::F32,
        };
        let h = crate::cube::envi::parse_header(&header_text(&spec)).unwrap();
        assert_eq!((h.lines, h.samples, h.bands), (40, 598, 425));
        assert_eq!(h.meta.ignore_value, Some(-9999.0));
        let bbl = h.meta.bbl.unwrap();
        let bad = bbl.iter().filter(|g| !**g).count();
        assert!((40..70).contains(&bad), "{bad} bad bands");
        let w = h.meta.wavelength.unwrap();
        assert!((w[0] - 376.86).abs() < 0.01 && (w[424] - 2500.63).abs() < 0.1);
    }

    #[test]
    fn the_noise_has_unit_variance() {
        let mut s = 7;
        let v: Vec<f64> = (0..200_000).map(|_| gauss(&mut s) as f64).collect();
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64;
        assert!(mean.abs() < 0.01 && (var - 1.0).abs() < 0.02, "mean {mean}, variance {var}");
    }
}

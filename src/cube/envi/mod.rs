//! ENVI cubes: a text header (.hdr) and a raw data file beside it, in BSQ, BIL or BIP, any of the
//! real ENVI data types, either byte order.
//!
//! - [`parse_header`] reads and validates the header text ([`header`]), accepting headers as GDAL and
//!   Spectral Python do (empty `{}` values, any key case, wavelengths in the band names; see there);
//! - [`read`] / [`read_parts`] check the data file against it and stream it into a BIP [`Cube`]
//!   ([`reader`]), keeping the samples in their file data type and byte order;
//! - [`write_f32_bsq`] writes MNF results, [`write_cube`] any cube in any layout ([`writer`]).

mod header;
mod mapped;
mod reader;
mod writer;

use std::path::Path;

pub use mapped::{map, map_parts};
pub use header::{parse_header, wavelength_scale_nm, wavelengths_from_band_names, EnviHeader};
pub use writer::OutputHeader;

use super::{ByteOrder, Cube, CubeError, CubeMeta, Interleave};

impl CubeMeta {
    /// The wavelengths in nanometres: as given when `wavelength units` says nanometres, × 1000 for
    /// micrometres, × 10⁶ for millimetres ([`wavelength_scale_nm`]). When the units are absent or not
    /// a known length (`Unknown`, `Index`, `Wavenumber`, ...) the values are returned **as given**,
    /// unconverted: nothing is guessed from their magnitudes. `wavelength_units` itself always keeps the
    /// source's string. None without wavelengths.
    pub fn wavelengths_nm(&self) -> Option<Vec<f64>> {
        let scale = self.wavelength_units.as_deref().and_then(wavelength_scale_nm).unwrap_or(1.0);
        self.wavelength.as_ref().map(|w| w.iter().map(|&v| v * scale).collect())
    }
}

/// Reads an ENVI cube from its header path; the data file is found beside it (the same path without
/// `.hdr`, or with .img/.dat/.raw/.bsq/.bil/.bip, lower or upper case).
pub fn read(hdr: &Path) -> Result<Cube, CubeError> {
    let text = reader::read_header_text(hdr)?;
    let header = reader::parse_header_at(&text, hdr)?;
    // Refuse absurd sizes before looking any further.
    header.data_bytes()?;
    let data = reader::find_data_file(hdr)?;
    reader::read_data(header, &data)
}

/// The data file `read` opens for the header `hdr`.
pub fn data_file(hdr: &Path) -> Result<std::path::PathBuf, CubeError> {
    reader::find_data_file(hdr)
}

/// Reads an ENVI cube whose header text and data file are stored apart (service uploads).
pub fn read_parts(header_text: &str, data: &Path) -> Result<Cube, CubeError> {
    let header = parse_header(header_text)?;
    header.data_bytes()?;
    reader::read_data(header, data)
}

/// Reads an ENVI cube from its header text and a reader over its data, which holds `len` bytes (what
/// `read_parts` does with a file; `name` labels the data in errors). The fuzz tests read from memory.
pub fn read_parts_from<R: std::io::Read + std::io::Seek>(
    header_text: &str,
    data: &mut R,
    len: u64,
    name: &Path,
) -> Result<Cube, CubeError> {
    let header = parse_header(header_text)?;
    header.data_bytes()?;
    reader::read_data_from(header, data, len, name)
}

/// Writes float32 little-endian BSQ: `hdr` and the data file beside it (`hdr` with extension `.img`).
/// `values_bip` holds lines × samples × bands values in BIP order; they are transposed while streaming.
pub fn write_f32_bsq(
    hdr: &Path,
    lines: usize,
    samples: usize,
    bands: usize,
    values_bip: &[f32],
    header: &OutputHeader,
) -> Result<(), CubeError> {
    writer::write_f32_bsq(hdr, lines, samples, bands, values_bip, header)
}

/// Writes only the header of a float32 little-endian BSQ output (as [`write_f32_bsq`] writes it); its
/// data file can be made later from the same values stored as a `.npy`
/// ([`write_f32_bsq_data_from_npy`]): the service keeps one copy of a result and makes the ENVI data
/// on the first request for it.
pub fn write_f32_bsq_header(hdr: &Path, lines: usize, samples: usize, bands: usize, header: &OutputHeader) -> Result<(), CubeError> {
    writer::write_f32_bsq_header(hdr, lines, samples, bands, header)
}

/// Writes the BSQ data file `img` of the float32 little-endian `.npy` `npy` (lines, samples, bands):
/// the bytes [`write_f32_bsq`] writes for the same values.
pub fn write_f32_bsq_data_from_npy(npy: &Path, img: &Path) -> Result<(), CubeError> {
    writer::write_f32_bsq_data_from_npy(npy, img)
}

/// Writes any cube in its own data type, in the given layout and byte order: `hdr` and `hdr` with
/// extension `.img`, with all of the cube's metadata.
pub fn write_cube(hdr: &Path, cube: &Cube, interleave: Interleave, byte_order: ByteOrder) -> Result<(), CubeError> {
    writer::write_cube(hdr, cube, interleave, byte_order)
}

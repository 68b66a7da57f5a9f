//! The `.npy` header as this crate writes it (format 1.0, padded to 64 bytes), and the canonical
//! header of a cube that its content digest hashes. Below the cube model (`Cube::content_digest`)
//! and the `.npy` reader and writer (`npy`).

use super::sample_type::{ByteOrder, DataType};

/// What every `.npy` file starts with.
pub(super) const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// The header of the canonical `.npy` of a cube: little-endian, C order (lines, samples, bands), as
/// `write_cube` writes it for a little-endian cube (and NumPy's `np.save` for 3-D arrays, byte for
/// byte). `Cube::content_digest` hashes the cube in this form, so that an upload in it needs one hash.
pub fn canonical_header(dtype: DataType, lines: usize, samples: usize, bands: usize) -> Vec<u8> {
    header_bytes(&descr_of(dtype, ByteOrder::Little), &[lines, samples, bands])
}

pub(super) fn descr_of(dtype: DataType, order: ByteOrder) -> String {
    let kind = if dtype.is_float() {
        'f'
    } else if matches!(dtype, DataType::I16 | DataType::I32 | DataType::I64) {
        'i'
    } else {
        'u'
    };
    let prefix = match (dtype.size(), order) {
        (1, _) => '|',
        (_, ByteOrder::Little) => '<',
        (_, ByteOrder::Big) => '>',
    };
    format!("{prefix}{kind}{}", dtype.size())
}

/// The header bytes (magic, version, length, dict, padding) for a C-order array: version 1.0, or 2.0
/// when the dict does not fit 1.0's 16-bit length. Padded with spaces and ended by '\n' so that the
/// data starts at a multiple of 64 bytes, as NumPy does.
pub(super) fn header_bytes(descr: &str, shape: &[usize]) -> Vec<u8> {
    let shape: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
    let dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {}, }}", shape_text(&shape));
    let padded = |preamble: usize| (preamble + dict.len() + 1).next_multiple_of(64) - preamble;
    let (version, preamble) = if padded(10) <= u16::MAX as usize { (1u8, 10) } else { (2u8, 12) };
    let header_len = padded(preamble);
    let mut out = Vec::with_capacity(preamble + header_len);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[version, 0]);
    if version == 1 {
        out.extend_from_slice(&(header_len as u16).to_le_bytes());
    } else {
        out.extend_from_slice(&(header_len as u32).to_le_bytes());
    }
    out.extend_from_slice(dict.as_bytes());
    out.resize(preamble + header_len - 1, b' ');
    out.push(b'\n');
    out
}

/// A shape as NumPy writes it in a header: `(3,)`, `(3, 4, 5)`.
pub(super) fn shape_text(shape: &[u64]) -> String {
    match shape {
        [one] => format!("({one},)"),
        _ => format!("({})", shape.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")),
    }
}

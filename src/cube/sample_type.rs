//! What a cube's samples are: their data type, byte order and interleave, how raw samples decode
//! to f64, and the checked byte size of a cube's dimensions. Below the cube model and the file
//! formats (`npy`, `envi`), which all use them.

use super::CubeError;

/// ENVI `data type` codes that hypermnf reads. Complex types (6, 9) are refused with a clear error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DataType {
    U8,
    I16,
    I32,
    F32,
    F64,
    U16,
    U32,
    I64,
    U64,
}

impl DataType {
    pub const ALL: [DataType; 9] = [
        DataType::U8,
        DataType::I16,
        DataType::I32,
        DataType::F32,
        DataType::F64,
        DataType::U16,
        DataType::U32,
        DataType::I64,
        DataType::U64,
    ];

    /// From the ENVI header's `data type` code.
    pub fn from_envi_code(code: i64) -> Result<Self, CubeError> {
        Ok(match code {
            1 => DataType::U8,
            2 => DataType::I16,
            3 => DataType::I32,
            4 => DataType::F32,
            5 => DataType::F64,
            12 => DataType::U16,
            13 => DataType::U32,
            14 => DataType::I64,
            15 => DataType::U64,
            6 | 9 => {
                return Err(CubeError::Unsupported(format!(
                    "ENVI data type {code} is complex; MNF needs real-valued bands"
                )))
            }
            other => return Err(CubeError::Header(format!("unknown ENVI data type {other}"))),
        })
    }

    pub fn envi_code(self) -> u8 {
        match self {
            DataType::U8 => 1,
            DataType::I16 => 2,
            DataType::I32 => 3,
            DataType::F32 => 4,
            DataType::F64 => 5,
            DataType::U16 => 12,
            DataType::U32 => 13,
            DataType::I64 => 14,
            DataType::U64 => 15,
        }
    }

    /// Bytes per sample.
    pub fn size(self) -> usize {
        match self {
            DataType::U8 => 1,
            DataType::I16 | DataType::U16 => 2,
            DataType::I32 | DataType::U32 | DataType::F32 => 4,
            DataType::I64 | DataType::U64 | DataType::F64 => 8,
        }
    }

    /// Name used in metadata and the API (`u8`, `i16`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DataType::U8 => "u8",
            DataType::I16 => "i16",
            DataType::I32 => "i32",
            DataType::F32 => "f32",
            DataType::F64 => "f64",
            DataType::U16 => "u16",
            DataType::U32 => "u32",
            DataType::I64 => "i64",
            DataType::U64 => "u64",
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DataType::F32 | DataType::F64)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ByteOrder {
    Little,
    Big,
}

impl ByteOrder {
    /// ENVI `byte order`: 0 little-endian, 1 big-endian.
    pub fn from_envi(v: i64) -> Result<Self, CubeError> {
        match v {
            0 => Ok(ByteOrder::Little),
            1 => Ok(ByteOrder::Big),
            other => Err(CubeError::Header(format!("byte order must be 0 or 1, not {other}"))),
        }
    }
    pub fn envi_code(self) -> u8 {
        match self {
            ByteOrder::Little => 0,
            ByteOrder::Big => 1,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Interleave {
    Bsq,
    Bil,
    Bip,
}

impl Interleave {
    pub fn name(self) -> &'static str {
        match self {
            Interleave::Bsq => "bsq",
            Interleave::Bil => "bil",
            Interleave::Bip => "bip",
        }
    }
}

/// Largest cube hypermnf accepts by default, in bytes of raw samples (a header claiming more is refused
/// before anything is allocated). The service sets its own, lower, limit.
pub const MAX_CUBE_BYTES: u64 = 1 << 40;

/// Checks dimensions from an untrusted source and returns the byte size they imply.
pub fn checked_cube_bytes(lines: u64, samples: u64, bands: u64, dtype: DataType) -> Result<u64, CubeError> {
    if lines == 0 || samples == 0 || bands == 0 {
        return Err(CubeError::Header(format!(
            "cube dimensions must be positive (lines {lines}, samples {samples}, bands {bands})"
        )));
    }
    lines
        .checked_mul(samples)
        .and_then(|p| p.checked_mul(bands))
        .and_then(|v| v.checked_mul(dtype.size() as u64))
        .filter(|&b| b <= MAX_CUBE_BYTES)
        .ok_or_else(|| {
            CubeError::TooLarge(format!(
                "{lines} lines x {samples} samples x {bands} bands of {} exceeds the {} TiB limit",
                dtype.name(),
                MAX_CUBE_BYTES >> 40
            ))
        })
}

/// Decodes raw samples of `dtype` in `order` into f64 values. `out.len()` must be `raw.len() / size`.
pub fn decode_into(raw: &[u8], dtype: DataType, order: ByteOrder, out: &mut [f64]) {
    assert_eq!(raw.len(), out.len() * dtype.size(), "decode_into: length mismatch");
    macro_rules! dec {
        ($t:ty, $n:expr) => {{
            let chunks = raw.chunks_exact($n);
            match order {
                ByteOrder::Little => {
                    for (o, c) in out.iter_mut().zip(chunks) {
                        *o = <$t>::from_le_bytes(c.try_into().unwrap()) as f64;
                    }
                }
                ByteOrder::Big => {
                    for (o, c) in out.iter_mut().zip(chunks) {
                        *o = <$t>::from_be_bytes(c.try_into().unwrap()) as f64;
                    }
                }
            }
        }};
    }
    match dtype {
        DataType::U8 => {
            for (o, &b) in out.iter_mut().zip(raw) {
                *o = b as f64;
            }
        }
        DataType::I16 => dec!(i16, 2),
        DataType::U16 => dec!(u16, 2),
        DataType::I32 => dec!(i32, 4),
        DataType::U32 => dec!(u32, 4),
        DataType::F32 => dec!(f32, 4),
        DataType::I64 => dec!(i64, 8),
        DataType::U64 => dec!(u64, 8),
        DataType::F64 => dec!(f64, 8),
    }
}

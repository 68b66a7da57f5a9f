//! NumPy `.npy` input and output (format versions 1.0, 2.0, 3.0).
//!
//! Hand-written rather than through a crate: the format is a magic string, a length and a small Python
//! dict literal, and the reader must take the raw samples as they are (any byte order, no typed copy)
//! and permute Fortran order into BIP while streaming, which is what `layout` already does.
//!
//! A cube is a 3-D array shaped (lines, samples, bands). C order is exactly the BIP layout of [`Cube`].

use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::path::{Path, PathBuf};

use super::layout::{read_into_bip, Dims, FileOrder};
use super::npy_header::{descr_of, header_bytes, shape_text, MAGIC};
pub use super::npy_header::canonical_header;
use super::sample_type::checked_cube_bytes;
use super::{ByteOrder, Cube, CubeError, CubeMeta, DataType, Interleave};

/// NumPy itself refuses headers above 10 000 bytes by default; this leaves room but bounds the read.
const MAX_HEADER_LEN: usize = 1 << 20;

/// What the header of a `.npy` file says.
#[derive(Debug, Clone, PartialEq)]
pub struct NpyHeader {
    pub dtype: DataType,
    pub byte_order: ByteOrder,
    pub fortran_order: bool,
    pub shape: Vec<u64>,
    /// Offset of the first sample in the file.
    pub data_offset: u64,
}

impl NpyHeader {
    /// The shape as (lines, samples, bands): a 3-D array without zero-sized axes (an empty array is
    /// an invalid .npy cube, not an invalid ENVI header, whatever the shared size check would say).
    pub fn cube_shape(&self) -> Result<[u64; 3], CubeError> {
        let [lines, samples, bands] = self.shape[..] else {
            return Err(npy_err(format!(
                "expected a 3-D array shaped (lines, samples, bands), got shape {}",
                shape_text(&self.shape)
            )));
        };
        if lines == 0 || samples == 0 || bands == 0 {
            return Err(npy_err(format!("shape {} has a zero-sized axis: the cube is empty", shape_text(&self.shape))));
        }
        Ok([lines, samples, bands])
    }
}

fn npy_err(msg: impl Into<String>) -> CubeError {
    CubeError::Npy(msg.into())
}

/// Maps a NumPy `descr` string (`'<i2'`, `'>f8'`, `'|u1'`, ...) to a data type and byte order.
fn parse_descr(descr: &str) -> Result<(DataType, ByteOrder), CubeError> {
    let native = if cfg!(target_endian = "little") { ByteOrder::Little } else { ByteOrder::Big };
    let mut chars = descr.chars();
    let (order, code) = match chars.next() {
        Some('<') => (Some(ByteOrder::Little), chars.as_str()),
        Some('>') => (Some(ByteOrder::Big), chars.as_str()),
        Some('=') => (Some(native), chars.as_str()),
        Some('|') => (None, chars.as_str()),
        _ => (Some(native), descr),
    };
    let unsupported = |what: &str| {
        Err(CubeError::Unsupported(format!(".npy dtype '{descr}' ({what}): MNF needs real numbers of a supported type (u1, i2, u2, i4, u4, i8, u8, f4, f8)")))
    };
    let dtype = match code {
        "u1" | "B" => DataType::U8,
        "i2" => DataType::I16,
        "u2" => DataType::U16,
        "i4" => DataType::I32,
        "u4" => DataType::U32,
        "i8" => DataType::I64,
        "u8" => DataType::U64,
        "f4" => DataType::F32,
        "f8" => DataType::F64,
        "b1" | "?" => return unsupported("bool"),
        "i1" | "b" => return unsupported("int8"),
        "f2" | "e" => return unsupported("float16"),
        "f16" | "f12" | "g" => return unsupported("long double"),
        c if c.starts_with('c') => return unsupported("complex"),
        c if c.starts_with('O') => return unsupported("Python objects"),
        c if c.starts_with(['S', 'U', 'a']) => return unsupported("strings"),
        c if c.starts_with('V') => return unsupported("raw or structured records"),
        c if c.starts_with(['M', 'm']) => return unsupported("dates and times"),
        _ => return Err(npy_err(format!("unknown dtype descr '{descr}'"))),
    };
    let order = match order {
        Some(o) => o,
        None if dtype.size() == 1 => ByteOrder::Little,
        None => return Err(npy_err(format!("dtype '{descr}': '|' (no byte order) for a multi-byte type"))),
    };
    Ok((dtype, order))
}

/// A value in the header dict.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Str(String),
    Bool(bool),
    Tuple(Vec<u64>),
    /// A list: only a structured dtype's descr looks like this.
    List,
}

/// A tiny parser for the Python dict literal NumPy writes, e.g.
/// `{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4, 5), }`. Keys in any order, either quote,
/// trailing commas and spaces, Python 2's `3L` integers.
struct DictParser<'a> {
    s: &'a [u8],
    pos: usize,
}

impl<'a> DictParser<'a> {
    fn skip_ws(&mut self) {
        while self.pos < self.s.len() && self.s[self.pos].is_ascii_whitespace() {
            self.pos += 1;
        }
    }
    fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.s.get(self.pos).copied()
    }
    fn expect(&mut self, c: u8) -> Result<(), CubeError> {
        if self.peek() == Some(c) {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.error(&format!("expected '{}'", c as char)))
        }
    }
    fn error(&self, what: &str) -> CubeError {
        let rest = String::from_utf8_lossy(&self.s[self.pos.min(self.s.len())..]);
        npy_err(format!(
            "header dict: {what} at byte {} (near '{}')",
            self.pos,
            rest.chars().take(30).collect::<String>()
        ))
    }
    fn string(&mut self) -> Result<String, CubeError> {
        let quote = self.peek().filter(|&q| q == b'\'' || q == b'"').ok_or_else(|| self.error("expected a string"))?;
        let start = self.pos + 1;
        let len = self.s[start..].iter().position(|&c| c == quote).ok_or_else(|| self.error("unterminated string"))?;
        self.pos = start + len + 1;
        Ok(String::from_utf8_lossy(&self.s[start..start + len]).into_owned())
    }
    fn tuple(&mut self) -> Result<Vec<u64>, CubeError> {
        self.expect(b'(')?;
        let mut items = Vec::new();
        loop {
            match self.peek() {
                Some(b')') => {
                    self.pos += 1;
                    return Ok(items);
                }
                Some(c) if c.is_ascii_digit() => {
                    let start = self.pos;
                    while self.pos < self.s.len() && self.s[self.pos].is_ascii_digit() {
                        self.pos += 1;
                    }
                    let digits = std::str::from_utf8(&self.s[start..self.pos]).expect("ASCII digits");
                    items.push(digits.parse::<u64>().map_err(|_| self.error("dimension too large"))?);
                    if matches!(self.s.get(self.pos), Some(b'L' | b'l')) {
                        self.pos += 1;
                    }
                    match self.peek() {
                        Some(b',') => self.pos += 1,
                        Some(b')') => {}
                        _ => return Err(self.error("expected ',' or ')' in the shape")),
                    }
                }
                _ => return Err(self.error("expected a non-negative integer in the shape")),
            }
        }
    }
    fn value(&mut self) -> Result<Value, CubeError> {
        match self.peek() {
            Some(b'\'' | b'"') => Ok(Value::Str(self.string()?)),
            Some(b'(') => Ok(Value::Tuple(self.tuple()?)),
            Some(b'[') => Ok(Value::List),
            _ => {
                let rest = &self.s[self.pos..];
                for (word, v) in [(&b"True"[..], true), (&b"False"[..], false)] {
                    if rest.starts_with(word) {
                        self.pos += word.len();
                        return Ok(Value::Bool(v));
                    }
                }
                Err(self.error("expected a string, a tuple, True or False"))
            }
        }
    }
    /// Parses the dict into (key, value) pairs. Stops at a list value (a structured dtype), whose
    /// contents hypermnf never needs.
    fn dict(&mut self) -> Result<Vec<(String, Value)>, CubeError> {
        self.expect(b'{')?;
        let mut pairs = Vec::new();
        loop {
            if self.peek() == Some(b'}') {
                self.pos += 1;
                break;
            }
            let key = self.string()?;
            self.expect(b':')?;
            let value = self.value()?;
            let stop = value == Value::List;
            pairs.push((key, value));
            if stop {
                return Ok(pairs);
            }
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {}
                _ => return Err(self.error("expected ',' or '}'")),
            }
        }
        if self.peek().is_some() {
            return Err(self.error("unexpected text after the dict"));
        }
        Ok(pairs)
    }
}

/// Interprets the header dict text.
fn parse_dict(text: &str) -> Result<(DataType, ByteOrder, bool, Vec<u64>), CubeError> {
    let pairs = DictParser { s: text.as_bytes(), pos: 0 }.dict()?;
    let get = |key: &str| pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v);
    let (dtype, order) = match get("descr") {
        Some(Value::Str(d)) => parse_descr(d)?,
        Some(Value::List) => {
            return Err(CubeError::Unsupported(".npy with a structured dtype: save a plain numeric array".into()))
        }
        Some(_) => return Err(npy_err("'descr' must be a string")),
        None => return Err(npy_err("header dict lacks 'descr'")),
    };
    let fortran = match get("fortran_order") {
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(npy_err("'fortran_order' must be True or False")),
        None => return Err(npy_err("header dict lacks 'fortran_order'")),
    };
    let shape = match get("shape") {
        Some(Value::Tuple(s)) => s.clone(),
        Some(_) => return Err(npy_err("'shape' must be a tuple of integers")),
        None => return Err(npy_err("header dict lacks 'shape'")),
    };
    Ok((dtype, order, fortran, shape))
}

/// Reads and checks the magic, version and header dict; leaves `r` at the first sample.
pub fn read_header<R: Read>(r: &mut R) -> Result<NpyHeader, CubeError> {
    let io = |e: io::Error| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            npy_err("file ends inside the header")
        } else {
            npy_err(format!("reading the header: {e}"))
        }
    };
    let mut pre = [0u8; 8];
    r.read_exact(&mut pre).map_err(io)?;
    if &pre[..6] != MAGIC {
        return Err(npy_err("not a .npy file: bad magic (expected \\x93NUMPY)"));
    }
    let (major, minor) = (pre[6], pre[7]);
    let (header_len, preamble) = match (major, minor) {
        (1, 0) => {
            let mut b = [0u8; 2];
            r.read_exact(&mut b).map_err(io)?;
            (u16::from_le_bytes(b) as usize, 10)
        }
        (2, 0) | (3, 0) => {
            let mut b = [0u8; 4];
            r.read_exact(&mut b).map_err(io)?;
            (u32::from_le_bytes(b) as usize, 12)
        }
        _ => return Err(CubeError::Unsupported(format!(".npy format version {major}.{minor} (known: 1.0, 2.0, 3.0)"))),
    };
    if header_len > MAX_HEADER_LEN {
        return Err(npy_err(format!("header of {header_len} bytes is implausibly large")));
    }
    // Read through `take`, not into a buffer of the claimed length: a 12-byte file claiming a 1 MiB
    // header must not cost 1 MiB.
    let mut raw = Vec::new();
    r.take(header_len as u64).read_to_end(&mut raw).map_err(io)?;
    if raw.len() < header_len {
        return Err(npy_err("file ends inside the header"));
    }
    // Versions 1 and 2 are Latin-1, version 3 UTF-8; the dict itself is ASCII either way.
    let text: String = if major == 3 {
        String::from_utf8(raw).map_err(|_| npy_err("version 3.0 header is not UTF-8"))?
    } else {
        raw.iter().map(|&b| b as char).collect()
    };
    let (dtype, byte_order, fortran_order, shape) = parse_dict(&text)?;
    Ok(NpyHeader { dtype, byte_order, fortran_order, shape, data_offset: (preamble + header_len) as u64 })
}

/// Reads a 3-D `.npy` array shaped (lines, samples, bands) into a cube (C order read straight in,
/// Fortran order permuted while streaming). The file size is checked against the shape first.
pub fn read(path: &Path) -> Result<Cube, CubeError> {
    let mut file = File::open(path).map_err(|e| CubeError::io(path, e))?;
    let have = file.metadata().map_err(|e| CubeError::io(path, e))?.len();
    read_from(&mut file, have, path)
}

/// `read` over any reader holding `have` bytes (`path` labels it in errors). The fuzz tests read from
/// memory.
pub fn read_from<R: Read + Seek>(file: &mut R, have: u64, path: &Path) -> Result<Cube, CubeError> {
    let v = validate(file, have, path)?;
    let mut bytes = Vec::new();
    bytes
        .try_reserve_exact(v.len)
        .map_err(|_| CubeError::TooLarge(format!("cannot allocate {} bytes for {}", v.len, v.geometry)))?;
    bytes.resize(v.len, 0);
    let order = if v.header.fortran_order { FileOrder::FORTRAN } else { FileOrder::BIP };
    read_into_bip(file, v.header.data_offset, order, Dims::new(v.lines, v.samples, v.bands), v.header.dtype.size(), &mut bytes)
        .map_err(|e| CubeError::io(path, e))?;
    Cube::from_raw(v.lines, v.samples, v.bands, v.header.dtype, v.header.byte_order, bytes, v.meta())
}

/// Checks, from its first bytes (`head`: at least its header), that a 3-D `.npy` of `have` bytes holds
/// exactly the array its header describes, neither cut short nor longer (`path` labels errors).
pub fn check_length(head: &[u8], have: u64, path: &Path) -> Result<(), CubeError> {
    validate(&mut io::Cursor::new(head), have, path).map(drop)
}

/// Like [`read`], but a C-order array whose data starts 64-byte aligned (as NumPy writes it) is mapped
/// instead of read: the cube's samples are the file's pages (see `cube/bytes.rs` for why, and for the
/// condition that the file is not changed while the cube lives). Other files are read.
pub fn map(path: &Path) -> Result<Cube, CubeError> {
    let mut file = File::open(path).map_err(|e| CubeError::io(path, e))?;
    let have = file.metadata().map_err(|e| CubeError::io(path, e))?.len();
    let v = validate(&mut file, have, path)?;
    let offset = usize::try_from(v.header.data_offset).ok().filter(|o| o % 64 == 0);
    let (Some(offset), false) = (offset, v.header.fortran_order) else {
        file.seek(std::io::SeekFrom::Start(0)).map_err(|e| CubeError::io(path, e))?;
        return read_from(&mut file, have, path);
    };
    // SAFETY: a read-only mapping of a file the service wrote once and never changes in place (the
    // caller's contract, see above); the cube only reads it. Not populated: the CUDA backend copies a
    // mapped cube to the device with positioned reads of the file (`Cube::raw_file`), not through the
    // mapping, and populating 300 MB took 9-12 ms of every job on the H100 host.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| CubeError::io(path, e))?;
    let meta = v.meta();
    Cube::from_mapped(v.lines, v.samples, v.bands, v.header.dtype, v.header.byte_order, map, file, offset, v.len, meta)
}

/// What a `.npy` file's header says, checked against the file's size before anything is allocated.
struct Validated {
    header: NpyHeader,
    lines: usize,
    samples: usize,
    bands: usize,
    len: usize,
    geometry: String,
}

impl Validated {
    fn meta(&self) -> CubeMeta {
        CubeMeta {
            source_interleave: Some(if self.header.fortran_order { Interleave::Bsq } else { Interleave::Bip }),
            ..CubeMeta::default()
        }
    }
}

fn validate<R: Read + Seek>(file: &mut R, have: u64, path: &Path) -> Result<Validated, CubeError> {
    let in_file = |e: CubeError| match e {
        CubeError::Npy(m) => CubeError::Npy(format!("{}: {m}", path.display())),
        CubeError::Unsupported(m) => CubeError::Unsupported(format!("{}: {m}", path.display())),
        other => other,
    };
    let header = read_header(file).map_err(in_file)?;
    let [lines, samples, bands] = header.cube_shape().map_err(in_file)?;
    let need = checked_cube_bytes(lines, samples, bands, header.dtype)?;
    let data_len = have.saturating_sub(header.data_offset);
    let geometry = format!("shape {} of {}", shape_text(&header.shape), header.dtype.name());
    if data_len < need {
        return Err(CubeError::SizeMismatch(format!(
            "{}: truncated: {data_len} bytes of data, {geometry} needs {need}",
            path.display()
        )));
    }
    if data_len > need {
        return Err(CubeError::SizeMismatch(format!(
            "{}: {} bytes of data beyond the array ({data_len} bytes, {geometry} needs {need})",
            path.display(),
            data_len - need
        )));
    }
    let too_big = || CubeError::TooLarge(format!("{geometry} does not fit this machine"));
    let size = |n: u64| usize::try_from(n).map_err(|_| too_big());
    Ok(Validated { lines: size(lines)?, samples: size(samples)?, bands: size(bands)?, len: size(need)?, header, geometry })
}


/// Writes float32 values as a little-endian C-order `.npy` of the given shape.
///
/// In one call from one thread: on the H100 host's ext4, 27 MB took 6.0 ms so, against 8.7 ms
/// as 2 MiB pieces written by eight threads with `pwrite` (the file's lock serializes them;
/// the write-strategies log in `docs/bench-logs`).
pub fn write_f32(path: &Path, shape: &[usize], values: &[f32]) -> Result<(), CubeError> {
    let file = File::create(path).map_err(|e| CubeError::io(path, e))?;
    let len = header_bytes("<f4", shape).len() as u64 + std::mem::size_of_val(values) as u64;
    crate::write_to_disk::reserve(&file, len).map_err(|e| CubeError::io(path, e))?;
    // Large writes pass the buffer by (the values go to the file in one call); the header is buffered.
    let mut w = io::BufWriter::with_capacity(1 << 16, file);
    write_f32_to(&mut w, shape, values).and_then(|()| w.flush()).map_err(|e| CubeError::io(path, e))
}

/// A float32 C-order `.npy` written in pieces, at their places, while its values are computed (the
/// service writes a job's components during the projection, so that the write overlaps it). The file
/// has its final length from the start; [`F32NpyPieces::is_complete`] says whether every value came.
pub struct F32NpyPieces {
    path: PathBuf,
    file: File,
    data_at: u64,
    len: usize,
    written: usize,
}

impl F32NpyPieces {
    /// Creates `path` with the header of `shape` (the bytes [`write_f32`] gives), its length reserved.
    pub fn create(path: &Path, shape: &[usize]) -> Result<F32NpyPieces, CubeError> {
        let len = shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .filter(|n| n.checked_mul(4).is_some())
            .ok_or_else(|| CubeError::Unsupported(format!("the shape {shape:?} is too large")))?;
        let header = header_bytes("<f4", shape);
        let total = header.len() as u64 + 4 * len as u64;
        let file = File::create(path).map_err(|e| CubeError::io(path, e))?;
        crate::write_to_disk::reserve(&file, total).map_err(|e| CubeError::io(path, e))?;
        use std::os::unix::fs::FileExt;
        file.write_all_at(&header, 0).and_then(|()| file.set_len(total)).map_err(|e| CubeError::io(path, e))?;
        Ok(F32NpyPieces { path: path.to_path_buf(), file, data_at: header.len() as u64, len, written: 0 })
    }

    /// Writes values `first..first + values.len()` (pieces must not overlap: each is counted once).
    pub fn put(&mut self, first: usize, values: &[f32]) -> Result<(), CubeError> {
        use std::os::unix::fs::FileExt;
        if first.checked_add(values.len()).is_none_or(|end| end > self.len) {
            return Err(CubeError::io(
                &self.path,
                io::Error::new(io::ErrorKind::InvalidInput, format!("values {first}+{} lie beyond the {} of the file", values.len(), self.len)),
            ));
        }
        let at = self.data_at + 4 * first as u64;
        let r = match f32_le_view(values) {
            Some(bytes) => self.file.write_all_at(bytes, at),
            None => {
                let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                self.file.write_all_at(&bytes, at)
            }
        };
        r.map_err(|e| CubeError::io(&self.path, e))?;
        self.written += values.len();
        Ok(())
    }

    /// Whether as many values were written as the shape holds.
    pub fn is_complete(&self) -> bool {
        self.written == self.len
    }
}

/// Writes float32 values as a little-endian C-order `.npy` of the given shape to `w` (converted a
/// bounded chunk at a time). The shape must hold exactly `values.len()` elements.
pub fn write_f32_to(w: &mut dyn Write, shape: &[usize], values: &[f32]) -> io::Result<()> {
    let elements = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    if elements != Some(values.len()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("shape {shape:?} does not hold {} values", values.len()),
        ));
    }
    w.write_all(&header_bytes("<f4", shape))?;
    if let Some(bytes) = f32_le_view(values) {
        return w.write_all(bytes);
    }
    let mut buf = Vec::with_capacity(4 * values.len().min(1 << 16));
    for chunk in values.chunks(1 << 16) {
        buf.clear();
        buf.extend(chunk.iter().flat_map(|v| v.to_le_bytes()));
        w.write_all(&buf)?;
    }
    Ok(())
}

/// Float32 values as their `<f4` bytes without a converted copy: on a little-endian host only (None
/// elsewhere).
pub(crate) fn f32_le_view(values: &[f32]) -> Option<&[u8]> {
    // SAFETY: f32 has no padding and any initialised memory may be read as bytes; on a little-endian
    // host these are exactly the little-endian bytes.
    cfg!(target_endian = "little")
        .then(|| unsafe { std::slice::from_raw_parts(values.as_ptr() as *const u8, std::mem::size_of_val(values)) })
}

/// Writes a cube as a C-order `.npy` shaped (lines, samples, bands) in its own data type and byte order.
pub fn write_cube(path: &Path, cube: &Cube) -> Result<(), CubeError> {
    let file = File::create(path).map_err(|e| CubeError::io(path, e))?;
    let mut w = io::BufWriter::with_capacity(1 << 16, file);
    let header =
        header_bytes(&descr_of(cube.dtype(), cube.byte_order()), &[cube.lines(), cube.samples(), cube.bands()]);
    w.write_all(&header)
        .and_then(|()| w.write_all(cube.raw()))
        .and_then(|()| w.flush())
        .map_err(|e| CubeError::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A mapped C-order file gives the cube `read` gives (same samples, digest and metadata), without
    /// memory of its own; Fortran order and an unaligned data offset are read instead; the size checks
    /// hold for the mapping too.
    #[test]
    fn map_gives_the_cube_read_gives() {
        let dir = tempfile::tempdir().unwrap();
        let values: Vec<i16> = (0..5 * 7 * 3).map(|i| (i * 37 % 1001 - 500) as i16).collect();
        let cube = Cube::from_i16(5, 7, 3, &values).unwrap();
        let p = dir.path().join("c.npy");
        write_cube(&p, &cube).unwrap();
        let (mapped, read) = (map(&p).unwrap(), read(&p).unwrap());
        assert!(mapped.is_mapped() && !read.is_mapped());
        assert_eq!(mapped.raw(), read.raw());
        assert_eq!(mapped.content_digest(), read.content_digest());
        assert_eq!(mapped.meta.source_interleave, read.meta.source_interleave);
        assert!(!mapped.clone().is_mapped(), "a clone owns its bytes");

        // Fortran order (the same values, BSQ on disk) is read and transposed.
        let mut bsq = header_bytes("<i2", &[5, 7, 3]);
        let (from, to) = (b"'fortran_order': False,", b"'fortran_order': True, ");
        let at = bsq.windows(from.len()).position(|w| w == from).unwrap();
        bsq[at..at + to.len()].copy_from_slice(to);
        for b in 0..3 {
            for smp in 0..7 {
                for l in 0..5 {
                    bsq.extend_from_slice(&values[(l * 7 + smp) * 3 + b].to_le_bytes());
                }
            }
        }
        let f = dir.path().join("f.npy");
        std::fs::write(&f, &bsq).unwrap();
        let fortran = map(&f).unwrap();
        assert!(!fortran.is_mapped());
        assert_eq!(fortran.raw(), read.raw());

        // A data offset that is not 64-byte aligned (a hand-made header) is read, not mapped.
        let good = std::fs::read(&p).unwrap();
        let off = good.iter().position(|&c| c == b'\n').unwrap() + 1;
        let mut odd = good[..off - 1].to_vec();
        odd.extend_from_slice(b" \n");
        let hl = u16::from_le_bytes([odd[8], odd[9]]) + 1;
        odd[8..10].copy_from_slice(&hl.to_le_bytes());
        odd.extend_from_slice(&good[off..]);
        let u = dir.path().join("u.npy");
        std::fs::write(&u, &odd).unwrap();
        let unaligned = map(&u).unwrap();
        assert!(!unaligned.is_mapped());
        assert_eq!(unaligned.raw(), read.raw());

        // Truncated and overlong files are refused before mapping.
        std::fs::write(&u, &good[..good.len() - 2]).unwrap();
        assert!(matches!(map(&u), Err(CubeError::SizeMismatch(_))));
        let mut long = good.clone();
        long.push(0);
        std::fs::write(&u, &long).unwrap();
        assert!(matches!(map(&u), Err(CubeError::SizeMismatch(_))));
    }

    #[test]
    fn dict_parser_is_tolerant() {
        let (dt, bo, f, shape) =
            parse_dict("{ \"shape\" : (3L, 4,5 ,),'fortran_order':True ,'descr':'>u2' ,}  \n").unwrap();
        assert_eq!((dt, bo, f, shape), (DataType::U16, ByteOrder::Big, true, vec![3, 4, 5]));
        assert!(parse_dict("{'descr': '<f4', 'fortran_order': False}").unwrap_err().to_string().contains("shape"));
        assert!(parse_dict("{'descr': '<f4', 'fortran_order': Nope, 'shape': ()}").is_err());
        assert!(matches!(
            parse_dict("{'descr': [('a', '<i4')], 'fortran_order': False, 'shape': (2,)}"),
            Err(CubeError::Unsupported(_))
        ));
    }

    #[test]
    fn descr_mapping() {
        assert_eq!(parse_descr("|u1").unwrap(), (DataType::U8, ByteOrder::Little));
        assert_eq!(parse_descr(">f8").unwrap(), (DataType::F64, ByteOrder::Big));
        for bad in ["<c8", "|b1", "<f2", "|O", "|i1", "<U3"] {
            assert!(matches!(parse_descr(bad), Err(CubeError::Unsupported(_))), "{bad}");
        }
        assert!(matches!(parse_descr("|i2"), Err(CubeError::Npy(_))));
        for dt in DataType::ALL {
            for bo in [ByteOrder::Little, ByteOrder::Big] {
                let (d2, b2) = parse_descr(&descr_of(dt, bo)).unwrap();
                assert_eq!(d2, dt);
                if dt.size() > 1 {
                    assert_eq!(b2, bo);
                }
            }
        }
    }

    #[test]
    fn header_is_aligned_and_switches_version() {
        let h = header_bytes("<f4", &[3, 4, 5]);
        assert_eq!(h.len() % 64, 0);
        assert_eq!((h[6], *h.last().unwrap()), (1, b'\n'));
        let back = read_header(&mut h.as_slice()).unwrap();
        assert_eq!(back.shape, vec![3, 4, 5]);
        assert_eq!(back.data_offset as usize, h.len());
        // A shape long enough to overflow version 1.0's 16-bit header length.
        let long = vec![1usize; 30_000];
        let h2 = header_bytes("<f4", &long);
        assert_eq!((h2[6], h2.len() % 64), (2, 0));
        assert_eq!(read_header(&mut h2.as_slice()).unwrap().shape.len(), 30_000);
    }
}

//! The in-memory cube: raw samples kept in their file data type and byte order, laid out BIP
//! (line, sample, band) — the same element order as a C-order `.npy` of shape (lines, samples, bands).
//!
//! Why raw and not f32: the GPU backend uploads the integer data as it is and converts on the device
//! (half the PCIe bytes for int16), and the CPU backend widens one chunk of lines at a time, so the cube
//! is never held twice. Why BIP: a chunk of lines is one contiguous byte range, which is what streaming,
//! chunked statistics and pinned staging buffers want.

use super::bytes::SampleBytes;
use super::npy_header::canonical_header;
pub use super::sample_type::{checked_cube_bytes, decode_into, ByteOrder, DataType, Interleave, MAX_CUBE_BYTES};
use super::CubeError;

/// What the source said about the bands and the scene, beyond the geometry. Header fields that hypermnf
/// does not interpret are kept verbatim in `extra` so that outputs carry them on.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CubeMeta {
    /// Layout of the source file (BIP for C-order .npy, BSQ-like for Fortran-order .npy).
    pub source_interleave: Option<Interleave>,
    /// ENVI `bbl`: one flag per band, false = bad band.
    pub bbl: Option<Vec<bool>>,
    /// ENVI `data ignore value`: a pixel holding it in any (good) band is no-data.
    pub ignore_value: Option<f64>,
    pub wavelength: Option<Vec<f64>>,
    pub wavelength_units: Option<String>,
    pub fwhm: Option<Vec<f64>>,
    pub band_names: Option<Vec<String>>,
    pub description: Option<String>,
    pub map_info: Option<String>,
    /// Header entries not interpreted above, in file order: (key as written, raw value text as written,
    /// including the braces of a list).
    pub extra: Vec<(String, String)>,
}

impl CubeMeta {
    /// A digest of the metadata that a result carries into its files (the ENVI headers' map info,
    /// coordinate system string, wavelengths, fwhm, band names, description and other keys, and the
    /// `source` and `input` members of the metadata JSON), or None when the cube carries none: a
    /// C-order `.npy`, or an ENVI BIP file whose header says nothing beyond its geometry.
    ///
    /// Why the job cache keys on it (`jobs::submit::CubeKey::job_digest`): the result level hands back an existing
    /// job, whose files were written from *its* request's header. Identical pixels under two headers
    /// (a product re-georeferenced after a better orthorectification, a tile cut from two mosaics) must
    /// not share a job, or the second request downloads the first one's georeferencing. The statistics
    /// and device levels do not key on it: an eigen system depends on the samples, bbl and no-data
    /// only, so the second request still reuses the first one's.
    ///
    /// `bbl` and `data ignore value` are left out here because the content digest already holds them.
    /// The whole record is hashed through its JSON form, so a field added to `CubeMeta` later is keyed
    /// on without anyone remembering to add it.
    pub fn carried_digest(&self) -> Option<[u8; 32]> {
        use sha2::Digest as _;
        let mut carried = self.clone();
        carried.bbl = None;
        carried.ignore_value = None;
        if carried.source_interleave == Some(Interleave::Bip) {
            carried.source_interleave = None;
        }
        if carried == CubeMeta::default() {
            return None;
        }
        let json = serde_json::to_vec(&carried).expect("CubeMeta serialises");
        let mut h = sha2::Sha256::new();
        h.update(b"hypermnf-carried-meta-v1");
        h.update(json);
        Some(h.finalize().into())
    }

    /// The value of a header key kept verbatim in `extra` (matched as ENVI matches keys: case and
    /// runs of whitespace ignored), without the braces of a list.
    pub fn extra_value(&self, key: &str) -> Option<&str> {
        let want = normalize_key(key);
        self.extra.iter().find_map(|(k, v)| {
            (normalize_key(k) == want).then(|| {
                let v = v.trim();
                v.strip_prefix('{').and_then(|v| v.strip_suffix('}')).unwrap_or(v).trim()
            })
        })
    }
}

/// Lower case with runs of whitespace made one space, as ENVI matches header keys:
/// `Data   Type` → `data type`.
pub(crate) fn normalize_key(key: &str) -> String {
    key.split_whitespace().map(str::to_lowercase).collect::<Vec<_>>().join(" ")
}

/// A hyperspectral cube in memory. See the module doc for the layout.
#[derive(Debug, Clone)]
pub struct Cube {
    lines: usize,
    samples: usize,
    bands: usize,
    dtype: DataType,
    byte_order: ByteOrder,
    /// Owned, or borrowed for the length of a `with_borrowed` call (bytes.rs says why that is sound).
    data: SampleBytes,
    /// The order of the samples in `data`: BIP, except for an ENVI file mapped in the layout it is
    /// stored in ([`Cube::from_mapped_native`]), which is read without a transpose on the host.
    storage: Interleave,
    pub meta: CubeMeta,
}

/// `len` bytes must be exactly what the (checked) dimensions need.
fn check_size(lines: usize, samples: usize, bands: usize, dtype: DataType, len: usize) -> Result<(), CubeError> {
    let want = checked_cube_bytes(lines as u64, samples as u64, bands as u64, dtype)?;
    if len as u64 != want {
        return Err(CubeError::SizeMismatch(format!(
            "{len} bytes of samples for {lines} x {samples} x {bands} {} (expected {want})",
            dtype.name()
        )));
    }
    Ok(())
}

impl Cube {
    /// Wraps raw BIP bytes. `data.len()` must equal lines × samples × bands × dtype size.
    pub fn from_raw(
        lines: usize,
        samples: usize,
        bands: usize,
        dtype: DataType,
        byte_order: ByteOrder,
        data: Vec<u8>,
        meta: CubeMeta,
    ) -> Result<Self, CubeError> {
        check_size(lines, samples, bands, dtype, data.len())?;
        Ok(Cube { lines, samples, bands, dtype, byte_order, data: SampleBytes::Owned(data), storage: Interleave::Bip, meta })
    }

    /// Runs `f` on a cube whose samples are `data`, borrowed instead of copied (same checks as
    /// [`from_raw`](Self::from_raw)). The cube exists only during the call: `f` sees `&Cube`, and a
    /// clone of it owns a copy of the bytes. The library API runs the MNF on an `ndarray` view this way
    /// without holding the cube twice.
    #[allow(clippy::too_many_arguments)] // the same fields as `from_raw`, plus the closure
    pub fn with_borrowed<R>(
        lines: usize,
        samples: usize,
        bands: usize,
        dtype: DataType,
        byte_order: ByteOrder,
        data: &[u8],
        meta: CubeMeta,
        f: impl FnOnce(&Cube) -> R,
    ) -> Result<R, CubeError> {
        check_size(lines, samples, bands, dtype, data.len())?;
        let cube = Cube { lines, samples, bands, dtype, byte_order, data: SampleBytes::borrowed(data), storage: Interleave::Bip, meta };
        // `cube` is dropped at the end of this function, while `data` is still borrowed.
        Ok(f(&cube))
    }

    /// Wraps `len` bytes of BIP samples at `offset` of a file mapping (same checks as
    /// [`from_raw`](Self::from_raw), and the range must lie in the mapping).
    #[allow(clippy::too_many_arguments)] // the same fields as `from_raw`, plus where the samples lie
    pub(super) fn from_mapped(
        lines: usize,
        samples: usize,
        bands: usize,
        dtype: DataType,
        byte_order: ByteOrder,
        map: memmap2::Mmap,
        file: std::fs::File,
        offset: usize,
        len: usize,
        meta: CubeMeta,
    ) -> Result<Self, CubeError> {
        Self::from_mapped_native(lines, samples, bands, dtype, byte_order, Interleave::Bip, map, file, offset, len, meta)
    }

    /// [`from_mapped`](Self::from_mapped) for samples stored in `storage` order (an ENVI BIL or BSQ
    /// file mapped as it is). Such a cube is never transposed on the host: the CPU backend widens a
    /// block of lines at a time into BIP ([`decode_lines_f64`](Self::decode_lines_f64)), the CUDA
    /// backend copies blocks of lines in the file's order and reorders them on the device, and the
    /// content digest gathers each of its leaves.
    #[allow(clippy::too_many_arguments)] // the same fields as `from_raw`, plus where the samples lie
    pub(super) fn from_mapped_native(
        lines: usize,
        samples: usize,
        bands: usize,
        dtype: DataType,
        byte_order: ByteOrder,
        storage: Interleave,
        map: memmap2::Mmap,
        file: std::fs::File,
        offset: usize,
        len: usize,
        meta: CubeMeta,
    ) -> Result<Self, CubeError> {
        check_size(lines, samples, bands, dtype, len)?;
        if offset.checked_add(len).is_none_or(|end| end > map.len()) {
            return Err(CubeError::SizeMismatch(format!("{len} bytes from offset {offset} run past a {} byte file", map.len())));
        }
        Ok(Cube { lines, samples, bands, dtype, byte_order, data: SampleBytes::Mapped { map, offset, len, file }, storage, meta })
    }

    /// The order of the samples in memory: BIP, or the layout of a natively mapped ENVI file.
    pub fn storage(&self) -> Interleave {
        self.storage
    }

    /// Bytes of samples (whatever their order).
    pub fn raw_len(&self) -> usize {
        self.data.as_slice().len()
    }

    /// Whether the samples are a file mapping ([`crate::cube::npy::map`]) rather than memory of their own.
    pub fn is_mapped(&self) -> bool {
        self.data.is_mapped()
    }

    /// For a mapped cube, the file and the byte offset of its first sample there, so that a reader can
    /// copy ranges of `raw()` with positioned reads instead of through the mapping.
    pub fn raw_file(&self) -> Option<(&std::fs::File, u64)> {
        self.data.file()
    }

    /// Whether the samples are borrowed (inside [`with_borrowed`](Self::with_borrowed)) rather than owned.
    pub fn is_borrowed(&self) -> bool {
        self.data.is_borrowed()
    }

    /// A float32 cube in native byte order from BIP values (synthetic data, tests, notebooks).
    pub fn from_f32(lines: usize, samples: usize, bands: usize, values: &[f32]) -> Result<Self, CubeError> {
        let mut data = Vec::with_capacity(values.len() * 4);
        for v in values {
            data.extend_from_slice(&v.to_le_bytes());
        }
        Cube::from_raw(lines, samples, bands, DataType::F32, ByteOrder::Little, data, CubeMeta::default())
    }

    /// An int16 cube (little-endian) from BIP values.
    pub fn from_i16(lines: usize, samples: usize, bands: usize, values: &[i16]) -> Result<Self, CubeError> {
        let mut data = Vec::with_capacity(values.len() * 2);
        for v in values {
            data.extend_from_slice(&v.to_le_bytes());
        }
        Cube::from_raw(lines, samples, bands, DataType::I16, ByteOrder::Little, data, CubeMeta::default())
    }

    pub fn lines(&self) -> usize {
        self.lines
    }
    pub fn samples(&self) -> usize {
        self.samples
    }
    pub fn bands(&self) -> usize {
        self.bands
    }
    pub fn pixels(&self) -> usize {
        self.lines * self.samples
    }
    pub fn dtype(&self) -> DataType {
        self.dtype
    }
    pub fn byte_order(&self) -> ByteOrder {
        self.byte_order
    }
    /// Raw BIP bytes in the cube's byte order (what the GPU backend uploads). Only for a cube stored
    /// BIP: a natively mapped BIL or BSQ file has no BIP bytes (see [`storage`](Self::storage));
    /// callers that may see one read it with [`decode_lines_f64`](Self::decode_lines_f64),
    /// [`copy_lines_bip`](Self::copy_lines_bip) or the file ([`raw_file`](Self::raw_file)).
    pub fn raw(&self) -> &[u8] {
        assert_eq!(self.storage, Interleave::Bip, "Cube::raw on a cube stored {}", self.storage.name());
        self.data.as_slice()
    }

    /// The samples in their stored order (see [`storage`](Self::storage)), in the cube's byte order.
    pub fn stored(&self) -> &[u8] {
        self.data.as_slice()
    }
    /// Bytes of one line (samples × bands samples).
    pub fn line_bytes(&self) -> usize {
        self.samples * self.bands * self.dtype.size()
    }
    /// Raw bytes of lines `first..first + count`.
    pub fn raw_lines(&self, first: usize, count: usize) -> &[u8] {
        let lb = self.line_bytes();
        &self.raw()[first * lb..(first + count) * lb]
    }

    /// Widens lines `first..first + count` into `out` (BIP order, length count × samples × bands),
    /// whatever the stored order: a BIL line or a BSQ band slab of those lines is widened as it lies
    /// and put in place (the only reordering a natively mapped cube sees on the CPU, a block at a time).
    pub fn decode_lines_f64(&self, first: usize, count: usize, out: &mut [f64]) {
        let (s, b) = (self.samples, self.bands);
        let size = self.dtype.size();
        let data = self.data.as_slice();
        match self.storage {
            Interleave::Bip => decode_into(self.raw_lines(first, count), self.dtype, self.byte_order, out),
            Interleave::Bil => {
                assert_eq!(out.len(), count * s * b, "decode_lines_f64: length mismatch");
                let mut line = vec![0f64; s * b];
                for (i, l) in (first..first + count).enumerate() {
                    let at = l * s * b * size;
                    decode_into(&data[at..at + s * b * size], self.dtype, self.byte_order, &mut line);
                    let dst = &mut out[i * s * b..(i + 1) * s * b];
                    for (band, row) in line.chunks_exact(s).enumerate() {
                        for (px, v) in row.iter().enumerate() {
                            dst[px * b + band] = *v;
                        }
                    }
                }
            }
            Interleave::Bsq => {
                assert_eq!(out.len(), count * s * b, "decode_lines_f64: length mismatch");
                let mut plane = vec![0f64; count * s];
                for band in 0..b {
                    let at = (band * self.lines + first) * s * size;
                    decode_into(&data[at..at + count * s * size], self.dtype, self.byte_order, &mut plane);
                    for (px, v) in plane.iter().enumerate() {
                        out[px * b + band] = *v;
                    }
                }
            }
        }
    }

    /// Widens the pixel at (`line`, `sample`) into `out` (`bands` values).
    pub fn decode_pixel_f64(&self, line: usize, sample: usize, out: &mut [f64]) {
        let (s, b, size) = (self.samples, self.bands, self.dtype.size());
        let data = self.data.as_slice();
        match self.storage {
            Interleave::Bip => {
                let at = (line * s + sample) * b * size;
                decode_into(&data[at..at + b * size], self.dtype, self.byte_order, out)
            }
            storage => {
                for (band, o) in out.iter_mut().enumerate().take(b) {
                    let at = self.stored_index(storage, line, sample, band) * size;
                    decode_into(&data[at..at + size], self.dtype, self.byte_order, std::slice::from_mut(o));
                }
            }
        }
    }

    /// Raw bytes of lines `first..first + count` in BIP order (the cube's byte order), into `out`:
    /// a copy of [`raw_lines`](Self::raw_lines), gathered for a cube stored BIL or BSQ.
    pub fn copy_lines_bip(&self, first: usize, count: usize, out: &mut [u8]) {
        if self.storage == Interleave::Bip {
            out.copy_from_slice(self.raw_lines(first, count));
            return;
        }
        let s = self.samples;
        self.gather_bip(first * s, (first + count) * s, false, out);
    }

    /// The BIP bytes of pixels `p0..p1` (in line-major order) of a cube stored BIL or BSQ into `out`
    /// (exactly (p1 − p0) × bands samples), each sample byte-reversed when `swap`. In both layouts
    /// a band's samples of one line are contiguous, so runs of up to RUN pixels of a line are copied
    /// band by band into a small tile (a few tens of KB: it stays in L1) and written out pixel by pixel.
    /// Element by element through the stored order this ran at a third of SHA-256's speed; the
    /// tile is written out as whole N-byte samples ([`tile_to_pixels`]).
    fn gather_bip(&self, p0: usize, p1: usize, swap: bool, out: &mut [u8]) {
        const RUN: usize = 16;
        let (s, b, size) = (self.samples, self.bands, self.dtype.size());
        assert_eq!(out.len(), (p1 - p0) * b * size, "gather_bip: length mismatch");
        let data = self.data.as_slice();
        let mut tile = vec![0u8; b * RUN * size];
        let (mut p, mut o) = (p0, 0);
        while p < p1 {
            let (line, c0) = (p / s, p % s);
            let n = RUN.min(s - c0).min(p1 - p);
            for band in 0..b {
                let at = self.stored_index(self.storage, line, c0, band) * size;
                tile[band * RUN * size..][..n * size].copy_from_slice(&data[at..at + n * size]);
            }
            let pixels = &mut out[o..o + n * b * size];
            match size {
                1 => tile_to_pixels::<1>(&tile, n, b, RUN, swap, pixels),
                2 => tile_to_pixels::<2>(&tile, n, b, RUN, swap, pixels),
                4 => tile_to_pixels::<4>(&tile, n, b, RUN, swap, pixels),
                _ => tile_to_pixels::<8>(&tile, n, b, RUN, swap, pixels),
            }
            o += n * b * size;
            p += n;
        }
    }

    /// Where sample (`line`, `sample`, `band`) is among the stored samples.
    #[inline]
    fn stored_index(&self, storage: Interleave, line: usize, sample: usize, band: usize) -> usize {
        let (l, s, b) = (self.lines, self.samples, self.bands);
        match storage {
            Interleave::Bip => (line * s + sample) * b + band,
            Interleave::Bil => (line * b + band) * s + sample,
            Interleave::Bsq => (band * l + line) * s + sample,
        }
    }

    /// Widens the whole cube to f64 BIP (tests and references only: it doubles memory).
    pub fn to_f64(&self) -> Vec<f64> {
        let mut out = vec![0.0; self.pixels() * self.bands];
        self.decode_lines_f64(0, self.lines, &mut out);
        out
    }
}

impl Cube {
    /// The digest the job cache keys on: the tree SHA-256 of `cube::digest` over the cube written as
    /// its canonical `.npy` (`npy::canonical_header`, then the samples little-endian in BIP order),
    /// followed by the metadata that changes results (bbl, data ignore value) only when the cube has
    /// any. The same cube gives the same digest whatever file layout or byte order it arrived in (an
    /// ENVI BIL upload and a .npy of the same values are the same cube). Why this form: a `.npy` upload
    /// written the canonical way (by `np.save`, this crate or the Python client) has the digest of its
    /// body as its content digest, so the service computes it while the body streams in.
    ///
    /// The suffix cannot make two cubes collide: a canonical `.npy` is exactly as long as its header
    /// says, so a cube with a suffix is hashed from a longer string than any cube of the same header
    /// without one, and cubes of different headers differ within the header bytes.
    pub fn content_digest(&self) -> [u8; 32] {
        self.content_digest_as_written(|_| true).expect("a cube whose samples are all there is digested whole")
    }

    /// [`content_digest`](Self::content_digest) of a cube whose file is still being written in order
    /// (an upload being received): before each wave of leaves, `written(n)` is told that the first `n`
    /// bytes of the stored samples are needed, and blocks until they are in the file (false stops the
    /// digest: None). A cube stored by lines (BIP, BIL) is digested as its lines arrive; BSQ needs
    /// every band of a line, so the whole file, before its first leaf.
    pub fn content_digest_as_written(&self, mut written: impl FnMut(u64) -> bool) -> Option<[u8; 32]> {
        let header = canonical_header(self.dtype, self.lines, self.samples, self.bands);
        let suffix = self.digest_suffix();
        let (h_len, r_len) = (header.len() as u64, self.raw_len() as u64);
        let (pixel, line) = ((self.bands * self.dtype.size()) as u64, self.line_bytes() as u64);
        let by_lines = self.storage != Interleave::Bsq;
        // The stream's bytes up to `end` come from the stored samples up to the returned length.
        let stored_needed = move |end: u64| -> u64 {
            let z = end.saturating_sub(h_len).min(r_len);
            match z {
                0 => 0,
                _ if !by_lines || pixel == 0 => r_len,
                _ => (z.div_ceil(pixel).div_ceil(self.samples.max(1) as u64) * line).min(r_len),
            }
        };
        let ready = |end: u64| written(stored_needed(end));
        let total = h_len + r_len + suffix.len() as u64;
        if self.storage != Interleave::Bip {
            return self.content_digest_gathered(&header, &suffix, total, ready);
        }
        let raw = self.raw();
        let size = self.dtype.size();
        if self.byte_order == ByteOrder::Little || size == 1 {
            return super::digest::of_stream_as_ready(total, ready, |start, end, h| {
                use sha2::Digest;
                super::digest::feed_parts(&[&header, raw, &suffix], start, end, |b| h.update(b));
            });
        }
        // Big-endian samples are swapped a leaf at a time (never a second copy of the cube).
        super::digest::of_stream_as_ready(total, ready, |start, end, h| {
            use sha2::Digest;
            super::digest::feed_parts(&[&header], start, end, |b| h.update(b));
            let (a, b) = (start.max(h_len) - h_len, end.min(h_len + r_len).saturating_sub(h_len));
            if a < b {
                // Whole samples around a..b, swapped, then the part of them that is in the leaf.
                let (a0, b0) = (a - a % size as u64, b.div_ceil(size as u64) * size as u64);
                let mut swapped = Vec::with_capacity((b0 - a0) as usize);
                for s in raw[a0 as usize..b0 as usize].chunks_exact(size) {
                    swapped.extend(s.iter().rev());
                }
                h.update(&swapped[(a - a0) as usize..(b - a0) as usize]);
            }
            super::digest::feed_parts(&[&suffix], start.max(h_len + r_len) - (h_len + r_len), end.saturating_sub(h_len + r_len), |b| {
                h.update(b)
            });
        })
    }

    /// [`content_digest`](Self::content_digest) of a cube stored BIL or BSQ: each leaf's samples are
    /// gathered (and made little-endian) from the stored order, a leaf at a time on every core, so the
    /// cube is never transposed whole.
    fn content_digest_gathered(&self, header: &[u8], suffix: &[u8], total: u64, ready: impl FnMut(u64) -> bool) -> Option<[u8; 32]> {
        let size = self.dtype.size();
        let (h_len, r_len) = (header.len() as u64, self.raw_len() as u64);
        let swap = self.byte_order == ByteOrder::Big && size > 1;
        let b = self.bands;
        super::digest::of_stream_as_ready(total, ready, |start, end, h| {
            use sha2::Digest;
            super::digest::feed_parts(&[header], start, end, |x| h.update(x));
            let (a, z) = (start.max(h_len) - h_len, end.min(h_len + r_len).saturating_sub(h_len));
            if a < z {
                // The whole pixels around a..z, in BIP order, then the part of them in the leaf.
                let pixel = (b * size) as u64;
                let (p0, p1) = ((a / pixel) as usize, z.div_ceil(pixel) as usize);
                let mut bytes = vec![0u8; (p1 - p0) * b * size];
                self.gather_bip(p0, p1, swap, &mut bytes);
                let e0 = p0 * b;
                let skip = (a - e0 as u64 * size as u64) as usize;
                h.update(&bytes[skip..skip + (z - a) as usize]);
            }
            super::digest::feed_parts(&[suffix], start.max(h_len + r_len) - (h_len + r_len), end.saturating_sub(h_len + r_len), |x| {
                h.update(x)
            });
        })
    }

    /// What follows the canonical `.npy` in the content digest's stream: nothing for a cube without
    /// bbl or data ignore value, else a tagged record of both.
    fn digest_suffix(&self) -> Vec<u8> {
        digest_suffix(&self.meta)
    }
}

/// [`Cube::digest_suffix`] of a cube with metadata `meta`: also what an upload's digest
/// (`digest::Arriving`) ends with, before the cube is mapped.
pub(super) fn digest_suffix(meta: &CubeMeta) -> Vec<u8> {
    let mut s = Vec::new();
    if meta.bbl.is_some() || meta.ignore_value.is_some() {
        s.extend_from_slice(b"hypermnf-meta-v1");
        match &meta.bbl {
            Some(bbl) => {
                s.push(1);
                s.extend(bbl.iter().map(|&g| g as u8));
            }
            None => s.push(0),
        }
        match meta.ignore_value {
            Some(v) => {
                s.push(1);
                s.extend_from_slice(&v.to_le_bytes());
            }
            None => s.push(0),
        }
    }
    s
}

/// The `n` pixels of a band-major tile (`b` bands of `run` samples of N bytes) written pixel by pixel
/// (all bands of a pixel together) into `out`, each sample byte-reversed when `swap`. Whole samples
/// are moved as N-byte values: a byte slice copy per sample ran at 0.87 GB/s, a third of SHA-256.
fn tile_to_pixels<const N: usize>(tile: &[u8], n: usize, b: usize, run: usize, swap: bool, out: &mut [u8]) {
    for (i, pixel) in out.chunks_exact_mut(b * N).take(n).enumerate() {
        for (band, dst) in pixel.chunks_exact_mut(N).enumerate() {
            let at = (band * run + i) * N;
            let mut v: [u8; N] = tile[at..at + N].try_into().expect("N bytes");
            if swap {
                v.reverse();
            }
            dst.copy_from_slice(&v);
        }
    }
}

#[cfg(test)]
mod tests {
    // A borrowed cube's bytes (`bytes::SampleBytes::Borrowed`) seen through the cube.
    use crate::cube::{ByteOrder, Cube, CubeMeta, DataType};

    #[test]
    fn a_borrowed_cube_reads_the_callers_bytes_and_its_clone_owns_a_copy() {
        let values: Vec<u8> = (0..24).collect();
        let owned = Cube::from_raw(2, 3, 4, DataType::U8, ByteOrder::Little, values.clone(), CubeMeta::default()).unwrap();
        let clone = Cube::with_borrowed(2, 3, 4, DataType::U8, ByteOrder::Little, &values, CubeMeta::default(), |c| {
            assert!(c.is_borrowed());
            assert_eq!(c.raw().as_ptr(), values.as_ptr(), "no copy");
            assert_eq!(c.raw_lines(1, 1), owned.raw_lines(1, 1));
            assert_eq!(c.content_digest(), owned.content_digest());
            c.clone()
        })
        .unwrap();
        assert!(!clone.is_borrowed());
        assert_ne!(clone.raw().as_ptr(), values.as_ptr());
        assert_eq!(clone.raw(), &values[..]);
    }

    #[test]
    fn a_borrowed_cube_is_checked_like_an_owned_one() {
        let values = [0u8; 10];
        let r = Cube::with_borrowed(2, 3, 4, DataType::U8, ByteOrder::Little, &values, CubeMeta::default(), |_| ());
        assert!(matches!(r, Err(crate::cube::CubeError::SizeMismatch(_))), "{r:?}");
        let r = Cube::with_borrowed(0, 3, 4, DataType::U8, ByteOrder::Little, &[], CubeMeta::default(), |_| ());
        assert!(matches!(r, Err(crate::cube::CubeError::Header(_))), "{r:?}");
    }
}

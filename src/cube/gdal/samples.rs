//! Assembling a BIP cube from blocks of lines read through GDAL, in the source's data type, or, when
//! the product defines a scale and offset, as float32 physical values.
//!
//! Why blocks: a granule is decoded (decompressed) by GDAL a block of lines at a time into a small typed
//! buffer, and placed into the cube's one allocation; the cube is never held twice.

use gdal::raster::GdalType;

use crate::cube::{ByteOrder, Cube, CubeError, CubeMeta, DataType};

/// A sample type GDAL reads into and the cube stores.
pub(super) trait Sample: Copy + Default + GdalType + Send + Sync + 'static {
    const DTYPE: DataType;
    fn to_f64(self) -> f64;
    fn put_ne(self, out: &mut [u8]);
    /// The sample stored in `bytes` (exactly its size) in the byte order `order`.
    fn from_bytes(bytes: &[u8], order: ByteOrder) -> Self;
}

macro_rules! sample {
    ($t:ty, $d:expr) => {
        impl Sample for $t {
            const DTYPE: DataType = $d;
            #[inline]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline]
            fn put_ne(self, out: &mut [u8]) {
                out.copy_from_slice(&self.to_ne_bytes());
            }
            #[inline]
            fn from_bytes(bytes: &[u8], order: ByteOrder) -> Self {
                let b = bytes.try_into().expect("one sample's bytes");
                match order {
                    ByteOrder::Little => <$t>::from_le_bytes(b),
                    ByteOrder::Big => <$t>::from_be_bytes(b),
                }
            }
        }
    };
}
sample!(u8, DataType::U8);
sample!(i16, DataType::I16);
sample!(u16, DataType::U16);
sample!(i32, DataType::I32);
sample!(u32, DataType::U32);
sample!(i64, DataType::I64);
sample!(u64, DataType::U64);
sample!(f32, DataType::F32);
sample!(f64, DataType::F64);

/// The byte order of samples GDAL hands over: the machine's.
pub(super) fn native_order() -> ByteOrder {
    if cfg!(target_endian = "big") {
        ByteOrder::Big
    } else {
        ByteOrder::Little
    }
}

/// The cube's data type for a GDAL numeric type, or an error naming what MNF cannot use.
#[allow(non_upper_case_globals)] // GDAL's own names of its type constants
pub(super) fn data_type_of(gdal_type: gdal_sys::GDALDataType::Type, what: &str) -> Result<DataType, CubeError> {
    use gdal_sys::GDALDataType::*;
    Ok(match gdal_type {
        GDT_Byte => DataType::U8,
        GDT_Int16 => DataType::I16,
        GDT_UInt16 => DataType::U16,
        GDT_Int32 => DataType::I32,
        GDT_UInt32 => DataType::U32,
        GDT_Int64 => DataType::I64,
        GDT_UInt64 => DataType::U64,
        GDT_Float32 => DataType::F32,
        GDT_Float64 => DataType::F64,
        GDT_CInt16 | GDT_CInt32 | GDT_CFloat32 | GDT_CFloat64 => {
            return Err(CubeError::Unsupported(format!("{what} is complex; MNF needs real-valued bands")))
        }
        other => return Err(CubeError::Unsupported(format!("{what} has a data type GDAL numbers {other}, which hypermnf does not read"))),
    })
}

/// Calls `$body` with the Rust sample type `$t` of the cube data type `$dtype`.
macro_rules! with_sample_type {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            $crate::cube::DataType::U8 => { type $t = u8; $body }
            $crate::cube::DataType::I16 => { type $t = i16; $body }
            $crate::cube::DataType::U16 => { type $t = u16; $body }
            $crate::cube::DataType::I32 => { type $t = i32; $body }
            $crate::cube::DataType::U32 => { type $t = u32; $body }
            $crate::cube::DataType::I64 => { type $t = i64; $body }
            $crate::cube::DataType::U64 => { type $t = u64; $body }
            $crate::cube::DataType::F32 => { type $t = f32; $body }
            $crate::cube::DataType::F64 => { type $t = f64; $body }
        }
    };
}
pub(super) use with_sample_type;

/// How the samples of one source array lie in a block of lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BlockOrder {
    /// (line, sample, band): EMIT, NEON, a GeoTIFF read pixel-interleaved.
    Bip,
    /// (line, band, sample): PRISMA's cubes.
    Bil,
}

/// Physical value = stored × scale + offset, per band; the fill value is kept as it is (it stays the
/// cube's no-data value).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Linear {
    pub scale: f64,
    pub offset: f64,
}

impl Linear {
    pub const IDENTITY: Linear = Linear { scale: 1.0, offset: 0.0 };
    pub fn is_identity(self) -> bool {
        self.scale == 1.0 && self.offset == 0.0
    }
}

/// The cube being assembled: its geometry, its data type and one allocation for its samples.
pub(super) struct CubeBuilder {
    lines: usize,
    samples: usize,
    bands: usize,
    dtype: DataType,
    bytes: Vec<u8>,
}

impl CubeBuilder {
    /// Allocates the cube after checking its size (the dimensions come from the file's header).
    pub fn new(lines: usize, samples: usize, bands: usize, dtype: DataType) -> Result<Self, CubeError> {
        let len = crate::cube::sample_type::checked_cube_bytes(lines as u64, samples as u64, bands as u64, dtype)?;
        let len = usize::try_from(len).map_err(|_| CubeError::TooLarge(format!("{len} bytes do not fit this machine's address space")))?;
        let mut bytes = Vec::new();
        bytes.try_reserve_exact(len).map_err(|_| {
            CubeError::TooLarge(format!("cannot allocate {len} bytes for {lines} x {samples} x {bands} {}", dtype.name()))
        })?;
        bytes.resize(len, 0);
        Ok(CubeBuilder { lines, samples, bands, dtype, bytes })
    }

    pub fn lines(&self) -> usize {
        self.lines
    }

    /// Places a block of `count` lines from `first`, read from a source array of `src_bands` bands in
    /// `order`, into the cube: source band `b` goes to cube band `band_map[b]` (None: left out),
    /// converted by `linear[b]` unless the sample equals `fill`. Without conversion the cube's type
    /// must be `T`'s; with it, float32 or float64.
    #[allow(clippy::too_many_arguments)] // a block, where it goes, and how its values are converted
    pub fn put<T: Sample>(
        &mut self,
        first: usize,
        count: usize,
        block: &[T],
        order: BlockOrder,
        src_bands: usize,
        band_map: &[Option<usize>],
        linear: &[Linear],
        fill: Option<f64>,
    ) {
        assert!(first + count <= self.lines, "CubeBuilder::put: lines {first}..{} of {}", first + count, self.lines);
        let line_bytes = self.samples * self.bands * self.dtype.size();
        let mut lines = Lines {
            samples: self.samples,
            bands: self.bands,
            dtype: self.dtype,
            count,
            bytes: &mut self.bytes[first * line_bytes..(first + count) * line_bytes],
        };
        lines.put(block, order, src_bands, band_map, linear, fill);
    }

    /// The cube cut into blocks of `per_block` lines (the last may be shorter), each to be filled on its
    /// own, on any thread, as [`put`](Self::put) fills lines.
    pub fn line_blocks(&mut self, per_block: usize) -> Vec<Lines<'_>> {
        let (samples, bands, dtype, lines) = (self.samples, self.bands, self.dtype, self.lines);
        let line_bytes = samples * bands * dtype.size();
        let per_block = per_block.max(1);
        if line_bytes == 0 {
            return Vec::new();
        }
        self.bytes
            .chunks_mut(per_block * line_bytes)
            .enumerate()
            .map(|(i, bytes)| Lines { samples, bands, dtype, count: (lines - i * per_block).min(per_block), bytes })
            .collect()
    }

    /// Places a block of `count` lines from `first` read band by band: `planes` holds, for each of the
    /// cube's bands in order, its `count` × samples values (line-major), as a band-interleaved GeoTIFF
    /// stores them. Converted by `linear[b]` as [`put`](Self::put) converts.
    ///
    /// Why this way: GDAL copies a band-interleaved file into a pixel-interleaved buffer one sample at a
    /// time at a stride of a whole pixel (~0.4 GB/s), while it reads each band's lines at about memcpy
    /// speed. The transpose into BIP runs here instead, one line per task on every core, a run of
    /// pixels at a time: the run's pixels (RUN × bands samples, 16 KB for 256 float32 bands) stay in L1
    /// while each band adds one sample to each of them.
    pub fn put_planes<T: Sample>(&mut self, first: usize, count: usize, planes: &[T], linear: &[Linear], fill: Option<f64>) {
        use rayon::prelude::*;
        const RUN: usize = 16;
        let (s, b, dtype) = (self.samples, self.bands, self.dtype);
        let size = dtype.size();
        assert_eq!(planes.len(), count * s * b, "CubeBuilder::put_planes: block length");
        assert!(first + count <= self.lines && linear.len() == b);
        let convert = T::DTYPE != dtype || linear.iter().any(|l| !l.is_identity());
        let line_bytes = s * b * size;
        let out = &mut self.bytes[first * line_bytes..(first + count) * line_bytes];
        out.par_chunks_mut(line_bytes.max(1)).enumerate().for_each(|(l, line)| {
            for p0 in (0..s).step_by(RUN) {
                let n = RUN.min(s - p0);
                let run = &mut line[p0 * b * size..(p0 + n) * b * size];
                for (band, lin) in linear.iter().enumerate() {
                    let src = &planes[(band * count + l) * s + p0..][..n];
                    for (pixel, &v) in run.chunks_exact_mut(b * size).zip(src) {
                        place_one(&mut pixel[band * size..(band + 1) * size], v, convert, *lin, fill, dtype);
                    }
                }
            }
        });
    }

    pub fn finish(self, meta: CubeMeta) -> Result<Cube, CubeError> {
        Cube::from_raw(self.lines, self.samples, self.bands, self.dtype, native_order(), self.bytes, meta)
    }
}

/// A run of whole lines of the cube being assembled ([`CubeBuilder::line_blocks`]).
pub(super) struct Lines<'a> {
    samples: usize,
    bands: usize,
    dtype: DataType,
    count: usize,
    bytes: &'a mut [u8],
}

impl Lines<'_> {
    /// Lines in this run.
    pub fn count(&self) -> usize {
        self.count
    }

    /// The run's bytes, when [`put`](Self::put) would copy a block of `T` into them as it is (no
    /// conversion, every band in place, BIP): a decoder may then write the samples straight there, in
    /// the machine's byte order.
    pub fn plain_bytes<T: Sample>(&mut self, order: BlockOrder, band_map: &[Option<usize>], linear: &[Linear]) -> Option<&mut [u8]> {
        let convert = T::DTYPE != self.dtype || linear.iter().any(|l| !l.is_identity());
        let identity_map = band_map.len() == self.bands && band_map.iter().enumerate().all(|(i, m)| *m == Some(i));
        (!convert && identity_map && order == BlockOrder::Bip).then_some(&mut *self.bytes)
    }

    /// Places all the run's lines from `block`, as [`CubeBuilder::put`] places `count` lines.
    pub fn put<T: Sample>(&mut self, block: &[T], order: BlockOrder, src_bands: usize, band_map: &[Option<usize>], linear: &[Linear], fill: Option<f64>) {
        let (count, s, b) = (self.count, self.samples, self.bands);
        assert_eq!(block.len(), count * s * src_bands, "CubeBuilder::put: block length");
        assert!(band_map.len() == src_bands && linear.len() == src_bands);
        let size = self.dtype.size();
        // Converted when the product scales or the cube's type is not the source's (PRISMA's uint16 into
        // float32 even where a scale happens to be 1).
        let convert = T::DTYPE != self.dtype || linear.iter().any(|l| !l.is_identity());
        let identity_map = src_bands == b && band_map.iter().enumerate().all(|(i, m)| *m == Some(i));
        let out = &mut *self.bytes;
        if !convert && identity_map && order == BlockOrder::Bip {
            for (o, v) in out.chunks_exact_mut(size).zip(block) {
                v.put_ne(o);
            }
            return;
        }
        let dtype = self.dtype;
        let put_one = |o: &mut [u8], v: T, lin: Linear| place_one(o, v, convert, lin, fill, dtype);
        for l in 0..count {
            for px in 0..s {
                for (sb, (m, lin)) in band_map.iter().zip(linear).enumerate() {
                    let Some(ob) = *m else { continue };
                    let v = match order {
                        BlockOrder::Bip => block[(l * s + px) * src_bands + sb],
                        BlockOrder::Bil => block[(l * src_bands + sb) * s + px],
                    };
                    let at = ((l * s + px) * b + ob) * size;
                    put_one(&mut out[at..at + size], v, *lin);
                }
            }
        }
    }
}

/// Writes one sample into `o` (its place in the cube): as it is, or, when `convert`, as physical value
/// `v` × scale + offset (the fill value kept as it is) in the cube's float type `dtype`.
#[inline(always)]
fn place_one<T: Sample>(o: &mut [u8], v: T, convert: bool, lin: Linear, fill: Option<f64>, dtype: DataType) {
    if !convert {
        v.put_ne(o);
        return;
    }
    let x = v.to_f64();
    let y = if fill.is_some_and(|f| f == x) { x } else { x * lin.scale + lin.offset };
    match dtype {
        DataType::F64 => o.copy_from_slice(&y.to_ne_bytes()),
        _ => o.copy_from_slice(&(y as f32).to_ne_bytes()),
    }
}

/// Lines per block: about 32 MB of samples, at least one line.
pub(super) fn block_lines(samples: usize, bands: usize, size: usize) -> usize {
    ((32usize << 20) / (samples * bands * size).max(1)).max(1)
}

/// The cube's data type when `linear` converts some band: float64 stays, anything else becomes float32.
pub(super) fn converted_type(source: DataType, linear: &[Linear]) -> DataType {
    if linear.iter().all(|l| l.is_identity()) {
        source
    } else if source == DataType::F64 {
        DataType::F64
    } else {
        DataType::F32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distinct values (no two samples equal), so a sample put in the wrong place shows.
    fn values(n: usize) -> Vec<f32> {
        (0..n).map(|i| i as f32 * 0.5 - 1000.0).collect()
    }

    /// The planes of `lines` × `samples` × `bands` BIP `cube` for lines `first..first + count`.
    fn planes_of<T: Copy>(cube: &[T], first: usize, count: usize, samples: usize, bands: usize) -> Vec<T> {
        let mut out = Vec::with_capacity(count * samples * bands);
        for b in 0..bands {
            for l in first..first + count {
                out.extend((0..samples).map(|s| cube[(l * samples + s) * bands + b]));
            }
        }
        out
    }

    #[test]
    fn planes_put_in_blocks_give_the_bip_cube() {
        // Samples not a multiple of the 16-pixel run, and blocks of unequal lines.
        let (lines, samples, bands) = (7, 37, 5);
        let cube = values(lines * samples * bands);
        let mut b = CubeBuilder::new(lines, samples, bands, DataType::F32).unwrap();
        let linear = vec![Linear::IDENTITY; bands];
        for (first, count) in [(0, 3), (3, 1), (4, 3)] {
            b.put_planes(first, count, &planes_of(&cube, first, count, samples, bands), &linear, None);
        }
        let got = b.finish(CubeMeta::default()).unwrap().to_f64();
        assert!(got.iter().zip(&cube).all(|(g, c)| g.to_bits() == (*c as f64).to_bits()));
    }

    #[test]
    fn line_blocks_fill_the_cube_as_put_does_and_are_plain_only_where_put_copies() {
        let (lines, samples, bands) = (7, 3, 4);
        let cube = values(lines * samples * bands);
        let map: Vec<Option<usize>> = (0..bands).map(Some).collect();
        let identity = vec![Linear::IDENTITY; bands];
        let mut whole = CubeBuilder::new(lines, samples, bands, DataType::F32).unwrap();
        whole.put(0, lines, &cube, BlockOrder::Bip, bands, &map, &identity, None);
        let mut by_blocks = CubeBuilder::new(lines, samples, bands, DataType::F32).unwrap();
        let blocks = by_blocks.line_blocks(3);
        assert_eq!(blocks.iter().map(Lines::count).collect::<Vec<_>>(), [3, 3, 1]);
        let mut first = 0;
        for mut block in blocks {
            let n = block.count();
            block.put(&cube[first * samples * bands..(first + n) * samples * bands], BlockOrder::Bip, bands, &map, &identity, None);
            first += n;
        }
        assert_eq!(by_blocks.bytes, whole.bytes);

        let mut blocks = by_blocks.line_blocks(lines);
        let block = &mut blocks[0];
        assert_eq!(block.plain_bytes::<f32>(BlockOrder::Bip, &map, &identity).map(|b| b.len()), Some(lines * samples * bands * 4));
        assert!(block.plain_bytes::<f32>(BlockOrder::Bil, &map, &identity).is_none());
        assert!(block.plain_bytes::<i16>(BlockOrder::Bip, &map, &identity).is_none());
        let mut scaled = identity.clone();
        scaled[2] = Linear { scale: 0.5, offset: 0.0 };
        assert!(block.plain_bytes::<f32>(BlockOrder::Bip, &map, &scaled).is_none());
        let mut reordered = map.clone();
        reordered.swap(0, 1);
        assert!(block.plain_bytes::<f32>(BlockOrder::Bip, &reordered, &identity).is_none());
    }

    #[test]
    fn planes_are_converted_per_band_as_put_converts_pixels() {
        let (lines, samples, bands) = (4, 19, 3);
        let cube: Vec<i16> = (0..lines * samples * bands).map(|i| (i as i16).wrapping_mul(37) - 500).collect();
        let linear = [Linear { scale: 0.5, offset: 1.0 }, Linear::IDENTITY, Linear { scale: 2.0, offset: -3.0 }];
        let fill = Some(cube[5] as f64);
        let mut by_pixels = CubeBuilder::new(lines, samples, bands, DataType::F32).unwrap();
        by_pixels.put(0, lines, &cube, BlockOrder::Bip, bands, &[Some(0), Some(1), Some(2)], &linear, fill);
        let mut by_planes = CubeBuilder::new(lines, samples, bands, DataType::F32).unwrap();
        for (first, count) in [(0, 1), (1, 3)] {
            by_planes.put_planes(first, count, &planes_of(&cube, first, count, samples, bands), &linear, fill);
        }
        assert_eq!(by_planes.bytes, by_pixels.bytes);
        assert_ne!(by_planes.bytes, vec![0; by_planes.bytes.len()]);
    }
}

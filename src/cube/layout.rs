//! Moving samples between a file's element order (BSQ, BIL, BIP, Fortran order) and the in-memory BIP
//! order, streamed through a bounded buffer so that a cube is never held twice.
//!
//! A file order is the list of the cube's three axes, outermost first (the last varies fastest). Reading
//! walks the file's elements in that order and scatters each one to its BIP position; writing gathers in
//! the same walk. When the axes of extent > 1 already come in BIP order (BIP itself, or e.g. BSQ with one
//! band) the bytes are copied straight through.

use std::io::{self, Read, Seek, SeekFrom, Write};

use super::Interleave;

/// One axis of a cube.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Axis {
    Line,
    Sample,
    Band,
}

/// The order in which a file stores the elements: its axes, outermost first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileOrder(pub [Axis; 3]);

impl FileOrder {
    pub const BIP: FileOrder = FileOrder([Axis::Line, Axis::Sample, Axis::Band]);
    pub const BIL: FileOrder = FileOrder([Axis::Line, Axis::Band, Axis::Sample]);
    pub const BSQ: FileOrder = FileOrder([Axis::Band, Axis::Line, Axis::Sample]);
    /// Fortran order of an array shaped (lines, samples, bands): the line index varies fastest.
    pub const FORTRAN: FileOrder = FileOrder([Axis::Band, Axis::Sample, Axis::Line]);

    pub fn of(interleave: Interleave) -> Self {
        match interleave {
            Interleave::Bsq => FileOrder::BSQ,
            Interleave::Bil => FileOrder::BIL,
            Interleave::Bip => FileOrder::BIP,
        }
    }

    /// True when the file's bytes are already in BIP order for these dimensions: axes of extent 1 do
    /// not change the order, so only the others need to come in BIP's relative order.
    fn same_as_bip(self, dims: Dims) -> bool {
        let long = |order: FileOrder| order.0.into_iter().filter(move |&a| dims.extent(a) > 1);
        long(self).eq(long(FileOrder::BIP))
    }
}

/// Cube dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    pub lines: usize,
    pub samples: usize,
    pub bands: usize,
}

impl Dims {
    pub fn new(lines: usize, samples: usize, bands: usize) -> Self {
        Dims { lines, samples, bands }
    }
    pub fn elements(self) -> usize {
        self.lines * self.samples * self.bands
    }
    fn extent(self, axis: Axis) -> usize {
        match axis {
            Axis::Line => self.lines,
            Axis::Sample => self.samples,
            Axis::Band => self.bands,
        }
    }
    /// Distance, in elements, between neighbours along `axis` in BIP order.
    fn bip_stride(self, axis: Axis) -> usize {
        match axis {
            Axis::Line => self.samples * self.bands,
            Axis::Sample => self.bands,
            Axis::Band => 1,
        }
    }
}

/// Size of the staging buffer used to stream a permutation (whole elements, about 1 MiB).
const STAGING_BYTES: usize = 1 << 20;
/// Staging for band-plane blocks (BSQ, Fortran order): one segment per band, so a little larger to keep
/// each positioned read or write a reasonable size.
const PLANE_STAGING_BYTES: usize = 4 << 20;

/// Walks a file's elements in file order and yields each one's BIP element index.
struct BipWalk {
    extent: [usize; 3],
    stride: [usize; 3],
    index: [usize; 3],
    pos: usize,
    remaining: usize,
}

impl BipWalk {
    fn new(order: FileOrder, dims: Dims) -> Self {
        BipWalk {
            extent: order.0.map(|a| dims.extent(a)),
            stride: order.0.map(|a| dims.bip_stride(a)),
            index: [0; 3],
            pos: 0,
            remaining: dims.elements(),
        }
    }
}

impl Iterator for BipWalk {
    type Item = usize;

    #[inline]
    fn next(&mut self) -> Option<usize> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let current = self.pos;
        // Odometer step: the innermost axis first, carrying into the outer ones.
        self.index[2] += 1;
        self.pos += self.stride[2];
        if self.index[2] == self.extent[2] {
            self.index[2] = 0;
            self.pos -= self.extent[2] * self.stride[2];
            self.index[1] += 1;
            self.pos += self.stride[1];
            if self.index[1] == self.extent[1] {
                self.index[1] = 0;
                self.pos -= self.extent[1] * self.stride[1];
                self.index[0] += 1;
                self.pos += self.stride[0];
            }
        }
        Some(current)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

/// A file whose outermost axis is the band (BSQ, Fortran order) is a stack of band planes. Scattering
/// such a file element by element into BIP writes every band of a pixel at a different time, a cache
/// miss per sample over the whole cube (10x slower than BIP on a 300 MB cube). Instead a block of
/// `block` plane positions is read from every plane (one positioned read per band), and each pixel's
/// spectrum is then written whole. Writing mirrors this.
struct Planes {
    bands: usize,
    /// Elements per band plane (lines x samples).
    plane: usize,
    /// Plane positions per block.
    block: usize,
    /// Extent of the plane's inner axis, and the BIP pixel strides of its outer and inner axes.
    inner_extent: usize,
    outer_stride: usize,
    inner_stride: usize,
}

impl Planes {
    fn of(order: FileOrder, dims: Dims, elem: usize) -> Option<Self> {
        if order.0[0] != Axis::Band {
            return None;
        }
        let pixel_stride = |a: Axis| dims.bip_stride(a) / dims.bands;
        let plane = dims.lines * dims.samples;
        Some(Planes {
            bands: dims.bands,
            plane,
            block: (PLANE_STAGING_BYTES / (dims.bands * elem)).clamp(1, plane),
            inner_extent: dims.extent(order.0[2]),
            outer_stride: pixel_stride(order.0[1]),
            inner_stride: pixel_stride(order.0[2]),
        })
    }

    /// BIP pixel index of plane position `q`.
    #[inline]
    fn pixel(&self, q: usize) -> usize {
        (q / self.inner_extent) * self.outer_stride + (q % self.inner_extent) * self.inner_stride
    }

    /// Blocks as (first plane position, length).
    fn blocks(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        (0..self.plane).step_by(self.block).map(|q0| (q0, self.block.min(self.plane - q0)))
    }

    /// File offset of plane position `q` of band `b`.
    fn offset(&self, base: u64, elem: usize, b: usize, q: usize) -> u64 {
        base + ((b * self.plane + q) * elem) as u64
    }
}

/// A file whose middle axis is the band (BIL) is a run of slabs, one per index of the outer axis, each
/// a bands x inner matrix. Whole slabs are read in file order and transposed so that each pixel's
/// spectrum is written whole (an element-by-element scatter would write with a stride of a spectrum).
struct Slabs {
    bands: usize,
    outer: usize,
    inner: usize,
    /// BIP pixel strides of the outer and inner axes.
    outer_stride: usize,
    inner_stride: usize,
    /// Slabs per staging chunk (at least one, whatever its size: one slab is one line of a BIL cube).
    per_chunk: usize,
}

impl Slabs {
    fn of(order: FileOrder, dims: Dims, elem: usize) -> Option<Self> {
        if order.0[1] != Axis::Band {
            return None;
        }
        let pixel_stride = |a: Axis| dims.bip_stride(a) / dims.bands;
        let (outer, inner) = (dims.extent(order.0[0]), dims.extent(order.0[2]));
        Some(Slabs {
            bands: dims.bands,
            outer,
            inner,
            outer_stride: pixel_stride(order.0[0]),
            inner_stride: pixel_stride(order.0[2]),
            per_chunk: (STAGING_BYTES / (dims.bands * inner * elem)).clamp(1, outer),
        })
    }

    fn slab_elements(&self) -> usize {
        self.bands * self.inner
    }

    /// Chunks as (first slab, number of slabs).
    fn chunks(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        (0..self.outer).step_by(self.per_chunk).map(|o0| (o0, self.per_chunk.min(self.outer - o0)))
    }

    /// BIP pixel index of position `i` of slab `o`.
    #[inline]
    fn pixel(&self, o: usize, i: usize) -> usize {
        o * self.outer_stride + i * self.inner_stride
    }
}

fn staging_len(elem: usize) -> usize {
    (STAGING_BYTES / elem).max(1) * elem
}

/// Reads `dims` elements of `elem` bytes stored in `order`, starting at byte `base` of `r`, into `out`
/// (BIP). Bytes are moved as they are: no byte swapping, no conversion. `out.len()` must be
/// `dims.elements() * elem`.
pub fn read_into_bip<R: Read + Seek>(
    r: &mut R,
    base: u64,
    order: FileOrder,
    dims: Dims,
    elem: usize,
    out: &mut [u8],
) -> io::Result<()> {
    assert_eq!(out.len(), dims.elements() * elem, "read_into_bip: output length");
    if order.same_as_bip(dims) {
        r.seek(SeekFrom::Start(base))?;
        return r.read_exact(out);
    }
    match elem {
        1 => read_permuted::<R, 1>(r, base, order, dims, out),
        2 => read_permuted::<R, 2>(r, base, order, dims, out),
        4 => read_permuted::<R, 4>(r, base, order, dims, out),
        8 => read_permuted::<R, 8>(r, base, order, dims, out),
        other => panic!("read_into_bip: unsupported element size {other}"),
    }
}

fn read_permuted<R: Read + Seek, const N: usize>(
    r: &mut R,
    base: u64,
    order: FileOrder,
    dims: Dims,
    out: &mut [u8],
) -> io::Result<()> {
    if let Some(planes) = Planes::of(order, dims, N) {
        let mut staging = vec![0u8; planes.bands * planes.block * N];
        for (q0, n) in planes.blocks() {
            for b in 0..planes.bands {
                r.seek(SeekFrom::Start(planes.offset(base, N, b, q0)))?;
                r.read_exact(&mut staging[b * n * N..(b + 1) * n * N])?;
            }
            for i in 0..n {
                let first = planes.pixel(q0 + i) * planes.bands * N;
                let spectrum = &mut out[first..first + planes.bands * N];
                for (b, dst) in spectrum.chunks_exact_mut(N).enumerate() {
                    dst.copy_from_slice(&staging[(b * n + i) * N..(b * n + i + 1) * N]);
                }
            }
        }
        return Ok(());
    }
    if let Some(slabs) = Slabs::of(order, dims, N) {
        r.seek(SeekFrom::Start(base))?;
        let slab_len = slabs.slab_elements() * N;
        let mut staging = vec![0u8; slabs.per_chunk * slab_len];
        for (o0, k) in slabs.chunks() {
            let chunk = &mut staging[..k * slab_len];
            r.read_exact(chunk)?;
            for (j, slab) in chunk.chunks_exact(slab_len).enumerate() {
                for i in 0..slabs.inner {
                    let first = slabs.pixel(o0 + j, i) * slabs.bands * N;
                    let spectrum = &mut out[first..first + slabs.bands * N];
                    for (b, dst) in spectrum.chunks_exact_mut(N).enumerate() {
                        let at = (b * slabs.inner + i) * N;
                        dst.copy_from_slice(&slab[at..at + N]);
                    }
                }
            }
        }
        return Ok(());
    }
    // Any other order: stream the file in order and scatter each element to its BIP place.
    r.seek(SeekFrom::Start(base))?;
    let mut staging = vec![0u8; staging_len(N).min(out.len())];
    let mut walk = BipWalk::new(order, dims);
    let mut left = out.len();
    while left > 0 {
        let chunk_len = left.min(staging.len());
        let chunk = &mut staging[..chunk_len];
        r.read_exact(chunk)?;
        for (src, dst) in chunk.chunks_exact(N).zip(walk.by_ref()) {
            out[dst * N..dst * N + N].copy_from_slice(src);
        }
        left -= chunk_len;
    }
    Ok(())
}

/// Writes `dims` elements in `order` to `w`, starting at byte `base`; `element(i)` gives the bytes of the
/// element whose BIP index is `i`. Goes through a bounded staging buffer (band-plane blocks for BSQ and
/// Fortran order, positioned writes), so `w` needs no buffering of its own.
pub fn write_elements<W: Write + Seek, const N: usize>(
    w: &mut W,
    base: u64,
    order: FileOrder,
    dims: Dims,
    mut element: impl FnMut(usize) -> [u8; N],
) -> io::Result<()> {
    if let Some(planes) = Planes::of(order, dims, N) {
        let mut staging = vec![0u8; planes.bands * planes.block * N];
        for (q0, n) in planes.blocks() {
            for i in 0..n {
                let first = planes.pixel(q0 + i) * planes.bands;
                for b in 0..planes.bands {
                    staging[(b * n + i) * N..(b * n + i + 1) * N].copy_from_slice(&element(first + b));
                }
            }
            for b in 0..planes.bands {
                w.seek(SeekFrom::Start(planes.offset(base, N, b, q0)))?;
                w.write_all(&staging[b * n * N..(b + 1) * n * N])?;
            }
        }
        return Ok(());
    }
    w.seek(SeekFrom::Start(base))?;
    if let Some(slabs) = Slabs::of(order, dims, N) {
        let slab_len = slabs.slab_elements() * N;
        let mut staging = vec![0u8; slabs.per_chunk * slab_len];
        for (o0, k) in slabs.chunks() {
            let chunk = &mut staging[..k * slab_len];
            for (j, slab) in chunk.chunks_exact_mut(slab_len).enumerate() {
                for i in 0..slabs.inner {
                    let first = slabs.pixel(o0 + j, i) * slabs.bands;
                    for b in 0..slabs.bands {
                        let at = (b * slabs.inner + i) * N;
                        slab[at..at + N].copy_from_slice(&element(first + b));
                    }
                }
            }
            w.write_all(chunk)?;
        }
        return Ok(());
    }
    let mut staging = Vec::with_capacity(staging_len(N).min(dims.elements() * N));
    for i in BipWalk::new(order, dims) {
        staging.extend_from_slice(&element(i));
        if staging.len() == staging.capacity() {
            w.write_all(&staging)?;
            staging.clear();
        }
    }
    w.write_all(&staging)
}

/// Writes raw BIP samples (`elem` bytes each) to `w` at byte `base` in `order`, reversing the bytes of
/// each sample when `swap` (a change of byte order).
pub fn write_from_bip<W: Write + Seek>(
    w: &mut W,
    base: u64,
    order: FileOrder,
    dims: Dims,
    elem: usize,
    src: &[u8],
    swap: bool,
) -> io::Result<()> {
    assert_eq!(src.len(), dims.elements() * elem, "write_from_bip: input length");
    if order.same_as_bip(dims) && (!swap || elem == 1) {
        w.seek(SeekFrom::Start(base))?;
        return w.write_all(src);
    }
    fn gather<W: Write + Seek, const N: usize>(
        w: &mut W,
        base: u64,
        order: FileOrder,
        dims: Dims,
        src: &[u8],
        swap: bool,
    ) -> io::Result<()> {
        write_elements::<W, N>(w, base, order, dims, |i| {
            let mut e: [u8; N] = src[i * N..i * N + N].try_into().expect("element slice has N bytes");
            if swap {
                e.reverse();
            }
            e
        })
    }
    match elem {
        1 => gather::<W, 1>(w, base, order, dims, src, swap),
        2 => gather::<W, 2>(w, base, order, dims, src, swap),
        4 => gather::<W, 4>(w, base, order, dims, src, swap),
        8 => gather::<W, 8>(w, base, order, dims, src, swap),
        other => panic!("write_from_bip: unsupported element size {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Independent offsets (in elements) of (line, sample, band) in each file order.
    fn offset(order: FileOrder, d: Dims, l: usize, s: usize, b: usize) -> usize {
        match order {
            FileOrder::BIP => (l * d.samples + s) * d.bands + b,
            FileOrder::BIL => (l * d.bands + b) * d.samples + s,
            FileOrder::BSQ => (b * d.lines + l) * d.samples + s,
            FileOrder::FORTRAN => l + d.lines * (s + d.samples * b),
            SAMPLE_MAJOR => (s * d.lines + l) * d.bands + b,
            _ => unreachable!(),
        }
    }

    /// Builds a file (after `base` bytes of preamble) whose element k holds k + 1, reads it into BIP,
    /// checks every element against the offset formula, and writes it back.
    fn check(order: FileOrder, d: Dims, base: usize) {
        let mut file = vec![0xEEu8; base];
        file.extend((0..d.elements() as u32).flat_map(|k| (k + 1).to_le_bytes()));
        let mut bip = vec![0u8; d.elements() * 4];
        read_into_bip(&mut io::Cursor::new(&file), base as u64, order, d, 4, &mut bip).unwrap();
        for l in 0..d.lines {
            for s in 0..d.samples {
                for b in 0..d.bands {
                    let i = (l * d.samples + s) * d.bands + b;
                    let got = u32::from_le_bytes(bip[4 * i..4 * i + 4].try_into().unwrap());
                    assert_eq!(got as usize, offset(order, d, l, s, b) + 1, "{order:?} {d:?} ({l},{s},{b})");
                }
            }
        }
        let mut back = io::Cursor::new(vec![0xEEu8; base]);
        write_from_bip(&mut back, base as u64, order, d, 4, &bip, false).unwrap();
        assert!(back.into_inner() == file, "{order:?} {d:?}: write");
    }

    /// No file format uses it, but it is the one order left to the element-by-element walk.
    const SAMPLE_MAJOR: FileOrder = FileOrder([Axis::Sample, Axis::Line, Axis::Band]);
    const ORDERS: [FileOrder; 5] = [FileOrder::BIP, FileOrder::BIL, FileOrder::BSQ, FileOrder::FORTRAN, SAMPLE_MAJOR];

    #[test]
    fn permutations_match_offset_formulas() {
        for order in ORDERS {
            check(order, Dims::new(5, 7, 3), 0);
            check(order, Dims::new(4, 1, 6), 16);
            check(order, Dims::new(1, 3, 1), 3);
        }
    }

    #[test]
    fn streams_larger_than_the_staging_buffers() {
        // 4.5 MB of u32: several streamed chunks, and two band-plane blocks (the second one partial).
        let d = Dims::new(520, 430, 5);
        let planes = Planes::of(FileOrder::BSQ, d, 4).unwrap();
        assert!(planes.blocks().count() == 2 && planes.block < planes.plane);
        let slabs = Slabs::of(FileOrder::BIL, d, 4).unwrap();
        assert!(slabs.chunks().count() > 2 && slabs.outer % slabs.per_chunk != 0, "a partial last chunk");
        for order in ORDERS {
            check(order, d, 7);
        }
    }

    #[test]
    fn single_band_bsq_is_bip() {
        assert!(FileOrder::BSQ.same_as_bip(Dims::new(4, 5, 1)));
        assert!(!FileOrder::BSQ.same_as_bip(Dims::new(4, 5, 2)));
        assert!(FileOrder::BIL.same_as_bip(Dims::new(4, 1, 6)));
    }

    #[test]
    fn write_swaps_byte_order() {
        let d = Dims::new(3, 4, 2);
        let bip: Vec<u8> = (0..d.elements() as u16).flat_map(|k| (k + 1).to_le_bytes()).collect();
        let mut out = io::Cursor::new(Vec::new());
        write_from_bip(&mut out, 0, FileOrder::BIP, d, 2, &bip, true).unwrap();
        let expect: Vec<u8> = (0..d.elements() as u16).flat_map(|k| (k + 1).to_be_bytes()).collect();
        assert_eq!(out.into_inner(), expect);
    }
}

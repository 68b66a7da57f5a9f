//! Moving samples between a file's element order (BSQ, BIL, BIP, Fortran order) and the in-memory BIP
//! order, streamed through a bounded buffer so that a cube is never held twice.
//!
//! A file order is the list of the cube's three axes, outermost first (the last varies fastest). Reading
//! walks the file's elements in that order and scatters each one to its BIP position; writing gathers in
//! the same walk. When the axes of extent > 1 already come in BIP order (BIP itself, or e.g. BSQ with one
//! band) the bytes are copied straight through.

use std::io::{self, Read, Write};

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

fn staging_len(elem: usize) -> usize {
    (STAGING_BYTES / elem).max(1) * elem
}

/// Reads `dims` elements of `elem` bytes stored in `order` from `r` into `out` (BIP). Bytes are moved
/// as they are: no byte swapping, no conversion. `out.len()` must be `dims.elements() * elem`.
pub fn read_into_bip<R: Read>(r: &mut R, order: FileOrder, dims: Dims, elem: usize, out: &mut [u8]) -> io::Result<()> {
    assert_eq!(out.len(), dims.elements() * elem, "read_into_bip: output length");
    if order.same_as_bip(dims) {
        return r.read_exact(out);
    }
    let mut staging = vec![0u8; staging_len(elem).min(out.len())];
    let mut walk = BipWalk::new(order, dims);
    let mut left = out.len();
    while left > 0 {
        let chunk_len = left.min(staging.len());
        let chunk = &mut staging[..chunk_len];
        r.read_exact(chunk)?;
        match elem {
            1 => scatter::<1>(chunk, out, &mut walk),
            2 => scatter::<2>(chunk, out, &mut walk),
            4 => scatter::<4>(chunk, out, &mut walk),
            8 => scatter::<8>(chunk, out, &mut walk),
            other => panic!("read_into_bip: unsupported element size {other}"),
        }
        left -= chunk_len;
    }
    Ok(())
}

#[inline]
fn scatter<const N: usize>(chunk: &[u8], out: &mut [u8], walk: &mut BipWalk) {
    for (src, dst) in chunk.chunks_exact(N).zip(walk.by_ref()) {
        out[dst * N..dst * N + N].copy_from_slice(src);
    }
}

/// Writes `dims` elements in `order` to `w`; `element(i)` gives the bytes of the element whose BIP
/// index is `i`. Buffered in a bounded staging buffer.
pub fn write_in_file_order<W: Write, const N: usize>(
    w: &mut W,
    order: FileOrder,
    dims: Dims,
    mut element: impl FnMut(usize) -> [u8; N],
) -> io::Result<()> {
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

/// Writes raw BIP samples (`elem` bytes each) to `w` in `order`, reversing the bytes of each sample
/// when `swap` (a change of byte order).
pub fn write_from_bip<W: Write>(
    w: &mut W,
    order: FileOrder,
    dims: Dims,
    elem: usize,
    src: &[u8],
    swap: bool,
) -> io::Result<()> {
    assert_eq!(src.len(), dims.elements() * elem, "write_from_bip: input length");
    if order.same_as_bip(dims) && (!swap || elem == 1) {
        return w.write_all(src);
    }
    fn gather<W: Write, const N: usize>(
        w: &mut W,
        order: FileOrder,
        dims: Dims,
        src: &[u8],
        swap: bool,
    ) -> io::Result<()> {
        write_in_file_order::<W, N>(w, order, dims, |i| {
            let mut e: [u8; N] = src[i * N..i * N + N].try_into().expect("element slice has N bytes");
            if swap {
                e.reverse();
            }
            e
        })
    }
    match elem {
        1 => gather::<W, 1>(w, order, dims, src, swap),
        2 => gather::<W, 2>(w, order, dims, src, swap),
        4 => gather::<W, 4>(w, order, dims, src, swap),
        8 => gather::<W, 8>(w, order, dims, src, swap),
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
            _ => unreachable!(),
        }
    }

    #[test]
    fn permutations_match_offset_formulas() {
        let d = Dims::new(5, 7, 3);
        for order in [FileOrder::BIP, FileOrder::BIL, FileOrder::BSQ, FileOrder::FORTRAN] {
            // File element k holds the u16 value k + 1: every position distinct and non-zero.
            let file: Vec<u8> = (0..d.elements() as u16).flat_map(|k| (k + 1).to_le_bytes()).collect();
            let mut bip = vec![0u8; file.len()];
            read_into_bip(&mut file.as_slice(), order, d, 2, &mut bip).unwrap();
            for l in 0..d.lines {
                for s in 0..d.samples {
                    for b in 0..d.bands {
                        let i = (l * d.samples + s) * d.bands + b;
                        let got = u16::from_le_bytes([bip[2 * i], bip[2 * i + 1]]);
                        assert_eq!(got as usize, offset(order, d, l, s, b) + 1, "{order:?} ({l},{s},{b})");
                    }
                }
            }
            let mut back = Vec::new();
            write_from_bip(&mut back, order, d, 2, &bip, false).unwrap();
            assert_eq!(back, file, "{order:?} write");
        }
    }

    #[test]
    fn single_band_bsq_is_bip() {
        assert!(FileOrder::BSQ.same_as_bip(Dims::new(4, 5, 1)));
        assert!(!FileOrder::BSQ.same_as_bip(Dims::new(4, 5, 2)));
        assert!(FileOrder::BIL.same_as_bip(Dims::new(4, 1, 6)));
    }

    #[test]
    fn streams_larger_than_the_staging_buffer() {
        // More than STAGING_BYTES of u32 so the walk continues across chunks.
        let d = Dims::new(130, 67, 31);
        let file: Vec<u8> = (0..d.elements() as u32).flat_map(|k| (k + 1).to_be_bytes()).collect();
        assert!(file.len() > STAGING_BYTES);
        let mut bip = vec![0u8; file.len()];
        read_into_bip(&mut file.as_slice(), FileOrder::BSQ, d, 4, &mut bip).unwrap();
        let (l, s, b) = (129, 66, 30);
        let i = (l * d.samples + s) * d.bands + b;
        let got = u32::from_be_bytes(bip[4 * i..4 * i + 4].try_into().unwrap());
        assert_eq!(got as usize, offset(FileOrder::BSQ, d, l, s, b) + 1);
        let mut back = Vec::new();
        write_from_bip(&mut back, FileOrder::BSQ, d, 4, &bip, true).unwrap();
        let swapped: Vec<u8> = (0..d.elements() as u32).flat_map(|k| (k + 1).to_le_bytes()).collect();
        assert_eq!(back, swapped);
    }
}

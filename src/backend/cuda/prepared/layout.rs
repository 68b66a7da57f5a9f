//! How a prepared cube's lines are cut into chunks.

use crate::backend::cuda::kernels::RawType;

/// The raw bytes of chunk-able lines as the device reads them.
pub(super) struct Layout {
    pub(super) lines: usize,
    pub(super) samples: usize,
    pub(super) bands: usize,
    pub(super) t: RawType,
    /// Lines of a full chunk (the largest).
    pub(super) chunk_lines: usize,
    /// Chunk c is lines bounds[c]..bounds[c + 1].
    pub(super) bounds: Vec<usize>,
}

impl Layout {
    /// Chunks of `chunk_lines` lines. With `split_tail` (a resident cube, uploaded and processed chunk
    /// by chunk) the last full chunk is cut into pieces of a half, a quarter and two eighths: what runs
    /// after the upload has ended is the statistics of the last piece only (see
    /// `CudaCube::resident_sums`), so the smaller the last piece, the shorter that tail. Halving keeps
    /// the pieces before it large enough to fill the device, and each piece's work done while the next
    /// one is copied.
    pub(super) fn new(lines: usize, samples: usize, bands: usize, t: RawType, chunk_lines: usize, split_tail: bool) -> Layout {
        let mut bounds: Vec<usize> = (0..lines).step_by(chunk_lines.max(1)).collect();
        bounds.push(lines);
        if split_tail && bounds.len() >= 3 {
            let l0 = bounds[bounds.len() - 2];
            let n = lines - l0;
            if n >= 16 {
                bounds.pop();
                bounds.extend([4, 6, 7].map(|i| l0 + n * i / 8));
                bounds.push(lines);
            }
        }
        Layout {
            lines,
            samples,
            bands,
            t,
            chunk_lines,
            bounds,
        }
    }
    pub(super) fn line_bytes(&self) -> usize {
        self.samples * self.bands * self.t.size
    }
    pub(super) fn chunks(&self) -> usize {
        self.bounds.len() - 1
    }
    /// Lines l0..l1 of chunk c.
    pub(super) fn chunk(&self, c: usize) -> (usize, usize) {
        (self.bounds[c], self.bounds[c + 1])
    }
    /// The chunk that holds line `l`.
    pub(super) fn chunk_of(&self, l: usize) -> usize {
        self.bounds.partition_point(|&b| b <= l) - 1
    }
    pub(super) fn chunk_pixels_max(&self) -> usize {
        self.chunk_lines * self.samples
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cube::{ByteOrder, DataType};

    /// Chunks cover every line once, in order; a resident layout's last full chunk is cut in pieces
    /// that halve.
    #[test]
    fn chunk_bounds_cover_the_lines_and_split_the_tail() {
        let t = RawType::of(DataType::I16, ByteOrder::Little);
        for (lines, chunk, split) in [(1087, 121, true), (1087, 121, false), (5, 2, true), (40, 40, true), (300, 64, true)] {
            let lay = Layout::new(lines, 7, 3, t, chunk, split);
            let mut next = 0;
            for c in 0..lay.chunks() {
                let (l0, l1) = lay.chunk(c);
                assert_eq!(l0, next, "{lines}/{chunk}: chunk {c} starts at {l0}");
                assert!(l1 > l0 && l1 - l0 <= chunk);
                for l in l0..l1 {
                    assert_eq!(lay.chunk_of(l), c);
                }
                next = l1;
            }
            assert_eq!(next, lines);
        }
        // 1087 = 8 × 121 + 119: the last full-size chunk (lines 968..1087) becomes pieces of 59, 30,
        // 15 and 15 lines.
        let lay = Layout::new(1087, 7, 3, t, 121, true);
        assert_eq!(lay.chunks(), 8 + 4);
        assert_eq!((8..12).map(|c| lay.chunk(c)).collect::<Vec<_>>(), [(968, 1027), (1027, 1057), (1057, 1072), (1072, 1087)]);
        assert_eq!(Layout::new(1087, 7, 3, t, 121, false).chunks(), 9);
    }
}

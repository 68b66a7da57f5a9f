//! How a prepared cube's lines are cut into chunks.

use crate::backend::cuda::kernels::RawType;

/// The smallest piece the tail of a resident cube is cut into (lines): below, a piece's launches cost
/// more than its copy saves.
const TAIL_PIECE_MIN: usize = 15;

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
    /// by chunk) the last two chunks are cut into pieces of 40 % of the lines left each, down to
    /// TAIL_PIECE_MIN lines: what runs after the upload has ended is the statistics of what the
    /// kernels have not caught up with (see `CudaCube::resident_sums`). A chunk's statistics take
    /// ~0.8 of its upload on the H100 (0.49 against 0.62 ms at 1×), so they are behind by most of a
    /// chunk when the last chunk lands; smaller pieces let them start earlier, but each piece costs
    /// ~0.04 ms of launches more. A model of both put the tail at 0.37 ms this way against 0.46 with
    /// the last chunk alone cut in a half, a quarter and two eighths (the measured 0.48).
    pub(super) fn new(lines: usize, samples: usize, bands: usize, t: RawType, chunk_lines: usize, split_tail: bool) -> Layout {
        let mut bounds: Vec<usize> = (0..lines).step_by(chunk_lines.max(1)).collect();
        bounds.push(lines);
        if split_tail && bounds.len() >= 3 {
            // The last two chunks where there are more, else the last.
            bounds.pop();
            let keep = bounds.len().saturating_sub(2).max(1);
            bounds.truncate(keep);
            let mut l0 = *bounds.last().expect("one bound kept");
            while l0 < lines {
                let left = lines - l0;
                let piece = (left * 2).div_ceil(5).max(TAIL_PIECE_MIN).min(chunk_lines.max(1)).min(left);
                l0 += piece;
                bounds.push(l0);
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

    /// Chunks cover every line once, in order; a resident layout's last two chunks are cut in pieces
    /// that shrink.
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
        // 1087 = 8 × 121 + 119: the last two chunks (lines 847..1087) become pieces of 96, 58, 35,
        // 21, 15 and 15 lines.
        let lay = Layout::new(1087, 7, 3, t, 121, true);
        assert_eq!(lay.chunks(), 7 + 6);
        let pieces: Vec<usize> = (7..13).map(|c| lay.chunk(c).1 - lay.chunk(c).0).collect();
        assert_eq!(pieces, [96, 58, 35, 21, 15, 15]);
        assert_eq!(lay.chunk(7).0, 847);
        assert_eq!(Layout::new(1087, 7, 3, t, 121, false).chunks(), 9);
    }
}

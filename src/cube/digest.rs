//! The hash behind a cube's content digest: SHA-256 as a tree of fixed 4 MiB leaves.
//!
//! One SHA-256 over a whole cube runs on one core (about 1.1-1.5 GB/s with the SHA extensions), and
//! it was what bounded the service's upload ingest and delayed the 202 by the bytes still queued in
//! front of it (25-31 ms for 299 MB on the H100 host). The leaves of a tree are
//! independent, so they are hashed on every core as the bytes arrive, and the root is one small hash
//! at the end. The definition, so that a client can compute it too (the Python client does):
//!
//! ```text
//! leaf_i = SHA-256(stream[i·4 MiB .. min((i+1)·4 MiB, len)])          i = 0 .. ceil(len / 4 MiB)
//! digest = SHA-256("hypermnf-content-v2 sha256-tree 4MiB" || u64le(len) || leaf_0 || leaf_1 || ...)
//! ```
//!
//! The stream is what `Cube::content_digest` names (the cube's canonical `.npy`, then its metadata
//! suffix, if any). The tag keeps a tree digest from ever equalling a plain SHA-256 of some message
//! that a client could send as `X-Content-SHA256`.

use std::sync::OnceLock;

use rayon::prelude::*;
use sha2::{Digest, Sha256};

/// Bytes per leaf.
pub const LEAF: usize = 4 << 20;
/// What the root hash starts with.
const ROOT_TAG: &[u8] = b"hypermnf-content-v2 sha256-tree 4MiB";

/// The root over the leaves of a stream of `len` bytes.
pub fn root(len: u64, leaves: &[[u8; 32]]) -> [u8; 32] {
    debug_assert_eq!(leaves.len() as u64, len.div_ceil(LEAF as u64));
    let mut h = Sha256::new();
    h.update(ROOT_TAG);
    h.update(len.to_le_bytes());
    for leaf in leaves {
        h.update(leaf);
    }
    h.finalize().into()
}

/// The pool the leaves are hashed on: its own threads, not rayon's global pool, so that an upload's
/// digest never waits behind a CPU backend's parallel pass that holds every global worker.
pub fn pool() -> &'static rayon::ThreadPool {
    static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();
    POOL.get_or_init(|| {
        let n = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .thread_name(|i| format!("hypermnf-digest-{i}"))
            .build()
            .expect("a thread pool of a few threads can be made")
    })
}

/// The digest of a stream of `len` bytes that `feed(start, end, hasher)` writes into a leaf's hasher
/// (bytes `start..end` of the stream, in order), the leaves hashed in parallel.
pub fn of_stream(len: u64, feed: impl Fn(u64, u64, &mut Sha256) + Sync) -> [u8; 32] {
    of_stream_as_ready(len, |_| true, feed).expect("a stream that is always ready is hashed whole")
}

/// [`of_stream`] of a stream whose bytes become readable in order while it is hashed (a file being
/// written): before each wave of leaves (two per pool thread), `ready(end)` is told the stream's
/// bytes up to `end` are needed, and blocks until they are there; false stops the digest (None).
pub fn of_stream_as_ready(len: u64, mut ready: impl FnMut(u64) -> bool, feed: impl Fn(u64, u64, &mut Sha256) + Sync) -> Option<[u8; 32]> {
    let n = len.div_ceil(LEAF as u64);
    let wave = 2 * pool().current_num_threads().max(1) as u64;
    let mut leaves: Vec<[u8; 32]> = Vec::with_capacity(n as usize);
    let mut first = 0;
    while first < n {
        let last = (first + wave).min(n);
        if !ready((last * LEAF as u64).min(len)) {
            return None;
        }
        let more: Vec<[u8; 32]> = pool().install(|| {
            (first..last)
                .into_par_iter()
                .map(|i| {
                    let start = i * LEAF as u64;
                    let mut h = Sha256::new();
                    feed(start, (start + LEAF as u64).min(len), &mut h);
                    h.finalize().into()
                })
                .collect()
        });
        leaves.extend(more);
        first = last;
    }
    Some(root(len, &leaves))
}

/// The digest of the concatenation of `parts`.
pub fn of_parts(parts: &[&[u8]]) -> [u8; 32] {
    let len = parts.iter().map(|p| p.len() as u64).sum();
    of_stream(len, |start, end, h| feed_parts(parts, start, end, |bytes| h.update(bytes)))
}

/// Calls `out` with the pieces of bytes `start..end` of the concatenation of `parts`, in order.
pub fn feed_parts(parts: &[&[u8]], start: u64, end: u64, mut out: impl FnMut(&[u8])) {
    let mut at = 0u64;
    for p in parts {
        let (p0, p1) = (at, at + p.len() as u64);
        at = p1;
        let (a, b) = (start.max(p0), end.min(p1));
        if a < b {
            out(&p[(a - p0) as usize..(b - p0) as usize]);
        }
    }
}

/// The digest of a stream that arrives in pieces (an upload): each leaf is hashed on the pool as
/// soon as it is full, while the next ones arrive; the pieces are shared, never copied.
pub struct Streaming {
    pending: Vec<bytes::Bytes>,
    pending_len: usize,
    len: u64,
    leaves: Vec<[u8; 32]>,
    dispatched: usize,
    in_flight: usize,
    done_tx: std::sync::mpsc::Sender<(usize, [u8; 32])>,
    done_rx: std::sync::mpsc::Receiver<(usize, [u8; 32])>,
}

impl Default for Streaming {
    fn default() -> Self {
        Self::new()
    }
}

impl Streaming {
    pub fn new() -> Streaming {
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        Streaming { pending: Vec::new(), pending_len: 0, len: 0, leaves: Vec::new(), dispatched: 0, in_flight: 0, done_tx, done_rx }
    }

    /// Adds the next bytes of the stream. Blocks while twice as many leaves as the pool has threads
    /// are waiting to be hashed, so that a stream faster than the hashing does not fill memory.
    pub fn update(&mut self, mut b: bytes::Bytes) {
        self.len += b.len() as u64;
        while !b.is_empty() {
            let take = (LEAF - self.pending_len).min(b.len());
            self.pending.push(b.split_to(take));
            self.pending_len += take;
            if self.pending_len == LEAF {
                self.dispatch();
            }
        }
    }

    /// The root, once every leaf is hashed.
    pub fn finish(mut self) -> [u8; 32] {
        if self.pending_len > 0 {
            self.dispatch();
        }
        while self.in_flight > 0 {
            self.collect_one();
        }
        root(self.len, &self.leaves)
    }

    fn dispatch(&mut self) {
        let parts = std::mem::take(&mut self.pending);
        self.pending_len = 0;
        let (index, tx) = (self.dispatched, self.done_tx.clone());
        pool().spawn(move || {
            let mut h = Sha256::new();
            for p in &parts {
                h.update(p);
            }
            let _ = tx.send((index, h.finalize().into()));
        });
        self.dispatched += 1;
        self.in_flight += 1;
        while self.in_flight >= 2 * pool().current_num_threads().max(1) {
            self.collect_one();
        }
    }

    fn collect_one(&mut self) {
        // The sender half is held by self, so this only returns once a leaf task has sent its digest
        // (a task cannot fail between its start and its send).
        let (i, d) = self.done_rx.recv().expect("self holds a sender");
        if self.leaves.len() <= i {
            self.leaves.resize(i + 1, [0; 32]);
        }
        self.leaves[i] = d;
        self.in_flight -= 1;
    }
}

/// How the stored samples of an arriving cube become the canonical stream's (little-endian BIP).
enum Stored {
    /// Already BIP little-endian (or single bytes): passed on as they come.
    AsIs,
    /// BIP big-endian: each sample's bytes reversed.
    Swapped { size: usize },
    /// BIL: each line (a bands × samples matrix) transposed to samples × bands, and swapped when big-endian.
    Lines { samples: usize, bands: usize, size: usize, swap: bool },
}

/// Digest pool threads from which an arriving BIL upload's lines are transposed on the pool rather than
/// by the thread feeding it. On 2 cores there is no idle core to give the work to, and handing it over
/// cost ~7 % of the ingest (0.94–0.96 against 0.99–1.03 GB/s, 2026-11-27, `bench flightline --lines
/// 3000 --backend cpu --upload-only`); on 16 it lifted the ingest from ~1.2 to ~1.8 GB/s.
const TRANSPOSE_ON_POOL_FROM: usize = 4;

/// Whole lines gathered into one piece of the stream: a few leaves' worth, so that the transposed
/// buffers are few and large and each line is transposed while its band rows are hot.
const GATHER: usize = LEAF;

/// `Cube::content_digest` of a cube stored BIP or BIL, computed from its stored samples as they
/// arrive in pieces cut anywhere (an upload's frames), instead of from the file they are written to:
/// the bytes are read once, while they are hot, and the mapped file is never faulted in. The stream
/// hashed is the same (the canonical `.npy` header, the samples little-endian in BIP order, the
/// metadata suffix), so the digest is identical to the cube's once it is mapped.
pub struct Arriving {
    tree: Streaming,
    stored: Stored,
    /// Bytes of a stored unit (a sample, or a BIL line) that the stream cannot take apart.
    unit: usize,
    /// Received pieces not yet passed on: less than `unit` bytes for BIP, fewer than GATHER bytes
    /// of whole lines for BIL.
    pending: std::collections::VecDeque<bytes::Bytes>,
    pending_len: usize,
    suffix: Vec<u8>,
    /// Whether BIL lines are transposed on the digest pool (see TRANSPOSE_ON_POOL_FROM).
    transpose_on_pool: bool,
}

impl Arriving {
    /// For a cube of this shape, type, byte order, storage and metadata; None for BSQ, whose first
    /// whole pixel needs its last band (it is digested from the file once it is complete).
    pub fn new(
        lines: usize,
        samples: usize,
        bands: usize,
        dtype: super::DataType,
        byte_order: super::ByteOrder,
        storage: super::Interleave,
        meta: &super::CubeMeta,
    ) -> Option<Arriving> {
        let size = dtype.size();
        let swap = byte_order == super::ByteOrder::Big && size > 1;
        let (stored, unit) = match storage {
            super::Interleave::Bsq => return None,
            super::Interleave::Bip if !swap => (Stored::AsIs, 1),
            super::Interleave::Bip => (Stored::Swapped { size }, size),
            super::Interleave::Bil => (Stored::Lines { samples, bands, size, swap }, samples * bands * size),
        };
        let mut tree = Streaming::new();
        tree.update(bytes::Bytes::from(super::npy::canonical_header(dtype, lines, samples, bands)));
        let suffix = super::model::digest_suffix(meta);
        let transpose_on_pool = pool().current_num_threads() >= TRANSPOSE_ON_POOL_FROM;
        Some(Arriving { tree, stored, unit: unit.max(1), pending: Default::default(), pending_len: 0, suffix, transpose_on_pool })
    }

    /// The next stored bytes (after the file's header offset).
    pub fn update(&mut self, b: bytes::Bytes) {
        if b.is_empty() {
            return;
        }
        if let Stored::AsIs = self.stored {
            return self.tree.update(b);
        }
        self.pending_len += b.len();
        self.pending.push_back(b);
        let batch = match self.stored {
            Stored::Lines { .. } => (GATHER / self.unit).max(1) * self.unit,
            _ => GATHER - GATHER % self.unit,
        };
        while self.pending_len >= batch {
            self.pass_on(batch);
        }
    }

    /// The digest, once every stored byte was given. A cube that arrived short (its last unit cut)
    /// gives a digest of its whole units only: the upload is refused for its size anyway.
    pub fn finish(mut self) -> [u8; 32] {
        let whole = self.pending_len - self.pending_len % self.unit;
        if whole > 0 {
            self.pass_on(whole);
        }
        let suffix = std::mem::take(&mut self.suffix);
        self.tree.update(bytes::Bytes::from(suffix));
        self.tree.finish()
    }

    /// Passes the first `n` pending bytes (whole units) on to the tree, made canonical.
    fn pass_on(&mut self, n: usize) {
        let mut out = vec![0u8; n];
        match self.stored {
            Stored::AsIs => unreachable!("passed on as they come"),
            Stored::Swapped { size } => {
                let mut o = 0;
                while o < n {
                    let front = self.pending.front_mut().expect("the pending bytes hold n");
                    let take = (n - o).min(front.len());
                    out[o..o + take].copy_from_slice(&front.split_to(take));
                    o += take;
                    if front.is_empty() {
                        self.pending.pop_front();
                    }
                }
                for sample in out.chunks_exact_mut(size) {
                    sample.reverse();
                }
            }
            Stored::Lines { samples, bands, size, swap } => {
                let row = samples * size;
                // Each line's band rows, taken off the pending pieces in order, then the lines
                // transposed on the digest pool, one task each (from TRANSPOSE_ON_POOL_FROM threads):
                // on the H100 host (16 cores) the one thread that transposed every line of a BIL
                // upload was 100 % busy while the upload ran at 1.1–1.3 GB/s, the ingest's bottleneck
                // (2026-11-27, issue 29).
                let lines: Vec<Vec<bytes::Bytes>> = (0..n / self.unit)
                    .map(|_| {
                        let mut rows = Vec::with_capacity(bands);
                        take_front(&mut self.pending, self.unit, row, |r| rows.push(r));
                        rows
                    })
                    .collect();
                let transpose = |(line, rows): (&mut [u8], &Vec<bytes::Bytes>)| match (size, swap) {
                    (1, _) => line_to_pixels::<1, false>(rows, samples, line),
                    (2, false) => line_to_pixels::<2, false>(rows, samples, line),
                    (2, true) => line_to_pixels::<2, true>(rows, samples, line),
                    (4, false) => line_to_pixels::<4, false>(rows, samples, line),
                    (4, true) => line_to_pixels::<4, true>(rows, samples, line),
                    (_, false) => line_to_pixels::<8, false>(rows, samples, line),
                    (_, true) => line_to_pixels::<8, true>(rows, samples, line),
                };
                let unit = self.unit;
                if self.transpose_on_pool {
                    pool().install(|| out.par_chunks_exact_mut(unit).zip(lines.par_iter()).for_each(transpose));
                } else {
                    out.chunks_exact_mut(unit).zip(lines.iter()).for_each(transpose);
                }
            }
        }
        self.pending_len -= n;
        self.tree.update(bytes::Bytes::from(out));
    }
}

/// Takes `n` bytes off the front of `pending` as pieces of exactly `piece` bytes each (`n` a multiple
/// of it), in order: a piece inside one received buffer is shared, one across two is copied.
fn take_front(pending: &mut std::collections::VecDeque<bytes::Bytes>, n: usize, piece: usize, mut out: impl FnMut(bytes::Bytes)) {
    let mut left = n;
    while left > 0 {
        let front = pending.front_mut().expect("the pending bytes hold n");
        if front.len() >= piece {
            // As many whole pieces as this buffer holds, shared.
            let k = (front.len() / piece).min(left / piece);
            for _ in 0..k {
                out(front.split_to(piece));
            }
            left -= k * piece;
            if front.is_empty() {
                pending.pop_front();
            }
            continue;
        }
        let mut joined = bytes::BytesMut::with_capacity(piece);
        while joined.len() < piece {
            let front = pending.front_mut().expect("the pending bytes hold n");
            let take = (piece - joined.len()).min(front.len());
            joined.extend_from_slice(&front.split_to(take));
            if front.is_empty() {
                pending.pop_front();
            }
        }
        out(joined.freeze());
        left -= piece;
    }
}

/// One BIL line, given as its band rows (`samples` samples of N bytes each), written pixel by pixel
/// (all bands of a sample together) into `out`, each sample byte-reversed when SWAP. It goes by tiles
/// of 16 bands × 16 samples held in a small array, so that each band row is read and each pixel is
/// written 16 samples at a time: a loop that wrote every sample of a band across a block of pixels
/// cost 0.58 core-seconds per GB (perf), as much as the SHA-256 of the same bytes.
fn line_to_pixels<const N: usize, const SWAP: bool>(rows: &[bytes::Bytes], samples: usize, out: &mut [u8]) {
    const T: usize = 16;
    let bands = rows.len();
    let pixel = bands * N;
    let mut tile = [[[0u8; N]; T]; T];
    for s0 in (0..samples).step_by(T) {
        let ns = T.min(samples - s0);
        for b0 in (0..bands).step_by(T) {
            let nb = T.min(bands - b0);
            for (row, t) in rows[b0..b0 + nb].iter().zip(tile.iter_mut()) {
                for (v, d) in row[s0 * N..(s0 + ns) * N].chunks_exact(N).zip(t.iter_mut()) {
                    *d = v.try_into().expect("N bytes");
                }
            }
            for i in 0..ns {
                let at = (s0 + i) * pixel + b0 * N;
                for (d, t) in out[at..at + nb * N].chunks_exact_mut(N).zip(tile.iter()) {
                    let mut v = t[i];
                    if SWAP {
                        v.reverse();
                    }
                    d.copy_from_slice(&v);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition, written the slow and obvious way.
    fn reference(stream: &[u8]) -> [u8; 32] {
        let leaves: Vec<[u8; 32]> = stream.chunks(LEAF).map(|c| Sha256::digest(c).into()).collect();
        let mut h = Sha256::new();
        h.update(b"hypermnf-content-v2 sha256-tree 4MiB");
        h.update((stream.len() as u64).to_le_bytes());
        for l in &leaves {
            h.update(l);
        }
        h.finalize().into()
    }

    #[test]
    fn parts_give_the_definition_whatever_their_cut() {
        let stream: Vec<u8> = (0..(2 * LEAF + 12345)).map(|i| (i * 7 + i / 4099) as u8).collect();
        let want = reference(&stream);
        for cuts in [vec![], vec![1], vec![LEAF], vec![LEAF - 1, LEAF + 1], vec![3, 2 * LEAF + 12344]] {
            let mut parts = Vec::new();
            let mut at = 0;
            for c in cuts.iter().copied().chain([stream.len()]) {
                parts.push(&stream[at..c]);
                at = c;
            }
            assert_eq!(of_parts(&parts), want, "cut at {cuts:?}");
        }
    }

    #[test]
    fn a_stream_in_pieces_gives_the_same_digest() {
        let stream = bytes::Bytes::from((0..(3 * LEAF + 77)).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
        for piece in [1000, LEAF - 3, LEAF, 3 * LEAF + 77] {
            let mut s = Streaming::new();
            let mut at = 0;
            while at < stream.len() {
                let end = (at + piece).min(stream.len());
                s.update(stream.slice(at..end));
                at = end;
            }
            assert_eq!(s.finish(), reference(&stream), "pieces of {piece}");
        }
        assert_eq!(Streaming::new().finish(), reference(&[]));
    }

    #[test]
    fn leaf_boundaries_and_lengths_change_the_digest() {
        // Exactly one leaf, one byte more, one byte less, and nothing: four different digests, and
        // none of them is the plain SHA-256 of the stream.
        let full = vec![5u8; LEAF + 1];
        let digests = [of_parts(&[&full[..LEAF]]), of_parts(&[&full]), of_parts(&[&full[..LEAF - 1]]), of_parts(&[])];
        for (i, a) in digests.iter().enumerate() {
            for b in &digests[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(digests[0], reference(&full[..LEAF]));
        assert_eq!(digests[3], reference(&[]));
        assert_ne!(digests[0], <[u8; 32]>::from(Sha256::digest(&full[..LEAF])));
    }

    /// The digest of a BIP or BIL ENVI cube computed from its data file's bytes as they arrive, cut
    /// anywhere (into pieces smaller than a band row, straddling lines, or whole), equals the mapped
    /// cube's `content_digest`: for every sample size, either byte order, with and without the
    /// metadata suffix, over one leaf and several; BSQ is not digested on arrival.
    #[test]
    fn an_arriving_cube_has_the_mapped_cubes_digest() {
        let dir = tempfile::tempdir().unwrap();
        let shapes = [(3, 5, 4, 4, "bil", 1, ""), (7, 9, 5, 2, "bip", 0, "bbl = {1, 0, 1, 1, 1}\n"), (2, 3, 2, 8, "bil", 1, ""), (4, 5, 3, 1, "bil", 0, "data ignore value = -9999\n"), (40, 301, 173, 4, "bil", 0, "data ignore value = -9999\n"), (21, 190, 211, 2, "bil", 1, ""), (33, 187, 201, 2, "bip", 1, "")];
        for (n, &(lines, samples, bands, size, interleave, order, extra)) in shapes.iter().enumerate() {
            let dt = match size {
                1 => 1,
                2 => 2,
                4 => 4,
                _ => 5,
            };
            let header = format!(
                "ENVI\nsamples = {samples}\nlines = {lines}\nbands = {bands}\ndata type = {dt}\ninterleave = {interleave}\nbyte order = {order}\nheader offset = 0\n{extra}"
            );
            let len = lines * samples * bands * size;
            let data: Vec<u8> = (0..len).map(|i| (i as u64 * 2654435761 % 251) as u8).collect();
            let path = dir.path().join(format!("c{n}.img"));
            std::fs::write(&path, &data).unwrap();
            let want = crate::cube::envi::map_parts(&header, &path).unwrap().content_digest();
            let h = crate::cube::envi::parse_header(&header).unwrap();
            let data = bytes::Bytes::from(data);
            let row = samples * size;
            let pieces = [7, row - 1, row + 3, samples * bands * size + 5, 1 << 20, len];
            for (piece, on_pool) in pieces.into_iter().flat_map(|p| [(p, false), (p, true)]) {
                let mut d = Arriving::new(h.lines, h.samples, h.bands, h.data_type, h.byte_order, h.interleave, &h.meta).unwrap();
                // Both ways of transposing BIL lines, whatever this machine's core count picks.
                d.transpose_on_pool = on_pool;
                let mut at = 0;
                while at < len {
                    let end = (at + piece.max(1)).min(len);
                    d.update(data.slice(at..end));
                    at = end;
                }
                assert_eq!(d.finish(), want, "{lines}x{samples}x{bands} {interleave} size {size} order {order}, pieces of {piece}, on the pool {on_pool}");
            }
        }
        let h = crate::cube::envi::parse_header("ENVI\nsamples = 2\nlines = 2\nbands = 2\ndata type = 4\ninterleave = bsq\nbyte order = 0\n").unwrap();
        assert!(Arriving::new(h.lines, h.samples, h.bands, h.data_type, h.byte_order, h.interleave, &h.meta).is_none());
    }
}

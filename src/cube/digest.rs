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
}

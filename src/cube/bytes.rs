//! The bytes behind a [`Cube`](super::Cube): owned (read from a file, decoded from an upload), mapped
//! from a file ([`Cube::map_npy`]'s stored uploads), or borrowed from the caller's memory for the length
//! of one call ([`Cube::with_borrowed`]).
//!
//! Why mapped: a job reads its stored `.npy` upload back. Reading it into a fresh buffer zeroes and
//! faults in 300 MB and copies them once more (270 ms of a 2.8 s job on the 2-core machine, most of what
//! the service adds to the pipeline on a GPU); the mapping serves the same page-cache pages with no copy.
//! The files mapped are the service's own uploads, written once and never changed in place (a file
//! truncated under a mapping would fault on access). The file stays open beside its mapping: the CUDA
//! backend's staging copies read it with `pread` (straight from the page cache into pinned memory,
//! and no page table to populate first).
//!
//! Why borrowed at all: the library API (`crate::library`) runs the MNF on an `ndarray` view the caller
//! owns. Copying it into an owned cube would hold the cube twice (a 1087 × 614 × 224 int16 scene is
//! 300 MB). The pipeline and the backends take `&Cube` without a lifetime, so a borrowed cube must not
//! outlive the borrow: it exists only inside [`Cube::with_borrowed`], whose closure sees `&Cube` and
//! nothing it could keep (every accessor ties what it returns to `&self`, and `Clone` copies the bytes
//! into an owned cube).
//!
//! [`Cube::with_borrowed`]: super::Cube::with_borrowed

/// Raw sample bytes, owned, mapped or borrowed.
pub(super) enum SampleBytes {
    Owned(Vec<u8>),
    /// `len` bytes from `offset` of a read-only mapping of `file`.
    Mapped { map: memmap2::Mmap, offset: usize, len: usize, file: std::fs::File },
    /// Points into memory that a caller of `Cube::with_borrowed` holds borrowed for the whole time the
    /// cube exists (see the module doc); never written through, never freed here.
    Borrowed { ptr: *const u8, len: usize },
}

// SAFETY: a borrowed `SampleBytes` is a shared `&[u8]` with its lifetime checked by `Cube::with_borrowed`
// instead of the type system, and `&[u8]` is Send and Sync.
unsafe impl Send for SampleBytes {}
unsafe impl Sync for SampleBytes {}

impl SampleBytes {
    /// Borrows `bytes`. The caller (only `Cube::with_borrowed`) must drop the value before the borrow
    /// of `bytes` ends.
    pub(super) fn borrowed(bytes: &[u8]) -> Self {
        SampleBytes::Borrowed { ptr: bytes.as_ptr(), len: bytes.len() }
    }

    pub(super) fn as_slice(&self) -> &[u8] {
        match self {
            SampleBytes::Owned(v) => v,
            SampleBytes::Mapped { map, offset, len, .. } => &map[*offset..*offset + *len],
            // SAFETY: `ptr` and `len` come from a `&[u8]` that outlives `self` (see `borrowed`).
            SampleBytes::Borrowed { ptr, len } => unsafe { std::slice::from_raw_parts(*ptr, *len) },
        }
    }

    pub(super) fn is_borrowed(&self) -> bool {
        matches!(self, SampleBytes::Borrowed { .. })
    }

    pub(super) fn is_mapped(&self) -> bool {
        matches!(self, SampleBytes::Mapped { .. })
    }

    /// The mapped file and the offset of the first byte in it.
    pub(super) fn file(&self) -> Option<(&std::fs::File, u64)> {
        match self {
            SampleBytes::Mapped { file, offset, .. } => Some((file, *offset as u64)),
            _ => None,
        }
    }
}

/// A clone owns its bytes: a borrowed cube cloned inside `Cube::with_borrowed` may outlive the call.
impl Clone for SampleBytes {
    fn clone(&self) -> Self {
        SampleBytes::Owned(self.as_slice().to_vec())
    }
}

/// As the bytes themselves, whichever way they are held (what `Cube`'s derived `Debug` printed before).
impl std::fmt::Debug for SampleBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.as_slice().fmt(f)
    }
}

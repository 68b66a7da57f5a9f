//! An ENVI data file mapped in the layout it is stored in: the cube of a BIL or BSQ flight line is
//! never transposed (nor copied) on the host. The CPU backend widens a block of lines at a time into
//! BIP, the CUDA backend reads blocks of lines in the file's order and reorders them on the device,
//! and the content digest gathers each of its leaves (`Cube::from_mapped_native`).
//!
//! The mapping is read-only and not populated: pages come from the page cache as they are read, so
//! a 6 GB float32 line holds no anonymous memory. A file truncated by another program while a job
//! reads it through the mapping would fault; the service maps only its own uploads and files under
//! its input roots, and `hypermnf run` the file it was given.

use std::fs::File;
use std::path::Path;

use super::header::EnviHeader;
use super::reader;
use crate::cube::{Cube, CubeError};

/// Maps the ENVI cube of header `hdr` (its data file found beside it, as [`super::read`] finds it).
pub fn map(hdr: &Path) -> Result<Cube, CubeError> {
    let text = reader::read_header_text(hdr)?;
    let header = reader::parse_header_at(&text, hdr)?;
    header.data_bytes()?;
    let data = reader::find_data_file(hdr)?;
    map_data(header, &data)
}

/// Maps an ENVI cube whose header text and data file are stored apart (service uploads).
pub fn map_parts(header_text: &str, data: &Path) -> Result<Cube, CubeError> {
    let header = super::parse_header(header_text)?;
    header.data_bytes()?;
    map_data(header, data)
}

fn map_data(header: EnviHeader, data: &Path) -> Result<Cube, CubeError> {
    let file = File::open(data).map_err(|e| CubeError::io(data, e))?;
    let have = file.metadata().map_err(|e| CubeError::io(data, e))?.len();
    let len = reader::checked_data_len(&header, have, data)?;
    let offset = usize::try_from(header.header_offset)
        .map_err(|_| CubeError::TooLarge(format!("header offset {} does not fit this machine", header.header_offset)))?;
    // SAFETY: a read-only mapping that the cube only reads (see the module doc for files changed
    // under it). An empty file cannot be mapped, but `checked_data_len` refused it already.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| CubeError::io(data, e))?;
    Cube::from_mapped_native(
        header.lines,
        header.samples,
        header.bands,
        header.data_type,
        header.byte_order,
        header.interleave,
        map,
        file,
        offset,
        len,
        header.meta,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cube::{ByteOrder, CubeMeta, DataType};

    /// A cube's samples (int16, BIP order) written in `interleave` and `big`-endian byte order.
    fn stored(values: &[i16], (l, s, b): (usize, usize, usize), interleave: &str, big: bool) -> Vec<u8> {
        let mut out = Vec::with_capacity(values.len() * 2);
        let mut push = |v: i16| out.extend_from_slice(&if big { v.to_be_bytes() } else { v.to_le_bytes() });
        match interleave {
            "bip" => values.iter().for_each(|&v| push(v)),
            "bil" => (0..l).for_each(|li| (0..b).for_each(|bi| (0..s).for_each(|si| push(values[(li * s + si) * b + bi])))),
            _ => (0..b).for_each(|bi| (0..l).for_each(|li| (0..s).for_each(|si| push(values[(li * s + si) * b + bi])))),
        }
        out
    }

    /// The digest that follows a file as it is written is the cube's content digest, whatever the
    /// layout and byte order; a file stored by lines is asked for in growing prefixes (the first
    /// wave before the whole file when there are several), BSQ for the whole file at once.
    #[test]
    fn the_digest_as_written_is_the_content_digest_and_asks_for_lines_in_order() {
        let dir = tempfile::tempdir().unwrap();
        // 6 leaves of 4 MiB: more than one wave where the digest pool has fewer than 3 threads.
        let (l, s, b) = (120, 256, 400);
        let values: Vec<i16> = (0..l * s * b).map(|i| ((i as u64 * 2654435761) % 20011) as i16 - 10000).collect();
        let bip = Cube::from_raw(l, s, b, DataType::I16, ByteOrder::Little, values.iter().flat_map(|v| v.to_le_bytes()).collect(), CubeMeta::default()).unwrap();
        let want = bip.content_digest();
        let total = (l * s * b * 2) as u64;
        for interleave in ["bip", "bil", "bsq"] {
            for big in [false, true] {
                let data = dir.path().join(format!("{interleave}-{big}.img"));
                std::fs::write(&data, stored(&values, (l, s, b), interleave, big)).unwrap();
                let header = format!(
                    "ENVI\nsamples = {s}\nlines = {l}\nbands = {b}\nheader offset = 0\ndata type = 2\ninterleave = {interleave}\nbyte order = {}\n",
                    big as u8
                );
                let cube = map_parts(&header, &data).unwrap();
                let mut asked = Vec::new();
                let got = cube.content_digest_as_written(|n| {
                    asked.push(n);
                    true
                });
                assert_eq!(got, Some(want), "{interleave}, big-endian {big}");
                assert!(asked.windows(2).all(|w| w[0] <= w[1]), "{interleave}: {asked:?}");
                assert_eq!(asked.last(), Some(&total), "{interleave}");
                let line = (s * b * 2) as u64;
                match interleave {
                    "bsq" => assert!(asked.iter().all(|&n| n == total), "{asked:?}"),
                    _ => {
                        assert!(asked.iter().all(|&n| n % line == 0), "whole lines: {asked:?}");
                        if asked.len() > 1 {
                            assert!(asked[0] < total, "{interleave}: {asked:?}");
                        }
                    }
                }
                // A writer that stops short stops the digest.
                assert_eq!(cube.content_digest_as_written(|n| n < total), None, "{interleave}");
            }
        }
    }
}

#[cfg(test)]
mod speed {
    /// How fast a BIL flight line's lines are gathered into BIP (the content digest of a stored BIL
    /// file does this for every leaf): `cargo test --release --lib gather_speed -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement, not a check"]
    fn gather_speed() {
        let dir = tempfile::tempdir().unwrap();
        let (l, s, b) = (200, 598, 425);
        let data: Vec<u8> = (0..l * s * b * 4).map(|i| (i * 7 % 251) as u8).collect();
        let img = dir.path().join("c.img");
        std::fs::write(&img, &data).unwrap();
        let header = format!("ENVI\nsamples = {s}\nlines = {l}\nbands = {b}\nheader offset = 0\ndata type = 4\ninterleave = bil\nbyte order = 0\n");
        let cube = super::map_parts(&header, &img).unwrap();
        let mut out = vec![0u8; 10 * s * b * 4];
        let t = std::time::Instant::now();
        for first in (0..l).step_by(10) {
            cube.copy_lines_bip(first, 10, &mut out);
        }
        let secs = t.elapsed().as_secs_f64();
        eprintln!("gathered {:.0} MB BIL into BIP at {:.2} GB/s on one thread", data.len() as f64 / 1e6, data.len() as f64 / secs / 1e9);
    }
}

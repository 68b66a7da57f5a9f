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

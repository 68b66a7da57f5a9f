//! Reading an ENVI data file into a BIP cube, after checking it against its header.

use std::fs::File;
use std::io::{Read, Seek};
use std::path::{Path, PathBuf};

use super::header::{parse_header, EnviHeader};
use crate::cube::layout::{read_into_bip, Dims, FileOrder};
use crate::cube::{Cube, CubeError};

/// A header file larger than this is not an ENVI header (someone passed the data file, most likely).
const MAX_HEADER_BYTES: u64 = 16 << 20;

/// Extensions a data file may carry beside its header, tried in this order (lower, then upper case).
const DATA_EXTENSIONS: [&str; 6] = ["img", "dat", "raw", "bsq", "bil", "bip"];

/// Reads the header text (lossily: descriptions in Latin-1 must not make a header unreadable).
pub(super) fn read_header_text(hdr: &Path) -> Result<String, CubeError> {
    let mut file = File::open(hdr).map_err(|e| CubeError::io(hdr, e))?;
    let len = file.metadata().map_err(|e| CubeError::io(hdr, e))?.len();
    if len > MAX_HEADER_BYTES {
        return Err(CubeError::Header(format!(
            "{}: {len} bytes is too large for an ENVI header (is it the data file?)",
            hdr.display()
        )));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.read_to_end(&mut bytes).map_err(|e| CubeError::io(hdr, e))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The data file beside `hdr`: the same path without `.hdr` (`x.img.hdr` → `x.img`, `x.hdr` → `x`), or
/// with one of the usual extensions.
pub(super) fn find_data_file(hdr: &Path) -> Result<PathBuf, CubeError> {
    let is_hdr = hdr.extension().and_then(|e| e.to_str()).is_some_and(|e| e.eq_ignore_ascii_case("hdr"));
    let stem = if is_hdr { hdr.with_extension("") } else { hdr.to_path_buf() };
    let mut candidates = Vec::new();
    if is_hdr {
        candidates.push(stem.clone());
    }
    for ext in DATA_EXTENSIONS.iter().map(|e| e.to_string()).chain(DATA_EXTENSIONS.iter().map(|e| e.to_uppercase())) {
        let mut name = stem.clone().into_os_string();
        name.push(".");
        name.push(ext);
        candidates.push(PathBuf::from(name));
    }
    if let Some(found) = candidates.iter().find(|p| p.is_file() && p.as_path() != hdr) {
        return Ok(found.clone());
    }
    let tried: Vec<String> =
        candidates.iter().filter_map(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned()).collect();
    Err(CubeError::io(
        hdr,
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("no data file beside the header (tried {})", tried.join(", ")),
        ),
    ))
}

/// Reads the samples of `data` described by `header` into a cube.
pub(super) fn read_data(header: EnviHeader, data: &Path) -> Result<Cube, CubeError> {
    let mut file = File::open(data).map_err(|e| CubeError::io(data, e))?;
    let have = file.metadata().map_err(|e| CubeError::io(data, e))?.len();
    read_data_from(header, &mut file, have, data)
}

/// Reads the samples described by `header` from `r`, which holds `have` bytes, into a cube (`name`
/// says where they come from, for errors).
///
/// The size is checked against the header before anything is allocated; the cube is then allocated
/// once and the bytes streamed into it (BIP straight in, BSQ/BIL through a bounded buffer).
pub(super) fn read_data_from<R: Read + Seek>(header: EnviHeader, r: &mut R, have: u64, name: &Path) -> Result<Cube, CubeError> {
    let len = checked_data_len(&header, have, name)?;
    let geometry = geometry(&header);
    let mut bytes = Vec::new();
    bytes
        .try_reserve_exact(len)
        .map_err(|_| CubeError::TooLarge(format!("cannot allocate {len} bytes for {geometry}")))?;
    bytes.resize(len, 0);

    let dims = Dims::new(header.lines, header.samples, header.bands);
    read_into_bip(r, header.header_offset, FileOrder::of(header.interleave), dims, header.data_type.size(), &mut bytes)
        .map_err(|e| CubeError::io(name, e))?;

    Cube::from_raw(header.lines, header.samples, header.bands, header.data_type, header.byte_order, bytes, header.meta)
}

/// The bytes of samples `header` describes, checked against the `have` bytes of the data file `name`
/// (exactly the header offset plus the samples: a shorter file is truncated, a longer one is not the
/// file the header describes).
pub(super) fn checked_data_len(header: &EnviHeader, have: u64, name: &Path) -> Result<usize, CubeError> {
    let need = header.data_bytes()?;
    let total = header.header_offset.checked_add(need).ok_or_else(|| {
        CubeError::TooLarge(format!("header offset {} + {need} bytes of samples overflows", header.header_offset))
    })?;
    let geometry = geometry(header);
    if have < total {
        return Err(CubeError::SizeMismatch(format!(
            "{}: truncated: {have} bytes, header needs {total} ({geometry})",
            name.display()
        )));
    }
    if have > total {
        return Err(CubeError::SizeMismatch(format!(
            "{}: {} bytes longer than the header describes ({have} bytes, header needs {total} for {geometry})",
            name.display(),
            have - total
        )));
    }

    usize::try_from(need).map_err(|_| CubeError::TooLarge(format!("{need} bytes do not fit this machine's address space")))
}

/// The header's geometry, for messages.
fn geometry(header: &EnviHeader) -> String {
    format!(
        "{} lines x {} samples x {} bands of {}{}",
        header.lines,
        header.samples,
        header.bands,
        header.data_type.name(),
        if header.header_offset > 0 {
            format!(" after a {}-byte header offset", header.header_offset)
        } else {
            String::new()
        }
    )
}

/// Parses the header text; errors name the header file.
pub(super) fn parse_header_at(text: &str, hdr: &Path) -> Result<EnviHeader, CubeError> {
    parse_header(text).map_err(|e| match e {
        CubeError::Header(m) => CubeError::Header(format!("{}: {m}", hdr.display())),
        CubeError::Unsupported(m) => CubeError::Unsupported(format!("{}: {m}", hdr.display())),
        CubeError::TooLarge(m) => CubeError::TooLarge(format!("{}: {m}", hdr.display())),
        other => other,
    })
}

//! What the device level needs to know about a stored upload without decoding it.

use std::io::{Read, Seek, SeekFrom};

use sha2::{Digest as _, Sha256};

use super::model::InputKind;
use crate::cache::Digest;
use crate::cube::{npy, CubeError};
use crate::storage::Storage;

/// SHA-256 of a stored upload's header bytes: the `.npy` preamble and header dict, or the ENVI `.hdr`
/// text. With the cube's content digest, it fixes the decoded cube exactly (byte order, layout and
/// header metadata, which the content digest leaves out), for a few kilobytes read. Only for uploads:
/// an href names a file that may change between jobs.
pub fn header_digest(kind: InputKind, location: &str, storage: &Storage) -> Result<Digest, CubeError> {
    let local = |name: &str| {
        storage
            .local_path(&format!("{location}/{name}"))
            .map_err(|e| CubeError::Io { path: format!("{location}/{name}"), source: std::io::Error::other(e.to_string()) })
    };
    let bytes = match kind {
        InputKind::Npy => {
            let path = local("cube.npy")?;
            let mut f = std::fs::File::open(&path).map_err(|e| CubeError::io(&path, e))?;
            let header = npy::read_header(&mut f)?;
            let mut bytes = vec![0u8; header.data_offset as usize];
            f.seek(SeekFrom::Start(0)).and_then(|_| f.read_exact(&mut bytes)).map_err(|e| CubeError::io(&path, e))?;
            bytes
        }
        InputKind::Envi => {
            let path = local("cube.hdr")?;
            std::fs::read(&path).map_err(|e| CubeError::io(&path, e))?
        }
        InputKind::Href => return Err(CubeError::Unsupported("an href input has no stored header".into())),
    };
    let mut h = Sha256::new();
    h.update(kind.as_str().as_bytes());
    h.update(&bytes);
    Ok(h.finalize().into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npy_headers_differ_by_byte_order_and_equal_for_the_same_header() {
        let dir = tempfile::tempdir().unwrap();
        let storage = Storage::local(dir.path().to_path_buf()).unwrap();
        let write = |loc: &str, cube: &crate::cube::Cube| {
            let p = storage.local_path(&format!("{loc}/cube.npy")).unwrap();
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            npy::write_cube(&p, cube).unwrap();
        };
        let le = crate::cube::Cube::from_i16(2, 3, 4, &[7i16; 24]).unwrap();
        write("a", &le);
        write("b", &crate::cube::Cube::from_i16(2, 3, 4, &[8i16; 24]).unwrap());
        let a = header_digest(InputKind::Npy, "a", &storage).unwrap();
        // Same header, whatever the samples (the content digest covers those).
        assert_eq!(a, header_digest(InputKind::Npy, "b", &storage).unwrap());
        let be = crate::cube::Cube::from_raw(2, 3, 4, crate::cube::DataType::I16, crate::cube::ByteOrder::Big, vec![0u8; 48], Default::default()).unwrap();
        write("c", &be);
        assert_ne!(a, header_digest(InputKind::Npy, "c", &storage).unwrap());
        assert!(header_digest(InputKind::Npy, "missing", &storage).is_err());
        assert!(header_digest(InputKind::Href, "a", &storage).is_err());
    }
}

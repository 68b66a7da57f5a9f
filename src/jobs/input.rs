//! A job's stored input: the cube itself ([`load_cube`]), and what the device level needs to know
//! about an upload without decoding it ([`header_digest`]).

use std::path::Path;

use sha2::{Digest as _, Sha256};

use super::model::InputKind;
use crate::job_cache::Digest;
use crate::cube::{npy, Cube, CubeError};
use crate::storage::{Storage, StorageError};

/// Reads a job's input cube: `<location>/cube.npy`, `<location>/cube.{hdr,img}`, or the href's file.
/// Runs on a blocking thread; `rt` fetches stored files (a local copy for the readers, which need a
/// file: with S3 a download into scratch, removed once the cube is read).
pub fn load_cube(kind: InputKind, location: &str, storage: &Storage, rt: &tokio::runtime::Handle) -> Result<Cube, CubeError> {
    let local = |name: &str| {
        let key = format!("{location}/{name}");
        rt.block_on(storage.local_copy(&key)).map_err(|e| CubeError::Io { path: key, source: e.into_io() })
    };
    match kind {
        // Mapped: the upload is ours, written once (a copy from S3 is a scratch file of this job).
        InputKind::Npy => npy::map(local("cube.npy")?.path()),
        // Mapped in the layout it is stored in: a BIL or BSQ upload is never transposed on the host.
        InputKind::Envi => {
            let hdr = local("cube.hdr")?;
            let text = std::fs::read_to_string(hdr.path()).map_err(|e| CubeError::io(hdr.path(), e))?;
            crate::cube::envi::map_parts(&text, local("cube.img")?.path())
        }
        // An s3:// or https:// reference (JSON) is read by `jobs::remote_input`, with its clients.
        InputKind::Href if location.starts_with('{') => Err(CubeError::Unsupported("a referenced cube is read by the worker's reference clients".into())),
        InputKind::Href => crate::cube::map(Path::new(location)),
    }
}

/// The first read of an `.npy` upload: numpy's headers are a few hundred bytes, so one ranged read
/// nearly always holds the whole header.
const NPY_FIRST_READ: u64 = 4096;
/// The longest read when the first was not enough: the reader's header limit and the preamble.
const NPY_HEADER_MAX: u64 = (1 << 20) + 12;

/// SHA-256 of a stored upload's header bytes: the `.npy` preamble and header dict, or the ENVI `.hdr`
/// text. With the cube's content digest, it fixes the decoded cube exactly (byte order, layout and
/// header metadata, which the content digest leaves out), for a few kilobytes read (ranged reads: the
/// upload may be in S3). Only for uploads: an href names a file that may change between jobs. Runs on
/// a blocking thread; `rt` runs the reads.
pub fn header_digest(kind: InputKind, location: &str, storage: &Storage, rt: &tokio::runtime::Handle) -> Result<Digest, CubeError> {
    let bytes = match kind {
        InputKind::Npy => {
            let key = format!("{location}/cube.npy");
            let read = |n: u64| rt.block_on(storage.get_range(&key, 0..n)).map_err(failed(&key));
            let mut head = read(NPY_FIRST_READ)?;
            let header = match npy::read_header(&mut &head[..]) {
                Ok(h) => h,
                // The header goes past the first read (or the file is bad: the second read says which).
                Err(_) if head.len() as u64 == NPY_FIRST_READ => {
                    head = read(NPY_HEADER_MAX)?;
                    npy::read_header(&mut &head[..])?
                }
                Err(e) => return Err(e),
            };
            head.truncate(header.data_offset as usize);
            head.to_vec()
        }
        InputKind::Envi => {
            let key = format!("{location}/cube.hdr");
            rt.block_on(storage.get_bytes(&key)).map_err(failed(&key))?.to_vec()
        }
        InputKind::Href => return Err(CubeError::Unsupported("an href input has no stored header".into())),
    };
    Ok(of_header(kind, &bytes))
}

/// [`header_digest`] of an upload of kind `kind` whose header is `bytes`.
pub fn of_header(kind: InputKind, bytes: &[u8]) -> Digest {
    let mut h = Sha256::new();
    h.update(kind.as_str().as_bytes());
    h.update(bytes);
    h.finalize().into()
}

fn failed(key: &str) -> impl FnOnce(StorageError) -> CubeError + '_ {
    move |e| CubeError::Io { path: key.to_string(), source: e.into_io() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npy_headers_differ_by_byte_order_and_equal_for_the_same_header() {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let storage = Storage::local(dir.path().to_path_buf()).unwrap();
        let write = |loc: &str, cube: &crate::cube::Cube| {
            let p = storage.scratch_dir("t").unwrap().join("cube.npy");
            npy::write_cube(&p, cube).unwrap();
            rt.block_on(storage.put_file(&p, &format!("{loc}/cube.npy"))).unwrap();
        };
        let digest = |kind, loc: &str| header_digest(kind, loc, &storage, rt.handle());
        let le = crate::cube::Cube::from_i16(2, 3, 4, &[7i16; 24]).unwrap();
        write("a", &le);
        write("b", &crate::cube::Cube::from_i16(2, 3, 4, &[8i16; 24]).unwrap());
        let a = digest(InputKind::Npy, "a").unwrap();
        // Same header, whatever the samples (the content digest covers those).
        assert_eq!(a, digest(InputKind::Npy, "b").unwrap());
        let be = crate::cube::Cube::from_raw(2, 3, 4, crate::cube::DataType::I16, crate::cube::ByteOrder::Big, vec![0u8; 48], Default::default()).unwrap();
        write("c", &be);
        assert_ne!(a, digest(InputKind::Npy, "c").unwrap());
        assert!(digest(InputKind::Npy, "missing").is_err());
        assert!(digest(InputKind::Href, "a").is_err());
    }

    /// A header longer than the first read is read whole by a second one, and hashed as before:
    /// the file's bytes up to the data.
    #[test]
    fn a_long_npy_header_is_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let storage = Storage::local(dir.path().to_path_buf()).unwrap();
        // numpy pads with spaces; this pads past the first read.
        let mut header = b"{'descr': '<i2', 'fortran_order': False, 'shape': (1, 1, 2), }".to_vec();
        header.resize(6000, b' ');
        while (12 + header.len() + 1) % 64 != 0 {
            header.push(b' ');
        }
        header.push(b'\n');
        let mut file = b"\x93NUMPY\x02\x00".to_vec();
        file.extend_from_slice(&(header.len() as u32).to_le_bytes());
        file.extend_from_slice(&header);
        let data_offset = file.len();
        file.extend_from_slice(&[1, 0, 2, 0]);
        rt.block_on(storage.put_bytes("long/cube.npy", file.clone().into())).unwrap();
        assert!(data_offset as u64 > NPY_FIRST_READ);
        let mut h = Sha256::new();
        h.update(b"npy");
        h.update(&file[..data_offset]);
        let want: Digest = h.finalize().into();
        assert_eq!(header_digest(InputKind::Npy, "long", &storage, rt.handle()).unwrap(), want);
    }
}

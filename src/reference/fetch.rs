//! The worker's read of a referenced cube: the recorded objects, each read with parallel ranged GETs
//! (conditional on the version recorded at submit) into the job's scratch, then mapped as a local
//! file of the same format would be. The scratch names are unlinked once the cube is mapped (the
//! mapping keeps the pages until the job drops the cube), so nothing is left behind however the job
//! ends; a process that dies meanwhile leaves files that the next start's scratch clearing removes.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};

use super::{Object, ObjectVersion, RefError, Reference, References, Stored};
use crate::cube::{Cube, CubeError};

/// Bytes per ranged GET.
pub const PART: u64 = 8 << 20;
/// Ranged GETs in flight per object.
pub const CONCURRENCY: usize = 6;

/// Why a referenced cube could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Reference(#[from] RefError),
    #[error(transparent)]
    Cube(#[from] CubeError),
}

/// The format of an object, by its name (as `cube::map` decides for a local file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Npy,
    EnviHeader,
    /// NetCDF, HDF5 or GeoTIFF, read through GDAL: the extension to give the local copy.
    Gdal(&'static str),
}

impl Format {
    pub fn of_name(name: &str) -> Option<Format> {
        let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase())?;
        Some(match ext.as_str() {
            "npy" => Format::Npy,
            "hdr" => Format::EnviHeader,
            "nc" | "nc4" | "netcdf" => Format::Gdal("nc"),
            "h5" | "he5" | "hdf5" | "hdf" => Format::Gdal("h5"),
            "tif" | "tiff" | "gtif" => Format::Gdal("tif"),
            _ => return None,
        })
    }
}

/// Reads the cube of `stored` into `dir` (the job's scratch directory, removed here before the
/// cube is returned). Runs on a blocking thread; `rt` runs the reads.
pub fn load(refs: &References, stored: &Stored, dir: &Path, rt: &tokio::runtime::Handle) -> Result<Cube, LoadError> {
    let result = (|| {
        std::fs::create_dir_all(dir).map_err(|e| CubeError::io(dir, e))?;
        let main = parse(&stored.object.href)?;
        let format =
            Format::of_name(&main.file_name()).ok_or_else(|| RefError::Unsupported(format!("{} is not a cube this server reads", stored.object.href)))?;
        let object = rt.block_on(refs.open(&main))?;
        match format {
            Format::Npy => {
                let path = rt.block_on(download(&object, &stored.object, dir.join("cube.npy")))?;
                Ok(crate::cube::npy::map(&path)?)
            }
            Format::EnviHeader => {
                let header = rt.block_on(object.get_range(0..stored.object.size, &stored.object))?;
                let text = String::from_utf8_lossy(&header).into_owned();
                let data_v = stored.data.as_ref().ok_or_else(|| RefError::Invalid("the job recorded no ENVI data object".into()))?;
                let data = rt.block_on(refs.open(&parse(&data_v.href)?))?;
                let path = rt.block_on(download(&data, data_v, dir.join("cube.img")))?;
                Ok(crate::cube::envi::map_parts(&text, &path)?)
            }
            Format::Gdal(ext) => {
                let path = rt.block_on(download(&object, &stored.object, dir.join(format!("cube.{ext}"))))?;
                Ok(crate::cube::map(&path)?)
            }
        }
    })();
    let _ = std::fs::remove_dir_all(dir);
    result
}

fn parse(href: &str) -> Result<Reference, RefError> {
    Reference::parse(href)?.ok_or_else(|| RefError::Invalid(format!("{href} is not an s3:// or https:// reference")))
}

/// Writes the object (version `v`) to `path` with parallel ranged GETs, each at its offset.
pub async fn download(object: &Object, v: &ObjectVersion, path: PathBuf) -> Result<PathBuf, LoadError> {
    let file = std::fs::File::create(&path).map_err(|e| CubeError::io(&path, e))?;
    file.set_len(v.size).map_err(|e| CubeError::io(&path, e))?;
    let file = Arc::new(file);
    let parts = (0..v.size).step_by(PART as usize).map(|at| at..(at + PART).min(v.size));
    futures::stream::iter(parts)
        .map(|range| {
            let (object, file, path) = (object.clone(), file.clone(), path.clone());
            async move {
                let bytes = object.get_range(range.clone(), v).await?;
                tokio::task::spawn_blocking(move || file.write_all_at(&bytes, range.start).map_err(|e| CubeError::io(&path, e)))
                    .await
                    .map_err(|e| CubeError::io(Path::new("download"), std::io::Error::other(e)))??;
                Ok::<_, LoadError>(())
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<()>()
        .await?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_follow_the_name() {
        assert_eq!(Format::of_name("a.NPY"), Some(Format::Npy));
        assert_eq!(Format::of_name("a.img.hdr"), Some(Format::EnviHeader));
        assert_eq!(Format::of_name("EMIT_L1B.nc"), Some(Format::Gdal("nc")));
        assert_eq!(Format::of_name("x.tiff"), Some(Format::Gdal("tif")));
        assert_eq!(Format::of_name("x.img"), None);
        assert_eq!(Format::of_name("noext"), None);
    }
}

//! The ENVI download of a job's result (`?format=envi`): its header and band-sequential data file
//! zipped once, kept beside the result, and streamed from then on.

use std::path::{Path, PathBuf};

use super::error::{ApiResult, Error};
use super::ApiContext;

/// Where the ENVI data file of a zip comes from.
pub(super) enum EnviData<'a> {
    /// The stored `.img`.
    Stored(&'a str),
    /// Made from the stored `.npy` of the same values (`envi::write_f32_bsq_data_from_npy`).
    FromNpy(&'a str),
}

/// Zips the ENVI pair once (stored, not deflated: float samples hardly compress) and keeps the zip
/// beside the result; later downloads stream it.
pub(super) async fn build_zip(ctx: &ApiContext, hdr_key: &str, data: EnviData<'_>, stem: &str, zip_key: &str) -> ApiResult<()> {
    let storage = ctx.runner.storage.clone();
    let token = format!("zip-{}", uuid::Uuid::now_v7());
    let dir = storage.scratch_dir(&token)?;
    let built = zip_in(&storage, hdr_key, data, stem, &dir).await;
    let r = match built {
        Ok(zip_path) => storage.put_file(&zip_path, zip_key).await.map_err(Error::from),
        Err(e) => Err(e),
    };
    storage.remove_scratch(&token);
    r
}

/// Writes the zip of the ENVI pair into `dir`; its path.
async fn zip_in(storage: &crate::storage::Storage, hdr_key: &str, data: EnviData<'_>, stem: &str, dir: &Path) -> ApiResult<PathBuf> {
    // Local files for the zip writer: the stored ones, or copies downloaded from S3 (gone when
    // dropped, after the zip is written).
    let hdr = storage.local_copy(hdr_key).await?;
    let (local, from_npy) = match data {
        EnviData::Stored(k) => (storage.local_copy(k).await?, false),
        EnviData::FromNpy(k) => (storage.local_copy(k).await?, true),
    };
    let stem = stem.to_string();
    let zip_path = dir.join("result.zip");
    let made_img = dir.join("result.img");
    let zp = zip_path.clone();
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let img = if from_npy {
            crate::cube::envi::write_f32_bsq_data_from_npy(local.path(), &made_img)?;
            made_img
        } else {
            local.path().to_path_buf()
        };
        let f = std::fs::File::create(&zp)?;
        let mut z = zip::ZipWriter::new(std::io::BufWriter::new(f));
        for (src, name) in [(hdr.path(), format!("{stem}.hdr")), (img.as_path(), format!("{stem}.img"))] {
            let len = std::fs::metadata(src)?.len();
            let opts = zip::write::SimpleFileOptions::default()
                .compression_method(zip::CompressionMethod::Stored)
                .large_file(len >= u32::MAX as u64);
            z.start_file(name, opts)?;
            std::io::copy(&mut std::fs::File::open(src)?, &mut z)?;
        }
        // On the disk before it is stored: it is served as it is from then on, unlike the job's
        // own results, which `jobs::result_sync` checks after a crash.
        z.finish()?.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        Ok(())
    })
    .await
    .map_err(Error::internal)?
    .map_err(Error::internal)?;
    Ok(zip_path)
}

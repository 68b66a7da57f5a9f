//! A job's result files, written into its scratch directory with the bytes `hypermnf run --out`
//! writes, before they are stored under `results/<id>/`.

use std::path::{Path, PathBuf};

use super::job_failure::JobFailure;
use super::model::product;
use crate::cube::Cube;
use crate::mnf::MnfOutput;

/// The components' file in the job's scratch directory (the other result files are named after it).
pub(super) const RESULT_NPY: &str = "result.npy";

/// Writes a job's result files into its scratch directory `dir`: the same writer as
/// `hypermnf run --out` for the .npy (and the metadata), and the ENVI headers it would write, so that
/// every download holds exactly the bytes the command line would have written. The components are
/// there already when `components_written` (written during the projection). The ENVI data
/// (band-sequential: a transposition that took as long as the rest of the write) is made from the
/// .npy when it is first asked for.
pub(super) fn write_results(dir: &Path, cube: &Cube, output: &MnfOutput, components_written: bool, system: &[u8]) -> Result<Vec<(String, PathBuf)>, JobFailure> {
    let npy = crate::output::write_result_with(&dir.join(RESULT_NPY), output, &cube.meta, components_written).map_err(JobFailure::cube)?;
    // Only the ENVI headers: the data files are made from the .npy on the first request for them
    // (`api::jobs::result`, `api::envi_zip`), instead of a second copy of the result written by every job.
    let envi_dir = dir.join("envi");
    std::fs::create_dir_all(&envi_dir).map_err(|e| JobFailure::storage(&e))?;
    let (hdr, denoised_hdr) = crate::output::write_envi_headers(&envi_dir.join("result.hdr"), output, &cube.meta).map_err(JobFailure::cube)?;
    let mut files = vec![
        (product::COMPONENTS_NPY.to_string(), npy.components),
        (product::METADATA.to_string(), npy.metadata),
        (product::COMPONENTS_HDR.to_string(), hdr),
    ];
    if let Some(d) = npy.denoised {
        files.push((product::DENOISED_NPY.to_string(), d));
    }
    if let Some(d) = denoised_hdr {
        files.push((product::DENOISED_HDR.to_string(), d));
    }
    // The eigen system (`system`, its stored form), whether this job computed it, found it in the job
    // cache or was given it: `GET /v1/jobs/{id}/system` and `statistics_from` need every succeeded
    // job's, and the cache's copy is neither made for every job nor kept as long as the job (about
    // 2.9 MB at 425 bands).
    let system_path = dir.join(product::SYSTEM);
    std::fs::write(&system_path, system).map_err(|e| JobFailure::storage(&e))?;
    files.push((product::SYSTEM.to_string(), system_path));
    Ok(files)
}

//! The run of a job whose cube is an `s3://` or `https://` reference (`reference::Stored` in its
//! `input_location`): the read (`reference::fetch`, into the job's scratch) and, once the cube's
//! content digest is known, the memo that lets a later submit of the same objects find its jobs as an
//! upload's would (table `reference_digests`).

use super::reuse::Plan;
use super::job_failure::JobFailure;
use super::services::JobServices;
use super::model::Job;
use crate::reference::fetch::{self, LoadError, Loaded};
use crate::reference::Stored;

/// Reads the referenced cube into the scratch directory `ref-<job id>` (removed again before this
/// returns: the cube maps the unlinked files), with its content digest when it was computed on the
/// way. Runs on a blocking thread.
pub fn load(s: &JobServices, job: &Job, stored: &Stored, rt: &tokio::runtime::Handle) -> Result<Loaded, JobFailure> {
    let token = format!("ref-{}", job.id);
    let dir = s.storage.scratch_dir(&token).map_err(|e| JobFailure::storage(&e))?;
    let t = std::time::Instant::now();
    let loaded = fetch::load(&s.references, stored, &dir, rt);
    s.storage.remove_scratch(&token);
    let loaded = loaded.map_err(|e| match e {
        LoadError::Reference(r) => JobFailure { code: r.code().into(), message: r.to_string() },
        LoadError::Cube(c) => JobFailure::cube(c),
    })?;
    tracing::debug!(job = %job.id, secs = t.elapsed().as_secs_f64(), bytes = stored.object.size + stored.data.as_ref().map_or(0, |d| d.size), "referenced cube read");
    Ok(loaded)
}

/// Records the content digest of a referenced job's objects (best effort: a failure only costs a
/// later submit its cache hit).
pub fn remember(s: &JobServices, job: &Job, plan: &Plan, rt: &tokio::runtime::Handle) {
    let Some(stored) = Stored::of_location(&job.input_location) else {
        return;
    };
    let content = hex::encode(plan.content_digest());
    let carried = plan.cube.meta.carried_digest().map(hex::encode);
    if let Err(e) = rt.block_on(s.store.remember_reference(&stored.memo_key(), &content, carried.as_deref())) {
        tracing::warn!(job = %job.id, "cannot record the reference's digest: {e}");
    }
}

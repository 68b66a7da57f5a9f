//! Job creation, once the API has checked a request's input and parameters: the job is found again
//! (the owner's job of the same cube and parameters) or its input is stored and its row inserted.
//! The API calls three things: [`CubeKey::job_digest`] (what the job is known by), [`existing_job`]
//! and [`enqueue`] (or [`insert_stored`], for a job started early on its upload: `early_start`).
//! What a request answers (202, 200 with `cached`, the metrics it counts) stays with the API.

use sha2::{Digest, Sha256};

use super::early_start::EarlyRun;
use super::model::Job;
use super::store::{Inserted, NewJob, StoreError};
use super::worker::Runner;
use super::PersistError;

/// What the job cache knows a decoded cube by: its content digest (samples, shape, type, bbl and
/// no-data), and the digest of the metadata its results carry (`CubeMeta::carried_digest`).
#[derive(Clone, Copy)]
pub struct CubeKey {
    pub content: [u8; 32],
    pub carried: Option<[u8; 32]>,
}

impl CubeKey {
    /// A C-order `.npy`: a cube that carries no metadata into its results.
    pub fn of_npy(content: [u8; 32]) -> CubeKey {
        CubeKey { content, carried: None }
    }

    /// The result level's key: the cube's digests and the canonical parameters. A cube that carries no
    /// metadata has the digest jobs had before the carried metadata was keyed on, so their rows are
    /// still found; one that carries some is a different job from the same pixels under another header.
    pub fn job_digest(&self, canonical_params: &str) -> String {
        let mut h = Sha256::new();
        h.update(b"hypermnf-job-v1");
        h.update(self.content);
        h.update(canonical_params.as_bytes());
        if let Some(carried) = self.carried {
            h.update(b"hypermnf-job-carried-v1");
            h.update(carried);
        }
        hex::encode(h.finalize())
    }
}

/// The owner's job of this job digest, if any: the result level first (a succeeded job, checked against
/// its row), then the job store, which also knows the queued and running jobs the cache does not hold.
pub async fn existing_job(runner: &Runner, owner: &str, digest: &str) -> Result<Option<Job>, StoreError> {
    if let Some(job) = runner.cache.find_result(owner, digest).await? {
        return Ok(Some(job));
    }
    runner.store.find_live_by_digest(owner, digest).await
}

/// The owner's live job of `new`'s digest, or `new` queued with its input stored from scratch under
/// `scratch_token` (see [`insert_stored`]).
pub async fn enqueue(runner: &Runner, new: NewJob, scratch_token: Option<&str>) -> Result<Inserted, PersistError> {
    if let Some(job) = existing_job(runner, &new.owner, &new.digest).await? {
        return Ok(Inserted::Existing(job));
    }
    insert_stored(runner, new, scratch_token, None).await
}

/// Stores the input from scratch under `scratch_token` (if any) at `new.input_location`, then inserts
/// the job: queued, or claimed by this instance when `early` already computes it. A live job of the
/// same owner and digest that was inserted meanwhile is answered instead (and `early` dropped).
pub async fn insert_stored(runner: &Runner, new: NewJob, scratch_token: Option<&str>, early: Option<EarlyRun>) -> Result<Inserted, PersistError> {
    let (location, new_id) = (new.input_location.clone(), new.id.clone());
    // The input is in its final place before the row exists: a queued job always has its input.
    if let Some(token) = scratch_token {
        let dir = runner.storage.scratch_dir(token)?;
        for name in ["cube.npy", "cube.hdr", "cube.img"] {
            let p = dir.join(name);
            if p.exists() {
                runner.storage.put_file(&p, &format!("{location}/{name}")).await?;
            }
        }
        // The files were synced where they were written; their new names too before the row, so
        // that an accepted job keeps its input through a power cut.
        runner.storage.sync_names(&location).await?;
        // An EMIT upload's GLT outlives the upload (removed once the job has run): its COG needs it.
        super::geometry::store_glt(&runner.storage, &dir, &new_id).await?;
    }
    let inserted = match &early {
        Some(_) => runner.store.insert_claimed(new, &runner.lease).await?,
        None => runner.store.insert(new).await?,
    };
    match &inserted {
        Inserted::Created(job) => match early {
            Some(run) => run.finish(job.clone()),
            None => runner.notify(),
        },
        Inserted::Existing(_) => {
            if scratch_token.is_some() {
                let _ = runner.storage.delete_prefix(&location).await;
                let _ = runner.storage.delete_prefix(&super::geometry::glt_prefix(&new_id)).await;
            }
        }
    }
    Ok(inserted)
}

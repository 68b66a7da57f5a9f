//! An OGC job made of several cubes: an execution whose `cube` input is an array creates a batch
//! (`/v1/batches`), and the OGC job for it is the batch itself: `/jobs/{batch id}` is its statusInfo,
//! `/jobs/{batch id}/results` links each member's outputs in the order of the cubes, DELETE dismisses
//! the whole batch. The member jobs stay ordinary OGC jobs too (`/jobs/{member id}`).

use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use serde_json::{json, Map, Value};

use super::outputs::{failure, Output, OutputChoice, Transmission};
use super::problem::{kind, OgcResult, Problem};
use super::{link, rel, BaseUrl, PROCESS_ID};
use crate::api::auth::Caller;
use crate::api::batches::{batch_document, owned_batch};
use crate::api::ApiContext;
use crate::jobs::{product, rfc3339, BatchRow, Job};

/// A batch with its member jobs, as one OGC job.
pub struct BatchJob {
    pub row: BatchRow,
    pub jobs: Vec<Job>,
}

impl BatchJob {
    /// The caller's batch `id`, or None when the caller has no batch of that id.
    pub async fn find(ctx: &ApiContext, caller: &Caller, id: &str) -> OgcResult<Option<BatchJob>> {
        let row = match owned_batch(ctx, caller, id).await {
            Ok(row) => row,
            Err(e) if e.status() == StatusCode::NOT_FOUND => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let jobs = ctx.runner.store.batch_jobs(&row.id).await.map_err(crate::api::error::Error::from)?;
        Ok(Some(BatchJob { row, jobs }))
    }

    /// The native batch document (`/v1/batches/{id}`), whose status this job's follows.
    pub fn document(&self) -> Value {
        batch_document(&self.row, &self.jobs, None)
    }

    /// Started when its first member started; finished when every member has finished.
    fn times(&self) -> (Option<i64>, Option<i64>) {
        let started = self.jobs.iter().filter_map(|j| j.started_at).min();
        let all_done = !self.jobs.is_empty() && self.jobs.iter().all(|j| j.status.is_finished());
        let finished = all_done.then(|| self.jobs.iter().filter_map(|j| j.finished_at).max()).flatten();
        (started, finished)
    }

    pub fn status_info(&self, base: &BaseUrl) -> Value {
        let (started, finished) = self.times();
        status_info(&self.document(), base, started, finished)
    }
}

/// The native batch status in OGC's words (the same mapping as a job's).
pub fn ogc_batch_status(native: &str) -> &'static str {
    match native {
        "queued" => "accepted",
        "running" => "running",
        "succeeded" => "successful",
        "failed" => "failed",
        _ => "dismissed",
    }
}

/// The statusInfo of a batch from its native document: the batch's status, progress and counts, a
/// link to each member's own OGC job, and to the results once every member has succeeded.
pub fn status_info(doc: &Value, base: &BaseUrl, started: Option<i64>, finished: Option<i64>) -> Value {
    let id = doc["id"].as_str().unwrap_or_default();
    let native = doc["status"].as_str().unwrap_or("queued");
    let status = ogc_batch_status(native);
    let members = doc["jobs"].as_array().map(Vec::as_slice).unwrap_or_default();
    let count = |s: &str| doc["counts"][s].as_u64().unwrap_or(0);
    let statistics = doc["statistics"].as_str().unwrap_or("each");
    let mut message = format!(
        "batch of {} cubes ({statistics} statistics): {} succeeded, {} running, {} queued, {} failed, {} canceled",
        members.len(),
        count("succeeded"),
        count("running"),
        count("queued"),
        count("failed"),
        count("canceled"),
    );
    if let Some(code) = doc["error"]["code"].as_str() {
        message = format!("{code}: {}; {message}", doc["error"]["message"].as_str().unwrap_or_default());
    }
    let url = base.join(&format!("/jobs/{id}"));
    let mut links = vec![
        link(url.clone(), "self", "application/json", "this job's status"),
        link(base.join(&format!("/v1/batches/{id}")), "alternate", "application/json", "the same batch in the native API"),
    ];
    if status == "successful" {
        links.push(link(format!("{url}/results"), rel::RESULTS, "application/json", "the results of every cube"));
    }
    for (i, m) in members.iter().enumerate() {
        let member = m["id"].as_str().unwrap_or_default();
        links.push(link(base.join(&format!("/jobs/{member}")), "item", "application/json", &format!("the job of cube {i}")));
    }
    let progress = doc["progress"].as_f64().unwrap_or(0.0);
    let mut info = json!({
        "processID": PROCESS_ID,
        "type": "process",
        "jobID": id,
        "status": status,
        "message": message,
        "created": doc["created_at"],
        // Whole percent, rounded down: 100 only once it is done (as a job's).
        "progress": if status == "successful" { 100 } else { ((progress * 100.0).floor() as i64).clamp(0, 99) },
        "links": links,
    });
    if let Some(t) = started {
        info["started"] = json!(rfc3339(t));
    }
    if let Some(t) = finished {
        info["finished"] = json!(rfc3339(t));
    }
    info["updated"] = match finished.or(started) {
        Some(t) => json!(rfc3339(t)),
        None => doc["created_at"].clone(),
    };
    info
}

/// The results of a batch whose members all succeeded: each output as an array of links, one per
/// cube in the order given (the arrays can be large, and a batch many: by reference only).
pub fn results_document(base: &BaseUrl, jobs: &[Job]) -> Value {
    let denoised = !jobs.is_empty() && jobs.iter().all(|j| j.results.contains_key(product::DENOISED_NPY));
    let mut doc = Map::new();
    for output in Output::ALL.into_iter().filter(|o| *o != Output::Denoised || denoised) {
        let choice = OutputChoice { output, transmission: Transmission::Reference, envi_zip: false, cog: false };
        let links: Vec<Value> = jobs
            .iter()
            .enumerate()
            .map(|(i, job)| {
                json!({"href": choice.href(base, job), "type": choice.media_type(), "rel": "enclosure",
                       "title": format!("{} of cube {i}", output.id())})
            })
            .collect();
        doc.insert(output.id().to_string(), Value::Array(links));
    }
    Value::Object(doc)
}

/// `/jobs/{id}/results` of a batch, or the exception the standard asks for while it is not done.
pub fn results(base: &BaseUrl, batch: &BatchJob) -> OgcResult<Value> {
    let doc = batch.document();
    match doc["status"].as_str().unwrap_or_default() {
        "succeeded" => Ok(results_document(base, &batch.jobs)),
        "queued" | "running" => Err(Problem::new(
            StatusCode::NOT_FOUND,
            "not_ready",
            format!("the batch is {}; its results are not ready", ogc_batch_status(doc["status"].as_str().unwrap_or_default())),
        )
        .of_kind(kind::RESULT_NOT_READY)),
        "failed" => Err(match batch.jobs.iter().find(|j| j.status == crate::jobs::JobStatus::Failed) {
            Some(job) => failure(job),
            None => Problem::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                doc["error"]["code"].as_str().unwrap_or("failed"),
                format!("the batch failed: {}", doc["error"]["message"].as_str().unwrap_or_default()),
            ),
        }),
        _ => Err(Problem::new(StatusCode::GONE, "dismissed", "the batch was dismissed; it has no results")),
    }
}

/// Dismiss: the batch's running and queued jobs are canceled and the batch, its jobs and their
/// files deleted (as `DELETE /v1/batches/{id}`); the answer is its last statusInfo, dismissed.
pub async fn dismiss(ctx: &ApiContext, base: &BaseUrl, caller: &Caller, batch: BatchJob) -> OgcResult<Value> {
    let mut info = batch.status_info(base);
    crate::api::batches::delete(State(ctx.clone()), caller.clone(), UrlPath(batch.row.id.clone())).await?;
    info["status"] = json!("dismissed");
    info["message"] = json!("dismissed: the batch, its jobs and their results are deleted");
    if let Some(links) = info["links"].as_array_mut() {
        links.retain(|l| l["rel"] == "self");
    }
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(status: &str, progress: f64) -> Value {
        json!({
            "id": "0190a0a0-0000-7000-8000-000000000001", "status": status, "statistics": "pooled", "progress": progress,
            "counts": {"queued": 1, "running": 1, "succeeded": 0, "failed": 0, "canceled": 0},
            "created_at": "2026-11-26T10:00:00Z", "error": null,
            "jobs": [{"id": "0190a0a0-0000-7000-8000-00000000000a"}, {"id": "0190a0a0-0000-7000-8000-00000000000b"}],
        })
    }

    #[test]
    fn a_batch_is_one_ogc_job_with_its_members_linked() {
        let base = BaseUrl("http://h:1".into());
        let info = status_info(&doc("running", 0.456), &base, Some(1_700_000_000_000), None);
        assert_eq!(info["status"], "running");
        assert_eq!(info["jobID"], "0190a0a0-0000-7000-8000-000000000001");
        assert_eq!(info["progress"], 45);
        assert!(info["message"].as_str().unwrap().starts_with("batch of 2 cubes (pooled statistics): 0 succeeded, 1 running, 1 queued"));
        let rels: Vec<&str> = info["links"].as_array().unwrap().iter().map(|l| l["rel"].as_str().unwrap()).collect();
        assert_eq!(rels, ["self", "alternate", "item", "item"], "no results link before it is done");
        assert_eq!(info["links"][2]["href"], "http://h:1/jobs/0190a0a0-0000-7000-8000-00000000000a");
        assert!(info.get("finished").is_none());

        let done = status_info(&doc("succeeded", 1.0), &base, Some(1), Some(2));
        assert_eq!((done["status"].as_str(), done["progress"].as_i64()), (Some("successful"), Some(100)));
        assert!(done["links"].as_array().unwrap().iter().any(|l| l["rel"] == rel::RESULTS));
        // Almost done is not done.
        assert_eq!(status_info(&doc("running", 0.999), &base, None, None)["progress"], 99);
    }

    #[test]
    fn batch_statuses_map_as_job_statuses_do() {
        for (native, ogc) in [("queued", "accepted"), ("running", "running"), ("succeeded", "successful"), ("failed", "failed"), ("canceled", "dismissed")] {
            assert_eq!(ogc_batch_status(native), ogc);
        }
        let mut failed = doc("failed", 1.0);
        failed["error"] = json!({"code": "degenerate_input", "message": "no noise"});
        let info = status_info(&failed, &BaseUrl(String::new()), None, None);
        assert!(info["message"].as_str().unwrap().starts_with("degenerate_input: no noise; batch of 2"), "{info}");
        assert_eq!(info["updated"], "2026-11-26T10:00:00Z");
    }
}

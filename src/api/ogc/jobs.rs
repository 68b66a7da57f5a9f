//! `/jobs`, `/jobs/{id}` (status; DELETE dismisses) and `/jobs/{id}/results`, over the same job rows
//! as `/v1/jobs`. The native statuses map to OGC's: queued → accepted, running → running,
//! succeeded → successful, failed → failed, canceled → dismissed. A batch's id is an OGC job too
//! (`batch_jobs`): an execution of several cubes.

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde_json::{json, Map, Value};

use super::batch_jobs::{self, BatchJob};
use super::problem::{kind, OgcResult, Problem};
use super::outputs::{failure, Output, OutputChoice, Transmission};
use super::process::NPY;
use super::{link, rel, BaseUrl, PROCESS_ID};
use crate::api::auth::Caller;
use crate::api::job_view::owned_job;
use crate::api::ApiContext;
use crate::jobs::{cancel_or_delete, now_ms, rfc3339, Job, JobStatus, Removal};

pub fn ogc_status(s: JobStatus) -> &'static str {
    match s {
        JobStatus::Queued => "accepted",
        JobStatus::Running => "running",
        JobStatus::Succeeded => "successful",
        JobStatus::Failed => "failed",
        JobStatus::Canceled => "dismissed",
    }
}

fn parse_ogc_status(s: &str) -> Option<JobStatus> {
    JobStatus::ALL.into_iter().find(|st| ogc_status(*st) == s)
}

/// The job's statusInfo document. `dismissed` overrides the status for a job whose row was just
/// deleted.
pub fn status_info(job: &Job, base: &BaseUrl, dismissed: bool) -> Value {
    let status = if dismissed { "dismissed" } else { ogc_status(job.status) };
    let message = match (job.status, &job.error_code) {
        _ if dismissed => "dismissed: the job and its results are deleted".to_string(),
        (JobStatus::Failed, Some(code)) => format!("{code}: {}", job.error_message.clone().unwrap_or_default()),
        (JobStatus::Running, _) => format!("running: {}", job.stage.as_deref().unwrap_or("starting")),
        (JobStatus::Queued, _) => "queued".to_string(),
        (JobStatus::Succeeded, _) => "done".to_string(),
        (JobStatus::Canceled, _) => "dismissed".to_string(),
        (JobStatus::Failed, None) => "failed".to_string(),
    };
    let url = base.join(&format!("/jobs/{}", job.id));
    let mut links = vec![
        link(url.clone(), "self", "application/json", "this job's status"),
        link(base.join(&format!("/v1/jobs/{}", job.id)), "alternate", "application/json", "the same job in the native API"),
    ];
    if job.status == JobStatus::Succeeded && !dismissed {
        links.push(link(format!("{url}/results"), rel::RESULTS, "application/json", "the job's results"));
    }
    let mut doc = json!({
        "processID": PROCESS_ID,
        "type": "process",
        "jobID": job.id,
        "status": status,
        "message": message,
        "created": rfc3339(job.created_at),
        // Whole percent, rounded down: 100 only once it is done.
        "progress": if job.status == JobStatus::Succeeded { 100 } else { ((job.progress * 100.0).floor() as i64).clamp(0, 99) },
        "links": links,
    });
    // Absent rather than null: the schema has these as date-times.
    if let Some(t) = job.started_at {
        doc["started"] = json!(rfc3339(t));
    }
    if let Some(t) = job.finished_at {
        doc["finished"] = json!(rfc3339(t));
    }
    doc["updated"] = json!(rfc3339(job.finished_at.or(job.started_at).unwrap_or(job.created_at)));
    doc
}

async fn caller_job(ctx: &ApiContext, caller: &Caller, id: &str) -> OgcResult<Job> {
    owned_job(ctx, caller, id).await.map_err(|e| match e.status() {
        StatusCode::NOT_FOUND => Problem::no_such_job(),
        _ => Problem::from(e),
    })
}

/// What an OGC job id names: a job, or a batch (an execution of several cubes, `batch_jobs`).
enum OgcJob {
    Job(Box<Job>),
    Batch(BatchJob),
}

async fn caller_ogc_job(ctx: &ApiContext, caller: &Caller, id: &str) -> OgcResult<OgcJob> {
    match caller_job(ctx, caller, id).await {
        Ok(job) => Ok(OgcJob::Job(Box::new(job))),
        Err(p) if p.status == StatusCode::NOT_FOUND => match BatchJob::find(ctx, caller, id).await? {
            Some(batch) => Ok(OgcJob::Batch(batch)),
            None => Err(p),
        },
        Err(p) => Err(p),
    }
}

pub async fn status(State(ctx): State<ApiContext>, base: BaseUrl, caller: Caller, Path(id): Path<String>) -> OgcResult<Response> {
    let doc = match caller_ogc_job(&ctx, &caller, &id).await? {
        OgcJob::Job(job) => status_info(&job, &base, false),
        OgcJob::Batch(batch) => batch.status_info(&base),
    };
    Ok(axum::Json(doc).into_response())
}

/// Dismiss: a queued or running job is canceled (and shows as dismissed); a finished one is deleted
/// with its files (afterwards its id is 404). A batch is canceled and deleted whole.
pub async fn dismiss(State(ctx): State<ApiContext>, base: BaseUrl, caller: Caller, Path(id): Path<String>) -> OgcResult<Response> {
    let job = match caller_ogc_job(&ctx, &caller, &id).await? {
        OgcJob::Job(job) => *job,
        OgcJob::Batch(batch) => return Ok(axum::Json(batch_jobs::dismiss(&ctx, &base, &caller, batch).await?).into_response()),
    };
    let doc = match cancel_or_delete(&ctx.runner, job.clone()).await.map_err(crate::api::error::Error::from)? {
        Removal::Canceled => {
            let now = ctx.runner.store.get(&id).await.map_err(crate::api::error::Error::from)?;
            status_info(now.as_ref().unwrap_or(&job), &base, now.is_none())
        }
        Removal::Deleted => status_info(&job, &base, true),
    };
    Ok(axum::Json(doc).into_response())
}

// ---------------------------------------------------------------------------------------------------
// Results

/// The caller's job with results, or the exception the standard asks for: 404 no-such-job,
/// 404 result-not-ready while it is queued or running, the failure's own status when it failed,
/// 410 when it was dismissed.
pub async fn finished_job(ctx: &ApiContext, caller: &Caller, id: &str) -> OgcResult<Job> {
    let job = caller_job(ctx, caller, id).await?;
    match job.status {
        JobStatus::Succeeded => Ok(job),
        JobStatus::Queued | JobStatus::Running => Err(Problem::new(
            StatusCode::NOT_FOUND,
            "not_ready",
            format!("the job is {}; its results are not ready", ogc_status(job.status)),
        )
        .of_kind(kind::RESULT_NOT_READY)),
        JobStatus::Failed => Err(failure(&job)),
        JobStatus::Canceled => Err(Problem::new(StatusCode::GONE, "dismissed", "the job was dismissed; it has no results")),
    }
}

/// The results document: output id → an inline value or a link.
pub async fn results_document(ctx: &ApiContext, base: &BaseUrl, job: &Job, outputs: &[OutputChoice]) -> OgcResult<Value> {
    let mut doc = Map::new();
    for choice in outputs {
        let entry = match choice.transmission {
            Transmission::Reference => {
                // Asked for by reference: still refuse a product the job lacks.
                if choice.output == Output::Denoised {
                    choice.key(job)?;
                }
                json!({"href": choice.href(base, job), "type": choice.media_type(), "rel": "enclosure", "title": choice.output.id()})
            }
            Transmission::Value => {
                let bytes = ctx.runner.storage.get_bytes(choice.key(job)?).await.map_err(crate::api::error::Error::from)?;
                match choice.output {
                    Output::Metadata => {
                        let v: Value = serde_json::from_slice(&bytes).map_err(Problem::internal)?;
                        json!({"value": v, "mediaType": "application/json"})
                    }
                    _ => json!({
                        "value": base64::engine::general_purpose::STANDARD.encode(&bytes),
                        "mediaType": NPY,
                        "encoding": "base64",
                    }),
                }
            }
        };
        doc.insert(choice.output.id().to_string(), entry);
    }
    Ok(Value::Object(doc))
}

pub async fn results(State(ctx): State<ApiContext>, base: BaseUrl, caller: Caller, Path(id): Path<String>) -> OgcResult<Response> {
    if let OgcJob::Batch(batch) = caller_ogc_job(&ctx, &caller, &id).await? {
        return Ok(axum::Json(batch_jobs::results(&base, &batch)?).into_response());
    }
    let job = finished_job(&ctx, &caller, &id).await?;
    let doc = results_document(&ctx, &base, &job, &OutputChoice::defaults(&job)).await?;
    Ok(axum::Json(doc).into_response())
}

// ---------------------------------------------------------------------------------------------------
// The job list

/// Filters of `GET /jobs` (the job-list conformance class).
#[derive(Debug, Default)]
struct ListQuery {
    statuses: Vec<JobStatus>,
    /// False when `processID` or `type` names no process of ours: the list is empty.
    ours: bool,
    limit: u32,
    after: Option<String>,
    /// Created within [from, to] (ms), either end open.
    created: (Option<i64>, Option<i64>),
    min_duration_ms: Option<i64>,
    max_duration_ms: Option<i64>,
}

fn bad_query(m: String) -> Problem {
    Problem::new(StatusCode::BAD_REQUEST, "invalid_query", m)
}

fn parse_time(s: &str) -> OgcResult<i64> {
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
        .map_err(|_| bad_query(format!("datetime must be RFC 3339 times (an instant or start/end, `..` for open), not {s:?}")))?;
    Ok((t.unix_timestamp_nanos() / 1_000_000) as i64)
}

fn parse_list_query(query: Option<&str>) -> OgcResult<ListQuery> {
    let mut q = ListQuery { ours: true, limit: 10, ..Default::default() };
    let seconds = |k: &str, v: &str| -> OgcResult<i64> {
        v.parse::<u64>().map(|s| (s as i64).saturating_mul(1000)).map_err(|_| bad_query(format!("{k} must be whole seconds, not {v:?}")))
    };
    for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        // Several values may come as repeated parameters or comma-separated.
        let values = || v.split(',').map(str::trim).filter(|s| !s.is_empty());
        match k.as_ref() {
            "status" => {
                for s in values() {
                    q.statuses.push(parse_ogc_status(s).ok_or_else(|| {
                        bad_query(format!("status must be accepted, running, successful, failed or dismissed, not {s:?}"))
                    })?);
                }
            }
            "processID" => q.ours &= values().any(|p| p == PROCESS_ID),
            "type" => q.ours &= values().any(|t| t == "process"),
            "limit" => {
                q.limit = v.parse().ok().filter(|n| (1..=1000).contains(n)).ok_or_else(|| bad_query(format!("limit must be an integer from 1 to 1000, not {v:?}")))?
            }
            "after" => {
                let id = uuid::Uuid::parse_str(&v).map_err(|_| bad_query(format!("after must be a job id, not {v:?}")))?;
                q.after = Some(id.to_string());
            }
            "datetime" => {
                q.created = match v.split_once('/') {
                    None => {
                        let t = parse_time(&v)?;
                        (Some(t), Some(t))
                    }
                    Some((a, b)) => {
                        let end = |s: &str| if s.is_empty() || s == ".." { Ok(None) } else { parse_time(s).map(Some) };
                        (end(a)?, end(b)?)
                    }
                }
            }
            "minDuration" => q.min_duration_ms = Some(seconds(&k, &v)?),
            "maxDuration" => q.max_duration_ms = Some(seconds(&k, &v)?),
            "f" if v == "json" => {}
            other => {
                return Err(bad_query(format!(
                    "unknown query parameter {other:?} (status, processID, type, limit, after, datetime, minDuration, maxDuration)"
                )))
            }
        }
    }
    Ok(q)
}

impl ListQuery {
    fn keeps(&self, job: &Job, now: i64) -> bool {
        let duration = job.started_at.map(|s| job.finished_at.unwrap_or(now) - s).unwrap_or(0);
        (self.statuses.is_empty() || self.statuses.contains(&job.status))
            && self.created.0.is_none_or(|t| job.created_at >= t)
            && self.created.1.is_none_or(|t| job.created_at <= t)
            && self.min_duration_ms.is_none_or(|d| duration >= d)
            && self.max_duration_ms.is_none_or(|d| duration <= d)
    }
}

/// Rows looked at for one page at most: a filter that matches little answers a short page with a
/// `next` link rather than scanning everything.
const LIST_SCAN_MAX: usize = 10_000;

pub async fn list(State(ctx): State<ApiContext>, base: BaseUrl, caller: Caller, RawQuery(query): RawQuery) -> OgcResult<Response> {
    let q = parse_list_query(query.as_deref())?;
    let now = now_ms();
    let mut page: Vec<Job> = Vec::new();
    let mut cursor = q.after.clone();
    let mut scanned = 0usize;
    let mut next: Option<String> = None;
    // One status is filtered by the database; several, and the other filters, here.
    let db_status = if q.statuses.len() == 1 { Some(q.statuses[0]) } else { None };
    if q.ours {
        loop {
            let batch = ctx.runner.store.list(&caller.owner, db_status, 200, cursor.as_deref()).await.map_err(crate::api::error::Error::from)?;
            let exhausted = batch.len() < 200;
            for job in batch {
                scanned += 1;
                cursor = Some(job.id.clone());
                if q.keeps(&job, now) {
                    if page.len() == q.limit as usize {
                        next = page.last().map(|j| j.id.clone());
                        break;
                    }
                    page.push(job);
                }
            }
            if next.is_some() || exhausted {
                break;
            }
            if scanned >= LIST_SCAN_MAX {
                next = cursor.clone();
                break;
            }
        }
    }
    let jobs: Vec<Value> = page.iter().map(|j| status_info(j, &base, false)).collect();
    let mut links = vec![link(base.join("/jobs"), "self", "application/json", "the caller's jobs")];
    if let Some(after) = next {
        // The same filters, from where this page ended.
        let mut params: Vec<(String, String)> =
            form_urlencoded::parse(query.as_deref().unwrap_or("").as_bytes()).filter(|(k, _)| k != "after").map(|(k, v)| (k.into_owned(), v.into_owned())).collect();
        params.push(("after".into(), after));
        let qs = form_urlencoded::Serializer::new(String::new()).extend_pairs(params).finish();
        links.push(link(base.join(&format!("/jobs?{qs}")), "next", "application/json", "the next page"));
    }
    Ok(axum::Json(json!({"jobs": jobs, "links": links})).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_both_ways() {
        for s in JobStatus::ALL {
            assert_eq!(parse_ogc_status(ogc_status(s)), Some(s));
        }
        assert_eq!(parse_ogc_status("succeeded"), None);
    }

    #[test]
    fn list_query() {
        let q = parse_list_query(Some("status=accepted,running&status=failed&processID=mnf&limit=5&minDuration=2")).unwrap();
        assert_eq!(q.statuses, vec![JobStatus::Queued, JobStatus::Running, JobStatus::Failed]);
        assert!(q.ours);
        assert_eq!((q.limit, q.min_duration_ms), (5, Some(2000)));
        assert!(!parse_list_query(Some("processID=other")).unwrap().ours);
        assert!(!parse_list_query(Some("type=wps")).unwrap().ours);
        let q = parse_list_query(Some("datetime=2026-11-24T00:00:00Z/..")).unwrap();
        assert!(q.created.0.is_some() && q.created.1.is_none());
        for bad in ["status=succeeded", "limit=0", "datetime=yesterday", "minDuration=-1", "colour=red", "after=x"] {
            assert_eq!(parse_list_query(Some(bad)).unwrap_err().status, StatusCode::BAD_REQUEST, "{bad}");
        }
    }
}

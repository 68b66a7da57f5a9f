//! OGC API – Processes, Part 1: Core (1.0, JSON), beside the native `/v1` API and over the same jobs,
//! API keys and job cache: one process, `mnf`. A job made here is the same row `/v1/jobs/{id}` shows,
//! and the other way round; only the vocabulary differs (`status_info` maps it).
//!
//! Routes: `/` (landing page), `/conformance`, `/api` (this server's OpenAPI document),
//! `/processes`, `/processes/mnf`, `/processes/mnf/execution`, `/jobs`, `/jobs/{id}` (GET: status,
//! DELETE: dismiss), `/jobs/{id}/results`. The landing page, conformance, API definition and process
//! descriptions are public; jobs and execution need the API key as `/v1` does.

pub mod batch_jobs;
pub mod execute;
pub mod jobs;
pub mod landing;
mod links;
pub mod outputs;
pub mod problem;
pub mod process;

use axum::routing::{get, post};
use axum::Router;

pub use links::{link, rel, BaseUrl};
pub use process::PROCESS_ID;

use super::ApiContext;

pub fn routes() -> Router<ApiContext> {
    Router::new()
        .route("/", get(landing::landing))
        .route("/conformance", get(landing::conformance))
        .route("/api", get(landing::api_definition))
        .route("/processes", get(process::list))
        .route("/processes/{process_id}", get(process::describe))
        .route("/processes/{process_id}/execution", post(execute::execute))
        .route("/jobs", get(jobs::list))
        .route("/jobs/{job_id}", get(jobs::status).delete(jobs::dismiss))
        .route("/jobs/{job_id}/results", get(jobs::results))
        .layer(axum::middleware::map_response(problem::problemize))
}

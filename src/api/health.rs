//! `/healthz`, `/readyz`, `/metrics` and `/v1/info`.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::auth::Caller;
use super::error::{ApiResult, Error};
use super::ApiContext;

/// How long `/readyz` waits for the database and for the store, each: the two together stay under a
/// second.
const READY_CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(450);

/// The process is up and answering.
pub async fn healthz() -> Response {
    axum::Json(json!({"status": "ok"})).into_response()
}

/// The database and the storage answer, and the default backend is initialised (it is created before
/// the server listens, so reaching here means it is).
pub async fn readyz(State(ctx): State<ApiContext>) -> Response {
    let unavailable = |what: &str, e: &dyn std::fmt::Display| {
        tracing::warn!("not ready: {what}: {e}");
        Error::new(StatusCode::SERVICE_UNAVAILABLE, "not_ready", format!("{what} is not reachable")).into_response()
    };
    // Each check within READY_CHECK_TIMEOUT: a load balancer asks often and acts on a prompt answer.
    match tokio::time::timeout(READY_CHECK_TIMEOUT, ctx.runner.store.ping()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return unavailable("the database", &e),
        Err(_) => return unavailable("the database", &"no answer within the readiness timeout"),
    }
    match tokio::time::timeout(READY_CHECK_TIMEOUT, ctx.runner.storage.check()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return unavailable("the storage", &e),
        Err(_) => return unavailable("the storage", &"no answer within the readiness timeout"),
    }
    let b = ctx.runner.backends.default_backend();
    axum::Json(json!({"status": "ready", "backend": b.name(), "device": b.device()})).into_response()
}

pub async fn metrics(State(ctx): State<ApiContext>) -> ApiResult<Response> {
    let text = super::metrics::render(&ctx.metrics, &ctx.runner).await?;
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response())
}

/// Version, backends, devices, and `max_upload_bytes`: the effective upload limit, as resolved at
/// start-up (`ServeArgs::resolve_upload_limit`: the option's value as given, or the 64 GiB default
/// capped by the data dir's free space).
pub async fn info(State(ctx): State<ApiContext>, _caller: Caller) -> Response {
    let b = ctx.runner.backends.default_backend();
    let mut backends = vec![json!({"name": "cpu", "device": if b.name() == "cpu" { b.device() } else { "CPU".to_string() }})];
    if b.name() != "cpu" {
        backends.push(json!({"name": b.name(), "device": b.device()}));
    }
    axum::Json(json!({
        "version": env!("CARGO_PKG_VERSION"),
        "default_backend": b.name(),
        "backends": backends,
        "devices": [b.device()],
        "max_upload_bytes": ctx.config.max_upload_bytes,
    }))
    .into_response()
}

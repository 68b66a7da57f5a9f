//! The OGC API's one error type: exceptions as RFC 7807 problem details (`type`, `title`, `status`,
//! `detail`, as OGC API – Processes 1.0's exception.yaml has them), served as
//! `application/problem+json`. The `code` member is the native API's stable code for the same
//! failure, so that a client of both sees one vocabulary.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::api::error::Error;

pub const PROBLEM_JSON: &str = "application/problem+json";

/// The exception types OGC API – Processes 1.0 names; everything else is `about:blank` (RFC 7807:
/// no more meaning than the status) with `code` telling which failure it was.
pub mod kind {
    pub const NO_SUCH_PROCESS: &str = "http://www.opengis.net/def/exceptions/ogcapi-processes-1/1.0/no-such-process";
    pub const NO_SUCH_JOB: &str = "http://www.opengis.net/def/exceptions/ogcapi-processes-1/1.0/no-such-job";
    pub const RESULT_NOT_READY: &str = "http://www.opengis.net/def/exceptions/ogcapi-processes-1/1.0/result-not-ready";
    pub const BLANK: &str = "about:blank";
}

#[derive(Debug)]
pub struct Problem {
    pub status: StatusCode,
    pub kind: &'static str,
    pub code: String,
    pub detail: String,
}

pub type OgcResult<T> = Result<T, Problem>;

impl Problem {
    pub fn new(status: StatusCode, code: &str, detail: impl Into<String>) -> Problem {
        Problem { status, kind: kind::BLANK, code: code.to_string(), detail: detail.into() }
    }
    pub fn of_kind(mut self, kind: &'static str) -> Problem {
        self.kind = kind;
        self
    }
    /// A client mistake in the execute request (400, `invalid_input`).
    pub fn invalid_input(detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::BAD_REQUEST, "invalid_input", detail)
    }
    pub fn no_such_job() -> Problem {
        Problem::new(StatusCode::NOT_FOUND, "not_found", "no such job").of_kind(kind::NO_SUCH_JOB)
    }
    pub fn no_such_process(id: &str) -> Problem {
        Problem::new(StatusCode::NOT_FOUND, "not_found", format!("no such process {id:?}: this server offers `mnf`"))
            .of_kind(kind::NO_SUCH_PROCESS)
    }
    pub fn internal(e: impl Into<anyhow::Error>) -> Problem {
        Problem::from(Error::internal(e))
    }
}

impl From<Error> for Problem {
    /// The native API's errors keep their status and code. Internal ones are logged here, with their
    /// detail, and answered without it (as `/v1` does).
    fn from(e: Error) -> Problem {
        match e {
            Error::Client { status, code, message } => {
                let kind = if code == "not_found" { kind::NO_SUCH_JOB } else { kind::BLANK };
                Problem { status, kind, code: code.to_string(), detail: message }
            }
            Error::Internal(e) => {
                tracing::error!("internal error: {e:#}");
                Problem::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "internal error; see the server log")
            }
        }
    }
}

pub fn problem_response(status: StatusCode, kind: &str, code: &str, detail: &str) -> Response {
    let title = status.canonical_reason().unwrap_or("Error");
    let body = json!({"type": kind, "title": title, "status": status.as_u16(), "detail": detail, "code": code});
    let mut r = (status, body.to_string()).into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    r
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        problem_response(self.status, self.kind, &self.code, &self.detail)
    }
}

/// Turns every other error answer on the OGC routes (an extractor's rejection such as a missing API
/// key, the router's 405) into a problem, keeping the native `{"code", "message"}` it may carry.
pub async fn problemize(resp: Response) -> Response {
    let status = resp.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let content_type = resp.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    if content_type.starts_with(PROBLEM_JSON) {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    // Error bodies are small; one that is not is not ours, and gets the status's own words.
    let bytes = axum::body::to_bytes(body, 64 << 10).await.unwrap_or_default();
    let native: Option<(String, String)> = serde_json::from_slice::<serde_json::Value>(&bytes).ok().and_then(|v| {
        Some((v.get("code")?.as_str()?.to_string(), v.get("message")?.as_str()?.to_string()))
    });
    let (code, detail) = native.unwrap_or_else(|| {
        let reason = status.canonical_reason().unwrap_or("error");
        (reason.to_ascii_lowercase().replace(' ', "_"), reason.to_string())
    });
    let mut out = problem_response(status, kind::BLANK, &code, &detail);
    for (k, v) in &parts.headers {
        if k != header::CONTENT_TYPE && k != header::CONTENT_LENGTH && k != header::CONTENT_ENCODING {
            out.headers_mut().insert(k.clone(), v.clone());
        }
    }
    out
}

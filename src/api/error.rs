//! The API's one error type: every failure becomes `{"code", "message"}` with its status. Internal
//! errors are logged with their detail and answered with a generic message (no internals leak).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::cube::CubeError;
use crate::jobs::{PersistError, StoreError};
use crate::mnf::MnfError;
use crate::storage::StorageError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad input the client can fix: status, stable code, message.
    #[error("{message}")]
    Client { status: StatusCode, code: &'static str, message: String },
    /// Something broke on our side: logged, answered 500 `internal` without details.
    #[error("internal: {0:#}")]
    Internal(anyhow::Error),
}

pub type ApiResult<T> = Result<T, Error>;

/// What a 503 tells a client to wait before it tries again (seconds).
pub const RETRY_AFTER_SECS: &str = "2";

impl Error {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Error {
        Error::Client { status, code, message: message.into() }
    }
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Error {
        Error::new(StatusCode::BAD_REQUEST, code, message)
    }
    pub fn unprocessable(code: &'static str, message: impl Into<String>) -> Error {
        Error::new(StatusCode::UNPROCESSABLE_ENTITY, code, message)
    }
    pub fn not_found() -> Error {
        Error::new(StatusCode::NOT_FOUND, "not_found", "no such job")
    }
    pub fn too_large(message: impl Into<String>) -> Error {
        Error::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", message)
    }
    pub fn unauthorized() -> Error {
        Error::new(StatusCode::UNAUTHORIZED, "unauthorized", "missing or unknown API key (Authorization: Bearer <key>)")
    }
    pub fn internal(e: impl Into<anyhow::Error>) -> Error {
        Error::Internal(e.into())
    }
    /// An error writing this server's own disk: a full disk (507 `insufficient_storage`) or one it may
    /// not write (503 `storage_unavailable`) is said as such, so that a client knows to retry later
    /// and an operator sees it in the log; anything else is internal.
    pub fn disk(e: std::io::Error) -> Error {
        let (status, code, message) = match e.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => {
                (StatusCode::INSUFFICIENT_STORAGE, "insufficient_storage", "the server's disk is full: the upload cannot be stored now")
            }
            Some(libc::EROFS) | Some(libc::EACCES) | Some(libc::EPERM) => {
                (StatusCode::SERVICE_UNAVAILABLE, "storage_unavailable", "the server cannot write to its data directory")
            }
            _ => return Error::internal(e),
        };
        tracing::error!("{message}: {e}");
        Error::new(status, code, message)
    }
    /// The same error, its message prefixed (which of several inputs it is about); internal errors
    /// are left as they are (their message is not shown).
    pub fn prefixed(self, prefix: &str) -> Error {
        match self {
            Error::Client { status, code, message } => Error::Client { status, code, message: format!("{prefix}{message}") },
            other => other,
        }
    }
    /// The same error with `path` (a file of this server's, which the client must not see) named
    /// `name` in its message; internal errors are left as they are.
    pub fn naming(self, path: &str, name: &str) -> Error {
        match self {
            Error::Client { status, code, message } => Error::Client { status, code, message: message.replace(path, name) },
            other => other,
        }
    }
    pub fn status(&self) -> StatusCode {
        match self {
            Error::Client { status, .. } => *status,
            Error::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
    pub fn code(&self) -> &'static str {
        match self {
            Error::Client { code, .. } => code,
            Error::Internal(_) => "internal",
        }
    }
}

/// The JSON body of every error response.
#[derive(serde::Serialize)]
pub struct ErrorBody<'a> {
    pub code: &'a str,
    pub message: &'a str,
}

pub fn json_error(status: StatusCode, code: &str, message: &str) -> Response {
    let body = serde_json::to_vec(&ErrorBody { code, message }).expect("error body serialises");
    let mut r = (status, body).into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    if status == StatusCode::SERVICE_UNAVAILABLE {
        // A database or store that went away is usually back within seconds (a restart, a failover).
        r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER_SECS));
    }
    r
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        match self {
            Error::Client { status, code, message } => json_error(status, code, &message),
            Error::Internal(e) => {
                tracing::error!("internal error: {e:#}");
                json_error(StatusCode::INTERNAL_SERVER_ERROR, "internal", "internal error; see the server log")
            }
        }
    }
}

impl From<CubeError> for Error {
    fn from(e: CubeError) -> Error {
        let status = match &e {
            CubeError::Io { .. } => return Error::internal(e),
            CubeError::Header(_) | CubeError::SizeMismatch(_) | CubeError::Npy(_) => StatusCode::BAD_REQUEST,
            CubeError::Unsupported(_) => StatusCode::UNPROCESSABLE_ENTITY,
            CubeError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            CubeError::NeedsGdal(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        };
        Error::new(status, e.code(), e.to_string())
    }
}

impl From<MnfError> for Error {
    fn from(e: MnfError) -> Error {
        match e {
            MnfError::InvalidParams(_) => Error::unprocessable("invalid_params", e.to_string()),
            other => Error::unprocessable(other.code(), other.to_string()),
        }
    }
}

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Error {
        if e.is_unavailable() {
            tracing::warn!("the database is unavailable: {e}");
            return Error::new(StatusCode::SERVICE_UNAVAILABLE, "database_unavailable", "the job database cannot be reached now; retry shortly");
        }
        Error::internal(e)
    }
}

impl From<PersistError> for Error {
    fn from(e: PersistError) -> Error {
        match e {
            PersistError::Store(e) => e.into(),
            PersistError::Storage(e) => e.into(),
        }
    }
}

impl From<StorageError> for Error {
    fn from(e: StorageError) -> Error {
        match e {
            StorageError::Io { source, op, path } => match Error::disk(source) {
                // Keep the operation and the file in the log for anything else.
                Error::Internal(source) => Error::internal(source.context(format!("cannot {op} {}", path.display()))),
                known => known,
            },
            // The object store did not answer, or answered with its own failure (object_store reports
            // both, after its retries, as `Generic`): to retry, as with the database. Its specific
            // answers (a refusal of our credentials, a missing object, a failed precondition) are
            // not an outage, and stay what they were.
            ref outage if outage.is_unavailable() => {
                tracing::warn!("the object store is unavailable: {e}");
                Error::new(StatusCode::SERVICE_UNAVAILABLE, "storage_unavailable", "the object store cannot be reached now; retry shortly")
            }
            other => Error::internal(other),
        }
    }
}

/// Turns the framework's own error answers (unknown route, wrong method, timeout, a body past a
/// limit layer) into the JSON error shape, so that every error looks alike.
pub async fn jsonify_errors(resp: Response) -> Response {
    let status = resp.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        // The OGC API's problem details are JSON already.
        .is_some_and(|v| v.starts_with("application/json") || v.starts_with("application/problem+json"));
    if is_json {
        return resp;
    }
    let code = match status {
        StatusCode::BAD_REQUEST => "bad_request",
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::REQUEST_TIMEOUT => "timeout",
        StatusCode::PAYLOAD_TOO_LARGE => "too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        StatusCode::UNPROCESSABLE_ENTITY => "invalid_request",
        _ if status.is_server_error() => "internal",
        _ => "error",
    };
    let message = status.canonical_reason().unwrap_or("error").to_string();
    let mut out = json_error(status, code, &message);
    for (k, v) in resp.headers() {
        if k != header::CONTENT_TYPE && k != header::CONTENT_LENGTH && k != header::CONTENT_ENCODING {
            out.headers_mut().insert(k.clone(), v.clone());
        }
    }
    out
}

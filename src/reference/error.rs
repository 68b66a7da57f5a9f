//! Why a reference cannot be read.

/// Why a reference cannot be read, each with its stable code (the API's `code`, or a job's
/// `error.code`).
#[derive(Debug, Clone, thiserror::Error)]
pub enum RefError {
    /// Malformed: 400 `invalid_href`.
    #[error("{0}")]
    Invalid(String),
    /// Outside the operator's allow-lists or the address policy: 403 `forbidden_reference`.
    #[error("{0}")]
    Forbidden(String),
    /// No such object (or host): 404 `input_not_found`.
    #[error("{0}")]
    NotFound(String),
    /// The server answered with a redirect, which is never followed: 422 `redirect_refused`.
    #[error("{0}")]
    Redirect(String),
    /// The object changed since the job was submitted: `input_changed` (409 at submit).
    #[error("{0}")]
    Changed(String),
    /// The object is not a cube this server reads (its name or its header): 422 `unsupported`.
    #[error("{0}")]
    Unsupported(String),
    /// The object's store or host failed or could not be reached: 502 `reference_unavailable`.
    #[error("{0}")]
    Unavailable(String),
}

impl RefError {
    pub fn code(&self) -> &'static str {
        match self {
            RefError::Invalid(_) => "invalid_href",
            RefError::Forbidden(_) => "forbidden_reference",
            RefError::NotFound(_) => "input_not_found",
            RefError::Redirect(_) => "redirect_refused",
            RefError::Changed(_) => "input_changed",
            RefError::Unsupported(_) => "unsupported",
            RefError::Unavailable(_) => "reference_unavailable",
        }
    }

    /// The HTTP status of the error at submit.
    pub fn status(&self) -> u16 {
        match self {
            RefError::Invalid(_) => 400,
            RefError::Forbidden(_) => 403,
            RefError::NotFound(_) => 404,
            RefError::Redirect(_) | RefError::Unsupported(_) => 422,
            RefError::Changed(_) => 409,
            RefError::Unavailable(_) => 502,
        }
    }
}

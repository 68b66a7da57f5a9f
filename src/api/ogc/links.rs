//! What OGC documents link with: the link objects, the OGC relation types, and this server's base URL.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use serde_json::{json, Value};

/// The OGC link relation types used in links (OGC API – Common / Processes 1.0).
pub mod rel {
    pub const CONFORMANCE: &str = "http://www.opengis.net/def/rel/ogc/1.0/conformance";
    pub const PROCESSES: &str = "http://www.opengis.net/def/rel/ogc/1.0/processes";
    pub const JOB_LIST: &str = "http://www.opengis.net/def/rel/ogc/1.0/job-list";
    pub const EXECUTE: &str = "http://www.opengis.net/def/rel/ogc/1.0/execute";
    pub const RESULTS: &str = "http://www.opengis.net/def/rel/ogc/1.0/results";
    pub const PROCESS_DESC: &str = "http://www.opengis.net/def/rel/ogc/1.0/process-desc";
}

/// Where this server is, as the client reached it (`Host`, and `X-Forwarded-Proto` behind a TLS
/// proxy), so that links are absolute URLs clients can follow as they are. Without a usable `Host`,
/// links are absolute paths.
#[derive(Debug, Clone)]
pub struct BaseUrl(pub String);

impl BaseUrl {
    pub fn join(&self, path: &str) -> String {
        format!("{}{path}", self.0)
    }
}

impl<S: Send + Sync> FromRequestParts<S> for BaseUrl {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<BaseUrl, Self::Rejection> {
        let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
        // Only a plain host[:port] goes into links: nothing a header could smuggle into them.
        let host = header("host").filter(|h| {
            !h.is_empty() && h.len() <= 255 && h.bytes().all(|b| b.is_ascii_alphanumeric() || b".-:[]_".contains(&b))
        });
        let scheme = match header("x-forwarded-proto") {
            Some(p) if p.eq_ignore_ascii_case("https") => "https",
            _ => "http",
        };
        Ok(BaseUrl(host.map(|h| format!("{scheme}://{h}")).unwrap_or_default()))
    }
}

/// A link object (OGC API – Common's link.yaml).
pub fn link(href: String, rel: &str, media_type: &str, title: &str) -> Value {
    json!({"href": href, "rel": rel, "type": media_type, "title": title})
}

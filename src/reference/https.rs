//! `https://` references: reqwest on the rustls `object_store` already uses, with one client per
//! opened reference, pinned to the address the policy checked (`ClientBuilder::resolve`), no proxy
//! from the environment, no redirect followed (a 3xx is `redirect_refused`: following one would
//! leave the allow-list), and timeouts on connecting and on every read.

use std::net::SocketAddr;
use std::ops::Range;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use reqwest::header;
use reqwest::StatusCode;

use super::policy::UrlHost;
use super::{ObjectVersion, RefError};

/// Opening a connection longer than this fails it.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A read that waits longer than this for its next bytes fails.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The trusted CAs: the system's, and the operator's `--input-ca-cert` files.
#[derive(Default)]
pub struct Settings {
    extra_roots: Vec<reqwest::Certificate>,
}

impl Settings {
    pub fn new(ca_certs: &[PathBuf]) -> anyhow::Result<Settings> {
        let mut extra_roots = Vec::new();
        for p in ca_certs {
            let pem = std::fs::read(p).map_err(|e| anyhow::anyhow!("cannot read --input-ca-cert {}: {e}", p.display()))?;
            let certs =
                reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| anyhow::anyhow!("--input-ca-cert {} is not a PEM certificate: {e}", p.display()))?;
            if certs.is_empty() {
                anyhow::bail!("--input-ca-cert {} holds no PEM certificate", p.display());
            }
            extra_roots.extend(certs);
        }
        Ok(Settings { extra_roots })
    }

    /// A client that reaches `host` only at `addr`.
    pub(super) fn client(&self, host: &UrlHost, addr: SocketAddr) -> Result<reqwest::Client, RefError> {
        let mut b = reqwest::Client::builder()
            .use_rustls_tls()
            .https_only(true)
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(READ_TIMEOUT)
            .user_agent(concat!("hypermnf/", env!("CARGO_PKG_VERSION")));
        if let UrlHost::Name(name) = host {
            b = b.resolve(name, addr);
        }
        for c in &self.extra_roots {
            b = b.add_root_certificate(c.clone());
        }
        b.build().map_err(|e| RefError::Unavailable(format!("cannot build the https client: {e}")))
    }
}

/// The error for an answer that is not the object.
fn answered(url: &reqwest::Url, r: &reqwest::Response) -> RefError {
    let status = r.status();
    if status.is_redirection() {
        let to = r.headers().get(header::LOCATION).and_then(|v| v.to_str().ok()).unwrap_or("elsewhere");
        return RefError::Redirect(format!("{url} answered {status} (to {to}); redirects are not followed: reference the final URL, on an allowed host"));
    }
    match status {
        StatusCode::NOT_FOUND | StatusCode::GONE => RefError::NotFound(format!("{url} does not exist ({status})")),
        StatusCode::PRECONDITION_FAILED => RefError::Changed(format!("{url} changed since the job was submitted")),
        _ => RefError::Unavailable(format!("{url} answered {status}")),
    }
}

fn sent(url: &reqwest::Url, e: reqwest::Error) -> RefError {
    RefError::Unavailable(format!("cannot read {url}: {e}"))
}

fn header_str(r: &reqwest::Response, name: header::HeaderName) -> Option<String> {
    r.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string)
}

pub(super) async fn head(client: &reqwest::Client, url: &reqwest::Url) -> Result<ObjectVersion, RefError> {
    let r = client.head(url.clone()).send().await.map_err(|e| sent(url, e))?;
    if !r.status().is_success() {
        return Err(answered(url, &r));
    }
    let size = header_str(&r, header::CONTENT_LENGTH)
        .and_then(|v| v.trim().parse::<u64>().ok())
        .ok_or_else(|| RefError::Unsupported(format!("{url} gives no Content-Length: its size must be known")))?;
    Ok(ObjectVersion { href: url.to_string(), size, etag: header_str(&r, header::ETAG), last_modified: header_str(&r, header::LAST_MODIFIED) })
}

pub(super) async fn get_range(client: &reqwest::Client, url: &reqwest::Url, range: Range<u64>, v: &ObjectVersion) -> Result<Bytes, RefError> {
    let mut req = client.get(url.clone()).header(header::RANGE, format!("bytes={}-{}", range.start, range.end - 1));
    // If-Match compares strongly: a weak ETag never matches it, so it is compared below instead.
    match (&v.etag, &v.last_modified) {
        (Some(e), _) if !e.starts_with("W/") => req = req.header(header::IF_MATCH, e),
        (None, Some(t)) => req = req.header(header::IF_UNMODIFIED_SINCE, t),
        _ => {}
    }
    let r = req.send().await.map_err(|e| sent(url, e))?;
    let changed = || RefError::Changed(format!("{url} changed since the job was submitted"));
    let whole = range.start == 0 && range.end == v.size;
    match r.status() {
        StatusCode::PARTIAL_CONTENT => {
            // `bytes a-b/total`: the total is the recorded size, or the object changed.
            let total = header_str(&r, header::CONTENT_RANGE).and_then(|c| c.rsplit_once('/').and_then(|(_, t)| t.trim().parse::<u64>().ok()));
            if total.is_some_and(|t| t != v.size) {
                return Err(changed());
            }
        }
        StatusCode::OK if whole => {}
        StatusCode::OK => return Err(RefError::Unsupported(format!("{url} does not answer ranged requests (Range)"))),
        _ => return Err(answered(url, &r)),
    }
    let etag = header_str(&r, header::ETAG);
    if v.etag.is_some() && etag.is_some() && etag != v.etag {
        return Err(changed());
    }
    let want = range.end - range.start;
    if r.content_length().is_some_and(|n| n != want) {
        return Err(changed());
    }
    r.bytes().await.map_err(|e| sent(url, e))
}

//! Cubes by reference: `s3://bucket/key` and `https://host/path`, beside the `file://` hrefs of
//! `api::href`.
//!
//! - [`Reference::parse`] reads an href; [`References`] holds the operator's allow-lists
//!   ([`policy`]) and opens an [`Object`] for a reference the policy allows: through `object_store`
//!   ([`s3`], with the server's own S3 settings) or a pinned, redirect-free HTTPS client ([`https`]).
//! - At submit, the API reads only the header (a ranged GET or two) and records each object's size
//!   and version (ETag, else Last-Modified) in the job ([`Stored`]).
//! - The worker ([`fetch`]) reads the objects with parallel ranged GETs into the job's scratch, each
//!   GET conditional on the recorded version: an object changed since the submit fails the job with
//!   `input_changed` instead of mixing two versions.

mod error;
pub mod fetch;
pub mod https;
pub mod policy;
pub mod s3;
mod version;

use std::collections::HashMap;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

pub use error::RefError;
use policy::{AllowLists, UrlHost};
pub use version::ObjectVersion;

/// A parsed `s3://` or `https://` reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reference {
    S3 { bucket: String, key: String },
    Https(reqwest::Url),
}

impl Reference {
    /// The reference an href names; None for any other scheme (`file://` is `api::href`'s). `http://`
    /// is invalid here, as any scheme the server does not read: a plain connection can be altered on
    /// the way, and the reader would trust what it got.
    pub fn parse(href: &str) -> Result<Option<Reference>, RefError> {
        let lower = href.get(..8).unwrap_or(href).to_ascii_lowercase();
        if lower.starts_with("http://") {
            return Err(RefError::Invalid("plain http:// is not read: use https:// (on a host allowed by --input-host)".into()));
        }
        if lower.starts_with("s3://") {
            let rest = &href[5..];
            let (bucket, key) = rest.split_once('/').ok_or_else(|| RefError::Invalid("an s3 reference is s3://bucket/key".into()))?;
            let valid_bucket =
                (3..=63).contains(&bucket.len()) && bucket.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
            if !valid_bucket {
                return Err(RefError::Invalid(format!("{bucket:?} is not an S3 bucket name")));
            }
            let key = percent_encoding::percent_decode_str(key).decode_utf8().map_err(|_| RefError::Invalid("the s3 key is not UTF-8 once decoded".into()))?;
            if key.is_empty() || key.ends_with('/') || key.split('/').any(|p| p.is_empty() || p == "." || p == "..") {
                return Err(RefError::Invalid(format!("{key:?} is not an object key (no empty, `.` or `..` parts)")));
            }
            return Ok(Some(Reference::S3 { bucket: bucket.to_string(), key: key.into_owned() }));
        }
        if lower.starts_with("https://") {
            let url = reqwest::Url::parse(href).map_err(|e| RefError::Invalid(format!("not a URL: {e}")))?;
            if !url.username().is_empty() || url.password().is_some() {
                return Err(RefError::Invalid("an https reference may not carry credentials".into()));
            }
            if url.host().is_none() || url.path().ends_with('/') {
                return Err(RefError::Invalid("an https reference names a file: https://host/path/name".into()));
            }
            let mut url = url;
            url.set_fragment(None);
            return Ok(Some(Reference::Https(url)));
        }
        Ok(None)
    }

    /// The href, as recorded.
    pub fn href(&self) -> String {
        match self {
            Reference::S3 { bucket, key } => format!("s3://{bucket}/{key}"),
            Reference::Https(url) => url.to_string(),
        }
    }

    /// The object's file name (its key's or path's last part), which says its format.
    pub fn file_name(&self) -> String {
        let last = match self {
            Reference::S3 { key, .. } => key.rsplit('/').next().unwrap_or(key).to_string(),
            Reference::Https(url) => url.path_segments().and_then(|mut s| s.next_back()).unwrap_or("").to_string(),
        };
        percent_encoding::percent_decode_str(&last).decode_utf8_lossy().into_owned()
    }

    /// The reference to `name` beside this one (an ENVI header's data object). An https URL keeps
    /// no query: the data object's own name is all it has.
    pub fn sibling(&self, name: &str) -> Reference {
        match self {
            Reference::S3 { bucket, key } => {
                let dir = key.rsplit_once('/').map(|(d, _)| format!("{d}/")).unwrap_or_default();
                Reference::S3 { bucket: bucket.clone(), key: format!("{dir}{name}") }
            }
            Reference::Https(url) => {
                let mut u = url.clone();
                if let Ok(mut segs) = u.path_segments_mut() {
                    segs.pop().push(name);
                }
                u.set_query(None);
                Reference::Https(u)
            }
        }
    }
}

/// The names an ENVI header's data object may have beside it, in the order the local reader tries
/// them (`cube::envi::data_file`): the name without `.hdr`, then the usual extensions.
pub fn envi_data_names(header_name: &str) -> Vec<String> {
    let stem = header_name.strip_suffix(".hdr").or_else(|| header_name.strip_suffix(".HDR")).unwrap_or(header_name);
    let mut names = vec![stem.to_string()];
    const EXTS: [&str; 6] = ["img", "dat", "raw", "bsq", "bil", "bip"];
    names.extend(EXTS.iter().map(|e| format!("{stem}.{e}")));
    names.extend(EXTS.iter().map(|e| format!("{stem}.{}", e.to_uppercase())));
    names.retain(|n| n != header_name);
    names
}

/// A referenced job's `input_location`: JSON (a `file://` href's location is its path, which starts
/// with `/`; this starts with `{`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stored {
    /// The object the href named: a `.npy`, an ENVI header, or a GDAL format's file.
    #[serde(flatten)]
    pub object: ObjectVersion,
    /// An ENVI header's data object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<ObjectVersion>,
}

impl Stored {
    /// The stored reference of a job's `input_location`, if it is one.
    pub fn of_location(location: &str) -> Option<Stored> {
        location.starts_with('{').then(|| serde_json::from_str(location).ok()).flatten()
    }

    pub fn to_location(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The memo's key (table `reference_digests`): the objects and their versions, whoever asks.
    pub fn memo_key(&self) -> String {
        self.to_location()
    }
}

/// The server's reference settings: allow-lists, the S3 settings (the AWS_* variables, as for
/// `--store s3://`), extra trusted CAs for https, and the clients opened so far.
pub struct References {
    lists: AllowLists,
    https: https::Settings,
    s3: Mutex<HashMap<String, Arc<dyn object_store::ObjectStore>>>,
}

impl References {
    /// Nothing allowed: every reference is refused (tests, and a runner built without options).
    pub fn none() -> References {
        References { lists: AllowLists::default(), https: https::Settings::default(), s3: Mutex::default() }
    }

    /// From `--input-bucket`, `--input-host` and `--input-ca-cert`.
    pub fn new(buckets: &[String], hosts: &[String], ca_certs: &[PathBuf]) -> anyhow::Result<References> {
        let lists = AllowLists::new(buckets, hosts).map_err(anyhow::Error::msg)?;
        let https = https::Settings::new(ca_certs)?;
        Ok(References { lists, https, s3: Mutex::default() })
    }

    /// Whether any reference can be allowed at all (for `/v1/info`-like reports and logs).
    pub fn allows_any(&self) -> bool {
        !self.lists.buckets.is_empty() || !self.lists.hosts.is_empty()
    }

    /// Checks `r` against the policy and opens it: a bucket must be allow-listed; a host must be,
    /// and its addresses must pass (`policy::AllowLists::check_addresses`), the connection then
    /// pinned to the checked one. Nothing is sent yet.
    pub async fn open(&self, r: &Reference) -> Result<Object, RefError> {
        match r {
            Reference::S3 { bucket, key } => {
                self.lists.check_bucket(bucket)?;
                let store = self.s3_store(bucket)?;
                Ok(Object::S3 { store, path: object_store::path::Path::from(key.as_str()), href: r.href() })
            }
            Reference::Https(url) => {
                let port = url.port_or_known_default().unwrap_or(443);
                let raw = url.host_str().ok_or_else(|| RefError::Invalid("an https reference needs a host".into()))?;
                // The URL parser gives IPv6 hosts in brackets and IPv4 ones normalized (no octal tricks).
                let host = match raw.trim_start_matches('[').trim_end_matches(']').parse::<std::net::IpAddr>() {
                    Ok(ip) => UrlHost::Ip(ip),
                    Err(_) => UrlHost::Name(raw.to_ascii_lowercase()),
                };
                self.lists.check_host(&host, port)?;
                let (name, addrs) = match &host {
                    UrlHost::Ip(ip) => (ip.to_string(), vec![*ip]),
                    UrlHost::Name(n) => (n.clone(), resolve(n, port).await?),
                };
                let ip = self.lists.check_addresses(&name, port, &addrs)?;
                let client = self.https.client(&host, std::net::SocketAddr::new(ip, port))?;
                Ok(Object::Https { client, url: url.clone() })
            }
        }
    }

    fn s3_store(&self, bucket: &str) -> Result<Arc<dyn object_store::ObjectStore>, RefError> {
        let mut stores = self.s3.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = stores.get(bucket) {
            return Ok(s.clone());
        }
        let s = s3::open(bucket)?;
        stores.insert(bucket.to_string(), s.clone());
        Ok(s)
    }
}

/// A name the system resolver has not answered for within this long is unavailable: the request that
/// names it gets its error instead of waiting on a resolver that is down.
const RESOLVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The addresses of `host` (the system resolver).
async fn resolve(host: &str, port: u16) -> Result<Vec<std::net::IpAddr>, RefError> {
    let addrs = tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host((host, port)))
        .await
        .map_err(|_| RefError::Unavailable(format!("cannot resolve {host}: no answer within {} s", RESOLVE_TIMEOUT.as_secs())))?
        .map_err(|e| RefError::NotFound(format!("cannot resolve {host}: {e}")))?;
    Ok(addrs.map(|a| a.ip()).collect())
}

/// One object, opened: its size and version, and ranges of its bytes.
#[derive(Clone)]
pub enum Object {
    S3 { store: Arc<dyn object_store::ObjectStore>, path: object_store::path::Path, href: String },
    Https { client: reqwest::Client, url: reqwest::Url },
}

impl Object {
    pub fn href(&self) -> String {
        match self {
            Object::S3 { href, .. } => href.clone(),
            Object::Https { url, .. } => url.to_string(),
        }
    }

    /// Its size and version (a HEAD).
    pub async fn head(&self) -> Result<ObjectVersion, RefError> {
        match self {
            Object::S3 { store, path, href } => s3::head(store.as_ref(), path, href).await,
            Object::Https { client, url } => https::head(client, url).await,
        }
    }

    /// The bytes of `range`, from the version `v` only (`RefError::Changed` otherwise).
    pub async fn get_range(&self, range: Range<u64>, v: &ObjectVersion) -> Result<Bytes, RefError> {
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        let bytes = match self {
            Object::S3 { store, path, href } => s3::get_range(store.as_ref(), path, href, range.clone(), v).await?,
            Object::Https { client, url } => https::get_range(client, url, range.clone(), v).await?,
        };
        if bytes.len() as u64 != range.end - range.start {
            return Err(RefError::Changed(format!(
                "{} gave {} bytes for the range {}..{}: it is no longer the object that was submitted",
                v.href,
                bytes.len(),
                range.start,
                range.end
            )));
        }
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse_and_name_their_siblings() {
        let r = Reference::parse("s3://cubes/lines/a%20b.hdr").unwrap().unwrap();
        assert_eq!(r, Reference::S3 { bucket: "cubes".into(), key: "lines/a b.hdr".into() });
        assert_eq!(r.file_name(), "a b.hdr");
        assert_eq!(r.sibling("a b.img"), Reference::S3 { bucket: "cubes".into(), key: "lines/a b.img".into() });
        let h = Reference::parse("https://data.example.org/x/y.hdr?sig=1#f").unwrap().unwrap();
        assert_eq!(h.file_name(), "y.hdr");
        assert_eq!(h.sibling("y.img").href(), "https://data.example.org/x/y.img");
        assert_eq!(Reference::parse("file:///a.npy").unwrap(), None);
        assert!(matches!(Reference::parse("http://a/b.npy"), Err(RefError::Invalid(_))));
        assert!(matches!(Reference::parse("HTTP://a/b.npy"), Err(RefError::Invalid(_))));
        for bad in ["s3://cubes", "s3://Cu_bes/a.npy", "s3://cubes/", "s3://cubes/a/../b.npy", "s3://cubes//a.npy", "https://u:p@h/a.npy", "https://h/"] {
            assert!(matches!(Reference::parse(bad), Err(RefError::Invalid(_))), "{bad}");
        }
    }

    #[test]
    fn envi_data_names_follow_the_local_reader() {
        let n = envi_data_names("line.hdr");
        assert_eq!(&n[..3], &["line", "line.img", "line.dat"]);
        assert!(n.contains(&"line.BIL".to_string()));
        assert_eq!(envi_data_names("line.img.hdr")[0], "line.img");
    }

    #[test]
    fn stored_locations_round_trip_and_are_told_from_paths() {
        let s = Stored {
            object: ObjectVersion { href: "s3://b/a.hdr".into(), size: 10, etag: Some("\"e\"".into()), last_modified: None },
            data: Some(ObjectVersion { href: "s3://b/a.img".into(), size: 99, etag: None, last_modified: Some("x".into()) }),
        };
        assert_eq!(Stored::of_location(&s.to_location()), Some(s));
        assert_eq!(Stored::of_location("/data/a.npy"), None);
    }
}

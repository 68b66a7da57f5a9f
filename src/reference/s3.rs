//! `s3://bucket/key` references: `object_store`'s S3 client with the server's own S3 settings, the
//! AWS_* variables `--store s3://` also uses (`AWS_ENDPOINT_URL`, `AWS_REGION`, the keys), whether or
//! not the server stores its own files in S3.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path;
use object_store::{BackoffConfig, GetOptions, GetRange, ObjectStore, RetryConfig};

use super::{ObjectVersion, RefError};

/// The client for `bucket`. Sends nothing yet.
pub(super) fn open(bucket: &str) -> Result<Arc<dyn ObjectStore>, RefError> {
    let s3 = AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        // As the storage's client (storage/s3.rs): a few quick retries, then the error.
        .with_retry(RetryConfig {
            backoff: BackoffConfig { init_backoff: Duration::from_millis(50), max_backoff: Duration::from_secs(1), base: 2.0 },
            max_retries: 3,
            retry_timeout: Duration::from_secs(10),
        })
        .with_config(AmazonS3ConfigKey::Client(object_store::ClientConfigKey::ConnectTimeout), "5s")
        .build()
        .map_err(|e| RefError::Unavailable(format!("cannot open the S3 client for bucket {bucket}: {e}")))?;
    Ok(Arc::new(s3))
}

fn failed(href: &str, e: object_store::Error) -> RefError {
    match e {
        object_store::Error::NotFound { .. } => RefError::NotFound(format!("{href} does not exist")),
        object_store::Error::Precondition { .. } | object_store::Error::NotModified { .. } => {
            RefError::Changed(format!("{href} changed since the job was submitted"))
        }
        object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. } => {
            RefError::Forbidden(format!("the server's S3 credentials may not read {href}"))
        }
        other => RefError::Unavailable(format!("cannot read {href}: {other}")),
    }
}

pub(super) async fn head(store: &dyn ObjectStore, path: &Path, href: &str) -> Result<ObjectVersion, RefError> {
    let meta = store.head(path).await.map_err(|e| failed(href, e))?;
    Ok(ObjectVersion { href: href.to_string(), size: meta.size, etag: meta.e_tag, last_modified: Some(meta.last_modified.to_rfc3339()) })
}

pub(super) async fn get_range(store: &dyn ObjectStore, path: &Path, href: &str, range: Range<u64>, v: &ObjectVersion) -> Result<Bytes, RefError> {
    let opts = GetOptions { range: Some(GetRange::Bounded(range)), if_match: v.etag.clone(), ..GetOptions::default() };
    let got = store.get_opts(path, opts).await.map_err(|e| failed(href, e))?;
    // S3 always gives an ETag (If-Match above); without one, the time it was last modified.
    let moved = match &v.etag {
        Some(_) => got.meta.e_tag.is_some() && got.meta.e_tag != v.etag,
        None => v.last_modified.as_ref().is_some_and(|t| *t != got.meta.last_modified.to_rfc3339()),
    };
    if got.meta.size != v.size || moved {
        return Err(RefError::Changed(format!("{href} changed since the job was submitted")));
    }
    got.bytes().await.map_err(|e| failed(href, e))
}

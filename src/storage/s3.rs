//! The S3 client for `--store s3://bucket/prefix`: object_store's `AmazonS3`, configured from the
//! usual AWS variables (`AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_ALLOW_HTTP`, ...). Requests are path-style
//! (`<endpoint>/<bucket>/<key>`) unless `AWS_VIRTUAL_HOSTED_STYLE_REQUEST=true`: a local S3 server
//! (Garage, MinIO) has no per-bucket host names.

use std::sync::Arc;
use std::time::Duration;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path as StorePath;
use object_store::{BackoffConfig, RetryConfig};

use super::remote::RemoteStore;
use super::StorageError;

/// The S3 store for `bucket` and `prefix` (as parsed by `StoreUrl`). Sends nothing yet: a wrong
/// endpoint or credentials show at the first request (and in `/readyz`).
pub(crate) fn open(bucket: &str, prefix: &str) -> Result<RemoteStore, StorageError> {
    let url = if prefix.is_empty() { format!("s3://{bucket}") } else { format!("s3://{bucket}/{prefix}") };
    let builder = AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        // A store that cannot be reached is told to the client as a 503 within a second (the client's
        // defaults retry for 3 minutes): three quick retries (50, 100, 200 ms) ride over a dropped
        // connection or a store's own brief failure, and a connection is given 1 s to open. A job whose
        // storage failed is run again by the workers, which back off meanwhile.
        .with_retry(RetryConfig {
            backoff: BackoffConfig { init_backoff: Duration::from_millis(50), max_backoff: Duration::from_secs(1), base: 2.0 },
            max_retries: 3,
            retry_timeout: Duration::from_secs(10),
        })
        // Set as a key, not as new client options: those would drop what the environment set
        // (AWS_ALLOW_HTTP, proxies).
        .with_config(AmazonS3ConfigKey::Client(object_store::ClientConfigKey::ConnectTimeout), "1s");
    let endpoint = builder.get_config_value(&AmazonS3ConfigKey::Endpoint);
    let region = builder.get_config_value(&AmazonS3ConfigKey::Region).unwrap_or_else(|| "us-east-1".into());
    if endpoint.is_some() && builder.get_config_value(&AmazonS3ConfigKey::AccessKeyId).is_none() {
        // Without keys the client falls back to the EC2 instance metadata service, which a
        // self-hosted server's clients rarely have: say so now rather than after its timeouts.
        tracing::warn!(store = %url, "AWS_ENDPOINT_URL is set but AWS_ACCESS_KEY_ID is not; credentials will be looked for in the instance metadata");
    }
    let name = match &endpoint {
        Some(e) => format!("{url} at {e} (region {region})"),
        None => format!("{url} (AWS, region {region})"),
    };
    let s3 = builder.build().map_err(|e| StorageError::Config { url: url.clone(), why: e.to_string() })?;
    let prefix = StorePath::parse(prefix).map_err(|e| StorageError::Config { url, why: e.to_string() })?;
    Ok(RemoteStore::new(Arc::new(s3), prefix, name))
}

//! The real S3 server of `scripts/lib/garage.sh` for the reference tests: `HYPERMNF_TEST_S3_URL`
//! names its bucket, the AWS_* variables its endpoint and keys.

use std::sync::Arc;

/// `HYPERMNF_TEST_S3_URL`, or None (skipped) without an S3 server; a failure instead when
/// `HYPERMNF_REQUIRE_S3=1` (scripts/test.sh, CI).
pub fn s3_test_url(test: &str) -> Option<String> {
    let url = std::env::var("HYPERMNF_TEST_S3_URL").unwrap_or_default();
    if url.is_empty() {
        if std::env::var("HYPERMNF_REQUIRE_S3").as_deref() == Ok("1") {
            panic!("HYPERMNF_REQUIRE_S3=1 but HYPERMNF_TEST_S3_URL is not set: no S3 server to test against");
        }
        eprintln!("{test}: skipped, HYPERMNF_TEST_S3_URL is not set (source scripts/lib/garage.sh to test against S3)");
        return None;
    }
    Some(url)
}

/// The test bucket (of [`s3_test_url`]).
pub fn s3_bucket(test: &str) -> Option<String> {
    let url = s3_test_url(test)?;
    let rest = url.strip_prefix("s3://").expect("HYPERMNF_TEST_S3_URL is an s3:// URL");
    Some(rest.split('/').next().unwrap().to_string())
}

/// An S3 client of the test's own (the AWS_* variables): objects are put there by the test, never
/// through the service.
pub fn s3_client(bucket: &str) -> Arc<dyn object_store::ObjectStore> {
    Arc::new(object_store::aws::AmazonS3Builder::from_env().with_bucket_name(bucket).build().unwrap())
}

/// Puts `bytes` as `key`.
pub async fn s3_put(store: &dyn object_store::ObjectStore, key: &str, bytes: Vec<u8>) {
    store.put(&object_store::path::Path::from(key), bytes.into()).await.unwrap();
}

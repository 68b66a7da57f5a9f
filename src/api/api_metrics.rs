//! The service's own counters and histograms, which handlers add to and `/metrics` renders.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};

use crate::jobs::metrics::{seconds_histogram, Seconds};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The route's template (`/v1/jobs/{id}`), never the path itself: ids would make a series each.
    pub route: String,
    pub method: String,
    pub status: u16,
}

pub struct ApiMetrics {
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub cache_hits: AtomicU64,
    pub jobs_created: AtomicU64,
    pub uploads_refused: AtomicU64,
    /// Seconds from a request's arrival to its response's head (a download's body streams after).
    pub requests: Seconds<RequestLabels>,
    /// Bytes of each cube upload received whole (`.npy` bodies and multipart ENVI).
    pub upload_sizes: Histogram,
    /// Bytes of each result download.
    pub download_sizes: Histogram,
}

/// Sizes from 4 KB to 70 GB, a bucket every factor of 4.
fn bytes_histogram() -> Histogram {
    Histogram::new(exponential_buckets(4096.0, 4.0, 13))
}

impl Default for ApiMetrics {
    fn default() -> Self {
        ApiMetrics {
            bytes_in: AtomicU64::default(),
            bytes_out: AtomicU64::default(),
            cache_hits: AtomicU64::default(),
            jobs_created: AtomicU64::default(),
            uploads_refused: AtomicU64::default(),
            requests: Family::new_with_constructor(seconds_histogram),
            upload_sizes: bytes_histogram(),
            download_sizes: bytes_histogram(),
        }
    }
}

impl ApiMetrics {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// A cube upload of `bytes`, received whole.
    pub fn uploaded(&self, bytes: u64) {
        Self::add(&self.bytes_in, bytes);
        self.upload_sizes.observe(bytes as f64);
    }

    /// A result download of `bytes`.
    pub fn downloaded(&self, bytes: u64) {
        Self::add(&self.bytes_out, bytes);
        self.download_sizes.observe(bytes as f64);
    }
}

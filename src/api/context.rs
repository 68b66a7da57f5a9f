//! The state every handler of the service shares.

use std::path::PathBuf;
use std::sync::Arc;

use super::api_keys::ApiKeys;
use super::api_metrics::ApiMetrics;
use crate::config::ServeArgs;
use crate::jobs::Runner;

/// What every handler shares.
#[derive(Clone)]
pub struct ApiContext {
    pub config: Arc<ServeArgs>,
    pub runner: Arc<Runner>,
    pub keys: Option<Arc<ApiKeys>>,
    pub metrics: Arc<ApiMetrics>,
    /// Canonical `--input-root` directories.
    pub input_roots: Arc<Vec<PathBuf>>,
}

//! Result metadata. (stub: being written)
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Metadata {}

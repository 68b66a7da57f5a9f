//! The job row and the values it holds.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobStatus {
    Queued,
    Running,
    Succeeded,
    Failed,
    Canceled,
}

impl JobStatus {
    pub const ALL: [JobStatus; 5] =
        [JobStatus::Queued, JobStatus::Running, JobStatus::Succeeded, JobStatus::Failed, JobStatus::Canceled];

    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Queued => "queued",
            JobStatus::Running => "running",
            JobStatus::Succeeded => "succeeded",
            JobStatus::Failed => "failed",
            JobStatus::Canceled => "canceled",
        }
    }

    pub fn parse(s: &str) -> Option<JobStatus> {
        JobStatus::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// Succeeded, failed or canceled: nothing will change any more.
    pub fn is_finished(self) -> bool {
        matches!(self, JobStatus::Succeeded | JobStatus::Failed | JobStatus::Canceled)
    }
}

/// How the cube reached the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputKind {
    /// A `.npy` body, stored as `<location>/cube.npy`.
    Npy,
    /// A multipart ENVI upload, stored as `<location>/cube.hdr` and `<location>/cube.img`.
    Envi,
    /// A file already on the server's disk (`location` is its canonical path).
    Href,
}

impl InputKind {
    pub fn as_str(self) -> &'static str {
        match self {
            InputKind::Npy => "npy",
            InputKind::Envi => "envi",
            InputKind::Href => "href",
        }
    }
    pub fn parse(s: &str) -> Option<InputKind> {
        match s {
            "npy" => Some(InputKind::Npy),
            "envi" => Some(InputKind::Envi),
            "href" => Some(InputKind::Href),
            _ => None,
        }
    }
}

/// What the API shows about the input cube.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputSummary {
    pub lines: usize,
    pub samples: usize,
    pub bands: usize,
    pub data_type: String,
    pub interleave: String,
}

/// One job row, decoded.
#[derive(Debug, Clone)]
pub struct Job {
    pub id: String,
    pub owner: String,
    pub status: JobStatus,
    pub stage: Option<String>,
    pub progress: f64,
    /// Canonical JSON of the `MnfParams`.
    pub params: String,
    pub digest: String,
    /// Hex `Cube::content_digest` of the input (None for jobs created before the job cache).
    pub content_digest: Option<String>,
    pub upload_sha256: Option<String>,
    pub input: InputSummary,
    pub input_kind: InputKind,
    pub input_location: String,
    pub error_code: Option<String>,
    pub error_message: Option<String>,
    /// Product name (`components`, `components_envi_hdr`, ...) → storage key.
    pub results: BTreeMap<String, String>,
    pub attempts: i64,
    pub created_at: i64,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    /// Succeeded, but its result files may not be on the disk yet (see `jobs::result_sync`).
    pub results_unsynced: bool,
    /// The batch that made this job, if one did (`POST /v1/batches`).
    pub batch: Option<BatchMember>,
}

#[cfg(test)]
impl Job {
    /// A job as a fresh row holds it (one attempt, no results, not in a batch), for unit tests.
    pub fn for_tests(id: &str, status: JobStatus, input: InputSummary, input_kind: InputKind) -> Job {
        Job {
            id: id.into(),
            owner: "alice".into(),
            status,
            stage: None,
            progress: 0.0,
            params: "{}".into(),
            digest: format!("digest-{id}"),
            content_digest: None,
            upload_sha256: None,
            input,
            input_kind,
            input_location: format!("uploads/{id}"),
            error_code: None,
            error_message: None,
            results: Default::default(),
            attempts: 1,
            created_at: 0,
            started_at: None,
            finished_at: None,
            results_unsynced: false,
            batch: None,
        }
    }
}

/// A job's place in its batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchMember {
    pub batch_id: String,
    /// 0-based index of the job's input in the batch's `inputs`.
    pub position: i64,
    /// Where a member of a pooled batch is; None for a batch of independent jobs.
    pub phase: Option<BatchPhase>,
}

/// The two runs of a member of a pooled batch: its cube's statistics, then (once every member's
/// statistics are in and the pooled eigen system is stored) its projection with that system.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchPhase {
    Statistics,
    Project,
}

impl BatchPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            BatchPhase::Statistics => "statistics",
            BatchPhase::Project => "project",
        }
    }
    pub fn parse(s: &str) -> Option<BatchPhase> {
        match s {
            "statistics" => Some(BatchPhase::Statistics),
            "project" => Some(BatchPhase::Project),
            _ => None,
        }
    }
}

/// Names of the stored result products (keys of `Job::results`).
pub mod product {
    pub const COMPONENTS_NPY: &str = "components.npy";
    pub const COMPONENTS_HDR: &str = "components.hdr";
    /// The ENVI data files, stored only by jobs from before the data file was made on demand: later
    /// jobs keep the `.npy` and the header, and the data file is made from the `.npy` on the first ENVI
    /// download.
    pub const COMPONENTS_IMG: &str = "components.img";
    pub const METADATA: &str = "metadata.json";
    pub const DENOISED_NPY: &str = "denoised.npy";
    pub const DENOISED_HDR: &str = "denoised.hdr";
    pub const DENOISED_IMG: &str = "denoised.img";
    /// The eigen system the job projected with (`job_cache::eigen_file`'s bit-exact form), served as a
    /// system file by `GET /v1/jobs/{id}/system` (`jobs::systems`). Jobs stored before system files were kept with
    /// every job lack it (their `results` have no `system.bin`).
    pub const SYSTEM: &str = "system.bin";
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// RFC 3339 text of a Unix-milliseconds time.
pub fn rfc3339(ms: i64) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    t.format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}

//! What `/metrics` reports of the jobs run here: time per pipeline stage and per phase of a job's
//! trip outside the pipeline (histograms), and how jobs ended.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

use crate::mnf::Stage;

/// A histogram of seconds from 0.5 ms to 10 minutes: a job's stages last from a fraction of a
/// millisecond (an eigen step on the GPU) to minutes (a flight line on two CPU cores).
pub fn seconds_histogram() -> Histogram {
    Histogram::new([0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 180.0, 600.0])
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabel {
    pub stage: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    pub phase: &'static str,
}

pub type Seconds<L> = Family<L, Histogram, fn() -> Histogram>;

/// Time spent per stage and job outcomes, for `/metrics`.
pub struct JobMetrics {
    /// Seconds per pipeline stage.
    pub stages: Seconds<StageLabel>,
    /// Seconds per job-path phase (a name of `PHASES`; `queued` is the queue wait).
    pub phases: Seconds<PhaseLabel>,
    pub succeeded: AtomicU64,
    pub failed: AtomicU64,
    pub canceled: AtomicU64,
    /// Jobs whose computation started while their upload was still being synced (`jobs::early_start`).
    pub started_early: AtomicU64,
    /// Jobs that ran on a cube sent to the device while its upload arrived (`jobs::upload_to_device`).
    pub fed_to_device: AtomicU64,
    /// Jobs run on a cube resident on a device, without their body (`jobs::resident_run`).
    pub resident_runs: AtomicU64,
}

/// The parts of a job's trip outside the pipeline's stages, so that the time between an accepted
/// upload and a visible `succeeded` can be accounted for (`hypermnf_job_phase_seconds`):
/// `queued` from creation to the claim, `compute` the blocking task (plan, pipeline, result files),
/// `store` the result files to storage, `register` the job cache's records, `record` the final
/// status written to the database.
pub const PHASES: [&str; 5] = ["queued", "compute", "store", "register", "record"];

impl Default for JobMetrics {
    fn default() -> Self {
        JobMetrics {
            stages: Family::new_with_constructor(seconds_histogram),
            phases: Family::new_with_constructor(seconds_histogram),
            succeeded: AtomicU64::default(),
            failed: AtomicU64::default(),
            canceled: AtomicU64::default(),
            started_early: AtomicU64::default(),
            fed_to_device: AtomicU64::default(),
            resident_runs: AtomicU64::default(),
        }
    }
}

impl JobMetrics {
    /// Adds one sample of a pipeline stage.
    pub fn record_stage(&self, stage: Stage, took: Duration) {
        self.stages.get_or_create(&StageLabel { stage: stage.name() }).observe(took.as_secs_f64());
    }
    /// Adds one sample of a job-path phase (a name of `PHASES`).
    pub fn record_phase(&self, phase: &str, took: Duration) {
        if let Some(&phase) = PHASES.iter().find(|&&p| p == phase) {
            self.phases.get_or_create(&PhaseLabel { phase }).observe(took.as_secs_f64());
        }
    }
}

//! What `/metrics` reports of the jobs run here: time per pipeline stage, time per phase of a job's
//! trip outside the pipeline, and how jobs ended.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::mnf::Stage;

/// Time spent per stage and job outcomes, for `/metrics`.
#[derive(Default)]
pub struct JobMetrics {
    /// Per stage (index = `stage_index`): total microseconds and count.
    stage_us: [AtomicU64; 6],
    stage_n: [AtomicU64; 6],
    /// Per job-path phase (index into `PHASES`): total microseconds and count.
    phase_us: [AtomicU64; 5],
    phase_n: [AtomicU64; 5],
    pub succeeded: AtomicU64,
    pub failed: AtomicU64,
    pub canceled: AtomicU64,
    /// Jobs whose computation started while their upload was still being synced (`jobs::early`).
    pub started_early: AtomicU64,
    /// Jobs that ran on a cube sent to the device while its upload arrived (`jobs::feed`).
    pub fed_to_device: AtomicU64,
    /// Jobs run on a cube resident on a device, without their body (`jobs::resident`).
    pub resident_runs: AtomicU64,
}

/// The parts of a job's trip outside the pipeline's stages, so that the time between an accepted
/// upload and a visible `succeeded` can be accounted for (`hypermnf_job_phase_seconds`):
/// `queued` from creation to the claim, `compute` the blocking task (plan, pipeline, result files),
/// `store` the result files to storage, `register` the job cache's records, `record` the final
/// status written to the database.
pub const PHASES: [&str; 5] = ["queued", "compute", "store", "register", "record"];

pub const STAGES: [Stage; 6] = [Stage::Read, Stage::Statistics, Stage::Eigen, Stage::Projection, Stage::Inverse, Stage::Write];

fn stage_index(s: Stage) -> usize {
    STAGES.iter().position(|&x| x == s).unwrap_or(0)
}

impl JobMetrics {
    pub fn record_stage(&self, stage: Stage, took: Duration) {
        let i = stage_index(stage);
        self.stage_us[i].fetch_add(took.as_micros() as u64, Ordering::Relaxed);
        self.stage_n[i].fetch_add(1, Ordering::Relaxed);
    }
    /// Adds one sample of a job-path phase (a name of `PHASES`).
    pub fn record_phase(&self, phase: &str, took: Duration) {
        if let Some(i) = PHASES.iter().position(|&p| p == phase) {
            self.phase_us[i].fetch_add(took.as_micros() as u64, Ordering::Relaxed);
            self.phase_n[i].fetch_add(1, Ordering::Relaxed);
        }
    }
    /// (phase, seconds in total, times) for each phase.
    pub fn phases(&self) -> Vec<(&'static str, f64, u64)> {
        PHASES
            .iter()
            .enumerate()
            .map(|(i, &p)| (p, self.phase_us[i].load(Ordering::Relaxed) as f64 / 1e6, self.phase_n[i].load(Ordering::Relaxed)))
            .collect()
    }
    /// (stage, seconds in total, times) for each stage.
    pub fn stages(&self) -> Vec<(Stage, f64, u64)> {
        STAGES
            .iter()
            .enumerate()
            .map(|(i, &s)| (s, self.stage_us[i].load(Ordering::Relaxed) as f64 / 1e6, self.stage_n[i].load(Ordering::Relaxed)))
            .collect()
    }
}

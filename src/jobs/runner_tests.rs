//! Runs of jobs driven through a [`Runner`]: a worker's (`job_run`), and one started early (`early_start`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::cpu::CpuBackend;
use crate::backend::{Backend, BackendError, PreparedCube};
use crate::cube::Cube;
use crate::job_cache::keys;
use crate::jobs::backends::Backends;
use crate::jobs::model::{InputKind, InputSummary, JobStatus};
use crate::jobs::store::NewJob;
use crate::jobs::worker::Runner;
use crate::mnf::stats::{Denoise, Moments, Projection, Statistics, StatsSpec};
use crate::mnf::{BackendChoice, Monitor};
use crate::config::EarlyStart;

/// Statistics on the CPU; every projection fails.
struct FailingProjection(CpuBackend);
struct FailingCube<'c>(Box<dyn PreparedCube + Send + 'c>);

impl PreparedCube for FailingCube<'_> {
    fn statistics(&mut self, spec: &StatsSpec, on_noise: &mut dyn FnMut(&Moments), m: &Monitor) -> Result<Statistics, BackendError> {
        self.0.statistics(spec, on_noise, m)
    }
    fn project(&mut self, _p: &Projection, _out: &mut [f32], _m: &Monitor) -> Result<(), BackendError> {
        Err(BackendError::Invalid("the projection failed (on purpose)".into()))
    }
    fn denoise(&mut self, d: &Denoise, out: &mut [f32], m: &Monitor) -> Result<(), BackendError> {
        self.0.denoise(d, out, m)
    }
}

impl Backend for FailingProjection {
    fn name(&self) -> &'static str {
        "cpu"
    }
    fn device(&self) -> String {
        "the CPU, failing its projections".into()
    }
    fn prepare<'c>(&'c self, cube: &'c Cube, monitor: &Monitor) -> Result<Box<dyn PreparedCube + Send + 'c>, BackendError> {
        Ok(Box::new(FailingCube(self.0.prepare(cube, monitor)?)))
    }
}

/// Step 6 begins with the fresh eigen system, before the projection; a projection that then
/// fails leaves neither the stored system nor its row behind, and the job failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_failing_after_its_system_was_stored_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let backends = Backends::given(BackendChoice::Cpu, vec![Arc::new(FailingProjection(CpuBackend::new())) as Arc<dyn Backend>]);
    let runner = Arc::new(Runner::for_test(dir.path(), backends, 0).await);
    let (store, storage) = (runner.store.clone(), runner.storage.clone());
    let workers = runner.start(1);

    let cube = crate::cube::synthetic::generate(&crate::cube::synthetic::SyntheticSpec::small(40, 30, 12));
    let file = dir.path().join("cube.npy");
    crate::cube::npy::write_cube(&file, &cube).unwrap();
    storage.put_file(&file, "uploads/j/cube.npy").await.unwrap();
    let params = r#"{"components":3}"#;
    let content = cube.content_digest();
    store
        .insert(NewJob {
            id: "j".into(),
            owner: "alice".into(),
            params: params.into(),
            digest: "digest-j".into(),
            content_digest: Some(hex::encode(content)),
            upload_sha256: None,
            input: InputSummary { lines: 40, samples: 30, bands: 12, data_type: cube.dtype().name().into(), interleave: "bip".into() },
            input_kind: InputKind::Npy,
            input_location: "uploads/j".into(),
        })
        .await
        .unwrap();
    runner.notify();
    let t = Instant::now();
    let job = loop {
        let j = store.get("j").await.unwrap().unwrap();
        if j.status.is_finished() || t.elapsed() > Duration::from_secs(30) {
            break j;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(job.status, JobStatus::Failed, "{job:?}");
    assert!(job.error_message.as_deref().is_some_and(|m| m.contains("on purpose")), "{job:?}");
    let key = keys::statistics_key(&content, &serde_json::from_str(params).unwrap(), "cpu");
    assert!(runner.cache.find_system(&key).await.is_none(), "the eigen system of a failed job is still known");
    let left = storage.list("results/").await.unwrap();
    assert!(left.is_empty(), "results left behind: {left:?}");
    workers.abort();
}

/// An upload that is not accepted after all drops its early run: the computation is canceled,
/// the job's scratch (the linked input, any result written) is removed, and the worker's place is
/// given back; no row was ever written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_early_run_leaves_nothing_and_frees_its_worker() {
    let dir = tempfile::tempdir().unwrap();
    let runner = Arc::new(Runner::for_test(dir.path(), Backends::new(BackendChoice::Cpu).unwrap(), 0).await.with_early_start(EarlyStart::Always));
    let (store, storage) = (runner.store.clone(), runner.storage.clone());
    let workers = runner.start(1);

    let cube = crate::cube::synthetic::generate(&crate::cube::synthetic::SyntheticSpec::small(200, 120, 32));
    let upload = storage.scratch_dir("upload-1").unwrap().join("cube.npy");
    crate::cube::npy::write_cube(&upload, &cube).unwrap();
    let mut new = NewJob::for_test("early-1");
    new.params = r#"{"components":3}"#.into();
    let early = runner.start_early(&new, BackendChoice::Cpu, &[upload.as_path()], None).expect("the worker is idle");
    assert!(!runner.has_idle_worker(), "the early run holds the worker's place");
    assert!(storage.scratch_dir("job-early-1").unwrap().join("cube.npy").exists(), "the input is linked");
    drop(early);

    let t = Instant::now();
    while !runner.has_idle_worker() && t.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(runner.has_idle_worker(), "the worker's place was not given back");
    assert!(!dir.path().join("objects/scratch/job-early-1").exists(), "the job's scratch was left behind");
    assert!(upload.exists(), "the upload itself is its request's to remove");
    assert!(store.get("early-1").await.unwrap().is_none());
    workers.abort();
}

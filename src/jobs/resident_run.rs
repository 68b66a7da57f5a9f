//! Jobs run on a cube this instance already holds on a device, without their body.
//!
//! A client that names its cube by `X-Cube-Digest` (the Python client does for every little-endian
//! array) and asks for parameters it has no job for would otherwise send the whole cube again: 299 MB
//! through the socket, the disk and its sync, for a re-projection whose computation takes ~3 ms on
//! the H100. When
//! - the owner has a job made from that cube (so they sent it: a digest alone gives nothing away),
//! - and the cube is still resident on a device of this instance in its canonical `.npy` form (its
//!   key at the device level is made from the content digest and the header, and that form's header
//!   follows from the shape and data type that the earlier job recorded),
//! - and a worker is idle,
//! - and the eigen system of the request's statistics parameters is kept beside that cube (so that
//!   only the projection runs: the request waits for it, and it is short),
//!
//! the job runs at once on the resident cube, before the body is read (or sent at all, with
//! `Expect: 100-continue`). It is the computation a job would make on that resident cube, so the
//! result is the same bit for bit.
//!
//! The row is inserted only once the job has succeeded, its results stored
//! ([`JobStore::insert_succeeded`]), and the job cache learns the result just after the answer: the
//! job has no input to keep for a retry, and needs none. A process that dies meanwhile leaves no row, and its client,
//! never answered, sends again. Anything that stops the job (an error, or a job of the same digest
//! inserted meanwhile) removes what it wrote; the caller then goes on as for any upload.
//!
//! On the H100 (BENCHMARKS.md, Service), a 14-component re-projection of the 299 MB benchmark cube
//! this way takes 10.0–11.3 ms from the request to `succeeded`, against 15.3–17.6 ms with the body sent
//! again. Most of it is writing the 37 MB result into the page cache (6–8.5 ms), which the projection's
//! chunks overlap (`output::components_file`); the rest is the first chunk, the metadata, the store,
//! the row's insert and the request.
//!
//! [`JobStore::insert_succeeded`]: super::store::JobStore::insert_succeeded

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::input;
use super::job_run::{JobRun, Resident};
use super::model::{InputKind, Job};
use super::store::{Inserted, NewJob, StoreError};
use super::worker::Runner;
use crate::job_cache::{keys, Digest};
use crate::cube::DataType;
use crate::mnf::{BackendChoice, MnfParams};

/// Whether a job of `choice` could run on a resident cube here now: a worker idle, and a cube on a
/// device of `choice` (no database read; checked before looking for the owner's earlier job).
pub fn possible(runner: &Runner, choice: BackendChoice) -> bool {
    runner.may_start_early(choice)
        && runner.has_idle_worker()
        && runner.backends.candidates(choice).iter().any(|b| runner.cache.device_for(b.as_ref()).is_some_and(|d| !d.is_empty()))
}

/// Runs `new` (its input summary from the owner's `earlier` job of the same cube, its content digest
/// set) on its cube resident on a device of `choice`, and inserts it succeeded. None when that is not
/// possible here (the cube not resident in its canonical form, no idle worker, `--early-start never`,
/// or the job failed): the caller then needs the body.
pub async fn run(runner: &Arc<Runner>, new: NewJob, earlier: &Job, params: &MnfParams) -> Option<Result<Inserted, StoreError>> {
    let choice = params.backend;
    if !runner.may_start_early(choice) || earlier.owner != new.owner {
        return None;
    }
    let content = new.content_digest.as_deref().and_then(keys::parse_hex)?;
    if earlier.content_digest.as_deref().and_then(keys::parse_hex) != Some(content) {
        return None;
    }
    let began = std::time::Instant::now();
    let resident = find(runner, &content, earlier, params)?;
    let slot = runner.try_take_slot()?;
    let found = began.elapsed();
    // The row's insert is synced and answers the client: no result sync of an earlier job may have
    // write-back in flight then (it held the insert 1.2–3.7 ms on the H100 host).
    let quiet = runner.storage.pause_syncs();
    let job = super::early_start::job_before_insert(&new, new.input_location.clone());
    let run = JobRun::on_resident(job, runner.services(), resident);
    let outcome = run.run_before_row().await;
    drop(slot);
    // Nothing was registered: the result level needs the row, which did not exist yet.
    let (_registered, results) = match outcome {
        Ok(r) => r,
        Err(f) => {
            tracing::warn!(job = %new.id, code = %f.code, "a job on a resident cube failed ({}); the body is needed", f.message);
            return None;
        }
    };
    let id = new.id.clone();
    let ran = began.elapsed();
    let inserted = runner.store.insert_succeeded(new, &results, &runner.lease.owner, runner.storage.syncs_locally()).await;
    let recorded = began.elapsed();
    drop(quiet);
    match &inserted {
        Ok(Inserted::Created(job)) => {
            // Already succeeded: nothing to withdraw later. The answer does not wait for the result
            // level to learn the job (a repeat meanwhile finds the row by its digest on insert), nor
            // for the results to reach the disk (`jobs::result_sync`).
            let (r, registering) = (runner.clone(), job.clone());
            tokio::spawn(async move {
                let _registered = r.cache.register_before_success(&registering, None).await;
                if r.storage.syncs_locally() {
                    super::result_sync::sync(&r.store, &r.storage, &registering.id).await;
                }
            });
            tracing::debug!(
                target: "hypermnf::timing",
                job = %job.id,
                find_ms = found.as_secs_f64() * 1e3,
                run_ms = (ran - found).as_secs_f64() * 1e3,
                insert_ms = (recorded - ran).as_secs_f64() * 1e3,
                "a job run on a resident cube"
            );
            runner.metrics.succeeded.fetch_add(1, Ordering::Relaxed);
            runner.metrics.resident_runs.fetch_add(1, Ordering::Relaxed);
            tracing::info!(job = %job.id, "job succeeded on a resident cube, without its body");
            runner.job_may_have_ended();
        }
        Ok(Inserted::Existing(_)) | Err(_) => {
            let _ = runner.storage.delete_prefix(&format!("results/{id}")).await;
        }
    }
    Some(inserted)
}

/// The owner's cube, resident in its canonical `.npy` form on a device of `params`' backend choice
/// (looked for on each, none taken out of turn), with the eigen system of `params` kept beside it.
fn find(runner: &Runner, content: &Digest, earlier: &Job, params: &MnfParams) -> Option<Resident> {
    let i = &earlier.input;
    let dtype = DataType::ALL.into_iter().find(|d| d.name() == i.data_type)?;
    let header = crate::cube::npy::canonical_header(dtype, i.lines, i.samples, i.bands);
    let header = input::of_header(InputKind::Npy, &header);
    runner.backends.candidates(params.backend).into_iter().find_map(|backend| {
        let device = runner.cache.device_for(backend.as_ref())?;
        let key = keys::device_key(content, &header, backend.name());
        let item = device.get(&key)?;
        item.system(&keys::statistics_key(content, params, backend.name()))?;
        Some(Resident { content: *content, key, item })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;
    use crate::backend::{Backend, BackendError, PreparedCube};
    use crate::config::EarlyStart;
    use crate::cube::Cube;
    use crate::jobs::backends::Backends;
    use crate::jobs::model::{InputSummary, JobStatus};
    use crate::mnf::stats::{Denoise, Moments, Projection, Statistics, StatsSpec};
    use crate::mnf::{MnfParams, Monitor};
    use std::time::{Duration, Instant};

    /// A device that computes on the CPU and says it holds each prepared cube in its memory, so that
    /// the device level keeps them.
    struct PretendDevice(CpuBackend);

    struct PretendCube<'c>(Box<dyn PreparedCube + Send + 'c>, u64);

    impl PreparedCube for PretendCube<'_> {
        fn statistics(&mut self, spec: &StatsSpec, on_noise: &mut dyn FnMut(&Moments), m: &Monitor) -> Result<Statistics, BackendError> {
            self.0.statistics(spec, on_noise, m)
        }
        fn project(&mut self, p: &Projection, out: &mut [f32], m: &Monitor) -> Result<(), BackendError> {
            self.0.project(p, out, m)
        }
        fn denoise(&mut self, d: &Denoise, out: &mut [f32], m: &Monitor) -> Result<(), BackendError> {
            self.0.denoise(d, out, m)
        }
        fn resident_bytes(&self) -> u64 {
            self.1
        }
    }

    impl Backend for PretendDevice {
        fn name(&self) -> &'static str {
            "pretend"
        }
        fn device(&self) -> String {
            "a pretend device (the CPU)".into()
        }
        fn memory_in_use(&self) -> Option<(u64, u64)> {
            Some((0, 1 << 40))
        }
        fn prepare<'c>(&'c self, cube: &'c Cube, monitor: &Monitor) -> Result<Box<dyn PreparedCube + Send + 'c>, BackendError> {
            Ok(Box::new(PretendCube(self.0.prepare(cube, monitor)?, cube.raw_len() as u64)))
        }
    }

    fn new_job(id: &str, owner: &str, cube: &Cube, params: &str) -> NewJob {
        NewJob {
            id: id.into(),
            owner: owner.into(),
            params: params.into(),
            digest: format!("digest-{id}"),
            content_digest: Some(hex::encode(cube.content_digest())),
            upload_sha256: None,
            input: InputSummary {
                lines: cube.lines(),
                samples: cube.samples(),
                bands: cube.bands(),
                data_type: cube.dtype().name().into(),
                interleave: "bip".into(),
            },
            input_kind: InputKind::Npy,
            input_location: format!("uploads/{id}"),
        }
    }

    /// A job of a cube that an earlier job of the same owner left on the (pretend) device runs with
    /// no input at all, is inserted succeeded, and gives the bytes of a cold run; other owners, other
    /// cubes and busy workers get None (the body is needed).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_job_of_a_resident_cube_needs_no_input() {
        let dir = tempfile::tempdir().unwrap();
        let device: Arc<dyn Backend> = Arc::new(PretendDevice(CpuBackend::new()));
        let backends = Backends::given(BackendChoice::Cpu, vec![device]);
        let runner = Arc::new(Runner::for_test(dir.path(), backends, 1 << 30).await.with_early_start(EarlyStart::Device));
        let (store, storage) = (runner.store.clone(), runner.storage.clone());
        let workers = runner.start(1);

        // The earlier job, through the queue and a worker, from its stored upload.
        let cube = crate::cube::synthetic::generate(&crate::cube::synthetic::SyntheticSpec::small(60, 40, 16));
        let file = dir.path().join("cube.npy");
        crate::cube::npy::write_cube(&file, &cube).unwrap();
        storage.put_file(&file, "uploads/first/cube.npy").await.unwrap();
        store.insert(new_job("first", "alice", &cube, r#"{"components":3}"#)).await.unwrap();
        runner.notify();
        let t = Instant::now();
        let earlier = loop {
            let j = store.get("first").await.unwrap().unwrap();
            if j.status.is_finished() || t.elapsed() > Duration::from_secs(30) {
                break j;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(earlier.status, JobStatus::Succeeded, "{earlier:?}");
        // The worker that ran it claims once more (an empty queue) after it, holding its slot for that
        // query: a worker is idle again within moments, not at the instant the job reads succeeded.
        let t = Instant::now();
        while !possible(&runner, BackendChoice::Cpu) && t.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(possible(&runner, BackendChoice::Cpu), "the cube stays on the device");

        let params = r#"{"components":5}"#;
        let p = |json: &str| -> MnfParams { serde_json::from_str(json).unwrap() };
        let Some(Ok(Inserted::Created(job))) = run(&runner, new_job("second", "alice", &cube, params), &earlier, &p(params)).await else {
            panic!("the job did not run on the resident cube")
        };
        assert_eq!(job.status, JobStatus::Succeeded);
        assert!(job.results.contains_key("components.npy"), "{:?}", job.results);
        let stored = storage.get_bytes(&job.results["components.npy"]).await.unwrap();
        let want = crate::mnf::run(&cube, &serde_json::from_str::<MnfParams>(params).unwrap(), &CpuBackend::new(), &Monitor::silent()).unwrap();
        let path = dir.path().join("want.npy");
        crate::cube::npy::write_f32(&path, &[60, 40, 5], &want.components).unwrap();
        assert!(stored[..] == std::fs::read(&path).unwrap()[..], "not the bytes of a cold run");
        // The result level learns the job once its row exists, and its scratch goes, both just after
        // the answer; the results of both jobs reach the disk, and then the first job's upload goes.
        let scratch = dir.path().join("objects/scratch");
        let t = Instant::now();
        loop {
            let known = runner.cache.find_result("alice", &job.digest).await.unwrap().map(|j| j.id) == Some(job.id.clone());
            let left = std::fs::read_dir(&scratch).map(|d| d.count()).unwrap_or(0);
            let mut unsynced = Vec::new();
            for id in ["first", "second"] {
                if store.get(id).await.unwrap().unwrap().results_unsynced {
                    unsynced.push(id);
                }
            }
            let upload = storage.list("uploads/first").await.unwrap().len();
            if known && left == 0 && unsynced.is_empty() && upload == 0 {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "known to the result level: {known}; scratch entries left: {left}; unsynced: {unsynced:?}; upload files: {upload}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(runner.metrics.resident_runs.load(Ordering::Relaxed), 1);

        // Another owner, another cube, a busy worker: the body is needed.
        assert!(run(&runner, new_job("third", "bob", &cube, params), &earlier, &p(params)).await.is_none());
        let other = crate::cube::synthetic::generate(&crate::cube::synthetic::SyntheticSpec::small(60, 40, 12));
        let mut other_earlier = earlier.clone();
        other_earlier.content_digest = Some(hex::encode(other.content_digest()));
        other_earlier.input.bands = 12;
        assert!(run(&runner, new_job("fourth", "alice", &other, params), &other_earlier, &p(params)).await.is_none());
        // Another noise estimator: no eigen system kept for it, so the statistics would have to run.
        let shift = r#"{"components":5,"noise":"shift-difference"}"#;
        assert!(run(&runner, new_job("sixth", "alice", &cube, shift), &earlier, &p(shift)).await.is_none());
        let busy = runner.try_take_slot().unwrap();
        assert!(!possible(&runner, BackendChoice::Cpu));
        assert!(run(&runner, new_job("fifth", "alice", &cube, r#"{"components":4}"#), &earlier, &p(r#"{"components":4}"#)).await.is_none());
        drop(busy);
        for id in ["third", "fourth", "fifth", "sixth"] {
            assert!(store.get(id).await.unwrap().is_none(), "{id} has a row");
        }
        assert!(!dir.path().join("objects/results/fifth").exists());
        workers.abort();
    }
}

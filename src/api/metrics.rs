//! `/metrics` in the Prometheus text format. Counters are atomics; job counts come from the database
//! at scrape time (so they are right after a restart too); latencies and sizes are histograms
//! (`prometheus-client`, in a registry made per scrape: each server of a process keeps its own, which
//! a global recorder would not).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use prometheus_client::registry::Registry;

pub use super::api_metrics::{ApiMetrics, RequestLabels};
use super::ApiContext;
use crate::jobs::{JobStatus, Runner};

/// The middleware that times every routed request by route, method and status.
pub async fn observe_request(State(ctx): State<ApiContext>, route: Option<MatchedPath>, req: Request, next: Next) -> Response {
    let route = route.map_or_else(|| "unmatched".to_string(), |r| r.as_str().to_string());
    let method = req.method().to_string();
    let began = std::time::Instant::now();
    let response = next.run(req).await;
    let labels = RequestLabels { route, method, status: response.status().as_u16() };
    ctx.metrics.requests.get_or_create(&labels).observe(began.elapsed().as_secs_f64());
    response
}

pub async fn render(api: &ApiMetrics, runner: &Runner) -> Result<String, crate::jobs::StoreError> {
    let counts = runner.store.count_by_status().await?;
    let mut s = String::new();
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);

    let _ = writeln!(s, "# HELP hypermnf_jobs Jobs in the database by status.\n# TYPE hypermnf_jobs gauge");
    for (st, n) in &counts {
        let _ = writeln!(s, "hypermnf_jobs{{status=\"{}\"}} {n}", st.as_str());
    }
    let queued = counts.iter().find(|(st, _)| *st == JobStatus::Queued).map(|x| x.1).unwrap_or(0);
    let _ = writeln!(s, "# HELP hypermnf_queue_depth Jobs waiting for a worker.\n# TYPE hypermnf_queue_depth gauge\nhypermnf_queue_depth {queued}");

    let _ = writeln!(s, "# HELP hypermnf_job_outcomes_total Jobs finished by this process, by outcome.\n# TYPE hypermnf_job_outcomes_total counter");
    for (name, c) in [("succeeded", &runner.metrics.succeeded), ("failed", &runner.metrics.failed), ("canceled", &runner.metrics.canceled)] {
        let _ = writeln!(s, "hypermnf_job_outcomes_total{{outcome=\"{name}\"}} {}", get(c));
    }
    for (name, help, c) in [
        ("hypermnf_upload_bytes_total", "Bytes of cube uploads received.", &api.bytes_in),
        ("hypermnf_download_bytes_total", "Bytes of results sent.", &api.bytes_out),
        ("hypermnf_cache_hits_total", "Requests answered with an existing job.", &api.cache_hits),
        ("hypermnf_jobs_created_total", "Jobs created by this process.", &api.jobs_created),
        ("hypermnf_jobs_fed_to_device_total", "Jobs of this process that ran on a cube sent to the device while its upload arrived.", &runner.metrics.fed_to_device),
        ("hypermnf_jobs_run_on_resident_cube_total", "Jobs of this process run on a cube it held on a device, named by X-Cube-Digest, without reading their body.", &runner.metrics.resident_runs),
        ("hypermnf_jobs_started_early_total", "Jobs of this process whose computation started while their upload was still being synced.", &runner.metrics.started_early),
        ("hypermnf_uploads_refused_total", "Uploads refused (too large, malformed, bad parameters).", &api.uploads_refused),
    ] {
        let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}", get(c));
    }
    render_job_cache(&mut s, &runner.cache.report());
    let mut registry = Registry::default();
    registry.register("hypermnf_stage_seconds", "Time spent in each job stage", runner.metrics.stages.clone());
    registry.register(
        "hypermnf_job_phase_seconds",
        "Time of each part of a job's trip outside the pipeline's stages (queued: creation to claim, the queue wait; compute: the blocking task; store: results to storage; register: job cache records; record: the final status written)",
        runner.metrics.phases.clone(),
    );
    registry.register(
        "hypermnf_http_request_duration_seconds",
        "Time from a request's arrival to its response's head, by route template, method and status",
        api.requests.clone(),
    );
    registry.register("hypermnf_upload_size_bytes", "Bytes of each cube upload received whole", api.upload_sizes.clone());
    registry.register("hypermnf_download_size_bytes", "Bytes of each result download", api.download_sizes.clone());
    let mut histograms = String::new();
    if prometheus_client::encoding::text::encode(&mut histograms, &registry).is_ok() {
        // The OpenMetrics end marker: this page goes on, and is served as Prometheus text.
        s.push_str(histograms.trim_end().trim_end_matches("# EOF").trim_end());
        s.push('\n');
    }
    let backend = runner.backends.default_backend();
    let _ = writeln!(
        s,
        "# HELP hypermnf_backend_info The default compute backend.\n# TYPE hypermnf_backend_info gauge\nhypermnf_backend_info{{backend=\"{}\",device=\"{}\"}} 1",
        backend.name(),
        backend.device().replace(['"', '\\', '\n'], " ")
    );
    if let Some((used, total)) = backend.memory_in_use() {
        let _ = writeln!(
            s,
            "# HELP hypermnf_gpu_memory_used_bytes Device memory in use (all processes).\n# TYPE hypermnf_gpu_memory_used_bytes gauge\nhypermnf_gpu_memory_used_bytes {used}\n# HELP hypermnf_gpu_memory_total_bytes Device memory in total.\n# TYPE hypermnf_gpu_memory_total_bytes gauge\nhypermnf_gpu_memory_total_bytes {total}"
        );
    }
    Ok(s)
}

/// The job cache's levels: `result` and `statistics` (the digest indexes) and `device` (cubes kept in
/// GPU memory; reported only when `--gpu-cache-bytes` is not 0).
fn render_job_cache(s: &mut String, cache: &crate::jobs::CacheReport) {
    let (r, st) = (cache.levels.result, cache.levels.statistics);
    let d = cache.device;
    let mut family = |name: &str, kind: &str, help: &str, values: [Option<u64>; 3]| {
        let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (level, v) in ["result", "statistics", "device"].iter().zip(values) {
            if let Some(v) = v {
                let _ = writeln!(s, "{name}{{level=\"{level}\"}} {v}");
            }
        }
    };
    family(
        "hypermnf_job_cache_hits_total",
        "counter",
        "Job cache lookups that found an entry, by level.",
        [Some(r.hits), Some(st.hits), d.map(|d| d.hits)],
    );
    family(
        "hypermnf_job_cache_misses_total",
        "counter",
        "Job cache lookups that found nothing usable (64-bit key collisions included), by level.",
        [Some(r.misses), Some(st.misses), d.map(|d| d.misses)],
    );
    family(
        "hypermnf_job_cache_evictions_total",
        "counter",
        "Entries the job cache evicted to make room, by level.",
        [Some(r.evictions), Some(st.evictions), d.map(|d| d.evictions)],
    );
    family(
        "hypermnf_job_cache_collisions_total",
        "counter",
        "Lookups and inserts whose 64-bit index key belonged to another digest, by level.",
        [Some(r.collisions), Some(st.collisions), None],
    );
    family(
        "hypermnf_job_cache_entries",
        "gauge",
        "Entries in the job cache, by level.",
        [Some(r.entries), Some(st.entries), d.map(|d| d.entries)],
    );
    if let Some(d) = d {
        let _ = writeln!(
            s,
            "# HELP hypermnf_job_cache_device_bytes GPU memory held by cubes the job cache keeps resident.\n# TYPE hypermnf_job_cache_device_bytes gauge\nhypermnf_job_cache_device_bytes {}\n# HELP hypermnf_job_cache_device_budget_bytes The device level's budget (--gpu-cache-bytes).\n# TYPE hypermnf_job_cache_device_budget_bytes gauge\nhypermnf_job_cache_device_budget_bytes {}\n# HELP hypermnf_job_cache_device_refused_total Cubes too large for the whole budget, not kept.\n# TYPE hypermnf_job_cache_device_refused_total counter\nhypermnf_job_cache_device_refused_total {}",
            d.bytes, d.budget_bytes, d.refused
        );
    }
    let location = match &cache.index {
        crate::job_cache::IndexBackend::Gpu(_) => "gpu",
        crate::job_cache::IndexBackend::Cpu(_) => "cpu",
    };
    let _ = writeln!(
        s,
        "# HELP hypermnf_job_cache_index_info Where the job cache's digest indexes live.\n# TYPE hypermnf_job_cache_index_info gauge\nhypermnf_job_cache_index_info{{location=\"{location}\"}} 1"
    );
}

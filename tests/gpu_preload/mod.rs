//! An upload copied to the device while it is made durable (`jobs::preload`, issue 16): the job finds
//! the cube resident (a device-level hit, no other lookup of the level) and its result is byte for byte
//! the one of a server that does not do this (`--gpu-cache-bytes 0`). Included by tests/gpu.rs; needs a
//! CUDA device.

use std::time::Duration;

use hypermnf::config::ServeArgs;
use hypermnf::cube::synthetic::{self, SyntheticSpec};
use hypermnf::mnf::BackendChoice;

/// Posts `npy` to a fresh CUDA server (device level `gpu_cache_bytes`), waits for the job and returns
/// the components `.npy` and the server's `/metrics` text.
fn run_job(npy: &[u8], gpu_cache_bytes: u64) -> (Vec<u8>, String) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let tmp = tempfile::tempdir().unwrap();
        let mut args = ServeArgs::with_data_dir(tmp.path());
        args.backend = BackendChoice::Cuda;
        args.gpu_cache_bytes = gpu_cache_bytes;
        let server = hypermnf::api::start(args).await.unwrap();
        let url = format!("http://{}", server.addr);
        let client = reqwest::Client::builder().timeout(Duration::from_secs(120)).build().unwrap();
        let r = client
            .post(format!("{url}/v1/jobs?components=6"))
            .header("content-type", "application/x-npy")
            .body(npy.to_vec())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202, "{}", r.text().await.unwrap());
        let id = r.json::<serde_json::Value>().await.unwrap()["id"].as_str().unwrap().to_string();
        let job: serde_json::Value = client.get(format!("{url}/v1/jobs/{id}?wait=60")).send().await.unwrap().json().await.unwrap();
        assert_eq!(job["status"], "succeeded", "{job}");
        let result = client.get(format!("{url}/v1/jobs/{id}/result")).send().await.unwrap().bytes().await.unwrap().to_vec();
        let metrics = client.get(format!("{url}/metrics")).send().await.unwrap().text().await.unwrap();
        server.stop().await.unwrap();
        (result, metrics)
    })
}

fn metric(text: &str, line_start: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix(line_start)).and_then(|v| v.trim().parse().ok())
}

#[test]
#[ignore = "needs a CUDA device"]
fn an_upload_is_on_the_device_before_its_job_runs() {
    // A fresh int16 cube of 7.3 MB: more than one chunk of the statistics pass, and several staging pieces.
    let mut spec = SyntheticSpec::small(300, 190, 64);
    spec.seed = 0x9e3779b97f4a7c15 ^ std::process::id() as u64;
    let cube = synthetic::generate(&spec);
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c.npy");
    hypermnf::cube::npy::write_cube(&p, &cube).unwrap();
    let npy = std::fs::read(&p).unwrap();

    let (with, metrics) = run_job(&npy, 1 << 30);
    // The job's one lookup of the device level found the cube the upload put there.
    assert_eq!(metric(&metrics, "hypermnf_job_cache_hits_total{level=\"device\"} "), Some(1), "{metrics}");
    assert_eq!(metric(&metrics, "hypermnf_job_cache_misses_total{level=\"device\"} "), Some(0), "{metrics}");

    let (without, metrics) = run_job(&npy, 0);
    assert!(!metrics.contains("level=\"device\""), "the device level is off: {metrics}");
    assert!(with.len() > 300 * 190 * 6 * 4);
    assert!(with == without, "the result differs when the cube was copied to the device ahead of the job");
}

//! The in-process server the service test binaries share (tests/service/, tests/service_cache.rs):
//! `hypermnf serve` on a free loopback port, on the CPU backend, with a client and the requests every
//! test needs. Test-specific requests are added by each binary in its own `impl TestServer` block.
#![allow(dead_code)] // each test binary uses a different subset

/// The GPU test binaries' helpers (tests/gpu*.rs).
pub mod gpu;
/// An https server of the test's own, for `https://` references.
pub mod https_site;
/// The test S3 server (Garage), for `s3://` references.
pub mod s3;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::Value;

pub struct TestServer {
    pub server: hypermnf::api::Server,
    pub base: String,
    pub client: reqwest::Client,
}

impl TestServer {
    /// The server as `hypermnf serve` runs it, on a free loopback port, on the CPU backend (the
    /// references are computed on the CPU).
    pub async fn start(mut args: hypermnf::config::ServeArgs) -> TestServer {
        args.backend = hypermnf::mnf::BackendChoice::Cpu;
        Self::start_on_given_backend(args).await
    }

    /// The same, on the backend `args` names (the GPU tests).
    pub async fn start_on_given_backend(args: hypermnf::config::ServeArgs) -> TestServer {
        let server = hypermnf::api::start(args).await.expect("server starts");
        let base = format!("http://{}", server.addr);
        // No connection reuse: a refused upload's connection is closed by the server, and a pooled
        // client could pick it up just before it sees the close.
        // A request that hangs fails its test, naming the request, rather than the whole run's time limit.
        let client = reqwest::Client::builder().pool_max_idle_per_host(0).timeout(Duration::from_secs(120)).build().unwrap();
        TestServer { server, base, client }
    }

    pub fn url(&self, p: &str) -> String {
        format!("{}{p}", self.base)
    }

    pub async fn post_npy(&self, body: &[u8], query: &str) -> (StatusCode, Value) {
        let r = self.client.post(self.url(&format!("/v1/jobs?{query}"))).header("content-type", "application/x-npy")
            .body(body.to_vec()).send().await.unwrap();
        (r.status(), r.json().await.unwrap())
    }

    pub async fn get_json(&self, p: &str) -> (StatusCode, Value) {
        let r = self.client.get(self.url(p)).send().await.unwrap();
        (r.status(), r.json().await.unwrap())
    }

    pub async fn get_bytes(&self, p: &str) -> (StatusCode, Vec<u8>) {
        let r = self.client.get(self.url(p)).send().await.unwrap();
        (r.status(), r.bytes().await.unwrap().to_vec())
    }

    /// Polls until the job is finished (its progress must stay within 0..=1 meanwhile).
    pub async fn wait(&self, id: &str) -> Value {
        self.wait_with(id, None).await
    }

    /// [`Self::wait`] as the owner of API key `key`.
    pub async fn wait_as(&self, id: &str, key: &str) -> Value {
        self.wait_with(id, Some(key)).await
    }

    async fn wait_with(&self, id: &str, key: Option<&str>) -> Value {
        let deadline = Instant::now() + Duration::from_secs(150);
        loop {
            let mut req = self.client.get(self.url(&format!("/v1/jobs/{id}")));
            if let Some(k) = key {
                req = req.bearer_auth(k);
            }
            let r = req.send().await.unwrap();
            let s = r.status();
            let j: Value = r.json().await.unwrap();
            assert_eq!(s, StatusCode::OK, "{j}");
            let p = j["progress"].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&p), "{j}");
            if !matches!(j["status"].as_str(), Some("queued") | Some("running")) {
                return j;
            }
            assert!(Instant::now() < deadline, "job {id} did not finish: {j}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn stop(self) {
        self.server.stop().await.unwrap();
    }
}

/// The cube as a C-order (lines, samples, bands) `.npy` in its own data type and byte order, as the
/// project's writer makes it.
pub fn npy_bytes(cube: &hypermnf::cube::Cube) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c.npy");
    hypermnf::cube::npy::write_cube(&p, cube).unwrap();
    std::fs::read(&p).unwrap()
}

/// A synthetic int16 cube with a 5-dimensional signal plus white noise (`seed` makes different cubes).
pub fn synthetic_cube(lines: usize, samples: usize, bands: usize, seed: u64) -> hypermnf::cube::Cube {
    let mut spec = hypermnf::cube::synthetic::SyntheticSpec::small(lines, samples, bands);
    spec.seed = seed;
    hypermnf::cube::synthetic::generate(&spec)
}

/// Naive float64 moments of several cubes pooled (issue 32), written from the definitions: the mean
/// and covariance of all their pixels, and the covariance of each cube's own shift differences
/// x(l, s) − x(l + 1, s + 1) (never across two cubes), unscaled. Returns (data mean, data covariance,
/// noise covariance), the covariances B × B row-major, unbiased.
pub fn pooled_moments_reference(cubes: &[hypermnf::cube::Cube]) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let b = cubes[0].bands();
    let (mut pixels, mut residuals) = (Vec::new(), Vec::new());
    for cube in cubes {
        let (l, s) = (cube.lines(), cube.samples());
        let x = cube.to_f64();
        let at = |li: usize, si: usize| &x[(li * s + si) * b..(li * s + si + 1) * b];
        for li in 0..l {
            for si in 0..s {
                pixels.push(at(li, si).to_vec());
                if li + 1 < l && si + 1 < s {
                    residuals.push(at(li, si).iter().zip(at(li + 1, si + 1)).map(|(p, q)| p - q).collect::<Vec<f64>>());
                }
            }
        }
    }
    let cov = |rows: &[Vec<f64>]| {
        let n = rows.len() as f64;
        let mean: Vec<f64> = (0..b).map(|j| rows.iter().map(|r| r[j]).sum::<f64>() / n).collect();
        let mut c = vec![0.0; b * b];
        for r in rows {
            for i in 0..b {
                for j in 0..b {
                    c[i * b + j] += (r[i] - mean[i]) * (r[j] - mean[j]);
                }
            }
        }
        (mean, c.into_iter().map(|v| v / (n - 1.0)).collect::<Vec<f64>>())
    };
    let (mean, cd) = cov(&pixels);
    let (_, cn) = cov(&residuals);
    (mean, cd, cn)
}

/// What a server's scratch areas hold (the data directory's, and its object store's): empty once every
/// request has ended.
pub fn scratch_entries(data_dir: &Path) -> Vec<PathBuf> {
    let mut left = Vec::new();
    for d in [data_dir.join("objects/scratch"), data_dir.join("scratch")] {
        if let Ok(entries) = std::fs::read_dir(&d) {
            left.extend(entries.filter_map(|e| e.ok()).map(|e| e.path()));
        }
    }
    left
}

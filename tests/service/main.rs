//! The HTTP service end to end: a real server on a loopback port with its real SQLite database in a
//! temporary data dir, driven over real HTTP (reqwest); and a real `hypermnf serve` process killed
//! with SIGKILL while a job runs, then started again on the same data dir.
//!
//! The tests are grouped by subject in tests/service/: uploads, jobs, hostile requests, restarts; the
//! helpers they share are here.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};

use hypermnf::mnf::MnfParams;

#[path = "../common/mod.rs"]
mod common;
use common::{npy_bytes, synthetic_cube, TestServer};

mod hostile;
mod jobs;
mod restart;
mod uploads;

const CUBES: [&str; 3] = ["salinasA_224_bip_be", "jasper_ridge_r198_bil", "abu_beach1_cat_island_bsq"];

/// A synthetic cube whose job runs long enough (a second or more) to be seen running and canceled.
const BIG: (usize, usize, usize) = (400, 300, 160);

fn test_data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").canonicalize().unwrap()
}

impl TestServer {
    /// A `.npy` POST with one digest header (`x-content-sha256` or `x-cube-digest`); the response as is.
    async fn post_npy_with(&self, body: &[u8], query: &str, header: &str, digest: &str) -> reqwest::Response {
        self.client.post(self.url(&format!("/v1/jobs?{query}"))).header("content-type", "application/x-npy")
            .header(header, digest).body(body.to_vec()).send().await.unwrap()
    }

    async fn wait_status(&self, id: &str, status: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let j = self.get_json(&format!("/v1/jobs/{id}")).await.1;
            if j["status"] == status {
                return;
            }
            assert!(Instant::now() < deadline && !j["finished_at"].is_string(), "job {id} never became {status}: {j}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Starts the real binary on port 0 and reads the address it prints.
async fn spawn_server(data: &Path, log: &Path) -> (std::process::Child, String) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_hypermnf"))
        .args(["serve", "--listen", "127.0.0.1:0", "--backend", "cpu", "--data-dir"])
        .arg(data)
        .env("RUST_LOG", "hypermnf=info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        std::io::BufReader::new(stdout).read_line(&mut line).unwrap();
        line
    })
    .await
    .unwrap();
    let base = line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("unexpected first line {line:?}")).to_string();
    (child, base)
}

fn cpu() -> Arc<dyn hypermnf::backend::Backend> {
    hypermnf::backend::select(hypermnf::mnf::BackendChoice::Cpu).unwrap()
}

/// What `hypermnf run --out DIR/ref.npy` writes for this cube and these parameters.
fn reference_result(cube: &hypermnf::cube::Cube, params: &MnfParams, dir: &Path) -> hypermnf::output::WrittenFiles {
    std::fs::create_dir_all(dir).unwrap();
    let out = hypermnf::mnf::run(cube, params, &*cpu(), &hypermnf::mnf::Monitor::silent()).unwrap();
    hypermnf::output::write_result(&dir.join("ref.npy"), &out, &cube.meta).unwrap()
}

/// A `.npy` header (version 1, padded to 64 bytes) for `descr` and `shape` (Python tuple text).
fn npy_header(descr: &str, shape: &str) -> Vec<u8> {
    let mut h = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + h.len() + 1) % 64 != 0 {
        h.push(' ');
    }
    h.push('\n');
    let mut v = b"\x93NUMPY\x01\x00".to_vec();
    v.extend_from_slice(&(h.len() as u16).to_le_bytes());
    v.extend_from_slice(h.as_bytes());
    v
}


fn without_timings(mut v: Value) -> Value {
    if let Some(o) = v.as_object_mut() {
        o.remove("timings_ms");
        // Present when the job cache let a job reuse an earlier job's statistics (same results).
        o.remove("statistics");
    }
    v
}

fn unzip(bytes: &[u8]) -> HashMap<String, Vec<u8>> {
    use std::io::Read;
    let mut z = zip::ZipArchive::new(std::io::Cursor::new(bytes)).unwrap();
    let mut out = HashMap::new();
    for i in 0..z.len() {
        let mut f = z.by_index(i).unwrap();
        let mut buf = Vec::new();
        f.read_to_end(&mut buf).unwrap();
        out.insert(f.name().to_string(), buf);
    }
    out
}

fn sha256_hex(b: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(b))
}

/// The status and `code` of an error answer, after checking it is the documented JSON shape.
async fn error_of(r: reqwest::Response) -> (StatusCode, String) {
    let status = r.status();
    let ct = r.headers().get("content-type").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
    let text = r.text().await.unwrap();
    assert!(ct.starts_with("application/json"), "{status}: content-type {ct:?}, body {text:?}");
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{status}: not JSON: {text:?}"));
    let o = v.as_object().unwrap();
    assert_eq!(o.len(), 2, "{text}");
    assert!(o["message"].as_str().is_some_and(|m| !m.is_empty()), "{text}");
    (status, o["code"].as_str().unwrap().to_string())
}

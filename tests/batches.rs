//! `/v1/batches` on the CPU backend: pooled statistics against an independent float64 reference,
//! a pooled batch of one against a plain job, batches of independent jobs, refusals, failures and
//! deletion.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{npy_bytes, synthetic_cube, TestServer};
use hypermnf::cube::Cube;
use nalgebra::{DMatrix, SymmetricEigen};
use reqwest::StatusCode;
use serde_json::{json, Value};

impl TestServer {
    async fn post_batch(&self, body: &Value) -> (StatusCode, Value) {
        let r = self.client.post(self.url("/v1/batches")).json(body).send().await.unwrap();
        (r.status(), r.json().await.unwrap())
    }

    async fn post_href(&self, href: &str, params: Value) -> Value {
        let body = json!({"input": {"href": href}, "params": params});
        let r = self.client.post(self.url("/v1/jobs")).json(&body).send().await.unwrap();
        let (s, j): (StatusCode, Value) = (r.status(), r.json().await.unwrap());
        assert!(s.is_success(), "{j}");
        j
    }

    /// Polls the batch until every member is finished.
    async fn wait_batch(&self, id: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(150);
        loop {
            let (s, b) = self.get_json(&format!("/v1/batches/{id}")).await;
            assert_eq!(s, StatusCode::OK, "{b}");
            let p = b["progress"].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&p), "{b}");
            let done = b["jobs"].as_array().unwrap().iter().all(|j| matches!(j["status"].as_str(), Some("succeeded" | "failed" | "canceled")));
            if done {
                return b;
            }
            assert!(Instant::now() < deadline, "batch {id} did not finish: {b}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn components(&self, job: &str) -> Vec<u8> {
        let (s, bytes) = self.get_bytes(&format!("/v1/jobs/{job}/result")).await;
        assert_eq!(s, StatusCode::OK);
        bytes
    }

    async fn metadata(&self, job: &str) -> Value {
        let (s, m) = self.get_json(&format!("/v1/jobs/{job}/metadata")).await;
        assert_eq!(s, StatusCode::OK, "{m}");
        m
    }
}

fn href(p: &Path) -> String {
    format!("file://{}", p.display())
}

/// Writes `cube` as `<dir>/<name>.npy` and returns its href.
fn put(dir: &Path, name: &str, cube: &Cube) -> String {
    let p = dir.join(format!("{name}.npy"));
    std::fs::write(&p, npy_bytes(cube)).unwrap();
    href(&p)
}

/// Writes `cube` (int16, BIP) as an ENVI pair `<dir>/<name>.{hdr,img}` with wavelengths `first`,
/// `first + 10`, ... nm, and returns the header's href.
fn put_envi(dir: &Path, name: &str, cube: &Cube, first: f64) -> String {
    let wl: Vec<String> = (0..cube.bands()).map(|b| format!("{:.2}", first + 10.0 * b as f64)).collect();
    let hdr = format!(
        "ENVI\nsamples = {}\nlines = {}\nbands = {}\nheader offset = 0\ndata type = 2\ninterleave = bip\nbyte order = 0\nwavelength units = Nanometers\nwavelength = {{{}}}\n",
        cube.samples(),
        cube.lines(),
        cube.bands(),
        wl.join(", ")
    );
    std::fs::write(dir.join(format!("{name}.hdr")), hdr).unwrap();
    let le: Vec<u8> = cube.to_f64().iter().flat_map(|v| (*v as i16).to_le_bytes()).collect();
    std::fs::write(dir.join(format!("{name}.img")), le).unwrap();
    href(&dir.join(format!("{name}.hdr")))
}

async fn server(root: &Path, data: &Path) -> TestServer {
    let mut args = hypermnf::config::ServeArgs::with_data_dir(data);
    args.input_roots = vec![root.canonicalize().unwrap()];
    args.workers = 2;
    TestServer::start(args).await
}

fn ids(batch: &Value) -> Vec<String> {
    batch["jobs"].as_array().unwrap().iter().map(|j| j["id"].as_str().unwrap().to_string()).collect()
}

/// The pooled MNF of `cubes`, naive float64, written from the definitions: data covariance of all
/// their pixels about the pooled mean, noise covariance of each cube's own shift differences (x at
/// (l, s) minus x at (l + 1, s + 1), never across two cubes) divided by 2, and the generalized
/// eigenvalues of (C_D, C_N) through C_N's eigen decomposition. Returns (eigenvalues descending, means).
fn pooled_reference(cubes: &[Cube]) -> (Vec<f64>, Vec<f64>) {
    let b = cubes[0].bands();
    let (means, cd, cn) = common::pooled_moments_reference(cubes);
    let (cd, cn) = (DMatrix::from_row_slice(b, b, &cd), DMatrix::from_row_slice(b, b, &cn) / 2.0);
    let en = SymmetricEigen::new(cn);
    let p = &en.eigenvectors * DMatrix::from_diagonal(&en.eigenvalues.map(|d| 1.0 / d.sqrt()));
    let cadj = p.transpose() * &cd * &p;
    let mut eig: Vec<f64> = SymmetricEigen::new((&cadj + cadj.transpose()) * 0.5).eigenvalues.iter().copied().collect();
    eig.sort_by(|a, b| b.total_cmp(a));
    (eig, means)
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
}

/// Three cubes of different sizes pooled: one eigen system for all (every member's metadata has the
/// same eigenvalues and means, equal to the independent float64 reference of the pooled pixels and
/// per-cube residuals to 1e-9), each cube projected with it; the members' documents name the batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_batch_projects_every_cube_with_the_system_of_all_their_statistics() {
    let (root, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let srv = server(root.path(), data.path()).await;
    let cubes = vec![synthetic_cube(24, 20, 8, 1), synthetic_cube(17, 20, 8, 2), synthetic_cube(30, 11, 8, 3)];
    let inputs: Vec<Value> = cubes.iter().enumerate().map(|(i, c)| json!({"href": put(root.path(), &format!("c{i}"), c)})).collect();
    let params = json!({"components": 4, "noise": "shift-difference"});
    let (s, created) = srv.post_batch(&json!({"inputs": inputs, "statistics": "pooled", "params": params})).await;
    assert_eq!(s, StatusCode::CREATED, "{created}");
    assert_eq!(created["statistics"], "pooled");
    assert_eq!(created["jobs"].as_array().unwrap().len(), 3);
    let id = created["id"].as_str().unwrap().to_string();
    let done = srv.wait_batch(&id).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(done["progress"], 1.0);
    assert_eq!(done["system_ready"], true);

    let (want_eig, want_means) = pooled_reference(&cubes);
    let mut first: Option<Value> = None;
    for (i, job) in ids(&done).iter().enumerate() {
        let (_, doc) = srv.get_json(&format!("/v1/jobs/{job}")).await;
        assert_eq!(doc["batch"]["id"], id.as_str(), "{doc}");
        assert_eq!(doc["batch"]["position"], i);
        let m = srv.metadata(job).await;
        assert_eq!(m["statistics"]["source"], "pooled", "{m}");
        assert_eq!(m["statistics"]["batch"], id.as_str());
        assert_eq!(m["batch"], id.as_str());
        let eig = floats(&m["eigenvalues"]);
        for (k, (g, w)) in eig.iter().zip(&want_eig).enumerate() {
            assert!((g - w).abs() <= 1e-9 * w.abs(), "cube {i}, eigenvalue {k}: {g} vs {w}");
        }
        for (g, w) in floats(&m["means"]).iter().zip(&want_means) {
            assert!((g - w).abs() <= 1e-9 * w.abs(), "cube {i}: mean {g} vs {w}");
        }
        // One system: identical bits in every member.
        match &first {
            None => first = Some(m.clone()),
            Some(f) => {
                assert_eq!(f["eigenvalues"], m["eigenvalues"]);
                assert_eq!(f["transform"], m["transform"]);
            }
        }
        // The components are that system applied to this cube.
        let npy = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(npy.path(), srv.components(job).await).unwrap();
        let comps = hypermnf::cube::npy::read(npy.path()).unwrap();
        assert_eq!((comps.lines(), comps.samples(), comps.bands()), (cubes[i].lines(), cubes[i].samples(), 4));
    }
    srv.stop().await;
}

/// A pooled batch of one cube is a plain job on that cube: the same components, bit for bit, and the
/// same eigen system.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_batch_of_one_cube_equals_a_plain_job_bit_for_bit() {
    let (root, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let srv = server(root.path(), data.path()).await;
    let cube = synthetic_cube(40, 33, 10, 7);
    let h = put(root.path(), "one", &cube);
    let params = json!({"components": 5, "inverse": true});
    let plain = srv.post_href(&h, params.clone()).await;
    let plain = srv.wait(plain["id"].as_str().unwrap()).await;
    assert_eq!(plain["status"], "succeeded", "{plain}");
    let (s, b) = srv.post_batch(&json!({"inputs": [{"href": h}], "statistics": "pooled", "params": params})).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let b = srv.wait_batch(b["id"].as_str().unwrap()).await;
    assert_eq!(b["status"], "succeeded", "{b}");
    let member = &ids(&b)[0];
    let plain_id = plain["id"].as_str().unwrap();
    assert_ne!(member, plain_id, "a batch's job is its own");
    assert_eq!(srv.components(member).await, srv.components(plain_id).await);
    let (pm, mm) = (srv.metadata(plain_id).await, srv.metadata(member).await);
    for key in ["eigenvalues", "means", "transform", "bands_used"] {
        assert_eq!(pm[key], mm[key], "{key}");
    }
    let (_, denoised_plain) = srv.get_bytes(&format!("/v1/jobs/{plain_id}/result?product=denoised")).await;
    let (_, denoised_member) = srv.get_bytes(&format!("/v1/jobs/{member}/result?product=denoised")).await;
    assert_eq!(denoised_plain, denoised_member);
    srv.stop().await;
}

/// `"each"`: independent jobs, each the plain job of its cube.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_independent_jobs_gives_each_cube_its_own_system() {
    let (root, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let srv = server(root.path(), data.path()).await;
    let hrefs: Vec<String> = (0..2).map(|i| put(root.path(), &format!("e{i}"), &synthetic_cube(26, 21, 9, 10 + i))).collect();
    let params = json!({"components": 3});
    let (s, b) = srv.post_batch(&json!({"inputs": hrefs.iter().map(|h| json!({"href": h})).collect::<Vec<_>>(), "statistics": "each", "params": params})).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let b = srv.wait_batch(b["id"].as_str().unwrap()).await;
    assert_eq!(b["status"], "succeeded", "{b}");
    let members = ids(&b);
    for member in &members {
        assert_eq!(srv.metadata(member).await["batch"], b["id"], "each job's metadata names its batch");
    }
    for (h, member) in hrefs.iter().zip(&members) {
        let plain = srv.post_href(h, params.clone()).await;
        let plain = srv.wait(plain["id"].as_str().unwrap()).await;
        assert_eq!(srv.components(member).await, srv.components(plain["id"].as_str().unwrap()).await);
    }
    let (m0, m1) = (srv.metadata(&members[0]).await, srv.metadata(&members[1]).await);
    assert_ne!(m0["eigenvalues"], m1["eigenvalues"], "independent systems");
    srv.stop().await;
}

/// Requests a batch cannot be made from are refused with their code, and leave nothing: no batch,
/// no job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_batches_are_refused_and_leave_nothing() {
    let (root, data, outside) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let srv = server(root.path(), data.path()).await;
    let a = put(root.path(), "a", &synthetic_cube(20, 20, 8, 1));
    let other_bands = put(root.path(), "b", &synthetic_cube(20, 20, 9, 2));
    let out = put(outside.path(), "o", &synthetic_cube(20, 20, 8, 3));
    let (wl_a, wl_b) = (put_envi(root.path(), "wa", &synthetic_cube(20, 20, 8, 4), 400.0), put_envi(root.path(), "wb", &synthetic_cube(20, 20, 8, 5), 405.0));
    let cases = [
        ("wavelengths differ", json!({"inputs": [{"href": wl_a}, {"href": wl_b}], "statistics": "pooled"}), StatusCode::UNPROCESSABLE_ENTITY, "batch_mismatch"),
        ("band counts differ", json!({"inputs": [{"href": a}, {"href": other_bands}], "statistics": "pooled"}), StatusCode::UNPROCESSABLE_ENTITY, "batch_mismatch"),
        ("no inputs", json!({"inputs": [], "statistics": "pooled"}), StatusCode::UNPROCESSABLE_ENTITY, "invalid_params"),
        ("unknown statistics", json!({"inputs": [{"href": a}], "statistics": "mean"}), StatusCode::UNPROCESSABLE_ENTITY, "invalid_params"),
        ("unknown member", json!({"inputs": [{"href": a}], "stats": "pooled"}), StatusCode::BAD_REQUEST, "invalid_json"),
        ("outside the roots", json!({"inputs": [{"href": a}, {"href": out}], "statistics": "each"}), StatusCode::FORBIDDEN, "forbidden_path"),
        ("missing file", json!({"inputs": [{"href": href(&root.path().join("nope.npy"))}]}), StatusCode::BAD_REQUEST, "input_not_found"),
        ("bad params", json!({"inputs": [{"href": a}], "params": {"components": 0}}), StatusCode::UNPROCESSABLE_ENTITY, "invalid_params"),
    ];
    for (what, body, status, code) in cases {
        let (s, e) = srv.post_batch(&body).await;
        assert_eq!((s, e["code"].as_str()), (status, Some(code)), "{what}: {e}");
    }
    // The message says which input.
    let (_, e) = srv.post_batch(&json!({"inputs": [{"href": a}, {"href": out}]})).await;
    assert!(e["message"].as_str().unwrap().starts_with("input 1: "), "{e}");
    let (_, batches) = srv.get_json("/v1/batches").await;
    assert_eq!(batches["batches"].as_array().unwrap().len(), 0);
    let (_, jobs) = srv.get_json("/v1/jobs").await;
    assert_eq!(jobs["jobs"].as_array().unwrap().len(), 0, "{jobs}");
    // The same wavelengths (and a .npy, which has none) pool.
    let wl_c = put_envi(root.path(), "wc", &synthetic_cube(20, 20, 8, 6), 400.0);
    let (s, b) = srv.post_batch(&json!({"inputs": [{"href": wl_a}, {"href": wl_c}, {"href": a}], "statistics": "pooled"})).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    assert_eq!(srv.wait_batch(b["id"].as_str().unwrap()).await["status"], "succeeded");
    srv.stop().await;
}

/// A pooled batch whose system cannot be computed (every pixel of every cube is no-data) fails, and
/// its members fail with `batch_failed`, saying why, instead of waiting for a system that cannot come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_batch_without_a_system_fails_its_members() {
    let (root, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let srv = server(root.path(), data.path()).await;
    let nodata = Cube::from_i16(20, 20, 6, &vec![-9999i16; 20 * 20 * 6]).unwrap();
    let inputs: Vec<Value> = (0..2).map(|i| json!({"href": put(root.path(), &format!("n{i}"), &nodata)})).collect();
    let (s, b) = srv.post_batch(&json!({"inputs": inputs, "statistics": "pooled", "params": {"ignore_value": -9999}})).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let b = srv.wait_batch(b["id"].as_str().unwrap()).await;
    assert_eq!(b["status"], "failed", "{b}");
    assert_eq!(b["error"]["code"], "degenerate_input", "{b}");
    for j in b["jobs"].as_array().unwrap() {
        assert_eq!(j["error"]["code"], "batch_failed", "{b}");
        assert!(j["error"]["message"].as_str().unwrap().contains("no-data"), "{b}");
    }
    srv.stop().await;
}

/// A member canceled before the pooled system exists ends the batch: no other member is left
/// waiting for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canceled_member_ends_its_pooled_batch() {
    let (root, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let srv = server(root.path(), data.path()).await;
    let inputs: Vec<Value> = (0..4).map(|i| json!({"href": put(root.path(), &format!("k{i}"), &synthetic_cube(60, 50, 12, 40 + i))})).collect();
    let (s, b) = srv.post_batch(&json!({"inputs": inputs, "statistics": "pooled"})).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let last = ids(&b).pop().unwrap();
    let r = srv.client.delete(srv.url(&format!("/v1/jobs/{last}"))).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let b = srv.wait_batch(b["id"].as_str().unwrap()).await;
    let (canceled, status) = (b["counts"]["canceled"].as_u64().unwrap(), b["status"].as_str().unwrap());
    // Canceled before its statistics: the batch fails; after them (the system already made): the
    // other members succeed and the batch says one was canceled.
    assert!(canceled + b["counts"]["succeeded"].as_u64().unwrap() == 4 || status == "failed", "{b}");
    assert!(matches!(status, "failed" | "canceled"), "{b}");
    srv.stop().await;
}

/// DELETE cancels and removes the batch, its jobs and every file they stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_batch_leaves_nothing_behind() {
    let (root, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let srv = server(root.path(), data.path()).await;
    let hrefs: Vec<Value> = (0..3).map(|i| json!({"href": put(root.path(), &format!("d{i}"), &synthetic_cube(22, 19, 7, 20 + i))})).collect();
    for statistics in ["pooled", "each"] {
        let (s, b) = srv.post_batch(&json!({"inputs": hrefs, "statistics": statistics, "params": {"components": 2}})).await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
        let id = b["id"].as_str().unwrap().to_string();
        let b = srv.wait_batch(&id).await;
        assert_eq!(b["status"], "succeeded", "{b}");
        let r = srv.client.delete(srv.url(&format!("/v1/batches/{id}"))).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
        let (s, _) = srv.get_json(&format!("/v1/batches/{id}")).await;
        assert_eq!(s, StatusCode::NOT_FOUND);
        for job in ids(&b) {
            let (s, _) = srv.get_json(&format!("/v1/jobs/{job}")).await;
            assert_eq!(s, StatusCode::NOT_FOUND);
        }
    }
    // A batch deleted while it runs: canceled, then removed.
    let (_, b) = srv.post_batch(&json!({"inputs": hrefs, "statistics": "pooled"})).await;
    let r = srv.client.delete(srv.url(&format!("/v1/batches/{}", b["id"].as_str().unwrap()))).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    // What the runs were writing is gone once they stop.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left: Vec<String> = ["batches", "results"]
            .iter()
            .flat_map(|d| std::fs::read_dir(data.path().join("objects").join(d)).into_iter().flatten().flatten().map(|e| e.path().display().to_string()))
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "left behind: {left:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    srv.stop().await;
}

fn npy_f64(v: &Value) -> Vec<f64> {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD.decode(v["npy"].as_str().unwrap()).unwrap();
    let header = hypermnf::cube::npy::read_header(&mut &bytes[..]).unwrap();
    bytes[header.data_offset as usize..].chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect()
}

/// The pooled batch's system file (`GET /v1/batches/{id}/system`): its pooled statistics equal the
/// independent float64 ones to 1e-9; every member's components are, byte for byte, what
/// `hypermnf run --system` writes with that file; and `statistics_from` naming the batch projects
/// another cube exactly as `hypermnf run --system` and `MnfFit::from_system` do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_batch_exports_its_system_and_lends_it_to_other_cubes() {
    let (root, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let srv = server(root.path(), data.path()).await;
    let cubes = vec![synthetic_cube(26, 22, 9, 31), synthetic_cube(19, 22, 9, 32)];
    let hrefs: Vec<String> = cubes.iter().enumerate().map(|(i, c)| put(root.path(), &format!("s{i}"), c)).collect();
    let params = json!({"components": 4, "noise": "shift-difference"});
    let (s, b) = srv.post_batch(&json!({"inputs": hrefs.iter().map(|h| json!({"href": h})).collect::<Vec<_>>(), "statistics": "pooled", "params": params})).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let id = b["id"].as_str().unwrap().to_string();
    let b = srv.wait_batch(&id).await;
    assert_eq!(b["status"], "succeeded", "{b}");

    let (s, bytes) = srv.get_bytes(&format!("/v1/batches/{id}/system")).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&bytes));
    let doc: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(doc["source"]["batch"], id.as_str(), "{}", doc["source"]);
    // The pooled statistics, against the naive float64 ones.
    let (want_eig, want_mean) = pooled_reference(&cubes);
    let mean = npy_f64(&doc["arrays"]["pooled_data_mean"]);
    for (g, w) in mean.iter().zip(&want_mean) {
        assert!((g - w).abs() <= 1e-9 * w.abs(), "pooled mean {g} vs {w}");
    }
    let counts = npy_f64(&doc["arrays"]["pooled_counts"]);
    assert_eq!(counts, vec![(26.0 * 22.0) + (19.0 * 22.0), (25.0 * 21.0) + (18.0 * 21.0), 0.0, 2.0]);
    let file = hypermnf::mnf::system_file::SystemFile::from_json(&bytes).unwrap();
    for (g, w) in file.system.eigenvalues.iter().zip(&want_eig) {
        assert!((g - w).abs() <= 1e-9 * w.abs(), "pooled eigenvalue {g} vs {w}");
    }
    let system_path = root.path().join("pooled-system.json");
    std::fs::write(&system_path, &bytes).unwrap();
    let cli = |cube: &Path, out: &Path| {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_hypermnf"))
            .args(["run", cube.to_str().unwrap(), "--out", out.to_str().unwrap(), "--components", "4", "--backend", "cpu", "--system", system_path.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        std::fs::read(out).unwrap()
    };
    // Each member is that system applied to its cube.
    for (i, job) in ids(&b).iter().enumerate() {
        let want = cli(&root.path().join(format!("s{i}.npy")), &root.path().join(format!("s{i}-cli.npy")));
        assert!(srv.components(job).await == want, "member {i} differs from hypermnf run --system");
    }
    // Another cube of the same bands, projected with the batch's system.
    let other = synthetic_cube(15, 17, 9, 33);
    let other_href = put(root.path(), "other", &other);
    let job = srv.post_href(&other_href, json!({"components": 4, "statistics_from": id})).await;
    let job = srv.wait(job["id"].as_str().unwrap()).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    let got = srv.components(job["id"].as_str().unwrap()).await;
    assert!(got == cli(&root.path().join("other.npy"), &root.path().join("other-cli.npy")), "statistics_from a batch differs from hypermnf run --system");
    let mnf = hypermnf::Mnf::new().components(4).backend(hypermnf::Backend::Cpu);
    let lib = hypermnf::MnfFit::from_system(&file, &mnf).unwrap().transform(hypermnf::library::cube_to_array::<i16>(&other).unwrap().view()).unwrap();
    let lib_path = root.path().join("other-lib.npy");
    hypermnf::cube::npy::write_f32(&lib_path, &[15, 17, 4], lib.as_slice().unwrap()).unwrap();
    assert!(std::fs::read(&lib_path).unwrap() == got, "MnfFit::from_system differs from statistics_from a batch");
    let m = srv.metadata(job["id"].as_str().unwrap()).await;
    assert_eq!(m["statistics"]["source"], "statistics_from", "{m}");
    assert_eq!(m["statistics"]["from"], id.as_str());

    // Other bands are refused; a batch of independent jobs has no system to export or lend.
    let nine_not = put(root.path(), "ten", &synthetic_cube(15, 17, 10, 34));
    let r = srv.client.post(srv.url("/v1/jobs")).json(&json!({"input": {"href": nine_not}, "params": {"statistics_from": id}})).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(r.json::<Value>().await.unwrap()["code"], "system_mismatch");
    let (_, each) = srv.post_batch(&json!({"inputs": [{"href": hrefs[0]}], "statistics": "each"})).await;
    let each_id = each["id"].as_str().unwrap();
    let (s, e) = srv.get_json(&format!("/v1/batches/{each_id}/system")).await;
    assert_eq!((s, e["code"].as_str()), (StatusCode::CONFLICT, Some("no_system")), "{e}");
    let r = srv.client.post(srv.url("/v1/jobs")).json(&json!({"input": {"href": other_href}, "params": {"statistics_from": each_id}})).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    // A pooled batch refuses statistics_from (it computes its own).
    let (s, e) = srv.post_batch(&json!({"inputs": [{"href": hrefs[0]}], "statistics": "pooled", "params": {"statistics_from": id}})).await;
    assert_eq!((s, e["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_params")), "{e}");
    srv.stop().await;
}

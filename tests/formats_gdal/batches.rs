//! Batches of GDAL-format cubes: by file://, https:// and s3:// reference.

use super::*;

/// A pooled batch of EMIT NetCDF granules by `file://` reference: GDAL reads each whole file where it
/// is, at submit (to check it) and in the run; every member's components are, byte for byte, what
/// `hypermnf run --system` writes with the batch's system file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_batch_of_netcdf_granules_by_file_reference() {
    let Some(l) = layouts() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let mut args = hypermnf::config::ServeArgs::with_data_dir(tmp.path());
    args.input_roots = vec![l.dir.canonicalize().unwrap()];
    let srv = common::TestServer::start(args).await;
    let files = [l.dir.join("emit_rdn.nc"), l.dir.join("emit_rfl.nc")];
    let hrefs: Vec<String> = files.iter().map(|f| format!("file://{}", f.display())).collect();
    let b = run_batch(&srv, &hrefs, "pooled", serde_json::json!({"components": 4, "backend": "cpu"})).await;
    members_equal_run_with_system(&srv, &b, &files).await;
    srv.stop().await;
}


use super::common::https_site::Https;
use super::common::s3::{s3_bucket, s3_client, s3_put};
use super::common::scratch_entries;

/// Posts a batch of `hrefs` and waits for every member to finish: the batch's document, which must
/// say succeeded.
async fn run_batch(srv: &common::TestServer, hrefs: &[String], statistics: &str, params: serde_json::Value) -> serde_json::Value {
    let inputs: Vec<serde_json::Value> = hrefs.iter().map(|h| serde_json::json!({"href": h})).collect();
    let body = serde_json::json!({"inputs": inputs, "statistics": statistics, "params": params});
    let r = srv.client.post(srv.url("/v1/batches")).json(&body).send().await.unwrap();
    let (s, b) = (r.status(), r.json::<serde_json::Value>().await.unwrap());
    assert_eq!(s, reqwest::StatusCode::CREATED, "{b}");
    let id = b["id"].as_str().unwrap().to_string();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(150);
    let b = loop {
        let (_, b) = srv.get_json(&format!("/v1/batches/{id}")).await;
        if b["jobs"].as_array().unwrap().iter().all(|j| matches!(j["status"].as_str(), Some("succeeded" | "failed" | "canceled"))) {
            break b;
        }
        assert!(std::time::Instant::now() < deadline, "the batch did not finish: {b}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(b["status"], "succeeded", "{b}");
    assert_eq!(b["jobs"].as_array().unwrap().len(), hrefs.len(), "{b}");
    b
}

/// Every member of the pooled batch `b` (4 components, CPU) gives, byte for byte, what
/// `hypermnf run --system` writes for the same file (`files`, in the batch's order) with the batch's
/// exported system.
async fn members_equal_run_with_system(srv: &common::TestServer, b: &serde_json::Value, files: &[PathBuf]) {
    let (s, system) = srv.get_bytes(&format!("/v1/batches/{}/system", b["id"].as_str().unwrap())).await;
    assert_eq!(s, reqwest::StatusCode::OK, "{}", String::from_utf8_lossy(&system));
    let work = tempfile::tempdir().unwrap();
    let system_path = work.path().join("system.json");
    std::fs::write(&system_path, &system).unwrap();
    for (i, job) in b["jobs"].as_array().unwrap().iter().enumerate() {
        let out = work.path().join(format!("m{i}.npy"));
        let o = Command::new(env!("CARGO_BIN_EXE_hypermnf"))
            .args(["run", files[i].to_str().unwrap(), "--out", out.to_str().unwrap(), "--components", "4", "--backend", "cpu", "--system", system_path.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let (s, got) = srv.get_bytes(&format!("/v1/jobs/{}/result", job["id"].as_str().unwrap())).await;
        assert_eq!(s, reqwest::StatusCode::OK);
        assert!(got == std::fs::read(&out).unwrap(), "member {i} ({}) differs from hypermnf run --system", files[i].display());
    }
}

/// The components of a finished job.
async fn job_components(srv: &common::TestServer, id: &str) -> Vec<u8> {
    let done = srv.wait(id).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    let (s, bytes) = srv.get_bytes(&format!("/v1/jobs/{id}/result")).await;
    assert_eq!(s, reqwest::StatusCode::OK);
    bytes
}

async fn counts(srv: &common::TestServer) -> (usize, usize) {
    let (_, jobs) = srv.get_json("/v1/jobs").await;
    let (_, batches) = srv.get_json("/v1/batches").await;
    (jobs["jobs"].as_array().unwrap().len(), batches["batches"].as_array().unwrap().len())
}

/// GDAL objects by reference (`url` names the layout file `name` where the test put it), through a
/// server allowed to read them:
/// - a pooled batch of the two EMIT NetCDF granules: every member equals `hypermnf run --system` with
///   the batch's system;
/// - an "each" batch of the GeoTIFF: its member equals the single job of the same href (submitted
///   after it: the single job's path, which digests the object at submit) and `hypermnf run`; the
///   single job asked again is answered with itself;
/// - a batch whose second input is the truncated NetCDF is refused naming that input, and leaves no
///   job, batch or scratch file.
async fn gdal_objects_by_reference(srv: &common::TestServer, data_dir: &Path, l: &Layouts, url: impl Fn(&str) -> String) {
    let params = serde_json::json!({"components": 4, "backend": "cpu"});
    let b = run_batch(srv, &[url("emit_rdn.nc"), url("emit_rfl.nc")], "pooled", params.clone()).await;
    members_equal_run_with_system(srv, &b, &[l.dir.join("emit_rdn.nc"), l.dir.join("emit_rfl.nc")]).await;

    let tif = url("cube.tif");
    let b = run_batch(srv, std::slice::from_ref(&tif), "each", params.clone()).await;
    let member = job_components(srv, b["jobs"][0]["id"].as_str().unwrap()).await;
    let body = serde_json::json!({"input": {"href": tif}, "params": params});
    let r = srv.client.post(srv.url("/v1/jobs")).json(&body).send().await.unwrap();
    let (s, j) = (r.status(), r.json::<serde_json::Value>().await.unwrap());
    assert_eq!(s, reqwest::StatusCode::ACCEPTED, "a batch's member answers no other request: {j}");
    let bands = cube::open(&l.dir.join("cube.tif")).unwrap().bands();
    assert_eq!(j["input"]["bands"].as_u64(), Some(bands as u64), "the object was decoded at submit: {j}");
    let single = j["id"].as_str().unwrap().to_string();
    assert!(job_components(srv, &single).await == member, "the \"each\" member differs from the single job of the same href");
    let r = srv.client.post(srv.url("/v1/jobs")).json(&body).send().await.unwrap();
    let (s, again) = (r.status(), r.json::<serde_json::Value>().await.unwrap());
    assert_eq!((s, again["id"].as_str()), (reqwest::StatusCode::OK, Some(single.as_str())), "{again}");
    let work = tempfile::tempdir().unwrap();
    let out = work.path().join("cli.npy");
    let o = Command::new(env!("CARGO_BIN_EXE_hypermnf"))
        .args(["run", l.dir.join("cube.tif").to_str().unwrap(), "--out", out.to_str().unwrap(), "--components", "4", "--backend", "cpu"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(member == std::fs::read(&out).unwrap(), "the \"each\" member differs from hypermnf run");

    let before = counts(srv).await;
    let inputs = [serde_json::json!({"href": url("emit_rdn.nc")}), serde_json::json!({"href": url("bad_truncated.nc")})];
    let body = serde_json::json!({"inputs": inputs, "statistics": "pooled", "params": {"components": 4}});
    let r = srv.client.post(srv.url("/v1/batches")).json(&body).send().await.unwrap();
    let (s, e) = (r.status(), r.json::<serde_json::Value>().await.unwrap());
    assert_eq!(s, reqwest::StatusCode::BAD_REQUEST, "{e}");
    let message = e["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("input 1: ") && message.contains("not a readable NetCDF"), "{e}");
    assert!(!message.contains("scratch"), "no server path in the message: {e}");
    assert_eq!(counts(srv).await, before, "the refused batch left jobs or a batch");
    assert_eq!(scratch_entries(data_dir), Vec::<PathBuf>::new(), "the refused batch left scratch files");
}

/// GDAL objects by `https://` reference, from the test's own https server (allowed by IP literal, its
/// CA trusted), in batches and as a single job; one the policy forbids (a port not allowed) is
/// refused in a batch naming its input, leaving nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gdal_objects_by_https_reference_in_batches() {
    let Some(l) = layouts() else { return };
    let site = Https::start().await;
    for name in ["emit_rdn.nc", "emit_rfl.nc", "cube.tif", "bad_truncated.nc"] {
        site.put(&format!("/granules/{name}"), std::fs::read(l.dir.join(name)).unwrap());
    }
    let tmp = tempfile::tempdir().unwrap();
    let mut args = hypermnf::config::ServeArgs::with_data_dir(tmp.path());
    args.input_hosts = vec![site.addr.to_string()];
    args.input_ca_certs = vec![site.ca.clone()];
    let srv = common::TestServer::start(args).await;
    gdal_objects_by_reference(&srv, tmp.path(), l, |name| site.url(&format!("/granules/{name}"))).await;

    let before = counts(&srv).await;
    let elsewhere = format!("https://127.0.0.1:{}/granules/emit_rfl.nc", site.addr.port() + 1);
    let body = serde_json::json!({"inputs": [{"href": site.url("/granules/emit_rdn.nc")}, {"href": elsewhere}], "statistics": "pooled"});
    let r = srv.client.post(srv.url("/v1/batches")).json(&body).send().await.unwrap();
    let (s, e) = (r.status(), r.json::<serde_json::Value>().await.unwrap());
    assert_eq!((s, e["code"].as_str()), (reqwest::StatusCode::FORBIDDEN, Some("forbidden_reference")), "{e}");
    assert!(e["message"].as_str().unwrap_or_default().starts_with("input 1: "), "{e}");
    assert_eq!(counts(&srv).await, before, "the refused batch left jobs or a batch");
    assert_eq!(scratch_entries(tmp.path()), Vec::<PathBuf>::new(), "the refused batch left scratch files");
    srv.stop().await;
}

/// The same with `s3://` references, the objects put in the test S3 server (scripts/lib/garage.sh) by
/// the test's own client; skipped without one, unless `HYPERMNF_REQUIRE_S3=1` (scripts/test.sh).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gdal_objects_by_s3_reference_in_batches() {
    let Some(l) = layouts() else { return };
    let Some(bucket) = s3_bucket("gdal_objects_by_s3_reference_in_batches") else { return };
    let store = s3_client(&bucket);
    let prefix = format!("formats-gdal-{}", uuid::Uuid::new_v4());
    let names = ["emit_rdn.nc", "emit_rfl.nc", "cube.tif", "bad_truncated.nc"];
    for name in names {
        s3_put(store.as_ref(), &format!("{prefix}/{name}"), std::fs::read(l.dir.join(name)).unwrap()).await;
    }
    let tmp = tempfile::tempdir().unwrap();
    let mut args = hypermnf::config::ServeArgs::with_data_dir(tmp.path());
    args.input_buckets = vec![bucket.clone()];
    let srv = common::TestServer::start(args).await;
    gdal_objects_by_reference(&srv, tmp.path(), l, |name| format!("s3://{bucket}/{prefix}/{name}")).await;
    srv.stop().await;
    for name in names {
        store.delete(&object_store::path::Path::from(format!("{prefix}/{name}"))).await.unwrap();
    }
}

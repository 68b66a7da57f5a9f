//! Cubes by reference (`s3://` and `https://` hrefs): the components equal those of the same cube
//! uploaded, a repeated request finds its job, an object changed after the submit fails the job with
//! `input_changed`, and every reference outside what the operator allows is refused with a 4xx and
//! its code, leaving no job and no scratch file behind.
//!
//! The https server is the tests' own (tests/common/https_site.rs: tokio-rustls, a CA and certificate
//! made by rcgen for the run), on 127.0.0.1, allowed by IP literal (`--input-host 127.0.0.1:PORT`)
//! with the CA trusted (`--input-ca-cert`). The S3 tests run against the real S3 server of `scripts/lib/garage.sh`
//! (`HYPERMNF_TEST_S3_URL`, AWS_* variables; skipped without it unless `HYPERMNF_REQUIRE_S3=1`), the
//! objects put there by the test with object_store, never through the service.

mod common;

use std::path::PathBuf;

use common::https_site::Https;
use common::s3::{s3_bucket, s3_client, s3_put};
use common::{npy_bytes, scratch_entries, synthetic_cube, TestServer};
use reqwest::StatusCode;
use serde_json::{json, Value};

// ---------------------------------------------------------------------------------------------------
// The service

fn envi_pair(cube: &hypermnf::cube::Cube, interleave: hypermnf::cube::Interleave) -> (Vec<u8>, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let hdr = dir.path().join("c.hdr");
    hypermnf::cube::envi::write_cube(&hdr, cube, interleave, hypermnf::cube::ByteOrder::Little).unwrap();
    (std::fs::read(&hdr).unwrap(), std::fs::read(hdr.with_extension("img")).unwrap())
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4())
}

async fn post_href(srv: &TestServer, href: &str, params: Value) -> (StatusCode, Value) {
    let r = srv.client.post(srv.url("/v1/jobs")).json(&json!({"input": {"href": href}, "params": params})).send().await.unwrap();
    (r.status(), r.json().await.unwrap())
}

/// The components of a succeeded job.
async fn components(srv: &TestServer, id: &str) -> Vec<u8> {
    let j = srv.wait(id).await;
    assert_eq!(j["status"], "succeeded", "{j}");
    let (s, bytes) = srv.get_bytes(&format!("/v1/jobs/{id}/result")).await;
    assert_eq!(s, StatusCode::OK);
    bytes
}

/// The components of `cube` uploaded as a `.npy` body to a server of its own.
async fn uploaded_components(cube: &hypermnf::cube::Cube, query: &str) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let srv = TestServer::start(hypermnf::config::ServeArgs::with_data_dir(dir.path())).await;
    let (s, j) = srv.post_npy(&npy_bytes(cube), query).await;
    assert!(s.is_success(), "{s} {j}");
    let out = components(&srv, j["id"].as_str().unwrap()).await;
    srv.stop().await;
    out
}

async fn job_count(srv: &TestServer) -> usize {
    let (s, j) = srv.get_json("/v1/jobs").await;
    assert_eq!(s, StatusCode::OK);
    j["jobs"].as_array().unwrap().len()
}

#[tokio::test]
async fn s3_references_give_the_uploads_components_and_find_their_jobs_again() {
    let Some(bucket) = s3_bucket("s3_references") else { return };
    let store = s3_client(&bucket);
    let prefix = unique("references");
    let cube = synthetic_cube(24, 20, 12, 7);
    s3_put(store.as_ref(), &format!("{prefix}/line.npy"), npy_bytes(&cube)).await;
    let (hdr, img) = envi_pair(&cube, hypermnf::cube::Interleave::Bil);
    s3_put(store.as_ref(), &format!("{prefix}/envi/line.hdr"), hdr).await;
    s3_put(store.as_ref(), &format!("{prefix}/envi/line.bil"), img).await;
    s3_put(store.as_ref(), &format!("{prefix}/lonely.hdr"), envi_pair(&cube, hypermnf::cube::Interleave::Bil).0).await;

    let dir = tempfile::tempdir().unwrap();
    let mut args = hypermnf::config::ServeArgs::with_data_dir(dir.path());
    args.input_buckets = vec![bucket.clone()];
    let srv = TestServer::start(args).await;
    let want = uploaded_components(&cube, "components=4").await;

    let npy_href = format!("s3://{bucket}/{prefix}/line.npy");
    let (s, j) = post_href(&srv, &npy_href, json!({"components": 4})).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{j}");
    assert_eq!(j["input"]["bands"], 12, "the header was read at submit: {j}");
    let id = j["id"].as_str().unwrap().to_string();
    // Asked again (before or after it ran): the same job.
    let (s, again) = post_href(&srv, &npy_href, json!({"components": 4})).await;
    assert_eq!((s, again["id"].as_str()), (StatusCode::OK, Some(id.as_str())), "{again}");
    assert!(components(&srv, &id).await == want, "s3 .npy: components differ from the upload's");
    let (s, again) = post_href(&srv, &npy_href, json!({"components": 4})).await;
    assert_eq!((s, again["id"].as_str(), again["cached"].as_bool()), (StatusCode::OK, Some(id.as_str()), Some(true)), "{again}");
    // The worker remembered the cube's digest: a job of other parameters from the same reference now
    // has the digest an upload of the cube has, and the upload finds it.
    let (s, other) = post_href(&srv, &npy_href, json!({"components": 5})).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{other}");
    let (s, up) = srv.post_npy(&npy_bytes(&cube), "components=5").await;
    assert_eq!((s, up["id"].as_str()), (StatusCode::OK, other["id"].as_str()), "{up}");
    assert_eq!(srv.wait(other["id"].as_str().unwrap()).await["status"], "succeeded");

    // The ENVI pair (BIL), named by its header; its data object found beside it as `line.bil`.
    let (s, j) = post_href(&srv, &format!("s3://{bucket}/{prefix}/envi/line.hdr"), json!({"components": 4})).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{j}");
    assert_eq!(j["input"]["interleave"], "bil", "{j}");
    let envi_id = j["id"].as_str().unwrap().to_string();
    assert_ne!(envi_id, id);
    assert!(components(&srv, &envi_id).await == want, "s3 ENVI: components differ from the upload's");

    // A missing object, and a bucket not allowed: refused, nothing left.
    let jobs = job_count(&srv).await;
    let (s, e) = post_href(&srv, &format!("s3://{bucket}/{prefix}/missing.npy"), json!({})).await;
    assert_eq!((s, e["code"].as_str()), (StatusCode::NOT_FOUND, Some("input_not_found")), "{e}");
    let (s, e) = post_href(&srv, &format!("s3://{bucket}/{prefix}/lonely.hdr"), json!({})).await;
    assert_eq!((s, e["code"].as_str()), (StatusCode::NOT_FOUND, Some("input_not_found")), "{e}");
    let (s, e) = post_href(&srv, "s3://another-bucket/line.npy", json!({})).await;
    assert_eq!((s, e["code"].as_str()), (StatusCode::FORBIDDEN, Some("forbidden_reference")), "{e}");
    assert!(e["message"].as_str().unwrap().contains("--input-bucket another-bucket"), "{e}");
    assert_eq!(job_count(&srv).await, jobs);
    assert_eq!(scratch_entries(dir.path()), Vec::<PathBuf>::new());
    srv.stop().await;

    // An object changed after its job was submitted: the worker's conditional reads refuse the new
    // version (here read directly, as the worker reads it, between the submit's HEAD and the read).
    let refs = hypermnf::reference::References::new(std::slice::from_ref(&bucket), &[], &[]).unwrap();
    let r = hypermnf::reference::Reference::parse(&npy_href).unwrap().unwrap();
    let v = refs.open(&r).await.unwrap().head().await.unwrap();
    let mut changed = npy_bytes(&cube);
    let n = changed.len();
    changed[n - 1] ^= 0xff; // same size, other bytes
    s3_put(store.as_ref(), &format!("{prefix}/line.npy"), changed).await;
    let stored = hypermnf::reference::Stored { object: v, data: None };
    let scratch = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Handle::current();
    let got = tokio::task::spawn_blocking(move || {
        hypermnf::reference::fetch::load(&refs, &stored, &scratch.path().join("ref"), &rt).map(|_| ()).map_err(|e| e.to_string())
    })
    .await
    .unwrap();
    let e = got.unwrap_err();
    assert!(e.contains("changed since the job was submitted"), "{e}");

    for key in ["line.npy", "envi/line.hdr", "envi/line.bil", "lonely.hdr"] {
        store.delete(&object_store::path::Path::from(format!("{prefix}/{key}"))).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_references_give_the_uploads_components() {
    let site = Https::start().await;
    let cube = synthetic_cube(20, 18, 10, 3);
    site.put("/cubes/line.npy", npy_bytes(&cube));
    let (hdr, img) = envi_pair(&cube, hypermnf::cube::Interleave::Bsq);
    site.put("/cubes/line.hdr", hdr);
    site.put("/cubes/line.img", img);
    let dir = tempfile::tempdir().unwrap();
    let mut args = hypermnf::config::ServeArgs::with_data_dir(dir.path());
    args.input_hosts = vec![site.addr.to_string()];
    args.input_ca_certs = vec![site.ca.clone()];
    let srv = TestServer::start(args).await;
    let want = uploaded_components(&cube, "components=3").await;

    let (s, j) = post_href(&srv, &site.url("/cubes/line.npy"), json!({"components": 3})).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{j}");
    let id = j["id"].as_str().unwrap().to_string();
    assert!(components(&srv, &id).await == want, "https .npy: components differ from the upload's");
    let (s, j) = post_href(&srv, &site.url("/cubes/line.hdr"), json!({"components": 3})).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{j}");
    assert!(components(&srv, j["id"].as_str().unwrap()).await == want, "https ENVI: components differ from the upload's");

    // Read as the worker reads them: the content digest computed while the bytes arrived is the
    // cube's (a .npy and a BIL data object followed part by part, a BSQ data object once it is whole),
    // also for a cube of several parts, which arrive out of order.
    let big = synthetic_cube(330, 200, 80, 5);
    assert!(npy_bytes(&big).len() as u64 > hypermnf::reference::fetch::PART);
    site.put("/cubes/big.npy", npy_bytes(&big));
    let (hdr, img) = envi_pair(&big, hypermnf::cube::Interleave::Bil);
    site.put("/cubes/big.hdr", hdr);
    site.put("/cubes/big.img", img);
    let refs = hypermnf::reference::References::new(&[], &[site.addr.to_string()], std::slice::from_ref(&site.ca)).unwrap();
    for (name, data, cube) in [("line.npy", None, &cube), ("line.hdr", Some("line.img"), &cube), ("big.npy", None, &big), ("big.hdr", Some("big.img"), &big)] {
        let open = |n: &str| {
            let r = hypermnf::reference::Reference::parse(&site.url(&format!("/cubes/{n}"))).unwrap().unwrap();
            let refs = &refs;
            async move { refs.open(&r).await.unwrap().head().await.unwrap() }
        };
        let object = open(name).await;
        let data = match data {
            Some(d) => Some(open(d).await),
            None => None,
        };
        let stored = hypermnf::reference::Stored { object, data };
        let scratch = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Handle::current();
        let refs = &refs;
        let loaded = tokio::task::block_in_place(|| hypermnf::reference::fetch::load(refs, &stored, &scratch.path().join("ref"), &rt)).unwrap();
        assert_eq!(loaded.content, Some(cube.content_digest()), "{name}");
        assert_eq!(loaded.cube.content_digest(), cube.content_digest(), "{name}");
        assert!(!scratch.path().join("ref").exists(), "{name}: the scratch directory is left");
    }

    // The OGC API takes the same references.
    let exec = json!({"inputs": {"cube": {"href": site.url("/cubes/line.npy")}, "components": 2}});
    let r = srv.client.post(srv.url("/processes/mnf/execution")).json(&exec).send().await.unwrap();
    let s = r.status();
    assert!(s.is_success(), "{s} {}", r.text().await.unwrap());

    // An object that changes after the submit's reads: the job fails with input_changed.
    site.put("/cubes/moving.npy", npy_bytes(&cube));
    let mut other = npy_bytes(&synthetic_cube(20, 18, 10, 4));
    other.truncate(npy_bytes(&cube).len());
    site.site.lock().unwrap().files.get_mut("/cubes/moving.npy").unwrap().change_after_gets = Some((1, other));
    let (s, j) = post_href(&srv, &site.url("/cubes/moving.npy"), json!({"components": 3})).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{j}");
    let done = srv.wait(j["id"].as_str().unwrap()).await;
    assert_eq!((done["status"].as_str(), done["error"]["code"].as_str()), (Some("failed"), Some("input_changed")), "{done}");
    assert_eq!(scratch_entries(dir.path()), Vec::<PathBuf>::new(), "the failed read left scratch files");
    srv.stop().await;
}

#[tokio::test]
async fn references_outside_the_policy_are_refused_and_leave_nothing() {
    let site = Https::start().await;
    let cube = synthetic_cube(8, 8, 6, 1);
    site.put("/cubes/line.npy", npy_bytes(&cube));
    let port = site.addr.port();
    // A second server, allowed only by the name `localhost`, whose addresses are loopback.
    let named = Https::start().await;
    named.put("/cubes/line.npy", npy_bytes(&cube));
    {
        let mut s = site.site.lock().unwrap();
        s.redirects.insert("/to-allowed.npy".into(), site.url("/cubes/line.npy"));
        s.redirects.insert("/to-elsewhere.npy".into(), "https://169.254.169.254/latest/meta-data/x.npy".into());
    }
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("inside.npy"), npy_bytes(&cube)).unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("outside.npy"), npy_bytes(&cube)).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let mut args = hypermnf::config::ServeArgs::with_data_dir(dir.path());
    // The first test server by IP literal; the second by the name `localhost` only.
    args.input_hosts = vec![format!("127.0.0.1:{port}"), format!("localhost:{}", named.addr.port())];
    args.input_ca_certs = vec![site.ca.clone()];
    args.input_buckets = vec!["cubes".into()];
    args.input_roots = vec![root.path().to_path_buf()];
    let srv = TestServer::start(args).await;

    let mut cases: Vec<(String, StatusCode, &str)> = vec![
        ("s3://not-allowed/line.npy".into(), StatusCode::FORBIDDEN, "forbidden_reference"),
        ("https://data.example.org/line.npy".into(), StatusCode::FORBIDDEN, "forbidden_reference"),
        (format!("https://127.0.0.1:{}/cubes/line.npy", port + 1), StatusCode::FORBIDDEN, "forbidden_reference"),
        (format!("https://127.0.0.2:{port}/cubes/line.npy"), StatusCode::FORBIDDEN, "forbidden_reference"),
        (format!("https://[::1]:{port}/cubes/line.npy"), StatusCode::FORBIDDEN, "forbidden_reference"),
        (format!("https://[::ffff:127.0.0.1]:{port}/cubes/line.npy"), StatusCode::FORBIDDEN, "forbidden_reference"),
        ("https://169.254.169.254/latest/meta-data/x.npy".into(), StatusCode::FORBIDDEN, "forbidden_reference"),
        (format!("http://127.0.0.1:{port}/cubes/line.npy"), StatusCode::BAD_REQUEST, "invalid_href"),
        (site.url("/to-allowed.npy"), StatusCode::UNPROCESSABLE_ENTITY, "redirect_refused"),
        (site.url("/to-elsewhere.npy"), StatusCode::UNPROCESSABLE_ENTITY, "redirect_refused"),
        (site.url("/cubes/missing.npy"), StatusCode::NOT_FOUND, "input_not_found"),
        (site.url("/cubes/line.txt"), StatusCode::UNPROCESSABLE_ENTITY, "unsupported"),
        (format!("file://{}", outside.path().join("outside.npy").display()), StatusCode::FORBIDDEN, "forbidden_path"),
        ("ftp://example.org/line.npy".into(), StatusCode::BAD_REQUEST, "invalid_href"),
        ("s3://cubes/../line.npy".into(), StatusCode::BAD_REQUEST, "invalid_href"),
        (format!("https://user:pw@127.0.0.1:{port}/cubes/line.npy"), StatusCode::BAD_REQUEST, "invalid_href"),
    ];
    // Allowed by name, but the name resolves to loopback, which only an IP literal allows. That needs
    // the system resolver to know `localhost`; where it does not answer, the case is left out (said so).
    if localhost_resolves_to_loopback() {
        cases.push((format!("https://localhost:{}/cubes/line.npy", named.addr.port()), StatusCode::FORBIDDEN, "forbidden_reference"));
    } else {
        eprintln!("this machine's resolver does not give `localhost` as loopback within 5 s: its case is left out");
    }
    for (href, status, code) in &cases {
        let (s, e) = post_href(&srv, href, json!({})).await;
        assert_eq!((s, e["code"].as_str()), (*status, Some(*code)), "{href}: {e}");
        assert!(!e["message"].as_str().unwrap_or("").is_empty(), "{href}: {e}");
    }
    // A GDAL format on a build without GDAL names the feature.
    if !cfg!(feature = "gdal") {
        site.put("/cubes/line.nc", b"CDF\x01".to_vec());
        let (s, e) = post_href(&srv, &site.url("/cubes/line.nc"), json!({})).await;
        assert_eq!((s, e["code"].as_str()), (StatusCode::UNSUPPORTED_MEDIA_TYPE, Some("needs_gdal_feature")), "{e}");
    }
    assert_eq!(job_count(&srv).await, 0, "a refused reference left a job");
    assert_eq!(scratch_entries(dir.path()), Vec::<PathBuf>::new(), "a refused reference left scratch files");

    // What is allowed works on the same server: the loopback IP literal, and a file under the root.
    let (s, j) = post_href(&srv, &site.url("/cubes/line.npy"), json!({"components": 2})).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{j}");
    let (s, j) = post_href(&srv, &format!("file://{}", root.path().join("inside.npy").display()), json!({"components": 2})).await;
    assert!(s.is_success(), "{s} {j}");
    srv.stop().await;
}

/// Whether the system resolver gives `localhost` as a loopback address, asked on a thread of its own so
/// that a resolver that never answers costs 5 s.
fn localhost_resolves_to_loopback() -> bool {
    use std::net::ToSocketAddrs;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let loopback = ("localhost", 443).to_socket_addrs().map(|mut a| a.any(|a| a.ip().is_loopback())).unwrap_or(false);
        let _ = tx.send(loopback);
    });
    rx.recv_timeout(std::time::Duration::from_secs(5)).unwrap_or(false)
}

/// Options that cannot work stop the start, naming the option.
#[tokio::test]
async fn bad_reference_options_stop_the_start() {
    let dir = tempfile::tempdir().unwrap();
    for (hosts, certs, want) in [(vec!["http://x".to_string()], vec![], "--input-host"), (vec![], vec![dir.path().join("missing.pem")], "--input-ca-cert")] {
        let mut args = hypermnf::config::ServeArgs::with_data_dir(dir.path());
        args.input_hosts = hosts;
        args.input_ca_certs = certs;
        let e = hypermnf::api::start(args).await.err().expect("refused");
        assert!(format!("{e:#}").contains(want), "{e:#}");
    }
}

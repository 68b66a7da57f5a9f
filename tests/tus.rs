//! Resumable uploads (tus 1.0 under `/v1/uploads`) against the in-process server on loopback: the
//! protocol's answers, a PATCH cut mid-body by a raw TCP client and resumed, jobs made from completed
//! uploads (equal to the jobs of plain uploads of the same bytes), termination, expiry, owners, and
//! an upload that outlives a restart of the server.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{npy_bytes, synthetic_cube, TestServer};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TUS: &str = "1.0.0";

fn args(dir: &Path) -> hypermnf::config::ServeArgs {
    hypermnf::config::ServeArgs::with_data_dir(dir)
}

/// The upload's directory on the server's disk.
fn upload_dir(data: &Path, location: &str) -> PathBuf {
    data.join("tus").join(location.rsplit('/').next().unwrap())
}

impl TestServer {
    fn req(&self, method: Method, path: &str, key: Option<&str>) -> reqwest::RequestBuilder {
        let r = self.client.request(method, self.url(path)).header("tus-resumable", TUS);
        match key {
            Some(k) => r.bearer_auth(k),
            None => r,
        }
    }

    /// POST /v1/uploads; the upload's path (Location).
    async fn create_upload(&self, length: usize, key: Option<&str>) -> String {
        let r = self
            .req(Method::POST, "/v1/uploads", key)
            .header("upload-length", length.to_string())
            .header("upload-metadata", "filename Y3ViZS5ucHk=,filetype YXBwbGljYXRpb24veC1ucHk=")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::CREATED, "{:?}", r.text().await);
        assert_eq!(r.headers()["tus-resumable"], TUS);
        assert!(r.headers().contains_key("upload-expires"));
        let location = r.headers()["location"].to_str().unwrap().to_string();
        assert!(location.starts_with("/v1/uploads/"), "{location}");
        location
    }

    async fn patch(&self, location: &str, offset: usize, body: &[u8], key: Option<&str>) -> reqwest::Response {
        self.req(Method::PATCH, location, key)
            .header("upload-offset", offset.to_string())
            .header("content-type", "application/offset+octet-stream")
            .body(body.to_vec())
            .send()
            .await
            .unwrap()
    }

    /// HEAD: (status, Upload-Offset).
    async fn offset(&self, location: &str, key: Option<&str>) -> (StatusCode, Option<u64>) {
        let r = self.req(Method::HEAD, location, key).send().await.unwrap();
        assert_eq!(r.headers()["tus-resumable"], TUS, "every answer says the version");
        let offset = r.headers().get("upload-offset").map(|v| v.to_str().unwrap().parse().unwrap());
        (r.status(), offset)
    }

    /// An upload of all of `bytes`, in two PATCHes; its path.
    async fn upload_all(&self, bytes: &[u8], key: Option<&str>) -> String {
        let location = self.create_upload(bytes.len(), key).await;
        let half = bytes.len() / 2;
        for (at, piece) in [(0, &bytes[..half]), (half, &bytes[half..])] {
            let r = self.patch(&location, at, piece, key).await;
            assert_eq!(r.status(), StatusCode::NO_CONTENT);
            assert_eq!(r.headers()["upload-offset"].to_str().unwrap(), (at + piece.len()).to_string());
        }
        location
    }

    async fn job_from(&self, body: Value, key: Option<&str>) -> (StatusCode, Value) {
        let mut r = self.client.post(self.url("/v1/jobs")).json(&body);
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        let r = r.send().await.unwrap();
        (r.status(), r.json().await.unwrap())
    }

    /// The job's components, once it has succeeded.
    async fn result_of(&self, id: &str) -> Vec<u8> {
        let done = self.wait(id).await;
        assert_eq!(done["status"], "succeeded", "{done}");
        let (s, bytes) = self.get_bytes(&format!("/v1/jobs/{id}/result")).await;
        assert_eq!(s, StatusCode::OK);
        bytes
    }
}

/// Sends the head of a PATCH and `sent` bytes of its body (of `total` announced) on a raw socket, then
/// closes it: the connection cut mid-upload.
async fn cut_patch(srv: &TestServer, location: &str, offset: usize, total: usize, sent: &[u8]) {
    let mut s = tokio::net::TcpStream::connect(srv.server.addr).await.unwrap();
    let head = format!(
        "PATCH {location} HTTP/1.1\r\nHost: {}\r\nTus-Resumable: {TUS}\r\nUpload-Offset: {offset}\r\n\
         Content-Type: application/offset+octet-stream\r\nContent-Length: {total}\r\n\r\n",
        srv.server.addr
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(sent).await.unwrap();
    s.flush().await.unwrap();
    // Long enough for the server to start the request (its body is then being read).
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(s);
}

/// Polls HEAD until the offset is `want` (what arrived is kept), failing after a few seconds.
async fn offset_becomes(srv: &TestServer, location: &str, want: u64, key: Option<&str>) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (s, got) = srv.offset(location, key).await;
        assert_eq!(s, StatusCode::OK);
        if got == Some(want) {
            return;
        }
        assert!(Instant::now() < deadline, "the offset stayed {got:?}, not {want}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_cut_mid_patch_resumes_and_its_job_equals_a_plain_uploads() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let srv = TestServer::start(args(&data)).await;
    let npy = npy_bytes(&synthetic_cube(48, 40, 24, 11));
    assert!(npy.len() > 90_000);

    // Discovery: the version, the extensions and the effective upload limit.
    let r = srv.client.request(Method::OPTIONS, srv.url("/v1/uploads")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let (info_status, info) = srv.get_json("/v1/info").await;
    assert_eq!(info_status, StatusCode::OK);
    assert_eq!(r.headers()["tus-resumable"], TUS);
    assert_eq!(r.headers()["tus-version"], TUS);
    assert_eq!(r.headers()["tus-extension"], "creation,termination,expiration");
    assert_eq!(r.headers()["tus-max-size"].to_str().unwrap(), info["max_upload_bytes"].as_u64().unwrap().to_string());

    let location = srv.create_upload(npy.len(), None).await;
    let r = srv.req(Method::HEAD, &location, None).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["upload-offset"], "0");
    assert_eq!(r.headers()["upload-length"].to_str().unwrap(), npy.len().to_string());
    assert_eq!(r.headers()["cache-control"], "no-store");
    assert_eq!(r.headers()["upload-metadata"], "filename Y3ViZS5ucHk=,filetype YXBwbGljYXRpb24veC1ucHk=");

    // A first piece.
    let first = 10_000;
    let r = srv.patch(&location, 0, &npy[..first], None).await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(r.headers()["upload-offset"].to_str().unwrap(), first.to_string());
    assert_eq!(r.headers()["tus-resumable"], TUS);

    // The rest announced, half of it sent, then the connection dropped: what arrived is kept.
    let rest = npy.len() - first;
    let half = rest / 2;
    cut_patch(&srv, &location, first, rest, &npy[first..first + half]).await;
    offset_becomes(&srv, &location, (first + half) as u64, None).await;
    let file = upload_dir(&data, &location).join("data");
    assert_eq!(std::fs::read(&file).unwrap(), &npy[..first + half], "the bytes kept are the ones sent");

    // A job from an upload not yet complete is refused, and the upload stays.
    let (s, e) = srv.job_from(json!({"upload": location.rsplit('/').next().unwrap(), "params": {"components": 4}}), None).await;
    assert_eq!((s, e["code"].as_str()), (StatusCode::CONFLICT, Some("upload_incomplete")), "{e}");

    // Resumed from the offset HEAD gave, to the end.
    let r = srv.patch(&location, first + half, &npy[first + half..], None).await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(r.headers()["upload-offset"].to_str().unwrap(), npy.len().to_string());
    assert_eq!(srv.offset(&location, None).await, (StatusCode::OK, Some(npy.len() as u64)));
    assert_eq!(std::fs::read(&file).unwrap(), npy);

    // Parameters the cube cannot take are refused, and the upload is still there to ask again.
    let id = location.rsplit('/').next().unwrap().to_string();
    let (s, e) = srv.job_from(json!({"upload": id, "params": {"components": 99}}), None).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
    assert_eq!(srv.offset(&location, None).await, (StatusCode::OK, Some(npy.len() as u64)));

    // The job; the upload is gone once it exists.
    let inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&file).unwrap());
    let (s, job) = srv.job_from(json!({"upload": id, "params": {"components": 4}}), None).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{job}");
    assert_eq!(job["cached"], false);
    assert_eq!(job["input"]["lines"], 48);
    let job_id = job["id"].as_str().unwrap().to_string();
    // Moved, not copied: the job's input is the uploaded file itself (while the job still has it).
    let input = data.join("objects/uploads").join(&job_id).join("cube.npy");
    if let Ok(m) = std::fs::metadata(&input) {
        assert_eq!(std::os::unix::fs::MetadataExt::ino(&m), inode, "the job's input is a copy");
    }
    assert!(!upload_dir(&data, &location).exists(), "the upload's files are gone");
    assert_eq!(srv.offset(&location, None).await.0, StatusCode::NOT_FOUND);
    let (s, _) = srv.job_from(json!({"upload": id, "params": {"components": 4}}), None).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "an upload makes one job");
    let via_tus = srv.result_of(&job_id).await;

    // The same bytes as a plain .npy body are the same cube: the existing job answers.
    let (s, plain) = srv.post_npy(&npy, "components=4").await;
    assert_eq!(s, StatusCode::OK, "{plain}");
    assert_eq!((plain["cached"].as_bool(), plain["id"].as_str()), (Some(true), Some(job_id.as_str())));
    srv.stop().await;

    // And on a fresh server, the plain upload's result is the same bytes.
    let other = TestServer::start(args(&tmp.path().join("other"))).await;
    let (s, plain) = other.post_npy(&npy, "components=4").await;
    assert_eq!(s, StatusCode::ACCEPTED, "{plain}");
    let direct = other.result_of(plain["id"].as_str().unwrap()).await;
    assert_eq!(via_tus, direct, "the job from the resumable upload differs from the plain upload's");
    other.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envi_cubes_from_uploads_with_the_header_inline_or_uploaded() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let srv = TestServer::start(args(&data)).await;
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let hdr = std::fs::read_to_string(dir.join("jasper_ridge_r198_bil.hdr")).unwrap();
    let img = std::fs::read(dir.join("jasper_ridge_r198_bil.img")).unwrap();

    // The multipart job of the pair first.
    let form = reqwest::multipart::Form::new()
        .part("header", reqwest::multipart::Part::text(hdr.clone()))
        .part("data", reqwest::multipart::Part::bytes(img.clone()))
        .part("params", reqwest::multipart::Part::text(r#"{"components": 5}"#));
    let r = srv.client.post(srv.url("/v1/jobs")).multipart(form).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let multipart: Value = r.json().await.unwrap();
    let multipart_id = multipart["id"].as_str().unwrap();
    srv.result_of(multipart_id).await;

    // The data uploaded, the header inline: the same cube and header, so the same job.
    let location = srv.upload_all(&img, None).await;
    let id = location.rsplit('/').next().unwrap();
    let (s, job) = srv.job_from(json!({"upload": id, "header": hdr, "params": {"components": 5}}), None).await;
    assert_eq!(s, StatusCode::OK, "{job}");
    assert_eq!((job["cached"].as_bool(), job["id"].as_str()), (Some(true), Some(multipart_id)));
    assert!(!upload_dir(&data, &location).exists());

    // The header as an upload of its own, other parameters: a new job, of the ENVI cube.
    let data_location = srv.upload_all(&img, None).await;
    let hdr_location = srv.upload_all(hdr.as_bytes(), None).await;
    let (data_id, hdr_id) = (data_location.rsplit('/').next().unwrap(), hdr_location.rsplit('/').next().unwrap());
    let (s, e) = srv.job_from(json!({"upload": data_id, "header_upload": hdr_id, "header": hdr, "params": {}}), None).await;
    assert_eq!((s, e["code"].as_str()), (StatusCode::BAD_REQUEST, Some("invalid_json")), "{e}");
    let (s, e) = srv.job_from(json!({"upload": data_id, "nonsense": 1}), None).await;
    assert_eq!((s, e["code"].as_str()), (StatusCode::BAD_REQUEST, Some("invalid_json")), "{e}");
    let (s, job) = srv.job_from(json!({"upload": data_id, "header_upload": hdr_id, "params": {"components": 3}}), None).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{job}");
    assert_eq!((job["input"]["bands"].as_u64(), job["input"]["interleave"].as_str()), (Some(198), Some("bil")));
    let done = srv.wait(job["id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    for l in [&data_location, &hdr_location] {
        assert!(!upload_dir(&data, l).exists(), "both uploads are gone once the job exists");
    }
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_offsets_versions_types_and_sizes_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let mut a = args(tmp.path());
    a.max_upload_bytes = 100_000;
    let srv = TestServer::start(a).await;
    let location = srv.create_upload(1000, None).await;
    assert_eq!(srv.patch(&location, 0, &[1; 300], None).await.status(), StatusCode::NO_CONTENT);

    // Upload-Offset other than the server's: 409, nothing written.
    for wrong in [0, 299, 301, 1000] {
        let r = srv.patch(&location, wrong, &[2; 10], None).await;
        assert_eq!(r.status(), StatusCode::CONFLICT, "offset {wrong}");
        assert_eq!(r.headers()["tus-resumable"], TUS);
    }
    assert_eq!(srv.offset(&location, None).await, (StatusCode::OK, Some(300)));

    // Another protocol version, or none: 412 with the versions served.
    for version in [Some("0.2.2"), Some("2.0.0"), None] {
        let mut r = srv.client.request(Method::HEAD, srv.url(&location));
        if let Some(v) = version {
            r = r.header("tus-resumable", v);
        }
        let r = r.send().await.unwrap();
        assert_eq!(r.status(), StatusCode::PRECONDITION_FAILED, "{version:?}");
        assert_eq!((r.headers()["tus-version"].to_str().unwrap(), r.headers()["tus-resumable"].to_str().unwrap()), (TUS, TUS));
        let r = srv.client.patch(srv.url(&location)).header("upload-offset", "300").header("content-type", "application/offset+octet-stream");
        let r = match version {
            Some(v) => r.header("tus-resumable", v),
            None => r,
        };
        assert_eq!(r.body(vec![3; 10]).send().await.unwrap().status(), StatusCode::PRECONDITION_FAILED);
    }
    assert_eq!(srv.offset(&location, None).await.1, Some(300));

    // An upload larger than the limit: 413, naming the option.
    let r = srv.req(Method::POST, "/v1/uploads", None).header("upload-length", "100001").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let e: Value = r.json().await.unwrap();
    assert!(e["message"].as_str().unwrap().contains("--max-upload-bytes"), "{e}");
    assert_eq!(srv.req(Method::POST, "/v1/uploads", None).header("upload-length", "100000").send().await.unwrap().status(), StatusCode::CREATED);

    // A body past the upload's length: 413; a PATCH body of another type: 415; bad headers: 400.
    assert_eq!(srv.patch(&location, 300, &[4; 701], None).await.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let r = srv.req(Method::PATCH, &location, None).header("upload-offset", "300").header("content-type", "application/octet-stream").body(vec![5; 10]);
    assert_eq!(r.send().await.unwrap().status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let r = srv.req(Method::PATCH, &location, None).header("upload-offset", "-1").header("content-type", "application/offset+octet-stream").body(vec![5; 10]);
    assert_eq!(r.send().await.unwrap().status(), StatusCode::BAD_REQUEST);
    for (name, v) in [("upload-length", "ten"), ("upload-metadata", "filename not-base64!")] {
        let mut r = srv.req(Method::POST, "/v1/uploads", None).header(name, v);
        if name != "upload-length" {
            r = r.header("upload-length", "10");
        }
        assert_eq!(r.send().await.unwrap().status(), StatusCode::BAD_REQUEST, "{name}: {v}");
    }
    assert_eq!(srv.req(Method::POST, "/v1/uploads", None).send().await.unwrap().status(), StatusCode::BAD_REQUEST, "no Upload-Length");
    assert_eq!(srv.offset(&location, None).await.1, Some(300));

    // Unknown uploads, and ids that are no ids.
    for p in ["/v1/uploads/0123456789abcdef0123456789abcdef", "/v1/uploads/..%2F..%2Fhypermnf.db", "/v1/uploads/x"] {
        let r = srv.req(Method::HEAD, p, None).send().await.unwrap();
        assert_eq!((r.status(), r.headers()["tus-resumable"].to_str().unwrap()), (StatusCode::NOT_FOUND, TUS), "{p}");
    }
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_frees_the_space() {
    let tmp = tempfile::tempdir().unwrap();
    let srv = TestServer::start(args(tmp.path())).await;
    let location = srv.create_upload(50_000, None).await;
    assert_eq!(srv.patch(&location, 0, &[7; 20_000], None).await.status(), StatusCode::NO_CONTENT);
    let dir = upload_dir(tmp.path(), &location);
    assert_eq!(std::fs::metadata(dir.join("data")).unwrap().len(), 20_000);

    let r = srv.req(Method::DELETE, &location, None).send().await.unwrap();
    assert_eq!((r.status(), r.headers()["tus-resumable"].to_str().unwrap()), (StatusCode::NO_CONTENT, TUS));
    assert!(!dir.exists(), "the upload's files are still there");
    assert_eq!(srv.offset(&location, None).await.0, StatusCode::NOT_FOUND);
    assert_eq!(srv.patch(&location, 20_000, &[7; 10], None).await.status(), StatusCode::NOT_FOUND);
    assert_eq!(srv.req(Method::DELETE, &location, None).send().await.unwrap().status(), StatusCode::NOT_FOUND);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_uploads_expire_and_their_space_is_freed() {
    let tmp = tempfile::tempdir().unwrap();
    let mut a = args(tmp.path());
    a.upload_expiry_secs = 2;
    let srv = TestServer::start(a).await;
    let abandoned = srv.create_upload(10_000, None).await;
    let r = srv.patch(&abandoned, 0, &[1; 4000], None).await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    // Upload-Expires: an HTTP date about 2 s ahead.
    let expires = r.headers()["upload-expires"].to_str().unwrap().to_string();
    assert!(expires.ends_with(" GMT") && expires.len() == 29, "{expires}");
    let dir = upload_dir(tmp.path(), &abandoned);
    assert!(dir.join("data").exists());

    // Another upload kept busy meanwhile does not expire.
    let busy = srv.create_upload(10_000, None).await;
    let started = Instant::now();
    let mut at = 0;
    while started.elapsed() <= Duration::from_secs(2) || dir.exists() {
        assert!(started.elapsed() < Duration::from_secs(20), "the abandoned upload was not deleted");
        assert_eq!(srv.patch(&busy, at, &[2; 100], None).await.status(), StatusCode::NO_CONTENT);
        at += 100;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(started.elapsed() >= Duration::from_millis(1500), "expired too early");
    assert_eq!(srv.offset(&abandoned, None).await.0, StatusCode::NOT_FOUND);
    assert_eq!(srv.offset(&busy, None).await, (StatusCode::OK, Some(at as u64)));
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_owner_can_neither_see_nor_patch_nor_use_an_upload() {
    let tmp = tempfile::tempdir().unwrap();
    let keys = tmp.path().join("keys");
    std::fs::write(&keys, "alice:alice-key\nbob:bob-key\n").unwrap();
    let mut a = args(&tmp.path().join("data"));
    a.api_keys_file = Some(keys);
    let srv = TestServer::start(a).await;
    let npy = npy_bytes(&synthetic_cube(20, 16, 8, 3));
    let location = srv.create_upload(npy.len(), Some("alice-key")).await;
    assert_eq!(srv.patch(&location, 0, &npy[..100], Some("alice-key")).await.status(), StatusCode::NO_CONTENT);

    // Without a key: 401 (with the tus header); with Bob's: 404 for everything.
    let r = srv.req(Method::HEAD, &location, None).send().await.unwrap();
    assert_eq!((r.status(), r.headers()["tus-resumable"].to_str().unwrap()), (StatusCode::UNAUTHORIZED, TUS));
    assert_eq!(srv.req(Method::POST, "/v1/uploads", None).header("upload-length", "10").send().await.unwrap().status(), StatusCode::UNAUTHORIZED);
    assert_eq!(srv.offset(&location, Some("bob-key")).await.0, StatusCode::NOT_FOUND);
    assert_eq!(srv.patch(&location, 100, &npy[100..], Some("bob-key")).await.status(), StatusCode::NOT_FOUND);
    assert_eq!(srv.req(Method::DELETE, &location, Some("bob-key")).send().await.unwrap().status(), StatusCode::NOT_FOUND);
    // Alice's upload, complete, is no input for Bob either.
    assert_eq!(srv.patch(&location, 100, &npy[100..], Some("alice-key")).await.status(), StatusCode::NO_CONTENT);
    let id = location.rsplit('/').next().unwrap();
    let (s, _) = srv.job_from(json!({"upload": id, "params": {"components": 2}}), Some("bob-key")).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(srv.offset(&location, Some("alice-key")).await, (StatusCode::OK, Some(npy.len() as u64)));
    let (s, job) = srv.job_from(json!({"upload": id, "params": {"components": 2}}), Some("alice-key")).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{job}");
    let done = srv.wait_as(job["id"].as_str().unwrap(), "alice-key").await;
    assert_eq!(done["status"], "succeeded");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_outlives_a_restart_and_a_stalled_patch_lets_a_resume_through() {
    let tmp = tempfile::tempdir().unwrap();
    let npy = npy_bytes(&synthetic_cube(24, 20, 10, 5));
    let srv = TestServer::start(args(tmp.path())).await;
    let location = srv.create_upload(npy.len(), None).await;
    assert_eq!(srv.patch(&location, 0, &npy[..1000], None).await.status(), StatusCode::NO_CONTENT);

    // A PATCH whose client stops sending without closing (a half-open connection, as after a network
    // failure): a resuming client's HEAD stops it, and gets the bytes it had received.
    let mut stalled = tokio::net::TcpStream::connect(srv.server.addr).await.unwrap();
    let head = format!(
        "PATCH {location} HTTP/1.1\r\nHost: x\r\nTus-Resumable: {TUS}\r\nUpload-Offset: 1000\r\n\
         Content-Type: application/offset+octet-stream\r\nContent-Length: {}\r\n\r\n",
        npy.len() - 1000
    );
    stalled.write_all(head.as_bytes()).await.unwrap();
    stalled.write_all(&npy[1000..1500]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = Instant::now();
    assert_eq!(srv.offset(&location, None).await, (StatusCode::OK, Some(1500)));
    assert!(t.elapsed() < Duration::from_secs(5), "the HEAD waited {:?}", t.elapsed());
    // The stopped request is answered (409 superseded), its connection still open.
    let mut answer = vec![0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(5), stalled.read(&mut answer)).await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&answer[..n]).starts_with("HTTP/1.1 409"), "{}", String::from_utf8_lossy(&answer[..n]));
    drop(stalled);
    srv.stop().await;

    // A new server on the same data dir holds the upload where it was.
    let srv = TestServer::start(args(tmp.path())).await;
    assert_eq!(srv.offset(&location, None).await, (StatusCode::OK, Some(1500)));
    assert_eq!(srv.patch(&location, 1500, &npy[1500..], None).await.status(), StatusCode::NO_CONTENT);
    let (s, job) = srv.job_from(json!({"upload": location.rsplit('/').next().unwrap(), "params": {"components": 3}}), None).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{job}");
    let done = srv.wait(job["id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    srv.stop().await;
}

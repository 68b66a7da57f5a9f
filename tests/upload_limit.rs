//! The upload limit as a user meets it: `/v1/info` reports the effective limit (by default 64 GiB,
//! capped by the data dir's free space less a margin; an explicit `--max-upload-bytes` as given), and
//! every 413 for the limit names the option that raises it, whichever way the upload goes over.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;

use hypermnf::config::{default_upload_limit, free_disk_bytes, ServeArgs, DEFAULT_MAX_UPLOAD_BYTES};

mod common;
use common::{npy_bytes, synthetic_cube, TestServer};

const GIB: u64 = 1 << 30;

/// The default: `/v1/info` says what the server enforces, which is 64 GiB or, on a disk with less room,
/// the free space less its margin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_reports_the_effective_default_limit() {
    let dir = tempfile::tempdir().unwrap();
    let before = free_disk_bytes(dir.path()).expect("statvfs answers for a temp dir");
    let srv = TestServer::start(ServeArgs::with_data_dir(dir.path().join("data"))).await;
    let after = free_disk_bytes(dir.path()).unwrap();

    let (s, info) = srv.get_json("/v1/info").await;
    assert_eq!(s, StatusCode::OK, "{info}");
    let reported = info["max_upload_bytes"].as_u64().unwrap_or_else(|| panic!("max_upload_bytes: {info}"));
    assert_eq!(reported, srv.server.ctx.config.max_upload_bytes, "/v1/info reports what the server enforces");
    assert!((1..=DEFAULT_MAX_UPLOAD_BYTES).contains(&reported), "{reported}");
    // Other tests write to the same disk meanwhile: the limit lies between those the free space before
    // and after the start give (with 1 GiB of slack for writes in between).
    let (lo, hi) = (default_upload_limit(Some(before.min(after))), default_upload_limit(Some(before.max(after))));
    assert!(reported + GIB >= lo && reported <= hi + GIB, "{reported} outside {lo}..={hi} ({before} then {after} bytes free)");
    if before.min(after) >= 100 * GIB {
        assert_eq!(reported, 64 * GIB, "a disk with room gets the 64 GiB default");
    }
    // Flight lines fit by default wherever the disk can hold them: a 6.1 GB AVIRIS-NG line on any
    // disk with 8 GiB free.
    if before.min(after) >= 8 * GIB {
        assert!(reported >= 6_100_000_000, "{reported}");
    }
    srv.stop().await;
}

async fn error_body(r: reqwest::Response) -> (StatusCode, Value) {
    let status = r.status();
    let text = r.text().await.unwrap();
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{status}: not JSON: {text:?}"));
    (status, v)
}

fn assert_names_the_option(what: &str, (status, body): (StatusCode, Value), limit: u64) {
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{what}: {body}");
    assert_eq!(body["code"], "too_large", "{what}: {body}");
    let message = body["message"].as_str().unwrap_or_default();
    for needle in ["--max-upload-bytes", "HYPERMNF_MAX_UPLOAD_BYTES", &limit.to_string()] {
        assert!(message.contains(needle), "{what}: the 413 message lacks {needle:?}: {message}");
    }
}

/// An explicit limit is used as given (also far above the free space) and reported; a 413 for it,
/// by Content-Length, by a chunked body, by a `.npy` header's claim and by a multipart ENVI header's
/// claim, names the option that raises it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_explicit_limit_is_used_as_given_and_a_413_names_the_option() {
    let dir = tempfile::tempdir().unwrap();
    // Far above any free space: an explicit value is not capped.
    let mut args = ServeArgs::with_data_dir(dir.path().join("big"));
    args.max_upload_bytes = 1 << 50;
    let srv = TestServer::start(args).await;
    assert_eq!(srv.get_json("/v1/info").await.1["max_upload_bytes"], 1u64 << 50);
    srv.stop().await;

    let limit: u64 = 1 << 20;
    let mut args = ServeArgs::with_data_dir(dir.path().join("data"));
    args.max_upload_bytes = limit;
    let srv = TestServer::start(args).await;
    assert_eq!(srv.get_json("/v1/info").await.1["max_upload_bytes"], limit);

    // 1.5 MiB of int16 samples: over the limit.
    let over = npy_bytes(&synthetic_cube(64, 64, 192, 3));
    assert!(over.len() as u64 > limit);
    let post = || srv.client.post(srv.url("/v1/jobs?components=3")).header("content-type", "application/x-npy");

    let r = post().body(over.clone()).send().await.unwrap();
    assert_names_the_option("Content-Length over the limit", error_body(r).await, limit);

    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = over.chunks(64 << 10).map(|c| Ok(c.to_vec())).collect();
    let r = post().body(reqwest::Body::wrap_stream(futures::stream::iter(chunks))).send().await.unwrap();
    assert_names_the_option("chunked body over the limit", error_body(r).await, limit);

    let mut claim = b"\x93NUMPY\x01\x00".to_vec();
    let dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (1000, 1000, 100), }";
    let pad = 64 - (10 + dict.len() + 1) % 64;
    let header = format!("{dict}{}\n", " ".repeat(pad));
    claim.extend_from_slice(&(header.len() as u16).to_le_bytes());
    claim.extend_from_slice(header.as_bytes());
    claim.extend_from_slice(&[0u8; 64]);
    let r = post().body(claim).send().await.unwrap();
    assert_names_the_option(".npy header claiming more than the limit", error_body(r).await, limit);

    let hdr = "ENVI\nsamples = 1000\nlines = 1000\nbands = 100\ndata type = 4\ninterleave = bil\nbyte order = 0\n";
    let form = reqwest::multipart::Form::new()
        .part("header", reqwest::multipart::Part::text(hdr).file_name("big.hdr"))
        .part("data", reqwest::multipart::Part::bytes(vec![0u8; 1024]).file_name("big.img"));
    let r = srv.client.post(srv.url("/v1/jobs")).multipart(form).send().await.unwrap();
    assert_names_the_option("ENVI header claiming more than the limit", error_body(r).await, limit);

    // The data part before the header: nothing bounds it but the request's byte budget.
    let form = reqwest::multipart::Form::new()
        .part("data", reqwest::multipart::Part::bytes(over[over.len() - 64 * 64 * 192 * 2..].to_vec()))
        .part("header", reqwest::multipart::Part::text("ENVI\nsamples = 64\nlines = 64\nbands = 192\ndata type = 2\ninterleave = bip\nbyte order = 0\n"));
    let r = srv.client.post(srv.url("/v1/jobs")).multipart(form).send().await.unwrap();
    assert_names_the_option("multipart body over the limit", error_body(r).await, limit);

    // Under the limit all is well.
    let small = npy_bytes(&synthetic_cube(16, 12, 8, 5));
    let (s, j) = srv.post_npy(&small, "components=3").await;
    assert_eq!(s, StatusCode::ACCEPTED, "{j}");
    assert_eq!(srv.wait(j["id"].as_str().unwrap()).await["status"], "succeeded");
    srv.stop().await;
}

/// `hypermnf serve` itself: the option and the variable set the limit `/v1/info` reports; without
/// either, the default is resolved at start-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_option_and_the_variable_reach_v1_info() {
    for (args, env, want) in [
        (vec!["--max-upload-bytes", "123456789"], None, Some(123_456_789u64)),
        (vec![], Some("987654321"), Some(987_654_321)),
        (vec!["--max-upload-bytes", "auto"], None, None),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_hypermnf"));
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--backend", "cpu", "--data-dir"]).arg(dir.path()).args(&args);
        cmd.env_remove("HYPERMNF_MAX_UPLOAD_BYTES");
        if let Some(v) = env {
            cmd.env("HYPERMNF_MAX_UPLOAD_BYTES", v);
        }
        let mut child = cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::null()).spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let line = tokio::task::spawn_blocking(move || {
            use std::io::BufRead;
            let mut line = String::new();
            std::io::BufReader::new(stdout).read_line(&mut line).unwrap();
            line
        })
        .await
        .unwrap();
        let base = line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("unexpected first line {line:?}")).to_string();
        let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
        let info: Value = client.get(format!("{base}/v1/info")).send().await.unwrap().json().await.unwrap();
        let _ = child.kill();
        let _ = child.wait();
        let reported = info["max_upload_bytes"].as_u64().unwrap_or_else(|| panic!("{info}"));
        match want {
            Some(w) => assert_eq!(reported, w, "{args:?} {env:?}"),
            None => assert!((1..=DEFAULT_MAX_UPLOAD_BYTES).contains(&reported), "{reported}"),
        }
    }
}

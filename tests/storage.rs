//! The storage layer against every kind of store, with one test body: the default local directory,
//! a `file://` directory, and a real S3 server when `HYPERMNF_TEST_S3_URL` names a bucket (endpoint
//! and keys in the AWS_* variables; `scripts/lib/garage.sh` starts a local Garage and sets them).
//! Without it the S3 tests say they were skipped, or fail if `HYPERMNF_REQUIRE_S3=1`. Each S3 test
//! works under a fresh prefix of that bucket, and leaves it empty.
//!
//! Then `hypermnf serve --store s3://...` end to end: the same uploads give the same bytes as with
//! the local store, and nothing of a deleted job stays in the bucket.

use std::collections::BTreeMap;
use std::path::Path;

use futures::TryStreamExt;
use rand::RngCore;
use reqwest::StatusCode;

use hypermnf::storage::{Storage, StoreUrl, PART_SIZE};

mod common;
use common::{npy_bytes, synthetic_cube, TestServer};

/// The S3 store to test against, under a prefix of its own; `None` (and a note) when there is none.
fn s3_url(test: &str) -> Option<StoreUrl> {
    let url = common::s3::s3_test_url(test)?;
    let StoreUrl::S3 { bucket, prefix } = StoreUrl::parse(&url).expect("HYPERMNF_TEST_S3_URL is an s3:// URL") else {
        panic!("HYPERMNF_TEST_S3_URL must be an s3:// URL, not {url}");
    };
    let run = format!("{test}-{}", uuid::Uuid::now_v7());
    let prefix = if prefix.is_empty() { run } else { format!("{prefix}/{run}") };
    Some(StoreUrl::S3 { bucket, prefix })
}

/// Everything the service asks of a store, on `storage` (whose scratch area is under `data_dir`).
async fn exercise(storage: &Storage, data_dir: &Path) {
    let name = storage.describe().to_string();
    storage.check().await.unwrap_or_else(|e| panic!("{name}: check: {e}"));

    // A file of more than two parts (and a partial last one) goes in from scratch and comes back
    // the same every way.
    let size = (2 * PART_SIZE + PART_SIZE / 2 + 12_345) as usize;
    let mut data = vec![0u8; size];
    rand::rng().fill_bytes(&mut data);
    let src = storage.scratch_dir("upload-1").unwrap().join("cube.npy");
    std::fs::write(&src, &data).unwrap();
    storage.put_file(&src, "uploads/j1/cube.npy").await.unwrap();
    assert!(!src.exists(), "{name}: the scratch file is still there once stored");
    storage.remove_scratch("upload-1");
    assert_eq!(storage.size("uploads/j1/cube.npy").await.unwrap(), size as u64);

    let dl = storage.get("uploads/j1/cube.npy").await.unwrap();
    assert_eq!(dl.size, size as u64);
    let streamed: Vec<u8> = dl.stream.map_ok(|b| b.to_vec()).try_concat().await.unwrap();
    assert!(streamed == data, "{name}: the streamed object differs from the file");

    let across = PART_SIZE - 100..PART_SIZE + 100;
    let got = storage.get_range("uploads/j1/cube.npy", across.clone()).await.unwrap();
    assert_eq!(&got[..], &data[across.start as usize..across.end as usize], "{name}: a range across a part boundary");
    let tail = storage.get_range("uploads/j1/cube.npy", size as u64 - 10..size as u64 + 1000).await.unwrap();
    assert_eq!(&tail[..], &data[size - 10..], "{name}: a range past the end gives what there is");

    let copy = storage.local_copy("uploads/j1/cube.npy").await.unwrap();
    assert!(std::fs::read(copy.path()).unwrap() == data, "{name}: the local copy differs");
    drop(copy);
    for scratch in [data_dir.join("scratch"), data_dir.join("objects/scratch")] {
        let copies = std::fs::read_dir(&scratch).map(|d| d.filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with("copy-")).count());
        assert_eq!(copies.unwrap_or(0), 0, "{name}: a local copy stayed in {}", scratch.display());
    }
    // The key of a scratch file names that file, on every store (uploads are decoded from there).
    let staged = storage.scratch_dir("upload-2").unwrap().join("cube.hdr");
    std::fs::write(&staged, "ENVI\n").unwrap();
    assert_eq!(std::fs::read(storage.local_copy("scratch/upload-2/cube.hdr").await.unwrap().path()).unwrap(), b"ENVI\n");
    storage.remove_scratch("upload-2");

    // Small objects, and deletes by prefix that stop at the prefix's own segment.
    let small = BTreeMap::from([
        ("results/j1/metadata.json", &b"{\"k\": 1}"[..]),
        ("results/j1/components.npy", &b"\x93NUMPY"[..]),
        ("results/j1/sub/eigen-system.bin", &b"abc"[..]),
        ("results/j10/metadata.json", &b"{}"[..]),
    ]);
    for (k, v) in &small {
        storage.put_bytes(k, bytes::Bytes::copy_from_slice(v)).await.unwrap();
    }
    for (k, v) in &small {
        assert_eq!(&storage.get_bytes(k).await.unwrap()[..], *v, "{name}: {k}");
    }
    let mut listed = storage.list("results/j1").await.unwrap();
    listed.sort();
    assert_eq!(listed, ["results/j1/components.npy", "results/j1/metadata.json", "results/j1/sub/eigen-system.bin"], "{name}");

    storage.delete_prefix("uploads/j1").await.unwrap();
    storage.delete_prefix("results/j1").await.unwrap();
    let mut left = storage.list("").await.unwrap();
    left.sort();
    assert_eq!(left, ["health/probe", "results/j10/metadata.json"], "{name}");
    storage.delete_prefix("results/j10/metadata.json").await.unwrap();
    storage.delete_prefix("health").await.unwrap();
    assert_eq!(storage.list("").await.unwrap(), Vec::<String>::new(), "{name}: something is left");

    // A missing key is "not found" every way it can be asked for, and the message names the store.
    let e = storage.get_bytes("results/j1/metadata.json").await.unwrap_err();
    assert!(e.is_not_found(), "{name}: {e}");
    assert!(e.to_string().contains("results/j1/metadata.json"), "{e}");
    assert!(storage.get("results/nothing").await.err().unwrap().is_not_found(), "{name}: get");
    assert!(storage.size("results/nothing").await.unwrap_err().is_not_found(), "{name}: size");
    assert!(storage.local_copy("results/nothing").await.unwrap_err().is_not_found(), "{name}: local_copy");
    assert!(storage.get_range("results/nothing", 0..10).await.unwrap_err().is_not_found(), "{name}: get_range");
    assert!(storage.delete_prefix("results/nothing").await.is_ok(), "{name}: deleting nothing is fine");
    assert!(storage.get_bytes("results/../etc").await.is_err(), "{name}: a key with .. is refused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn local_directory() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::open(None, dir.path()).unwrap();
    exercise(&storage, dir.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn file_url() {
    let (data, store) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let url = StoreUrl::parse(&format!("file://{}", store.path().join("shared").display())).unwrap();
    let storage = Storage::open(Some(&url), data.path()).unwrap();
    exercise(&storage, data.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s3() {
    let Some(url) = s3_url("storage") else { return };
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::open(Some(&url), dir.path()).unwrap();
    exercise(&storage, dir.path()).await;

    // A bucket that is not there: the error says which bucket, and where.
    let StoreUrl::S3 { prefix, .. } = &url else { unreachable!() };
    let missing = StoreUrl::S3 { bucket: "hypermnf-no-such-bucket".into(), prefix: prefix.clone() };
    let e = Storage::open(Some(&missing), dir.path()).unwrap().check().await.unwrap_err().to_string();
    assert!(e.contains("s3://hypermnf-no-such-bucket/"), "{e}");
    if let Ok(endpoint) = std::env::var("AWS_ENDPOINT_URL") {
        assert!(e.contains(&endpoint), "{e}");
    }
}

/// `hypermnf serve --store s3://...`: an .npy upload and an ENVI upload give the bytes the local store
/// gives; the uploads leave the bucket once the jobs are done, and a deleted job's results go too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn service_on_s3() {
    let Some(url) = s3_url("service") else { return };
    let cube = synthetic_cube(24, 20, 12, 7);
    let npy = npy_bytes(&cube);
    let (hdr, img) = envi_pair(&cube);

    let mut outputs = Vec::new();
    for store in [None, Some(url.clone())] {
        let dir = tempfile::tempdir().unwrap();
        let mut args = hypermnf::config::ServeArgs::with_data_dir(dir.path());
        args.store = store.clone();
        let srv = TestServer::start(args).await;
        let (s, a) = srv.post_npy(&npy, "components=4").await;
        assert_eq!(s, StatusCode::ACCEPTED, "{a}");
        let form = reqwest::multipart::Form::new()
            .text("header", hdr.clone())
            .part("data", reqwest::multipart::Part::bytes(img.clone()).file_name("cube.img"))
            .text("params", r#"{"components": 3, "inverse": true}"#);
        let r = srv.client.post(srv.url("/v1/jobs")).multipart(form).send().await.unwrap();
        let (s, b) = (r.status(), r.json::<serde_json::Value>().await.unwrap());
        assert_eq!(s, StatusCode::ACCEPTED, "{b}");
        let (a, b) = (a["id"].as_str().unwrap().to_string(), b["id"].as_str().unwrap().to_string());
        for id in [&a, &b] {
            let done = srv.wait(id).await;
            assert_eq!(done["status"], "succeeded", "{done}");
        }
        let mut got = Vec::new();
        for path in [format!("/v1/jobs/{a}/result"), format!("/v1/jobs/{b}/result?product=denoised"), format!("/v1/jobs/{a}/metadata")] {
            let (s, body) = srv.get_bytes(&path).await;
            assert_eq!(s, StatusCode::OK, "{path}");
            got.push(body);
        }
        // Twice: built and stored the first time, streamed from the store the second.
        for _ in 0..2 {
            let (s, zip) = srv.get_bytes(&format!("/v1/jobs/{b}/result?format=envi")).await;
            assert_eq!(s, StatusCode::OK);
            let entries = unzip(&zip);
            assert_eq!(entries.keys().collect::<Vec<_>>(), [&format!("{b}.hdr"), &format!("{b}.img")]);
            got.push(entries[&format!("{b}.img")].clone());
        }
        if let Some(url) = &store {
            let bucket = Storage::open(Some(url), dir.path()).unwrap();
            for id in [&a, &b] {
                // Deleted once the job is finished, beside the worker's next job.
                let t = std::time::Instant::now();
                while !bucket.list(&format!("uploads/{id}")).await.unwrap().is_empty() && t.elapsed() < std::time::Duration::from_secs(10) {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
                assert_eq!(bucket.list(&format!("uploads/{id}")).await.unwrap(), Vec::<String>::new(), "the upload stayed");
                assert!(!bucket.list(&format!("results/{id}")).await.unwrap().is_empty(), "no results in the bucket");
                let r = srv.client.delete(srv.url(&format!("/v1/jobs/{id}"))).send().await.unwrap();
                assert_eq!(r.status(), StatusCode::NO_CONTENT);
                assert_eq!(bucket.list(&format!("results/{id}")).await.unwrap(), Vec::<String>::new(), "the results stayed");
            }
            bucket.delete_prefix("health").await.unwrap();
            assert_eq!(bucket.list("").await.unwrap(), Vec::<String>::new(), "something stayed in the bucket");
        }
        srv.stop().await;
        outputs.push(got);
    }
    // The metadata has timings in it; everything else must match byte for byte.
    let (local, s3) = (&outputs[0], &outputs[1]);
    for i in [0, 1, 3, 4] {
        assert!(local[i] == s3[i], "output {i} differs between the local store and S3");
    }
    let meta = |b: &[u8]| serde_json::from_slice::<serde_json::Value>(b).unwrap()["eigenvalues"].clone();
    assert_eq!(meta(&local[2]), meta(&s3[2]));
}

/// The cube as ENVI header text and little-endian BSQ data.
fn envi_pair(cube: &hypermnf::cube::Cube) -> (String, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let hdr = dir.path().join("c.hdr");
    hypermnf::cube::envi::write_cube(&hdr, cube, hypermnf::cube::Interleave::Bsq, hypermnf::cube::ByteOrder::Little).unwrap();
    (std::fs::read_to_string(&hdr).unwrap(), std::fs::read(hdr.with_extension("img")).unwrap())
}

fn unzip(bytes: &[u8]) -> BTreeMap<String, Vec<u8>> {
    let mut z = zip::ZipArchive::new(std::io::Cursor::new(bytes)).unwrap();
    (0..z.len())
        .map(|i| {
            let mut f = z.by_index(i).unwrap();
            let mut out = Vec::new();
            std::io::Read::read_to_end(&mut f, &mut out).unwrap();
            (f.name().to_string(), out)
        })
        .collect()
}

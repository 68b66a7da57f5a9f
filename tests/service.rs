//! The HTTP service end to end: a real server on a loopback port with its real SQLite database in a
//! temporary data dir, driven over real HTTP (reqwest); and a real `hypermnf serve` process killed
//! with SIGKILL while a job runs, then started again on the same data dir.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};

use hypermnf::mnf::MnfParams;

mod common;
use common::{npy_bytes, synthetic_cube, TestServer};

/// Each real cube through each upload form gives the bytes `hypermnf run` (that is, `write_result` on
/// the same cube and parameters) gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_real_cube_through_every_upload_form_gives_the_cli_bytes() {
    let data = test_data();
    let tmp = tempfile::tempdir().unwrap();
    let mut args = hypermnf::config::ServeArgs::with_data_dir(tmp.path());
    args.input_roots = vec![data.clone()];
    args.workers = 2;
    let srv = TestServer::start(args).await;
    let work = tempfile::tempdir().unwrap();

    for (i, name) in CUBES.iter().enumerate() {
        let hdr = data.join(format!("{name}.hdr"));
        let img = data.join(format!("{name}.img"));
        let cube = hypermnf::cube::open(&hdr).unwrap();

        // Three different parameter sets, so that every form runs a job of its own (identical requests
        // would be answered from the cache, which another test checks).
        let p_npy = json!({"components": 6});
        let p_envi = json!({"components": 5, "inverse": i == 0});
        let p_href = json!({"snr": 1.0, "noise": "shift-difference"});

        // 1. a .npy body: the decoded cube as a C-order .npy, in the file's own byte order
        let npy = npy_bytes(&cube);
        let npy_path = work.path().join(format!("{name}.npy"));
        std::fs::write(&npy_path, &npy).unwrap();
        let j_npy = srv.post_npy(&npy, "components=6").await;
        assert_eq!(j_npy.0, StatusCode::ACCEPTED, "{}", j_npy.1);

        // 2. multipart header + data (+ params)
        let form = reqwest::multipart::Form::new()
            .text("header", std::fs::read_to_string(&hdr).unwrap())
            .part("data", reqwest::multipart::Part::bytes(std::fs::read(&img).unwrap()).file_name("cube.img"))
            .text("params", p_envi.to_string());
        let r = srv.client.post(srv.url("/v1/jobs")).multipart(form).send().await.unwrap();
        let j_envi = (r.status(), r.json::<Value>().await.unwrap());
        assert_eq!(j_envi.0, StatusCode::ACCEPTED, "{}", j_envi.1);

        // 3. a file:// href under the input root
        let body = json!({"input": {"href": format!("file://{}", hdr.display())}, "params": p_href});
        let r = srv.client.post(srv.url("/v1/jobs")).json(&body).send().await.unwrap();
        let j_href = (r.status(), r.json::<Value>().await.unwrap());
        assert_eq!(j_href.0, StatusCode::ACCEPTED, "{}", j_href.1);
        assert_eq!(j_href.1["input"]["lines"], cube.lines());
        assert_eq!(j_href.1["input"]["bands"], cube.bands());

        let npy_cube = hypermnf::cube::npy::read(&npy_path).unwrap();
        for (job, cube, params, tag) in [
            (&j_npy.1, &npy_cube, &p_npy, "npy"),
            (&j_envi.1, &cube, &p_envi, "envi"),
            (&j_href.1, &cube, &p_href, "href"),
        ] {
            let id = job["id"].as_str().unwrap();
            let done = srv.wait(id).await;
            assert_eq!(done["status"], "succeeded", "{name} {tag}: {done}");
            let params: MnfParams = serde_json::from_value(params.clone()).unwrap();
            let refdir = work.path().join(format!("ref-{name}-{tag}"));
            let reference = reference_result(cube, &params, &refdir);

            let got = srv.get_bytes(&format!("/v1/jobs/{id}/result")).await;
            assert_eq!(got.0, StatusCode::OK);
            assert!(got.1 == std::fs::read(&reference.components).unwrap(), "{name} {tag}: components differ from write_result");

            let meta: Value = serde_json::from_slice(&srv.get_bytes(&format!("/v1/jobs/{id}/metadata")).await.1).unwrap();
            let want: Value = serde_json::from_slice(&std::fs::read(&reference.metadata).unwrap()).unwrap();
            assert_eq!(without_timings(meta), without_timings(want), "{name} {tag}: metadata");

            if tag == "href" && i == 0 {
                // and the command line itself, for once: `hypermnf run` on the same file
                let cli_out = refdir.join("cli.npy");
                let st = std::process::Command::new(env!("CARGO_BIN_EXE_hypermnf"))
                    .args(["run", "--snr", "1", "--noise", "shift-difference", "--backend", "cpu", "--out"])
                    .arg(&cli_out)
                    .arg(&hdr)
                    .env("RUST_LOG", "warn")
                    .status()
                    .unwrap();
                assert!(st.success());
                assert!(got.1 == std::fs::read(&cli_out).unwrap(), "{name}: the service's bytes differ from `hypermnf run`");
            }
            if tag == "envi" {
                // ?format=envi: a zip of exactly the .hdr and .img `hypermnf run --out X.hdr` writes
                let envi_dir = refdir.join("envi");
                std::fs::create_dir_all(&envi_dir).unwrap();
                let out = hypermnf::mnf::run(cube, &params, &*cpu(), &hypermnf::mnf::Monitor::silent()).unwrap();
                let files = hypermnf::output::write_result(&envi_dir.join("x.hdr"), &out, &cube.meta).unwrap();
                let zip = srv.get_bytes(&format!("/v1/jobs/{id}/result?format=envi")).await;
                assert_eq!(zip.0, StatusCode::OK);
                let entries = unzip(&zip.1);
                assert_eq!(entries.len(), 2);
                assert_eq!(entries[&format!("{id}.hdr")], std::fs::read(&files.components).unwrap());
                assert_eq!(entries[&format!("{id}.img")], std::fs::read(files.components_data.unwrap()).unwrap());
                if params.inverse {
                    let d = srv.get_bytes(&format!("/v1/jobs/{id}/result?product=denoised")).await;
                    assert_eq!(d.0, StatusCode::OK);
                    assert!(d.1 == std::fs::read(reference.denoised.as_ref().unwrap()).unwrap(), "{name}: denoised differs");
                    // its ENVI data file, too, is made from the stored .npy on this first request
                    let zip = srv.get_bytes(&format!("/v1/jobs/{id}/result?product=denoised&format=envi")).await;
                    assert_eq!(zip.0, StatusCode::OK);
                    let entries = unzip(&zip.1);
                    assert_eq!(entries[&format!("{id}-denoised.hdr")], std::fs::read(files.denoised.as_ref().unwrap()).unwrap());
                    assert!(entries[&format!("{id}-denoised.img")] == std::fs::read(files.denoised_data.as_ref().unwrap()).unwrap());
                } else {
                    let d = srv.get_json(&format!("/v1/jobs/{id}/result?product=denoised")).await;
                    assert_eq!((d.0, d.1["code"].as_str()), (StatusCode::CONFLICT, Some("no_denoised")));
                }
            }
        }
    }
    srv.stop().await;
}

/// An identical request answers 200 with the same job and `cached: true`, across upload forms, and a
/// `.npy` sent with its SHA-256 is answered without its body being read again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_requests_return_the_existing_job() {
    let data = test_data();
    let root = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let mut args = hypermnf::config::ServeArgs::with_data_dir(tmp.path());
    args.input_roots = vec![data.clone(), root.path().to_path_buf()];
    let srv = TestServer::start(args).await;
    let hdr = data.join("jasper_ridge_r198_bil.hdr");
    let img = data.join("jasper_ridge_r198_bil.img");
    let form = || {
        reqwest::multipart::Form::new()
            .text("header", std::fs::read_to_string(&hdr).unwrap())
            .part("data", reqwest::multipart::Part::bytes(std::fs::read(&img).unwrap()))
    };
    let r = srv.client.post(srv.url("/v1/jobs?components=3")).multipart(form()).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    assert_eq!(r.headers()["location"].to_str().unwrap().len(), "/v1/jobs/".len() + 36);
    let first: Value = r.json().await.unwrap();
    assert_eq!(first["cached"], false);
    let id = first["id"].as_str().unwrap().to_string();

    // the same upload again, at once (the job may still be queued or running)
    let r = srv.client.post(srv.url("/v1/jobs?components=3")).multipart(form()).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let again: Value = r.json().await.unwrap();
    assert_eq!((again["id"].as_str(), again["cached"].as_bool()), (Some(id.as_str()), Some(true)));

    // the same cube named by href, same parameters: the same decoded cube, so the same job
    let body = json!({"input": {"href": format!("file://{}", hdr.display())}, "params": {"components": 3}});
    let r = srv.client.post(srv.url("/v1/jobs")).json(&body).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Value>().await.unwrap()["id"].as_str(), Some(id.as_str()));

    // different parameters: a new job
    let body = json!({"input": {"href": format!("file://{}", hdr.display())}, "params": {"components": 4}});
    let r = srv.client.post(srv.url("/v1/jobs")).json(&body).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let c4_id = r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string();
    assert_ne!(c4_id, id);
    assert_eq!(srv.wait(&id).await["status"], "succeeded");

    // .npy with X-Content-SHA256: the second time the header alone finds the job
    let cube = hypermnf::cube::open(&data.join("salinasA_224_bip_be.hdr")).unwrap();
    let npy = npy_bytes(&cube);
    let sha = sha256_hex(&npy);
    let r = srv.post_npy_with(&npy, "components=2", "x-content-sha256", &sha).await;
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let npy_id = r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string();
    let r = srv.post_npy_with(&[], "components=2", "x-content-sha256", &sha).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Value>().await.unwrap()["id"].as_str(), Some(npy_id.as_str()));
    // a digest that does not match the body is refused
    let r = srv.post_npy_with(&npy, "components=3", "x-content-sha256", &"0".repeat(64)).await;
    assert_eq!(error_of(r).await, (StatusCode::BAD_REQUEST, "digest_mismatch".into()));
    // X-Cube-Digest names the cube, not the body: it finds the job made from the same big-endian body
    // above, without a body, and one that is not the decoded cube's is refused
    let cube_digest = hex::encode(cube.content_digest());
    let r = srv.post_npy_with(&[], "components=2", "x-cube-digest", &cube_digest).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Value>().await.unwrap()["id"].as_str(), Some(npy_id.as_str()));
    let r = srv.post_npy_with(&npy, "components=3", "x-cube-digest", &"0".repeat(64)).await;
    assert_eq!(error_of(r).await, (StatusCode::BAD_REQUEST, "digest_mismatch".into()));
    // without a body, new parameters need it (a CPU server holds no cube on a device)
    let r = srv.post_npy_with(&[], "components=3", "x-cube-digest", &cube_digest).await;
    assert_eq!(error_of(r).await, (StatusCode::CONFLICT, "body_needed".into()));
    let r = srv.post_npy_with(&npy, "components=3", "x-cube-digest", "xyz").await;
    assert_eq!(error_of(r).await, (StatusCode::BAD_REQUEST, "invalid_digest".into()));

    // a little-endian .npy is digested while it streams in; the same file named by href is decoded
    // and digested by the cube: both must give the same job
    let syn = npy_bytes(&synthetic_cube(40, 30, 12, 11));
    std::fs::write(root.path().join("syn.npy"), &syn).unwrap();
    let (s, streamed) = srv.post_npy(&syn, "components=2").await;
    assert_eq!(s, StatusCode::ACCEPTED);
    let body = json!({"input": {"href": format!("file://{}", root.path().join("syn.npy").display())}, "params": {"components": 2}});
    let r = srv.client.post(srv.url("/v1/jobs")).json(&body).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Value>().await.unwrap()["id"], streamed["id"]);
    // ... and with the right X-Cube-Digest, its body is answered by the same job; with another, refused
    let syn_digest = hex::encode(hypermnf::cube::digest::of_parts(&[&syn]));
    let r = srv.post_npy_with(&[], "components=2", "x-cube-digest", &syn_digest).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Value>().await.unwrap()["id"], streamed["id"]);
    let mut wrong = syn_digest.into_bytes();
    wrong[0] = if wrong[0] == b'0' { b'1' } else { b'0' };
    let r = srv.post_npy_with(&syn, "components=5", "x-cube-digest", &String::from_utf8(wrong).unwrap()).await;
    assert_eq!(error_of(r).await, (StatusCode::BAD_REQUEST, "digest_mismatch".into()));

    // the listing shows the caller's jobs newest first, paginated
    let page = srv.get_json("/v1/jobs?limit=2").await.1;
    assert_eq!(page["jobs"].as_array().unwrap().len(), 2);
    assert_eq!(page["jobs"][0]["id"], streamed["id"]);
    assert_eq!(page["jobs"][1]["id"].as_str(), Some(npy_id.as_str()));
    let next = page["next"].as_str().unwrap().to_string();
    let page2 = srv.get_json(&format!("/v1/jobs?limit=2&after={next}")).await.1;
    assert_eq!(page2["jobs"].as_array().unwrap().len(), 2);
    assert_eq!(page2["jobs"][1]["id"].as_str(), Some(id.as_str()));
    assert!(page2["next"].is_null());
    for job in [c4_id.as_str(), npy_id.as_str(), streamed["id"].as_str().unwrap()] {
        assert_eq!(srv.wait(job).await["status"], "succeeded");
    }
    let metrics = srv.client.get(srv.url("/metrics")).send().await.unwrap().text().await.unwrap();
    // the multipart and href repeats, the X-Content-SHA256 one, the .npy named by href and the two
    // X-Cube-Digest ones
    assert!(metrics.contains("hypermnf_cache_hits_total 6"), "{metrics}");
    // every computed job reads once and writes once (the read stage used to be counted twice)
    let count = |stage: &str| -> u64 {
        let prefix = format!("hypermnf_stage_seconds_count{{stage=\"{stage}\"}} ");
        let line = metrics.lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("no {prefix} in {metrics}"));
        line[prefix.len()..].trim().parse().unwrap()
    };
    assert!(count("write") >= 3, "{metrics}");
    assert_eq!(count("read"), count("write"), "{metrics}");
    // the eigen stage runs wherever the statistics do (a job that reuses them skips both)
    assert!(count("eigen") >= 1, "{metrics}");
    assert_eq!(count("eigen"), count("statistics"), "{metrics}");
    // Histograms, as Prometheus users expect: request latency by route template, the queue wait,
    // upload sizes.
    for series in [
        "hypermnf_http_request_duration_seconds_bucket{le=\"+Inf\",route=\"/v1/jobs\",method=\"POST\",status=\"202\"}",
        "hypermnf_http_request_duration_seconds_count{route=\"/v1/jobs/{id}\",method=\"GET\",status=\"200\"}",
        "hypermnf_job_phase_seconds_bucket{le=\"+Inf\",phase=\"queued\"}",
        "hypermnf_upload_size_bytes_count",
        "hypermnf_download_size_bytes_count",
    ] {
        assert!(metrics.lines().any(|l| l.starts_with(series)), "no {series} in {metrics}");
    }
    assert!(!metrics.contains("# EOF"), "{metrics}");
    srv.stop().await;
}

/// Cancel a queued and a running job; the worker then goes on with other jobs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_queued_and_running_jobs() {
    let tmp = tempfile::tempdir().unwrap();
    let srv = TestServer::start(hypermnf::config::ServeArgs::with_data_dir(tmp.path())).await;
    let big = npy_bytes(&synthetic_cube(BIG.0, BIG.1, BIG.2, 1));
    let other = npy_bytes(&synthetic_cube(BIG.0, BIG.1, BIG.2, 2));
    let (s, running) = srv.post_npy(&big, "components=4").await;
    assert_eq!(s, StatusCode::ACCEPTED);
    let (s, queued) = srv.post_npy(&other, "components=4").await;
    assert_eq!(s, StatusCode::ACCEPTED);
    let (run_id, q_id) = (running["id"].as_str().unwrap(), queued["id"].as_str().unwrap());
    srv.wait_status(run_id, "running").await;
    assert_eq!(srv.get_json(&format!("/v1/jobs/{q_id}")).await.1["status"], "queued");
    let r = srv.get_json(&format!("/v1/jobs/{q_id}/result")).await;
    assert_eq!((r.0, r.1["code"].as_str()), (StatusCode::CONFLICT, Some("not_ready")));

    for id in [q_id, run_id] {
        let r = srv.client.delete(srv.url(&format!("/v1/jobs/{id}"))).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
        let j = srv.get_json(&format!("/v1/jobs/{id}")).await.1;
        assert_eq!(j["status"], "canceled");
        assert_eq!(j["error"]["code"], "canceled");
    }
    // the worker is free again: a small job runs to the end
    let (s, small) = srv.post_npy(&npy_bytes(&synthetic_cube(30, 20, 12, 3)), "components=3").await;
    assert_eq!(s, StatusCode::ACCEPTED);
    assert_eq!(srv.wait(small["id"].as_str().unwrap()).await["status"], "succeeded");
    // the canceled job did not get a result, and a canceled job is deleted by a second DELETE
    assert_eq!(srv.get_json(&format!("/v1/jobs/{run_id}")).await.1["status"], "canceled");
    let r = srv.get_json(&format!("/v1/jobs/{run_id}/result")).await;
    assert_eq!((r.0, r.1["code"].as_str()), (StatusCode::CONFLICT, Some("no_result")));
    let r = srv.client.delete(srv.url(&format!("/v1/jobs/{run_id}"))).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(srv.get_json(&format!("/v1/jobs/{run_id}")).await.0, StatusCode::NOT_FOUND);
    srv.stop().await;
}

/// With `--early-start always`, a `.npy` upload that finds the worker idle is computed while it is
/// still being synced (`jobs::early_start`): its 202 already shows it running (inserted claimed), its result is the
/// in-process pipeline's, and nothing of it is left in scratch. An upload that comes while the only
/// worker is busy is queued as before, and runs after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_that_finds_the_worker_idle_starts_before_its_202() {
    let tmp = tempfile::tempdir().unwrap();
    let mut args = hypermnf::config::ServeArgs::with_data_dir(tmp.path());
    // By default only jobs on a GPU start early; `always` takes the CPU ones too.
    args.early_start = hypermnf::config::EarlyStart::Always;
    let srv = TestServer::start(args).await;
    let (a, b) = (synthetic_cube(BIG.0, BIG.1, BIG.2, 31), synthetic_cube(60, 40, 16, 32));
    let (s, early) = srv.post_npy(&npy_bytes(&a), "components=4").await;
    assert_eq!((s, early["status"].as_str()), (StatusCode::ACCEPTED, Some("running")), "{early}");
    let (s, queued) = srv.post_npy(&npy_bytes(&b), "components=3").await;
    assert_eq!((s, queued["status"].as_str()), (StatusCode::ACCEPTED, Some("queued")), "{queued}");
    for (job, cube, k) in [(&early, &a, 4), (&queued, &b, 3)] {
        let id = job["id"].as_str().unwrap();
        assert_eq!(srv.wait(id).await["status"], "succeeded");
        let (s, got) = srv.get_bytes(&format!("/v1/jobs/{id}/result")).await;
        assert_eq!(s, StatusCode::OK);
        let params: hypermnf::mnf::MnfParams = serde_json::from_value(json!({"components": k})).unwrap();
        let want = hypermnf::mnf::run(cube, &params, &hypermnf::backend::cpu::CpuBackend::new(), &hypermnf::mnf::Monitor::silent()).unwrap();
        let values: Vec<u32> = got[got.len() - want.components.len() * 4..]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(values, want.components.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "job {id}");
    }
    let metrics = srv.client.get(srv.url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("hypermnf_jobs_started_early_total 1\n"), "{metrics}");
    let left: Vec<_> = std::fs::read_dir(tmp.path().join("objects/scratch"))
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left in scratch: {left:?}");
    srv.stop().await;

    // The default (`device`) leaves a CPU job queued, as before.
    let tmp = tempfile::tempdir().unwrap();
    let srv = TestServer::start(hypermnf::config::ServeArgs::with_data_dir(tmp.path())).await;
    let (s, queued) = srv.post_npy(&npy_bytes(&b), "components=3").await;
    assert_eq!((s, queued["status"].as_str()), (StatusCode::ACCEPTED, Some("queued")), "{queued}");
    assert_eq!(srv.wait(queued["id"].as_str().unwrap()).await["status"], "succeeded");
    srv.stop().await;
}

/// A multipart ENVI upload is handled as a `.npy` body is (`api::envi_upload`): its content digest is
/// computed while the data part is written, and with the parameters before the data its job starts
/// before the 202. Checked for each interleave and both byte orders: each job is running at its 202
/// and gives the in-process pipeline's components bit for bit; a big-endian BIP upload and a `.npy`
/// of the same samples are one cube (the `.npy` finds the ENVI job), and so is a BIL upload sent
/// again, in either byte order; and nothing is left in scratch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multipart_envi_upload_is_digested_as_it_arrives_and_starts_before_its_202() {
    let tmp = tempfile::tempdir().unwrap();
    let mut args = hypermnf::config::ServeArgs::with_data_dir(tmp.path());
    args.early_start = hypermnf::config::EarlyStart::Always;
    let srv = TestServer::start(args).await;
    let cube = synthetic_cube(BIG.0, BIG.1, BIG.2, 41);
    let (l, s, b, size) = (cube.lines(), cube.samples(), cube.bands(), cube.dtype().size());
    let code = match cube.dtype() {
        hypermnf::cube::DataType::I16 => 2,
        hypermnf::cube::DataType::F32 => 4,
        other => panic!("the synthetic cube is {other:?}"),
    };
    let raw = cube.raw();
    // The samples in `interleave`, each made big-endian when `big`.
    let stored = |interleave: &str, big: bool| -> Vec<u8> {
        let mut out = Vec::with_capacity(raw.len());
        let mut push = |li: usize, si: usize, bi: usize| {
            let at = ((li * s + si) * b + bi) * size;
            let sample = &raw[at..at + size];
            if big {
                out.extend(sample.iter().rev());
            } else {
                out.extend_from_slice(sample);
            }
        };
        match interleave {
            "bip" => (0..l).for_each(|li| (0..s).for_each(|si| (0..b).for_each(|bi| push(li, si, bi)))),
            "bil" => (0..l).for_each(|li| (0..b).for_each(|bi| (0..s).for_each(|si| push(li, si, bi)))),
            _ => (0..b).for_each(|bi| (0..l).for_each(|li| (0..s).for_each(|si| push(li, si, bi)))),
        }
        out
    };
    let post = |interleave: &'static str, big: bool| {
        let header = format!(
            "ENVI\nsamples = {s}\nlines = {l}\nbands = {b}\nheader offset = 0\ndata type = {code}\ninterleave = {interleave}\nbyte order = {}\n",
            big as u8
        );
        let form = reqwest::multipart::Form::new()
            .text("header", header)
            .text("params", r#"{"components": 4}"#)
            .part("data", reqwest::multipart::Part::bytes(stored(interleave, big)).file_name("cube.img"));
        let request = srv.client.post(srv.url("/v1/jobs")).multipart(form);
        async move {
            let r = request.send().await.unwrap();
            (r.status(), r.json::<Value>().await.unwrap())
        }
    };
    let params: MnfParams = serde_json::from_value(json!({"components": 4})).unwrap();
    let want = hypermnf::mnf::run(&cube, &params, &hypermnf::backend::cpu::CpuBackend::new(), &hypermnf::mnf::Monitor::silent()).unwrap();
    let want: Vec<u32> = want.components.iter().map(|v| v.to_bits()).collect();
    let mut started = 0;
    let mut ids = HashMap::new();
    for (interleave, big) in [("bil", false), ("bip", true), ("bsq", false)] {
        let (status, job) = post(interleave, big).await;
        assert_eq!((status, job["status"].as_str()), (StatusCode::ACCEPTED, Some("running")), "{interleave} big-endian {big}: {job}");
        started += 1;
        let id = job["id"].as_str().unwrap().to_string();
        assert_eq!(srv.wait(&id).await["status"], "succeeded", "{interleave} big-endian {big}");
        let (st, got) = srv.get_bytes(&format!("/v1/jobs/{id}/result")).await;
        assert_eq!(st, StatusCode::OK);
        let values: Vec<u32> = got[got.len() - want.len() * 4..].chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
        assert!(values == want, "{interleave} big-endian {big}: the components differ from the pipeline's");
        ids.insert((interleave, big), id);
    }
    // The same samples as a .npy: the big-endian BIP upload's job (its header carries nothing more).
    let (status, again) = srv.post_npy(&npy_bytes(&cube), "components=4").await;
    assert_eq!((status, again["cached"].as_bool(), again["id"].as_str()), (StatusCode::OK, Some(true), Some(ids[&("bip", true)].as_str())), "{again}");
    // The same BIL upload again, and in the other byte order: the first one's job.
    for big in [false, true] {
        let (status, again) = post("bil", big).await;
        assert_eq!((status, again["cached"].as_bool(), again["id"].as_str()), (StatusCode::OK, Some(true), Some(ids[&("bil", false)].as_str())), "{again}");
    }
    let metrics = srv.client.get(srv.url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains(&format!("hypermnf_jobs_started_early_total {started}\n")), "{metrics}");
    let left: Vec<_> = std::fs::read_dir(tmp.path().join("objects/scratch"))
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left in scratch: {left:?}");
    srv.stop().await;
}

/// The Grafana dashboard (docker/monitoring) asks only for series this server exports: every
/// `hypermnf_*` name in its queries is a metric family of `/metrics` (with `_bucket`, `_count` or
/// `_sum` for a histogram's parts) once a job has run and its result was downloaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grafana_dashboard_asks_only_for_exported_metrics() {
    let tmp = tempfile::tempdir().unwrap();
    let srv = TestServer::start(hypermnf::config::ServeArgs::with_data_dir(tmp.path())).await;
    let (s, job) = srv.post_npy(&npy_bytes(&synthetic_cube(60, 40, 16, 51)), "components=3").await;
    assert_eq!(s, StatusCode::ACCEPTED, "{job}");
    let id = job["id"].as_str().unwrap();
    assert_eq!(srv.wait(id).await["status"], "succeeded");
    assert_eq!(srv.get_bytes(&format!("/v1/jobs/{id}/result")).await.0, StatusCode::OK);
    let metrics = srv.client.get(srv.url("/metrics")).send().await.unwrap().text().await.unwrap();
    let families: Vec<&str> = metrics.lines().filter_map(|l| l.strip_prefix("# TYPE ")).filter_map(|l| l.split_whitespace().next()).collect();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docker/monitoring/grafana/dashboards/hypermnf.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut asked = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            for (at, _) in expr.match_indices("hypermnf_") {
                let name: String = expr[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                let base = ["_bucket", "_count", "_sum"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(&name);
                assert!(families.contains(&base) || families.contains(&name.as_str()), "{}: {name} is not exported: {metrics}", panel["title"]);
                asked += 1;
            }
        }
    }
    assert!(asked >= 10, "the dashboard asks for {asked} series");
    srv.stop().await;
}

/// `GET /v1/jobs/{id}?wait=S` holds the request until the job ends: one request sees `succeeded`; a
/// finished job answers at once; a job that does not end within S (on a server with no worker) is
/// answered with its state after S; a cancellation wakes the waiter; a wait out of range is a 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_answers_when_the_job_ends() {
    let tmp = tempfile::tempdir().unwrap();
    let srv = TestServer::start(hypermnf::config::ServeArgs::with_data_dir(tmp.path())).await;
    let (s, small) = srv.post_npy(&npy_bytes(&synthetic_cube(60, 40, 16, 21)), "components=3").await;
    assert_eq!(s, StatusCode::ACCEPTED);
    let id = small["id"].as_str().unwrap();
    let (s, j) = srv.get_json(&format!("/v1/jobs/{id}?wait=40")).await;
    assert_eq!((s, j["status"].as_str()), (StatusCode::OK, Some("succeeded")), "{j}");
    let t = Instant::now();
    assert_eq!(srv.get_json(&format!("/v1/jobs/{id}?wait=40")).await.1["status"], "succeeded");
    assert!(t.elapsed() < Duration::from_secs(5), "a finished job was held {:?}", t.elapsed());

    // A server whose workers never claim (none started): its jobs stay queued, with no race.
    let idle_dir = tempfile::tempdir().unwrap();
    let mut idle_args = hypermnf::config::ServeArgs::with_data_dir(idle_dir.path());
    idle_args.workers = 0;
    let idle = TestServer::start(idle_args).await;
    let (s, queued) = idle.post_npy(&npy_bytes(&synthetic_cube(30, 20, 12, 23)), "components=3").await;
    assert_eq!(s, StatusCode::ACCEPTED);
    let q_id = queued["id"].as_str().unwrap().to_string();
    let t = Instant::now();
    let (s, j) = idle.get_json(&format!("/v1/jobs/{q_id}?wait=0.4")).await;
    assert_eq!((s, j["status"].as_str()), (StatusCode::OK, Some("queued")), "{j}");
    assert!(t.elapsed() >= Duration::from_millis(400), "answered after {:?}", t.elapsed());

    let (client, url) = (idle.client.clone(), idle.url(&format!("/v1/jobs/{q_id}?wait=40")));
    let waiter = tokio::spawn(async move {
        let t = Instant::now();
        let v: Value = client.get(url).send().await.unwrap().json().await.unwrap();
        (v, t.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = idle.client.delete(idle.url(&format!("/v1/jobs/{q_id}"))).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let (v, took) = waiter.await.unwrap();
    assert_eq!(v["status"], "canceled", "{v}");
    assert!(took < Duration::from_secs(20), "the cancellation did not wake the waiter ({took:?})");
    idle.stop().await;

    for bad in ["wait=-1", "wait=51", "wait=NaN", "wait=inf", "wait=soon", "colour=red"] {
        let (s, e) = srv.get_json(&format!("/v1/jobs/{id}?{bad}")).await;
        assert_eq!((s, e["code"].as_str()), (StatusCode::BAD_REQUEST, Some("invalid_query")), "{bad}: {e}");
    }
    srv.stop().await;
}

/// With API keys, each key sees only its own jobs; without a key, 401.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_isolate_owners() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    std::fs::write(&keys, "# test keys\nalice:alice-key\nbob:bob-key\n").unwrap();
    let mut args = hypermnf::config::ServeArgs::with_data_dir(dir.path().join("data"));
    args.api_keys_file = Some(keys);
    let srv = TestServer::start(args).await;
    let npy = npy_bytes(&synthetic_cube(20, 16, 10, 4));

    let r = srv.client.post(srv.url("/v1/jobs")).header("content-type", "application/x-npy").body(npy.clone()).send().await.unwrap();
    assert_eq!(r.headers().get("www-authenticate").map(|v| v.to_str().unwrap()), Some("Bearer"));
    assert_eq!(error_of(r).await, (StatusCode::UNAUTHORIZED, "unauthorized".into()));
    let r = srv.client.get(srv.url("/v1/jobs")).bearer_auth("mallory-key").send().await.unwrap();
    assert_eq!(error_of(r).await, (StatusCode::UNAUTHORIZED, "unauthorized".into()));
    assert_eq!(srv.client.get(srv.url("/healthz")).send().await.unwrap().status(), StatusCode::OK);

    let r = srv.client.post(srv.url("/v1/jobs?components=2")).bearer_auth("alice-key")
        .header("content-type", "application/x-npy").body(npy.clone()).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let id = r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string();

    for path in [format!("/v1/jobs/{id}"), format!("/v1/jobs/{id}/result"), format!("/v1/jobs/{id}/metadata")] {
        let r = srv.client.get(srv.url(&path)).bearer_auth("bob-key").send().await.unwrap();
        assert_eq!(error_of(r).await, (StatusCode::NOT_FOUND, "not_found".into()), "{path}");
    }
    let r = srv.client.delete(srv.url(&format!("/v1/jobs/{id}"))).bearer_auth("bob-key").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let bobs: Value = srv.client.get(srv.url("/v1/jobs")).bearer_auth("bob-key").send().await.unwrap().json().await.unwrap();
    assert_eq!(bobs["jobs"].as_array().unwrap().len(), 0);
    // Bob's identical upload is a job of his own, not Alice's
    let r = srv.client.post(srv.url("/v1/jobs?components=2")).bearer_auth("bob-key")
        .header("content-type", "application/x-npy").body(npy.clone()).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    assert_ne!(r.json::<Value>().await.unwrap()["id"].as_str(), Some(id.as_str()));

    let alices: Value = srv.client.get(srv.url(&format!("/v1/jobs/{id}"))).bearer_auth("alice-key").send().await.unwrap().json().await.unwrap();
    assert_eq!(alices["id"].as_str(), Some(id.as_str()));
    srv.stop().await;

    // a non-loopback address without keys is refused unless --insecure
    let mut open = hypermnf::config::ServeArgs::with_data_dir(dir.path().join("open"));
    open.listen = "0.0.0.0:0".into();
    let err = hypermnf::api::start(open.clone()).await.err().expect("must refuse");
    assert!(err.to_string().contains("--insecure"), "{err}");
    open.insecure = true;
    hypermnf::api::start(open).await.unwrap().stop().await.unwrap();
}

/// Malformed and hostile requests get their documented status and code, and the server keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_hostile_requests_get_their_documented_errors() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("inputs");
    std::fs::create_dir_all(&root).unwrap();
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let mut args = hypermnf::config::ServeArgs::with_data_dir(dir.path().join("data"));
    args.input_roots = vec![root.clone()];
    args.max_upload_bytes = 1 << 20;
    let srv = TestServer::start(args).await;
    let small = synthetic_cube(16, 12, 8, 5);
    let good = npy_bytes(&small);

    let mut cases: Vec<(&str, reqwest::RequestBuilder, StatusCode, &str)> = Vec::new();
    let npy = |q: &str, body: Vec<u8>| srv.client.post(srv.url(&format!("/v1/jobs{q}"))).header("content-type", "application/x-npy").body(body);
    let mut short = good.clone();
    short.truncate(good.len() - 10);
    cases.push(("npy shorter than its header says", npy("", short), StatusCode::BAD_REQUEST, "size_mismatch"));
    let mut long = good.clone();
    long.extend_from_slice(&[1, 2, 3, 4]);
    cases.push(("npy longer than its header says", npy("", long), StatusCode::BAD_REQUEST, "size_mismatch"));
    cases.push(("npy claiming absurd dimensions", npy("", npy_header("<f8", "(4294967296, 4294967296, 4096)")), StatusCode::PAYLOAD_TOO_LARGE, "too_large"));
    cases.push(("npy claiming more than the limit", npy("", npy_header("<f4", "(1000, 1000, 100)")), StatusCode::PAYLOAD_TOO_LARGE, "too_large"));
    cases.push(("npy of two dimensions", npy("", npy_header("<f4", "(10, 10)")), StatusCode::BAD_REQUEST, "invalid_npy"));
    cases.push(("not a npy at all", npy("", b"GIF89a this is not an array".to_vec()), StatusCode::BAD_REQUEST, "invalid_npy"));
    cases.push(("empty body", npy("", Vec::new()), StatusCode::BAD_REQUEST, "invalid_npy"));
    // "body over the limit" by Content-Length is checked below over a raw socket (refused on the headers
    // alone), and with the whole body streaming in by refused_uploads_are_answered_while_the_body_is_still_coming.
    // Chunked (no Content-Length) whose .npy header claims 2 MB: refused from the header, before the body.
    let mut chunked_body = npy_header("<u1", "(100, 100, 200)");
    chunked_body.extend(std::iter::repeat_n(1u8, 1000));
    let all_chunks: Vec<Result<Vec<u8>, std::io::Error>> = vec![Ok(chunked_body)];
    cases.push((
        "chunked upload whose header claims more than the limit (no Content-Length)",
        srv.client.post(srv.url("/v1/jobs")).header("content-type", "application/x-npy")
            .body(reqwest::Body::wrap_stream(futures::stream::iter(all_chunks))),
        StatusCode::PAYLOAD_TOO_LARGE,
        "too_large",
    ));
    cases.push(("components = 0", npy("?components=0", good.clone()), StatusCode::UNPROCESSABLE_ENTITY, "invalid_params"));
    cases.push(("components not a number", npy("?components=many", good.clone()), StatusCode::UNPROCESSABLE_ENTITY, "invalid_params"));
    cases.push(("components above the bands", npy("?components=9", good.clone()), StatusCode::UNPROCESSABLE_ENTITY, "invalid_params"));
    cases.push(("unknown parameter", npy("?colour=red", good.clone()), StatusCode::UNPROCESSABLE_ENTITY, "invalid_params"));
    cases.push(("components and snr", npy("?components=2&snr=1", good.clone()), StatusCode::UNPROCESSABLE_ENTITY, "invalid_params"));
    cases.push(("noise window outside the cube", npy("?noise_window=0,0,50,50", good.clone()), StatusCode::UNPROCESSABLE_ENTITY, "invalid_params"));
    cases.push(("bad band out of range", npy("?bad_bands=3,8", good.clone()), StatusCode::UNPROCESSABLE_ENTITY, "invalid_params"));
    cases.push(("unknown backend", npy("?backend=tpu", good.clone()), StatusCode::UNPROCESSABLE_ENTITY, "invalid_params"));
    cases.push(("wrong content type", srv.client.post(srv.url("/v1/jobs")).header("content-type", "text/plain").body("hello"), StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type"));
    cases.push(("no content type", srv.client.post(srv.url("/v1/jobs")).body("hello"), StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type"));

    // multipart
    let hdr = |l: usize, s: usize, b: usize, dt: u8| format!("ENVI\nsamples = {s}\nlines = {l}\nbands = {b}\ndata type = {dt}\ninterleave = bsq\nbyte order = 0\n");
    let mp = |parts: Vec<(&str, Vec<u8>)>| {
        let mut f = reqwest::multipart::Form::new();
        for (n, b) in parts {
            f = f.part(n.to_string(), reqwest::multipart::Part::bytes(b));
        }
        srv.client.post(srv.url("/v1/jobs")).multipart(f)
    };
    let raw = small.raw().to_vec(); // i16 little-endian BIP, 16 x 12 x 8
    cases.push(("multipart without data", mp(vec![("header", hdr(16, 12, 8, 2).into_bytes())]), StatusCode::BAD_REQUEST, "invalid_multipart"));
    cases.push(("multipart with an unknown part", mp(vec![("header", hdr(16, 12, 8, 2).into_bytes()), ("data", raw.clone()), ("extra", vec![1])]), StatusCode::BAD_REQUEST, "invalid_multipart"));
    cases.push(("multipart data shorter than its header says", mp(vec![("header", hdr(16, 12, 9, 2).into_bytes()), ("data", raw.clone())]), StatusCode::BAD_REQUEST, "size_mismatch"));
    cases.push(("multipart data longer than its header says", mp(vec![("header", hdr(16, 12, 7, 2).into_bytes()), ("data", raw.clone())]), StatusCode::BAD_REQUEST, "size_mismatch"));
    cases.push(("multipart header claiming a huge cube", mp(vec![("header", hdr(100000, 100000, 400, 4).into_bytes()), ("data", raw.clone())]), StatusCode::PAYLOAD_TOO_LARGE, "too_large"));
    cases.push(("multipart header with a complex data type", mp(vec![("header", hdr(16, 12, 8, 6).into_bytes()), ("data", raw.clone())]), StatusCode::UNPROCESSABLE_ENTITY, "unsupported"));
    cases.push(("multipart params not JSON", mp(vec![("header", hdr(16, 12, 8, 2).into_bytes()), ("data", raw.clone()), ("params", b"{components: 2".to_vec())]), StatusCode::UNPROCESSABLE_ENTITY, "invalid_params"));
    let mut truncated = b"--XYZ\r\nContent-Disposition: form-data; name=\"header\"\r\n\r\n".to_vec();
    truncated.extend_from_slice(hdr(16, 12, 8, 2).as_bytes());
    truncated.extend_from_slice(b"\r\n--XYZ\r\nContent-Disposition: form-data; name=\"data\"\r\n\r\n");
    truncated.extend_from_slice(&raw[..1000]);
    cases.push((
        "truncated multipart",
        srv.client.post(srv.url("/v1/jobs")).header("content-type", "multipart/form-data; boundary=XYZ").body(truncated),
        StatusCode::BAD_REQUEST,
        "incomplete_body",
    ));
    cases.push((
        "multipart without a boundary",
        srv.client.post(srv.url("/v1/jobs")).header("content-type", "multipart/form-data").body("x"),
        StatusCode::BAD_REQUEST,
        "invalid_multipart",
    ));

    // href
    std::fs::write(outside.join("cube.npy"), &good).unwrap();
    std::os::unix::fs::symlink(outside.join("cube.npy"), root.join("escape.npy")).unwrap();
    std::fs::write(root.join("notes.txt"), "x").unwrap();
    std::fs::write(root.join("lonely.hdr"), "ENVI\nsamples = 4\nlines = 4\nbands = 4\ndata type = 2\ninterleave = bsq\nbyte order = 0\n").unwrap();
    let href = |h: String| srv.client.post(srv.url("/v1/jobs")).json(&json!({"input": {"href": h}}));
    cases.push(("href outside the roots", href(format!("file://{}", outside.join("cube.npy").display())), StatusCode::FORBIDDEN, "forbidden_path"));
    cases.push(("href through a symlink out of the root", href(format!("file://{}", root.join("escape.npy").display())), StatusCode::FORBIDDEN, "forbidden_path"));
    cases.push(("href with ..", href(format!("file://{}/../outside/cube.npy", root.display())), StatusCode::BAD_REQUEST, "invalid_href"));
    cases.push(("href to a header without its data file", href(format!("file://{}", root.join("lonely.hdr").display())), StatusCode::BAD_REQUEST, "input_not_found"));
    cases.push(("href to a missing file", href(format!("file://{}", root.join("nope.npy").display())), StatusCode::BAD_REQUEST, "input_not_found"));
    cases.push(("href that is not file://", href("http://example.com/cube.npy".into()), StatusCode::BAD_REQUEST, "invalid_href"));
    cases.push(("href to a file that is no cube", href(format!("file://{}", root.join("notes.txt").display())), StatusCode::UNPROCESSABLE_ENTITY, "unsupported"));
    cases.push(("malformed JSON", srv.client.post(srv.url("/v1/jobs")).header("content-type", "application/json").body("{\"input\": "), StatusCode::BAD_REQUEST, "invalid_json"));
    cases.push(("JSON with unknown members", srv.client.post(srv.url("/v1/jobs")).json(&json!({"input": {"href": "file:///x"}, "priority": 1})), StatusCode::BAD_REQUEST, "invalid_json"));

    // ids, queries, routes
    for bad in ["not-a-uuid", "00000000-0000-0000-0000-000000000000", "%2e%2e%2fetc"] {
        cases.push(("unknown job", srv.client.get(srv.url(&format!("/v1/jobs/{bad}"))), StatusCode::NOT_FOUND, "not_found"));
        cases.push(("unknown job result", srv.client.get(srv.url(&format!("/v1/jobs/{bad}/result"))), StatusCode::NOT_FOUND, "not_found"));
        cases.push(("unknown job delete", srv.client.delete(srv.url(&format!("/v1/jobs/{bad}"))), StatusCode::NOT_FOUND, "not_found"));
    }
    cases.push(("bad status filter", srv.client.get(srv.url("/v1/jobs?status=done")), StatusCode::BAD_REQUEST, "invalid_query"));
    cases.push(("limit 0", srv.client.get(srv.url("/v1/jobs?limit=0")), StatusCode::BAD_REQUEST, "invalid_query"));
    cases.push(("bad result format", srv.client.get(srv.url("/v1/jobs/00000000-0000-0000-0000-000000000000/result?format=tiff")), StatusCode::BAD_REQUEST, "invalid_query"));
    cases.push(("unknown route", srv.client.get(srv.url("/v2/things")), StatusCode::NOT_FOUND, "not_found"));
    cases.push(("wrong method", srv.client.put(srv.url("/v1/jobs")), StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"));

    for (what, req, status, code) in cases {
        let r = req.send().await.unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(error_of(r).await, (status, code.to_string()), "{what}");
    }

    // Body over the limit: the headers alone announce 1 MiB + 1, and the server must refuse on them,
    // without waiting for (or reading) a body.
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let addr = srv.url("/").trim_start_matches("http://").trim_end_matches('/').to_string();
        let mut sock = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let head = format!(
            "POST /v1/jobs HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-npy\r\nContent-Length: {}\r\n\r\n",
            (1 << 20) + 1
        );
        sock.write_all(head.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        let read = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            let mut buf = [0u8; 4096];
            loop {
                let n = sock.read(&mut buf).await.unwrap_or(0);
                answer.extend_from_slice(&buf[..n]);
                if n == 0 || String::from_utf8_lossy(&answer).contains("too_large") {
                    break;
                }
            }
        })
        .await;
        let text = String::from_utf8_lossy(&answer);
        assert!(read.is_ok(), "body over the limit: no answer to the headers alone (got {text:?})");
        assert!(text.starts_with("HTTP/1.1 413"), "body over the limit: {text}");
        assert!(text.contains("\"code\":\"too_large\""), "body over the limit: {text}");
    }

    // still serving: a good upload runs to the end, and nothing was left behind by the refused ones
    let (s, j) = srv.post_npy(&good, "components=3").await;
    assert_eq!(s, StatusCode::ACCEPTED, "{j}");
    assert_eq!(srv.wait(j["id"].as_str().unwrap()).await["status"], "succeeded");
    let scratch = dir.path().join("data/objects/scratch");
    let left = std::fs::read_dir(&scratch).map(|d| d.count()).unwrap_or(0);
    assert_eq!(left, 0, "scratch files left behind");
    let ready = srv.get_json("/readyz").await;
    assert_eq!(ready.0, StatusCode::OK);
    srv.stop().await;
}

/// A refused upload gets its JSON answer even while the client is still sending the body: the server
/// reads and discards the rest instead of closing on unread bytes (which resets the connection, and a
/// reset loses the answer). Each case 20 times, on fresh connections, with reqwest sending the whole
/// body as fast as it can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_uploads_are_answered_while_the_body_is_still_coming() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = hypermnf::config::ServeArgs::with_data_dir(dir.path().join("data"));
    args.max_upload_bytes = 1 << 20;
    let srv = TestServer::start(args).await;
    const MB2: usize = 2 << 20;
    // A .npy that claims (and holds) 2 MiB, twice the limit.
    let mut over = npy_header("<u1", "(1024, 1024, 2)");
    over.resize(over.len() + MB2, 7);
    // A .npy that claims 512 KiB (under the limit) but goes on for 2 MiB.
    let mut longer = npy_header("<u1", "(512, 512, 2)");
    longer.resize(longer.len() + MB2, 7);
    // Multipart whose data part comes first (so no header bounds it): only the byte budget stops it,
    // in the middle of the stream.
    let mut multipart = b"--XYZ\r\nContent-Disposition: form-data; name=\"data\"\r\n\r\n".to_vec();
    multipart.resize(multipart.len() + MB2, 7);
    multipart.extend_from_slice(b"\r\n--XYZ--\r\n");
    // Streamed in 64 KiB frames: chunked transfer encoding, no Content-Length.
    let chunked = |body: &[u8]| {
        let frames: Vec<Result<Vec<u8>, std::io::Error>> = body.chunks(64 << 10).map(|c| Ok(c.to_vec())).collect();
        reqwest::Body::wrap_stream(futures::stream::iter(frames))
    };
    for round in 0..20 {
        let cases = [
            (
                "Content-Length over the limit (refused on the headers)",
                srv.client.post(srv.url("/v1/jobs")).header("content-type", "application/x-npy").body(over.clone()),
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
            ),
            (
                "chunked .npy whose header claims more than the limit",
                srv.client.post(srv.url("/v1/jobs")).header("content-type", "application/x-npy").body(chunked(&over)),
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
            ),
            (
                "chunked multipart past the limit mid-stream",
                srv.client.post(srv.url("/v1/jobs")).header("content-type", "multipart/form-data; boundary=XYZ").body(chunked(&multipart)),
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
            ),
            (
                "chunked .npy longer than its header claims",
                srv.client.post(srv.url("/v1/jobs")).header("content-type", "application/x-npy").body(chunked(&longer)),
                StatusCode::BAD_REQUEST,
                "size_mismatch",
            ),
        ];
        for (what, req, status, code) in cases {
            let r = req.send().await.unwrap_or_else(|e| panic!("round {round}, {what}: {e:?}"));
            assert_eq!(error_of(r).await, (status, code.to_string()), "round {round}, {what}");
        }
    }
    assert_eq!(srv.get_json("/healthz").await.0, StatusCode::OK);
    srv.stop().await;
}

/// A client that never stops sending after its upload was refused is not drained for ever: the server
/// cuts it off past the lingering bounds in bytes (a fast sender) and in time (a slow one), and serves
/// other requests meanwhile. The fast sender still receives its 413 before the cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_body_is_cut_off() {
    use hypermnf::api::lingering_close::{LINGER_MAX_BYTES, LINGER_MAX_TIME};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let mut args = hypermnf::config::ServeArgs::with_data_dir(dir.path().join("data"));
    args.max_upload_bytes = 1 << 20;
    let srv = TestServer::start(args).await;
    let addr = srv.server.addr;
    // Claims a terabyte: refused on the headers, then the client just keeps sending.
    let head = format!("POST /v1/jobs HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-npy\r\nContent-Length: {}\r\n\r\n", 1u64 << 40);

    // How long a sender goes on (sending `block` bytes, then pausing `pause`) before a write fails;
    // what it read meanwhile.
    let flood = |block: usize, pause: Duration| {
        let head = head.clone();
        tokio::spawn(async move {
            let sock = tokio::net::TcpStream::connect(addr).await.unwrap();
            let (mut rd, mut wr) = sock.into_split();
            let reader = tokio::spawn(async move {
                let mut answer = Vec::new();
                let _ = tokio::time::timeout(Duration::from_secs(60), rd.read_to_end(&mut answer)).await;
                answer
            });
            wr.write_all(head.as_bytes()).await.unwrap();
            let data = vec![0u8; block];
            let (start, mut sent) = (Instant::now(), 0u64);
            let cut = loop {
                if start.elapsed() > Duration::from_secs(60) {
                    break false;
                }
                match wr.write_all(&data).await {
                    Ok(()) => sent += block as u64,
                    Err(_) => break true,
                }
                tokio::time::sleep(pause).await;
            };
            (cut, sent, start.elapsed(), String::from_utf8_lossy(&reader.await.unwrap()).into_owned())
        })
    };
    let fast = flood(1 << 20, Duration::ZERO);
    let slow = flood(1, Duration::from_millis(100));
    // served meanwhile
    for _ in 0..5 {
        assert_eq!(srv.get_json("/healthz").await.0, StatusCode::OK);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (cut, sent, took, answer) = fast.await.unwrap();
    assert!(cut, "a fast endless body was never cut off ({sent} bytes in {took:?})");
    // what the kernel buffers on both sides comes on top of what the server read
    assert!(sent < LINGER_MAX_BYTES + (256 << 20), "cut off only after {sent} bytes");
    assert!(answer.starts_with("HTTP/1.1 413") && answer.contains("\"code\":\"too_large\""), "{answer:?}");
    let (cut, sent, took, _) = slow.await.unwrap();
    assert!(cut, "a slow endless body was never cut off ({sent} bytes in {took:?})");
    assert!(took < LINGER_MAX_TIME + Duration::from_secs(10), "cut off only after {took:?}");
    assert_eq!(srv.get_json("/healthz").await.0, StatusCode::OK);
    srv.stop().await;
}

/// Every file an href leads the server to open is held to the input roots once its symlinks are
/// resolved, not only the file named: an ENVI header's data file under whichever name the reader finds
/// it (upper case, no extension, `x.img.hdr` → `x.img`, ...), and the data file beside a header reached
/// through a symlink (the one beside the resolved header, which is the one read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn href_data_files_are_held_to_the_input_roots() {
    use hypermnf::cube::{ByteOrder, Interleave};
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("inputs");
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    let mut args = hypermnf::config::ServeArgs::with_data_dir(dir.path().join("data"));
    args.input_roots = vec![root.clone()];
    let srv = TestServer::start(args).await;
    let cube = synthetic_cube(12, 10, 6, 3);
    let envi = |hdr: &Path| hypermnf::cube::envi::write_cube(hdr, &cube, Interleave::Bsq, ByteOrder::Little).unwrap();
    envi(&outside.join("secret.hdr")); // secret.hdr + secret.img
    envi(&root.join("sub/good.hdr"));
    let header_text = std::fs::read(root.join("sub/good.hdr")).unwrap();
    let header = |p: &Path| std::fs::write(p, &header_text).unwrap();
    let secret = outside.join("secret.img");

    // a header inside the root whose data file, under each name the reader tries, leads outside
    for (hdr, data) in [("upper.hdr", "upper.IMG"), ("bare.hdr", "bare"), ("dat.hdr", "dat.dat"), ("x.img.hdr", "x.img"), ("lower.hdr", "lower.img")] {
        header(&root.join(hdr));
        symlink(&secret, root.join(data)).unwrap();
    }
    // a header symlinked (inside the root) from another directory, whose own data file leads outside
    header(&root.join("sub/evil.hdr"));
    symlink(&secret, root.join("sub/evil.img")).unwrap();
    symlink(root.join("sub/evil.hdr"), root.join("via-link.hdr")).unwrap();
    // a header symlinked out of the root
    symlink(outside.join("secret.hdr"), root.join("out.hdr")).unwrap();
    let refused = ["upper.hdr", "bare.hdr", "dat.hdr", "x.img.hdr", "lower.hdr", "via-link.hdr", "out.hdr"];

    // and one that is fine: a symlink to a good header in the root; the decoy beside the link (which
    // is not the file read) does not matter
    symlink(root.join("sub/good.hdr"), root.join("good-link.hdr")).unwrap();
    symlink(&secret, root.join("good-link.img")).unwrap();

    let post = |name: &str| {
        let body = json!({"input": {"href": format!("file://{}", root.join(name).display())}, "params": {"components": 2}});
        srv.client.post(srv.url("/v1/jobs")).json(&body).send()
    };
    for name in refused {
        let r = post(name).await.unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{name}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["code"], "forbidden_path", "{name}: {v}");
        assert!(!v["message"].as_str().unwrap().contains(outside.to_str().unwrap()), "{name}: the message shows the target: {v}");
    }
    let r = post("good-link.hdr").await.unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let job: Value = r.json().await.unwrap();
    assert_eq!(srv.wait(job["id"].as_str().unwrap()).await["status"], "succeeded");
    srv.stop().await;
}

/// Finished jobs and their files go once they are older than --retention.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_jobs_expire_after_the_retention_time() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = hypermnf::config::ServeArgs::with_data_dir(dir.path().join("data"));
    args.retention = Duration::from_secs(1);
    let srv = TestServer::start(args).await;
    let (s, j) = srv.post_npy(&npy_bytes(&synthetic_cube(24, 20, 10, 9)), "components=2").await;
    assert_eq!(s, StatusCode::ACCEPTED);
    let id = j["id"].as_str().unwrap().to_string();
    assert_eq!(srv.wait(&id).await["status"], "succeeded");
    let results = dir.path().join(format!("data/objects/results/{id}"));
    assert!(results.join("components.npy").is_file());
    // not yet old enough
    assert_eq!(hypermnf::api::expire_once(&srv.server.ctx).await.unwrap(), 0);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // the server's own expiry task runs every second too, so it may have been first
    assert!(hypermnf::api::expire_once(&srv.server.ctx).await.unwrap() <= 1);
    assert_eq!(srv.get_json(&format!("/v1/jobs/{id}")).await.0, StatusCode::NOT_FOUND);
    assert!(!results.join("components.npy").exists());
    srv.stop().await;
}

/// An upload slower than --request-timeout is answered 408 in the JSON error shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_upload_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = hypermnf::config::ServeArgs::with_data_dir(dir.path().join("data"));
    args.request_timeout = Duration::from_secs(1);
    let srv = TestServer::start(args).await;
    let npy = npy_bytes(&synthetic_cube(24, 20, 10, 10));
    let first = npy[..200].to_vec();
    let body = futures::stream::once(async move { Ok::<_, std::io::Error>(first) })
        .chain(futures::stream::once(async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok::<_, std::io::Error>(vec![0u8; 10])
        }));
    use futures::StreamExt;
    let r = srv.client.post(srv.url("/v1/jobs")).header("content-type", "application/x-npy")
        .body(reqwest::Body::wrap_stream(body)).send().await.unwrap();
    assert_eq!(error_of(r).await, (StatusCode::REQUEST_TIMEOUT, "timeout".into()));
    assert_eq!(srv.get_json("/healthz").await.0, StatusCode::OK);
    srv.stop().await;
}

/// A real `hypermnf serve` process killed with SIGKILL while its job runs; started again on the same
/// data dir, it runs the job to the end (nothing accepted is lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_finishes_its_running_job_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let cube = synthetic_cube(BIG.0, BIG.1, BIG.2, 7);
    let npy = npy_bytes(&cube);

    let data = dir.path().join("data");
    let (mut child, base) = spawn_server(&data, &dir.path().join("first.log")).await;
    let client = reqwest::Client::new();
    let r = client.post(format!("{base}/v1/jobs?components=4")).header("content-type", "application/x-npy").body(npy.clone()).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let id = r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let j: Value = client.get(format!("{base}/v1/jobs/{id}")).send().await.unwrap().json().await.unwrap();
        if j["status"] == "running" {
            break;
        }
        assert_eq!(j["status"], "queued", "{j}");
        assert!(Instant::now() < deadline, "the job never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child.kill().unwrap(); // SIGKILL: no shutdown code runs
    child.wait().unwrap();

    let (mut child, base) = spawn_server(&data, &dir.path().join("second.log")).await;
    let deadline = Instant::now() + Duration::from_secs(120);
    let done = loop {
        let j: Value = client.get(format!("{base}/v1/jobs/{id}")).send().await.unwrap().json().await.unwrap();
        if j["status"] != "queued" && j["status"] != "running" {
            break j;
        }
        assert!(Instant::now() < deadline, "the job did not finish after the restart: {j}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(done["status"], "succeeded", "{done}");
    let log = std::fs::read_to_string(dir.path().join("second.log")).unwrap();
    assert!(log.contains("queued again"), "the second process did not recover the running job:\n{log}");
    let got = client.get(format!("{base}/v1/jobs/{id}/result")).send().await.unwrap().bytes().await.unwrap();
    let npy_path = dir.path().join("in.npy");
    std::fs::write(&npy_path, &npy).unwrap();
    let params: MnfParams = serde_json::from_value(json!({"components": 4})).unwrap();
    let reference = reference_result(&hypermnf::cube::npy::read(&npy_path).unwrap(), &params, &dir.path().join("ref"));
    assert!(got.as_ref() == std::fs::read(&reference.components).unwrap().as_slice(), "the recovered result differs");
    child.kill().unwrap();
    child.wait().unwrap();
}

/// A machine that stopped after two jobs were seen succeeded but before their results reached the
/// disk (simulated on a stopped server: each result cut short, the jobs marked unsynced, one upload
/// back where it was): at the next start the job with its input is computed again to the same
/// bytes, and the one without input fails with `result_lost` instead of serving a short file. A
/// job whose results did reach the disk loses its upload, and the row says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_that_missed_the_disk_are_computed_again_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let npy = npy_bytes(&synthetic_cube(60, 50, 20, 11));
    let data = dir.path().join("data");
    let objects = data.join("objects");
    let (mut child, base) = spawn_server(&data, &dir.path().join("first.log")).await;
    let client = reqwest::Client::new();
    let mut jobs = Vec::new();
    for k in [4, 3] {
        let r = client.post(format!("{base}/v1/jobs?components={k}")).header("content-type", "application/x-npy").body(npy.clone()).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::ACCEPTED);
        jobs.push(r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string());
    }
    let mut results = Vec::new();
    for id in &jobs {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let j: Value = client.get(format!("{base}/v1/jobs/{id}?wait=10")).send().await.unwrap().json().await.unwrap();
            if j["status"] == "succeeded" {
                break;
            }
            assert!(j["status"] == "queued" || j["status"] == "running", "{j}");
            assert!(Instant::now() < deadline, "the job never finished");
        }
        results.push(client.get(format!("{base}/v1/jobs/{id}/result")).send().await.unwrap().bytes().await.unwrap());
        // Synced, then the upload goes.
        let deadline = Instant::now() + Duration::from_secs(30);
        while objects.join("uploads").join(id).exists() {
            assert!(Instant::now() < deadline, "the upload of a finished job stays");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let db = format!("sqlite://{}", data.join("hypermnf.db").display());
    let unsynced = || async {
        let pool = sqlx::SqlitePool::connect(&db).await.unwrap();
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM jobs WHERE results_unsynced = 1").fetch_one(&pool).await.unwrap();
        pool.close().await;
        n
    };
    assert_eq!(unsynced().await, 0, "the results are recorded as on the disk");
    child.kill().unwrap();
    child.wait().unwrap();

    // What a machine that stopped in time can leave: each .npy cut after its header and a few values.
    for id in &jobs {
        let f = std::fs::OpenOptions::new().write(true).open(objects.join(format!("results/{id}/components.npy"))).unwrap();
        f.set_len(200).unwrap();
    }
    std::fs::create_dir_all(objects.join(format!("uploads/{}", jobs[0]))).unwrap();
    std::fs::write(objects.join(format!("uploads/{}/cube.npy", jobs[0])), &npy).unwrap();
    let pool = sqlx::SqlitePool::connect(&db).await.unwrap();
    sqlx::query("UPDATE jobs SET results_unsynced = 1").execute(&pool).await.unwrap();
    pool.close().await;

    let (mut child, base) = spawn_server(&data, &dir.path().join("second.log")).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let again = loop {
        let j: Value = client.get(format!("{base}/v1/jobs/{}?wait=10", jobs[0])).send().await.unwrap().json().await.unwrap();
        if j["status"] != "queued" && j["status"] != "running" {
            break j;
        }
        assert!(Instant::now() < deadline, "the job was not computed again: {j}");
    };
    assert_eq!(again["status"], "succeeded", "{again}");
    let got = client.get(format!("{base}/v1/jobs/{}/result", jobs[0])).send().await.unwrap().bytes().await.unwrap();
    assert!(got == results[0], "the result computed again differs");

    let lost: Value = client.get(format!("{base}/v1/jobs/{}", jobs[1])).send().await.unwrap().json().await.unwrap();
    assert_eq!((&lost["status"], &lost["error"]["code"]), (&json!("failed"), &json!("result_lost")), "{lost}");
    let r = client.get(format!("{base}/v1/jobs/{}/result", jobs[1])).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::CONFLICT, "no short file is served");
    let log = std::fs::read_to_string(dir.path().join("second.log")).unwrap();
    assert!(log.contains("computing them again") && log.contains("its input is gone"), "{log}");
    // The same request again makes a new job: the lost one left the cache.
    let r = client.post(format!("{base}/v1/jobs?components=3")).header("content-type", "application/x-npy").body(npy.clone()).send().await.unwrap();
    let fresh: Value = r.json().await.unwrap();
    assert_ne!(fresh["id"], json!(jobs[1]), "{fresh}");
    child.kill().unwrap();
    child.wait().unwrap();
}

// ---------------------------------------------------------------------------------------------------
// Helpers

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

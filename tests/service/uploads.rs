//! Uploads in every form: the CLI's bytes, identical requests, jobs that start before their 202.

use super::*;

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

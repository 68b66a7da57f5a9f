//! A server stopped mid-job and started again: nothing accepted is lost.

use super::*;

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

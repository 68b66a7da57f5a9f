//! Jobs once accepted: cancellation, long polls, owners, metrics, retention.

use super::*;

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

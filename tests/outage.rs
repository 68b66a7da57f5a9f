//! The service while its job database is away, in process: the server reaches a real PostgreSQL
//! through a TCP relay that the test cuts (its open connections dropped, its port closed), which is
//! what the server sees when the database host goes down. Needs `HYPERMNF_TEST_POSTGRES_URL`
//! (scripts/test.sh starts a server); skipped without it, unless `HYPERMNF_REQUIRE_POSTGRES=1`.
//! scripts/chaos-test.sh does the same with real crashes of PostgreSQL, Garage and instances.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::TestServer;
use reqwest::StatusCode;
use serde_json::Value;
use sqlx::{Connection, Executor, PgConnection};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// The PostgreSQL server for tests, or None (the test is skipped) unless the environment requires one.
fn postgres_url() -> Option<String> {
    match std::env::var("HYPERMNF_TEST_POSTGRES_URL") {
        Ok(u) if !u.is_empty() => Some(u),
        _ => {
            assert_ne!(std::env::var("HYPERMNF_REQUIRE_POSTGRES").as_deref(), Ok("1"), "HYPERMNF_TEST_POSTGRES_URL is not set");
            eprintln!("skipped: set HYPERMNF_TEST_POSTGRES_URL (scripts/test.sh does)");
            None
        }
    }
}

/// A TCP relay from a loopback port to `target`; [`Relay::cut`] closes its port and every
/// connection through it.
struct Relay {
    port: u16,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
}

impl Relay {
    async fn start(target: String) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let tasks: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let spawned = tasks.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let target = target.clone();
                let relay = tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(&target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                spawned.lock().unwrap().push(relay);
            }
        });
        Relay { port, tasks, accept }
    }

    /// The database is gone: new connections are refused, open ones are closed.
    fn cut(&self) {
        self.accept.abort();
        for t in self.tasks.lock().unwrap().drain(..) {
            t.abort();
        }
    }
}

/// A database of its own on the test server, and its URL through a relay.
async fn database_behind_relay(admin: &str) -> (String, String, Relay) {
    let name = format!("hypermnf_outage_{}", uuid::Uuid::new_v4().simple());
    let mut conn = PgConnection::connect(admin).await.expect("connect to HYPERMNF_TEST_POSTGRES_URL");
    conn.execute(format!("CREATE DATABASE {name}").as_str()).await.expect("create a test database");
    let mut url = reqwest::Url::parse(admin).expect("a postgres:// URL");
    let target = format!("{}:{}", url.host_str().unwrap(), url.port().unwrap_or(5432));
    let relay = Relay::start(target).await;
    url.set_port(Some(relay.port)).unwrap();
    url.set_path(&format!("/{name}"));
    (name, url.to_string(), relay)
}

impl TestServer {
    async fn get_as(&self, path: &str, key: &str) -> (StatusCode, Option<String>, Value, Duration) {
        let started = Instant::now();
        let r = self.client.get(self.url(path)).bearer_auth(key).send().await.unwrap();
        let stale = r.headers().get("x-hypermnf-stale").map(|v| v.to_str().unwrap().to_string());
        let retry_after = r.headers().get("retry-after").is_some();
        let (status, body) = (r.status(), r.json::<Value>().await.unwrap());
        if status == StatusCode::SERVICE_UNAVAILABLE {
            assert!(retry_after, "a 503 without Retry-After: {body}");
        }
        (status, stale, body, started.elapsed())
    }

    async fn succeeded_job(&self, key: &str, seed: u64) -> String {
        let body = common::npy_bytes(&common::synthetic_cube(20, 16, 8, seed));
        let r = self.client.post(self.url("/v1/jobs?components=2")).bearer_auth(key)
            .header("content-type", "application/x-npy").body(body).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::ACCEPTED);
        let id = r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string();
        assert_eq!(self.wait_as(&id, key).await["status"], "succeeded");
        id
    }
}

/// While the database cannot be reached, `GET /v1/jobs/{id}` of a job this instance saw succeed
/// answers 200 with the document it had, marked `X-Hypermnf-Stale: database_unavailable`, to its
/// owner only; another owner, a deleted job and an unknown one get the 503 `database_unavailable`
/// within a second, as every other request that needs the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_succeeded_jobs_status_is_served_from_the_job_cache_while_the_database_is_down() {
    let Some(admin) = postgres_url() else { return };
    let (db, url, relay) = database_behind_relay(&admin).await;
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    std::fs::write(&keys, "alice:key-alice\nbob:key-bob\n").unwrap();
    let mut args = hypermnf::config::ServeArgs::with_data_dir(dir.path().join("data"));
    args.database_url = Some(url);
    args.api_keys_file = Some(keys);
    let server = TestServer::start(args).await;

    let kept = server.succeeded_job("key-alice", 1).await;
    let deleted = server.succeeded_job("key-alice", 2).await;
    let r = server.client.delete(server.url(&format!("/v1/jobs/{deleted}"))).bearer_auth("key-alice").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let (status, stale, before, _) = server.get_as(&format!("/v1/jobs/{kept}"), "key-alice").await;
    assert_eq!((status, stale), (StatusCode::OK, None), "the database answers: no mark");

    relay.cut();
    let (status, stale, during, took) = server.get_as(&format!("/v1/jobs/{kept}"), "key-alice").await;
    assert_eq!(status, StatusCode::OK, "{during}");
    assert_eq!(stale.as_deref(), Some("database_unavailable"));
    assert_eq!(during, before, "the document as it was");
    assert!(took < Duration::from_secs(1), "{took:?}");
    let (status, stale, during, _) = server.get_as(&format!("/v1/jobs/{kept}?wait=20"), "key-alice").await;
    assert_eq!((status, stale.as_deref(), &during), (StatusCode::OK, Some("database_unavailable"), &before), "a long poll of it answers at once");

    let unknown = uuid::Uuid::new_v4().to_string();
    for (what, id, key) in [("another owner's job", &kept, "key-bob"), ("a deleted job", &deleted, "key-alice"), ("an unknown job", &unknown, "key-alice")] {
        let (status, stale, body, took) = server.get_as(&format!("/v1/jobs/{id}"), key).await;
        assert_eq!((status, stale), (StatusCode::SERVICE_UNAVAILABLE, None), "{what}: {body}");
        assert_eq!(body["code"], "database_unavailable", "{what}");
        assert!(took < Duration::from_secs(1), "{what}: {took:?}");
    }
    let (status, _, body, _) = server.get_as("/v1/jobs", "key-alice").await;
    assert_eq!((status, body["code"].as_str()), (StatusCode::SERVICE_UNAVAILABLE, Some("database_unavailable")), "the list needs the database");

    server.stop().await;
    let mut conn = PgConnection::connect(&admin).await.unwrap();
    let _ = conn.execute(format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)").as_str()).await;
}

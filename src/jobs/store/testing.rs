//! One test body, run against every database the store supports: SQLite in a temp dir always, and
//! PostgreSQL when `HYPERMNF_TEST_POSTGRES_URL` names a server (scripts/test.sh starts one). Each run
//! gets a database of its own, dropped afterwards. With `HYPERMNF_REQUIRE_POSTGRES=1` (CI) a missing
//! server fails the test instead of skipping its PostgreSQL half.

use std::future::Future;

use sqlx::{Connection, Executor, PgConnection};

use super::JobStore;

/// Runs `body` on a fresh SQLite store, then on a fresh PostgreSQL database when one is configured.
pub async fn each_store<F, Fut>(body: F)
where
    F: Fn(JobStore) -> Fut,
    Fut: Future<Output = ()>,
{
    let dir = tempfile::tempdir().unwrap();
    let sqlite = JobStore::open(&format!("sqlite://{}", dir.path().join("t.db").display())).await.unwrap();
    body(sqlite).await;

    let Some(pg) = FreshPostgres::create().await else { return };
    let store = JobStore::open(&pg.url).await.expect("open the PostgreSQL store");
    body(store).await;
    pg.drop_database().await;
}

/// The PostgreSQL URL for tests, or None (skipped) unless the environment requires one.
pub fn postgres_url() -> Option<String> {
    match std::env::var("HYPERMNF_TEST_POSTGRES_URL") {
        Ok(u) if !u.is_empty() => Some(u),
        _ => {
            if std::env::var("HYPERMNF_REQUIRE_POSTGRES").as_deref() == Ok("1") {
                panic!("HYPERMNF_REQUIRE_POSTGRES=1 but HYPERMNF_TEST_POSTGRES_URL is not set");
            }
            eprintln!("PostgreSQL half skipped: set HYPERMNF_TEST_POSTGRES_URL (scripts/test.sh does)");
            None
        }
    }
}

/// A database created for one test on the configured server.
pub struct FreshPostgres {
    admin: String,
    name: String,
    pub url: String,
}

impl FreshPostgres {
    pub async fn create() -> Option<FreshPostgres> {
        let admin = postgres_url()?;
        let name = format!("hypermnf_test_{}", uuid::Uuid::new_v4().simple());
        let (base, query) = match admin.split_once('?') {
            Some((b, q)) => (b, format!("?{q}")),
            None => (admin.as_str(), String::new()),
        };
        let (server, _db) = base.rsplit_once('/').expect("a postgres:// URL with a database");
        let url = format!("{server}/{name}{query}");
        let mut conn = PgConnection::connect(&admin).await.expect("connect to HYPERMNF_TEST_POSTGRES_URL");
        conn.execute(format!("CREATE DATABASE {name}").as_str()).await.expect("create a test database");
        Some(FreshPostgres { admin, name, url })
    }

    pub async fn drop_database(self) {
        if let Ok(mut conn) = PgConnection::connect(&self.admin).await {
            let _ = conn.execute(format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name).as_str()).await;
        }
    }
}

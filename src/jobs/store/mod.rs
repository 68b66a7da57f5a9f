//! The job table, in SQLite (embedded, one instance) or PostgreSQL (several instances sharing one
//! queue), through sqlx's `any` driver: one set of queries (numbered `$n` parameters, which both
//! databases read) with a few dialect-specific clauses, and each database's own migrations
//! (`migrations/sqlite/`, `migrations/postgres/`) applied at open. The job cache's rows (row handles,
//! stored eigen systems) are in `cache_rows`; PostgreSQL's notifications between instances in `notify`.
//!
//! A claim is a lease: the instance that runs a job records itself and a time until which the job is
//! its, and extends it while the job runs ([`JobStore::heartbeat`]); a job whose lease ran out (its
//! instance was killed, its node lost) is claimed again by any instance. The final status of a job is
//! written only by the holder of its lease, so a job succeeds once however often it was claimed.

mod batches;
mod dialect;
mod event;
mod cache_rows;
mod system_rows;
mod reference_rows;
mod start_wait;
pub mod notify;
#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;

pub use batches::{BatchRow, NewBatch};
pub use cache_rows::NewEigenRow;
pub use system_rows::SystemRow;
pub use dialect::Dialect;
pub use start_wait::{retry_while_unavailable, START_WAIT};

use std::collections::BTreeMap;
use std::time::Duration;

use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, Row};

use super::model::{now_ms, BatchMember, BatchPhase, InputKind, InputSummary, Job, JobStatus};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error("database migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("corrupt job row {id}: {what}")]
    Corrupt { id: String, what: String },
    #[error("unsupported database URL {0:?}: use sqlite://PATH or postgres://USER@HOST:PORT/DATABASE")]
    UnsupportedUrl(String),
}

impl StoreError {
    /// Whether the database could not be reached or is going away (a pool that waited its acquire
    /// timeout, a refused or broken connection, a server shutting down or starting up): a condition
    /// to retry after, not a fault of the request or of this server.
    pub fn is_unavailable(&self) -> bool {
        match self {
            StoreError::Db(e) => match e {
                sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::WorkerCrashed => true,
                // PostgreSQL's connection exceptions (class 08) and its shutdown and start-up refusals.
                sqlx::Error::Database(d) => d.code().is_some_and(|c| c.starts_with("08") || matches!(c.as_ref(), "57P01" | "57P02" | "57P03")),
                _ => false,
            },
            _ => false,
        }
    }
}

/// The claim's condition on a queued job: not a pooled member waiting for its batch's system.
const CLAIMABLE: &str = "(batch_phase IS NULL OR batch_phase = 'statistics'
     OR EXISTS (SELECT 1 FROM batches b WHERE b.id = jobs.batch_id AND b.system_key IS NOT NULL))";

/// How long a request waits for a PostgreSQL connection before it is told the database is unavailable
/// (503): below a second, so that a client hears it at once instead of after the 10 s of before (an
/// acquire includes connecting, and a refused connection is retried until then). A pool that is busy
/// rather than unreachable answers the same way: 16 connections all held that long is overload.
const PG_ACQUIRE_TIMEOUT: Duration = Duration::from_millis(600);
/// The longest a statement may run on PostgreSQL: every query of the job store is an indexed read or
/// a one-row write, so one that runs this long waits on a lock or a sick server.
const PG_STATEMENT_TIMEOUT: &str = "10s";

/// A job about to be inserted.
#[derive(Debug, Clone)]
pub struct NewJob {
    pub id: String,
    pub owner: String,
    pub params: String,
    pub digest: String,
    /// Hex `Cube::content_digest` of the input.
    pub content_digest: Option<String>,
    pub upload_sha256: Option<String>,
    pub input: InputSummary,
    pub input_kind: InputKind,
    pub input_location: String,
}

type AnyQuery<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>;

/// Binds a new job's own columns, the first nine parameters of every insert of a job: `id, owner,
/// params, digest, content_digest, upload_sha256, input` (`input`, its summary as JSON), `input_kind,
/// input_location`.
fn bind_new_job<'q>(query: AnyQuery<'q>, new: &'q NewJob, input: &'q str) -> AnyQuery<'q> {
    query
        .bind(&new.id)
        .bind(&new.owner)
        .bind(&new.params)
        .bind(&new.digest)
        .bind(&new.content_digest)
        .bind(&new.upload_sha256)
        .bind(input)
        .bind(new.input_kind.as_str())
        .bind(&new.input_location)
}

#[cfg(test)]
impl NewJob {
    /// A 1-pixel `.npy` job of alice's, for the store's and the cache's unit tests.
    pub(crate) fn for_test(id: &str) -> NewJob {
        NewJob {
            id: id.into(),
            owner: "alice".into(),
            params: "{}".into(),
            digest: format!("digest-{id}"),
            content_digest: Some("ab".repeat(32)),
            upload_sha256: None,
            input: InputSummary { lines: 1, samples: 1, bands: 1, data_type: "int16".into(), interleave: "bip".into() },
            input_kind: InputKind::Npy,
            input_location: format!("uploads/{id}"),
        }
    }
}

/// What an insert found.
pub enum Inserted {
    Created(Job),
    /// A live job (queued, running or succeeded) with the same owner and digest already exists.
    Existing(Job),
}

#[derive(Clone)]
pub struct JobStore {
    pool: AnyPool,
    /// For the commits that must survive a power cut: a job accepted (its insert: the client has
    /// its 201 or 202), and results marked synced (after which a job's input is deleted). On SQLite
    /// its connections sync the write-ahead log at each commit (`synchronous = FULL`), and so make
    /// every earlier commit durable too; the others (`NORMAL`: claims, progress, heartbeats, a job
    /// marked succeeded) are written to the log without a sync, which keeps them atomic and
    /// consistent but may lose the last of them in a power cut. Such a job is then found running
    /// at the next start and run again from its input, which is kept until its results are synced.
    /// PostgreSQL commits durably by default: the same pool.
    durable: AnyPool,
    dialect: Dialect,
    /// The URL, for PostgreSQL's notification listener (a connection of its own).
    url: String,
}

const LIVE: &str = "('queued', 'running', 'succeeded')";

/// A pool on SQLite file `url` whose connections use `synchronous` (`NORMAL` or `FULL`).
async fn sqlite_pool(url: &str, synchronous: &'static str, max: u32) -> Result<AnyPool, StoreError> {
    Ok(AnyPoolOptions::new()
        .max_connections(max)
        .after_connect(move |conn, _| {
            Box::pin(async move {
                // The pragmas are per connection.
                for pragma in [
                    "PRAGMA journal_mode = WAL".to_string(),
                    format!("PRAGMA synchronous = {synchronous}"),
                    "PRAGMA busy_timeout = 10000".to_string(),
                    "PRAGMA foreign_keys = ON".to_string(),
                ] {
                    sqlx::query(&pragma).execute(&mut *conn).await?;
                }
                Ok(())
            })
        })
        .connect(url)
        .await?)
}

/// A claim: who takes the job, and for how long before another instance may take it again.
#[derive(Debug, Clone)]
pub struct Lease {
    pub owner: String,
    pub duration: Duration,
}

impl Lease {
    fn expires_at(&self) -> i64 {
        now_ms() + self.duration.as_millis() as i64
    }
}

impl JobStore {
    /// Opens the database (creating an SQLite file if needed) and applies its migrations.
    pub async fn open(url: &str) -> Result<JobStore, StoreError> {
        let dialect = Dialect::of_url(url).ok_or_else(|| StoreError::UnsupportedUrl(url.to_string()))?;
        sqlx::any::install_default_drivers();
        // `mode=rwc` creates an SQLite file.
        let sqlite_url = if url.contains('?') { url.to_string() } else { format!("{url}?mode=rwc") };
        let pool = match dialect {
            Dialect::Sqlite => sqlite_pool(&sqlite_url, "NORMAL", 8).await?,
            Dialect::Postgres => {
                AnyPoolOptions::new()
                    .max_connections(16)
                    .acquire_timeout(PG_ACQUIRE_TIMEOUT)
                    .after_connect(|conn, _| {
                        Box::pin(async move {
                            sqlx::Executor::execute(&mut *conn, format!("SET statement_timeout = '{PG_STATEMENT_TIMEOUT}'").as_str()).await?;
                            Ok(())
                        })
                    })
                    .connect(url)
                    .await?
            }
        };
        match dialect {
            Dialect::Sqlite => sqlx::migrate!("./migrations/sqlite").run(&pool).await?,
            // Instances starting together: the migrator takes PostgreSQL's advisory lock, so one applies them.
            Dialect::Postgres => sqlx::migrate!("./migrations/postgres").run(&pool).await?,
        }
        // SQLite: the commits that must survive a power cut (see `JobStore::durable`) go through
        // connections that sync the write-ahead log at each commit; the migrations ran first.
        let durable = match dialect {
            Dialect::Sqlite => sqlite_pool(&sqlite_url, "FULL", 2).await?,
            Dialect::Postgres => pool.clone(),
        };
        Ok(JobStore { pool, durable, dialect, url: url.to_string() })
    }

    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    pub async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// Inserts a queued job, unless a live job of the same owner has the same digest (then that one).
    pub async fn insert(&self, new: NewJob) -> Result<Inserted, StoreError> {
        self.insert_as(new, None).await
    }

    /// Inserts a job already claimed under `lease`, as [`JobStore::claim`] would leave it (running,
    /// first attempt): this instance runs it at once (a job started early, see `jobs::early_start`), and no
    /// worker of any instance claims it unless the lease lapses.
    pub async fn insert_claimed(&self, new: NewJob, lease: &Lease) -> Result<Inserted, StoreError> {
        self.insert_as(new, Some(lease)).await
    }

    async fn insert_as(&self, new: NewJob, claimed: Option<&Lease>) -> Result<Inserted, StoreError> {
        let input = serde_json::to_string(&new.input).expect("input summary serialises");
        let now = now_ms();
        let insert = sqlx::query(
            "INSERT INTO jobs (id, owner, params, digest, content_digest, upload_sha256, input, input_kind, input_location,
                               status, stage, progress, created_at, started_at, attempts, lease_owner, lease_expires_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, 0, $12, $13, $14, $15, $16)",
        );
        let res = bind_new_job(insert, &new, &input)
            .bind(if claimed.is_some() { "running" } else { "queued" })
            .bind(claimed.map(|_| "read"))
            .bind(now)
            .bind(claimed.map(|_| now))
            .bind(if claimed.is_some() { 1i64 } else { 0 })
            .bind(claimed.map(|l| l.owner.clone()))
            .bind(claimed.map(|l| l.expires_at()))
            .execute(&self.durable)
            .await;
        match self.inserted(res.map(drop), &new).await? {
            Some(i) => {
                if matches!(i, Inserted::Created(_)) && claimed.is_none() {
                    self.notify(notify::Event::Queued).await;
                }
                Ok(i)
            }
            None => Box::pin(self.insert_as(new, claimed)).await,
        }
    }

    /// What an insert of `new` came to (`res`): the row, or after a unique violation the live job of
    /// the same owner and digest; None when that job left the live set in between (insert again).
    async fn inserted(&self, res: Result<(), sqlx::Error>, new: &NewJob) -> Result<Option<Inserted>, StoreError> {
        match res {
            Ok(()) => Ok(Some(Inserted::Created(self.get(&new.id).await?.ok_or_else(|| StoreError::Corrupt {
                id: new.id.clone(),
                what: "inserted row vanished".into(),
            })?))),
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Ok(self.find_live_by_digest(&new.owner, &new.digest).await?.map(Inserted::Existing)),
            Err(e) => Err(e.into()),
        }
    }

    /// Inserts a job that already succeeded, with its stored `results`: computed before its row
    /// existed, on a cube this instance held (`jobs::resident_run`), so there is no input to keep and
    /// nothing to claim. A live job of the same owner and digest that appeared meanwhile is
    /// returned instead (the caller drops its results).
    ///
    /// `ran_by` (this instance) is recorded as the job's lease owner, as for a claimed job, so that
    /// this instance checks its results at its next start while `results_unsynced` (see
    /// [`JobStore::succeed`]).
    pub async fn insert_succeeded(
        &self,
        new: NewJob,
        results: &BTreeMap<String, String>,
        ran_by: &str,
        results_unsynced: bool,
    ) -> Result<Inserted, StoreError> {
        let input = serde_json::to_string(&new.input).expect("input summary serialises");
        let now = now_ms();
        let insert = sqlx::query(
            "INSERT INTO jobs (id, owner, status, progress, params, digest, content_digest, upload_sha256, input,
                               input_kind, input_location, results, created_at, started_at, finished_at, attempts,
                               lease_owner, results_unsynced)
             VALUES ($1, $2, 'succeeded', 1, $3, $4, $5, $6, $7, $8, $9, $10, $11, $11, $11, 1, $12, $13)",
        );
        let res = bind_new_job(insert, &new, &input)
            .bind(serde_json::to_string(results).expect("map serialises"))
            .bind(now)
            .bind(ran_by)
            .bind(results_unsynced as i64)
            .execute(&self.durable)
            .await;
        match self.inserted(res.map(drop), &new).await? {
            Some(i) => {
                if matches!(i, Inserted::Created(_)) {
                    self.notify(notify::Event::Succeeded(new.id.clone())).await;
                }
                Ok(i)
            }
            None => Box::pin(self.insert_succeeded(new, results, ran_by, results_unsynced)).await,
        }
    }

    /// The newest job of `owner` made from the cube of content digest `content` (hex), whatever its
    /// parameters and status: that the owner sent this cube, and what it was (its input summary).
    pub async fn find_by_content(&self, owner: &str, content: &str) -> Result<Option<Job>, StoreError> {
        let row = sqlx::query("SELECT * FROM jobs WHERE owner = $1 AND content_digest = $2 ORDER BY id DESC LIMIT 1")
            .bind(owner)
            .bind(content)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| decode(&r)).transpose()
    }

    pub async fn find_live_by_digest(&self, owner: &str, digest: &str) -> Result<Option<Job>, StoreError> {
        let row = sqlx::query(&format!("SELECT * FROM jobs WHERE owner = $1 AND digest = $2 AND status IN {LIVE}"))
            .bind(owner)
            .bind(digest)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| decode(&r)).transpose()
    }

    /// A live job of this owner made from the same request bytes and parameters.
    pub async fn find_live_by_upload(&self, owner: &str, sha256: &str, params: &str) -> Result<Option<Job>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT * FROM jobs WHERE owner = $1 AND upload_sha256 = $2 AND params = $3 AND status IN {LIVE}
             ORDER BY created_at DESC LIMIT 1"
        ))
        .bind(owner)
        .bind(sha256)
        .bind(params)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| decode(&r)).transpose()
    }

    pub async fn get(&self, id: &str) -> Result<Option<Job>, StoreError> {
        let row = sqlx::query("SELECT * FROM jobs WHERE id = $1").bind(id).fetch_optional(&self.pool).await?;
        row.map(|r| decode(&r)).transpose()
    }

    /// Jobs of `owner`, newest first, strictly older than the job `after` when given.
    pub async fn list(
        &self,
        owner: &str,
        status: Option<JobStatus>,
        limit: u32,
        after: Option<&str>,
    ) -> Result<Vec<Job>, StoreError> {
        // Ids are UUID v7, so their text order is their creation order. The optional filters are
        // bound as NULL when absent (CAST: PostgreSQL must know a parameter's type to compare it).
        let rows = sqlx::query(
            "SELECT * FROM jobs WHERE owner = $1 AND (CAST($2 AS TEXT) IS NULL OR status = $2)
             AND (CAST($3 AS TEXT) IS NULL OR id < $3)
             ORDER BY id DESC LIMIT $4",
        )
        .bind(owner)
        .bind(status.map(|s| s.as_str()))
        .bind(after)
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(decode).collect()
    }

    /// Takes the oldest job that is queued, or running under a lease that ran out, and marks it
    /// running under `lease`, atomically: on PostgreSQL, instances claiming at the same time skip
    /// each other's rows (`FOR UPDATE SKIP LOCKED`); SQLite serialises writers.
    pub async fn claim(&self, lease: &Lease) -> Result<Option<Job>, StoreError> {
        let now = now_ms();
        let row = sqlx::query(&format!(
            "UPDATE jobs SET status = 'running', stage = 'read', progress = 0, started_at = $1,
                             attempts = attempts + 1, lease_owner = $2, lease_expires_at = $3
             WHERE id = (SELECT id FROM jobs
                         WHERE (status = 'queued' AND {READY})
                            OR (status = 'running' AND lease_expires_at < $1)
                         ORDER BY created_at, id LIMIT 1 {})
             RETURNING *",
            self.dialect.skip_locked(),
            READY = CLAIMABLE,
        ))
        .bind(now)
        .bind(&lease.owner)
        .bind(lease.expires_at())
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| decode(&r)).transpose()
    }

    /// Extends the lease of a running job. False when the job is no longer this holder's to run
    /// (canceled, deleted, or claimed again by another instance after the lease ran out): the
    /// caller stops working on it.
    pub async fn heartbeat(&self, id: &str, lease: &Lease) -> Result<bool, StoreError> {
        let r = sqlx::query(
            "UPDATE jobs SET lease_expires_at = $1 WHERE id = $2 AND status = 'running' AND lease_owner = $3",
        )
        .bind(lease.expires_at())
        .bind(id)
        .bind(&lease.owner)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected() == 1)
    }

    /// Records the stage and progress of a running job.
    pub async fn progress(&self, id: &str, stage: &str, progress: f64) -> Result<(), StoreError> {
        sqlx::query("UPDATE jobs SET stage = $1, progress = $2 WHERE id = $3 AND status = 'running'")
            .bind(stage)
            .bind(progress.clamp(0.0, 1.0))
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Marks a running job succeeded with its stored results, if `lease_owner` still holds it. False
    /// when it does not (canceled, deleted, or claimed again elsewhere): the caller then discards
    /// what it computed. `results_unsynced`: the result files may not be on the disk yet (local
    /// storage); [`JobStore::results_synced`] says when they are.
    pub async fn succeed(&self, id: &str, lease_owner: &str, results: &BTreeMap<String, String>, results_unsynced: bool) -> Result<bool, StoreError> {
        let r = sqlx::query(
            "UPDATE jobs SET status = 'succeeded', stage = NULL, progress = 1, results = $1, finished_at = $2,
                             lease_expires_at = NULL, results_unsynced = $3
             WHERE id = $4 AND status = 'running' AND lease_owner = $5",
        )
        .bind(serde_json::to_string(results).expect("map serialises"))
        .bind(now_ms())
        .bind(results_unsynced as i64)
        .bind(id)
        .bind(lease_owner)
        .execute(&self.pool)
        .await?;
        let done = r.rows_affected() == 1;
        if done {
            self.notify(notify::Event::Succeeded(id.to_string())).await;
        }
        Ok(done)
    }

    /// Marks a running job failed, if `lease_owner` still holds it.
    pub async fn fail(&self, id: &str, lease_owner: &str, code: &str, message: &str) -> Result<bool, StoreError> {
        let r = sqlx::query(
            "UPDATE jobs SET status = 'failed', error_code = $1, error_message = $2, finished_at = $3,
                             lease_expires_at = NULL
             WHERE id = $4 AND status = 'running' AND lease_owner = $5",
        )
        .bind(code)
        .bind(message)
        .bind(now_ms())
        .bind(id)
        .bind(lease_owner)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected() == 1)
    }

    /// Cancels a queued or running job; false when it was not queued or running. A running job's
    /// worker, in whichever instance, notices at once (notification) or at its next heartbeat, and
    /// stops at its next chunk (or when it tries to record its result, which then fails).
    pub async fn cancel(&self, id: &str) -> Result<bool, StoreError> {
        let r = sqlx::query(
            "UPDATE jobs SET status = 'canceled', error_code = 'canceled', error_message = 'canceled by request',
                             stage = NULL, finished_at = $1, lease_expires_at = NULL
             WHERE id = $2 AND status IN ('queued', 'running')",
        )
        .bind(now_ms())
        .bind(id)
        .execute(&self.pool)
        .await?;
        let done = r.rows_affected() == 1;
        if done {
            self.notify(notify::Event::Canceled(id.to_string())).await;
        }
        Ok(done)
    }

    pub async fn delete(&self, id: &str) -> Result<bool, StoreError> {
        let r = sqlx::query("DELETE FROM jobs WHERE id = $1").bind(id).execute(&self.pool).await?;
        let done = r.rows_affected() == 1;
        if done {
            self.notify(notify::Event::Deleted(id.to_string())).await;
        }
        Ok(done)
    }

    /// Puts back in the queue the jobs an earlier run of this instance left running, at its start:
    /// on SQLite every running job (one process owns the file), on PostgreSQL only those whose lease
    /// names `lease_owner` (other instances' jobs are theirs until their leases run out).
    pub async fn requeue_running(&self, lease_owner: &str) -> Result<u64, StoreError> {
        let r = sqlx::query(
            "UPDATE jobs SET status = 'queued', stage = NULL, progress = 0, started_at = NULL,
                             lease_owner = NULL, lease_expires_at = NULL
             WHERE status = 'running' AND ($1 = 'sqlite' OR lease_owner = $2)",
        )
        .bind(self.dialect.name())
        .bind(lease_owner)
        .execute(&self.pool)
        .await?;
        if r.rows_affected() > 0 {
            self.notify(notify::Event::Queued).await;
        }
        Ok(r.rows_affected())
    }

    /// The result files of succeeded job `id` are on the disk: durably recorded (its input may go
    /// once this returns).
    pub async fn results_synced(&self, id: &str) -> Result<(), StoreError> {
        sqlx::query("UPDATE jobs SET results_unsynced = 0 WHERE id = $1").bind(id).execute(&self.durable).await?;
        Ok(())
    }

    /// The succeeded jobs whose results were not yet synced when their instance (`lease_owner`)
    /// last ran: on SQLite every such job (one process owns the file), on PostgreSQL this
    /// instance's only (another's results are on its disk).
    pub async fn unsynced_results(&self, lease_owner: &str) -> Result<Vec<Job>, StoreError> {
        let rows = sqlx::query(
            "SELECT * FROM jobs WHERE results_unsynced = 1 AND status = 'succeeded' AND ($1 = 'sqlite' OR lease_owner = $2)
             ORDER BY id",
        )
        .bind(self.dialect.name())
        .bind(lease_owner)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(decode).collect()
    }

    /// A succeeded job whose results were lost before they reached the disk goes back to the queue,
    /// to be computed again from its input. False when it was no longer succeeded with its results
    /// unsynced.
    pub async fn requeue_lost(&self, id: &str) -> Result<bool, StoreError> {
        let r = sqlx::query(
            "UPDATE jobs SET status = 'queued', stage = NULL, progress = 0, results = NULL, started_at = NULL,
                             finished_at = NULL, lease_owner = NULL, lease_expires_at = NULL, results_unsynced = 0
             WHERE id = $1 AND status = 'succeeded' AND results_unsynced = 1",
        )
        .bind(id)
        .execute(&self.durable)
        .await?;
        let done = r.rows_affected() == 1;
        if done {
            self.notify(notify::Event::Queued).await;
        }
        Ok(done)
    }

    /// A succeeded job whose results were lost before they reached the disk, and that has no input
    /// to compute them again from, fails with `code` and `message`. False when it was no longer
    /// succeeded with its results unsynced.
    pub async fn fail_lost(&self, id: &str, code: &str, message: &str) -> Result<bool, StoreError> {
        let r = sqlx::query(
            "UPDATE jobs SET status = 'failed', error_code = $1, error_message = $2, results = NULL, results_unsynced = 0
             WHERE id = $3 AND status = 'succeeded' AND results_unsynced = 1",
        )
        .bind(code)
        .bind(message)
        .bind(id)
        .execute(&self.durable)
        .await?;
        Ok(r.rows_affected() == 1)
    }

    /// Finished jobs whose end lies before `cutoff_ms`.
    pub async fn finished_before(&self, cutoff_ms: i64, limit: u32) -> Result<Vec<Job>, StoreError> {
        let rows = sqlx::query(
            "SELECT * FROM jobs WHERE finished_at IS NOT NULL AND finished_at < $1
             AND status IN ('succeeded', 'failed', 'canceled') LIMIT $2",
        )
        .bind(cutoff_ms)
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(decode).collect()
    }

    /// Number of jobs per status (all owners), for the metrics.
    pub async fn count_by_status(&self) -> Result<Vec<(JobStatus, i64)>, StoreError> {
        let rows = sqlx::query("SELECT status, COUNT(*) AS n FROM jobs GROUP BY status").fetch_all(&self.pool).await?;
        let mut out: Vec<(JobStatus, i64)> = JobStatus::ALL.iter().map(|&s| (s, 0)).collect();
        for r in rows {
            let s: String = r.try_get("status")?;
            let n: i64 = r.try_get("n")?;
            if let Some(slot) = out.iter_mut().find(|(st, _)| st.as_str() == s) {
                slot.1 = n;
            }
        }
        Ok(out)
    }
}

fn decode(r: &AnyRow) -> Result<Job, StoreError> {
    let id: String = r.try_get("id")?;
    let corrupt = |what: &str| StoreError::Corrupt { id: id.clone(), what: what.to_string() };
    let status: String = r.try_get("status")?;
    let input: String = r.try_get("input")?;
    let kind: String = r.try_get("input_kind")?;
    let results: Option<String> = r.try_get("results")?;
    Ok(Job {
        owner: r.try_get("owner")?,
        status: JobStatus::parse(&status).ok_or_else(|| corrupt("status"))?,
        stage: r.try_get("stage")?,
        progress: r.try_get("progress")?,
        params: r.try_get("params")?,
        digest: r.try_get("digest")?,
        content_digest: r.try_get("content_digest")?,
        upload_sha256: r.try_get("upload_sha256")?,
        input: serde_json::from_str(&input).map_err(|_| corrupt("input"))?,
        input_kind: InputKind::parse(&kind).ok_or_else(|| corrupt("input_kind"))?,
        input_location: r.try_get("input_location")?,
        error_code: r.try_get("error_code")?,
        error_message: r.try_get("error_message")?,
        results: match results {
            Some(s) => serde_json::from_str(&s).map_err(|_| corrupt("results"))?,
            None => BTreeMap::new(),
        },
        attempts: r.try_get("attempts")?,
        created_at: r.try_get("created_at")?,
        started_at: r.try_get("started_at")?,
        finished_at: r.try_get("finished_at")?,
        results_unsynced: r.try_get::<i64, _>("results_unsynced")? != 0,
        batch: match r.try_get::<Option<String>, _>("batch_id")? {
            Some(batch_id) => Some(BatchMember {
                batch_id,
                position: r.try_get::<Option<i64>, _>("batch_position")?.unwrap_or(0),
                phase: match r.try_get::<Option<String>, _>("batch_phase")? {
                    Some(p) => Some(BatchPhase::parse(&p).ok_or_else(|| corrupt("batch_phase"))?),
                    None => None,
                },
            }),
            None => None,
        },
        id,
    })
}

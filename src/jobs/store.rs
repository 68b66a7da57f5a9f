//! The job table in SQLite (sqlx), with the migrations in `migrations/sqlite/` applied at open. The
//! job cache's rows (row ids, stored eigen systems) are in `cache_rows`.

mod cache_rows;

pub use cache_rows::{EigenRow, NewEigenRow};

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous};
use sqlx::{Row, SqlitePool};

use super::model::{now_ms, InputKind, InputSummary, Job, JobStatus};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error("database migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("corrupt job row {id}: {what}")]
    Corrupt { id: String, what: String },
    #[error("unsupported database URL {0:?}: only sqlite:// is supported")]
    UnsupportedUrl(String),
}

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
    pool: SqlitePool,
}

const LIVE: &str = "('queued', 'running', 'succeeded')";

impl JobStore {
    /// Opens (creating if needed) the database and applies the migrations.
    pub async fn open(url: &str) -> Result<JobStore, StoreError> {
        if !url.starts_with("sqlite:") {
            return Err(StoreError::UnsupportedUrl(url.to_string()));
        }
        let opts = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new().max_connections(8).connect_with(opts).await?;
        sqlx::migrate!("./migrations/sqlite").run(&pool).await?;
        Ok(JobStore { pool })
    }

    pub async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// Inserts a queued job, unless a live job of the same owner has the same digest (then that one).
    pub async fn insert(&self, new: NewJob) -> Result<Inserted, StoreError> {
        let input = serde_json::to_string(&new.input).expect("input summary serialises");
        let res = sqlx::query(
            "INSERT INTO jobs (id, owner, status, progress, params, digest, content_digest, upload_sha256, input,
                               input_kind, input_location, created_at)
             VALUES (?, ?, 'queued', 0, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&new.id)
        .bind(&new.owner)
        .bind(&new.params)
        .bind(&new.digest)
        .bind(&new.content_digest)
        .bind(&new.upload_sha256)
        .bind(&input)
        .bind(new.input_kind.as_str())
        .bind(&new.input_location)
        .bind(now_ms())
        .execute(&self.pool)
        .await;
        match res {
            Ok(_) => Ok(Inserted::Created(self.get(&new.id).await?.ok_or_else(|| StoreError::Corrupt {
                id: new.id.clone(),
                what: "inserted row vanished".into(),
            })?)),
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                match self.find_live_by_digest(&new.owner, &new.digest).await? {
                    Some(j) => Ok(Inserted::Existing(j)),
                    // The other job left the live set in between: try once more.
                    None => Box::pin(self.insert(new)).await,
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    pub async fn find_live_by_digest(&self, owner: &str, digest: &str) -> Result<Option<Job>, StoreError> {
        let row = sqlx::query(&format!("SELECT * FROM jobs WHERE owner = ? AND digest = ? AND status IN {LIVE}"))
            .bind(owner)
            .bind(digest)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| decode(&r)).transpose()
    }

    /// A live job of this owner made from the same request bytes and parameters.
    pub async fn find_live_by_upload(&self, owner: &str, sha256: &str, params: &str) -> Result<Option<Job>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT * FROM jobs WHERE owner = ? AND upload_sha256 = ? AND params = ? AND status IN {LIVE}
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
        let row = sqlx::query("SELECT * FROM jobs WHERE id = ?").bind(id).fetch_optional(&self.pool).await?;
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
        // Ids are UUID v7, so their text order is their creation order.
        let rows = sqlx::query(
            "SELECT * FROM jobs WHERE owner = ?1 AND (?2 IS NULL OR status = ?2) AND (?3 IS NULL OR id < ?3)
             ORDER BY id DESC LIMIT ?4",
        )
        .bind(owner)
        .bind(status.map(|s| s.as_str()))
        .bind(after)
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(decode).collect()
    }

    /// Takes the oldest queued job and marks it running, atomically (SQLite serialises writers).
    pub async fn claim(&self) -> Result<Option<Job>, StoreError> {
        let row = sqlx::query(
            "UPDATE jobs SET status = 'running', stage = 'read', progress = 0, started_at = ?,
                             attempts = attempts + 1
             WHERE id = (SELECT id FROM jobs WHERE status = 'queued' ORDER BY created_at, id LIMIT 1)
             RETURNING *",
        )
        .bind(now_ms())
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| decode(&r)).transpose()
    }

    /// Records the stage and progress of a running job.
    pub async fn progress(&self, id: &str, stage: &str, progress: f64) -> Result<(), StoreError> {
        sqlx::query("UPDATE jobs SET stage = ?, progress = ? WHERE id = ? AND status = 'running'")
            .bind(stage)
            .bind(progress.clamp(0.0, 1.0))
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Marks a running job succeeded with its stored results. False when the job is no longer running
    /// (canceled or deleted meanwhile): the caller then discards the results.
    pub async fn succeed(&self, id: &str, results: &BTreeMap<String, String>) -> Result<bool, StoreError> {
        let r = sqlx::query(
            "UPDATE jobs SET status = 'succeeded', stage = NULL, progress = 1, results = ?, finished_at = ?
             WHERE id = ? AND status = 'running'",
        )
        .bind(serde_json::to_string(results).expect("map serialises"))
        .bind(now_ms())
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected() == 1)
    }

    /// Marks a running job failed.
    pub async fn fail(&self, id: &str, code: &str, message: &str) -> Result<bool, StoreError> {
        let r = sqlx::query(
            "UPDATE jobs SET status = 'failed', error_code = ?, error_message = ?, finished_at = ?
             WHERE id = ? AND status = 'running'",
        )
        .bind(code)
        .bind(message)
        .bind(now_ms())
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected() == 1)
    }

    /// Cancels a queued or running job; false when it was not queued or running. A running job's
    /// worker notices at its next chunk (or when it tries to record its result, which then fails).
    pub async fn cancel(&self, id: &str) -> Result<bool, StoreError> {
        let r = sqlx::query(
            "UPDATE jobs SET status = 'canceled', error_code = 'canceled', error_message = 'canceled by request',
                             stage = NULL, finished_at = ?
             WHERE id = ? AND status IN ('queued', 'running')",
        )
        .bind(now_ms())
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected() == 1)
    }

    pub async fn delete(&self, id: &str) -> Result<bool, StoreError> {
        let r = sqlx::query("DELETE FROM jobs WHERE id = ?").bind(id).execute(&self.pool).await?;
        Ok(r.rows_affected() == 1)
    }

    /// Puts jobs left running by a process that died back in the queue. Returns how many.
    pub async fn requeue_running(&self) -> Result<u64, StoreError> {
        let r = sqlx::query("UPDATE jobs SET status = 'queued', stage = NULL, progress = 0, started_at = NULL WHERE status = 'running'")
            .execute(&self.pool)
            .await?;
        Ok(r.rows_affected())
    }

    /// Finished jobs whose end lies before `cutoff_ms`.
    pub async fn finished_before(&self, cutoff_ms: i64, limit: u32) -> Result<Vec<Job>, StoreError> {
        let rows = sqlx::query(
            "SELECT * FROM jobs WHERE finished_at IS NOT NULL AND finished_at < ?
             AND status IN ('succeeded', 'failed', 'canceled') LIMIT ?",
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

fn decode(r: &SqliteRow) -> Result<Job, StoreError> {
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
        id,
    })
}

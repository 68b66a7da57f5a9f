//! The batch rows (`POST /v1/batches`) and the member jobs' batch columns.
//!
//! A pooled batch's members each run twice (see migrations/sqlite/20261126000001_batches.sql): the
//! statistics run ends with [`JobStore::statistics_done`], which queues the job again in phase
//! `project`; such a job is not claimable ([`super::CLAIMABLE`]) until [`JobStore::set_batch_system`] stored
//! the pooled system. Every step is one statement, so an instance killed between any two leaves a state
//! the others finish from: a lapsed lease is claimed again, and a batch whose members all have their
//! statistics but no system is found by [`JobStore::batches_awaiting_system`].

use sqlx::any::AnyRow;
use sqlx::Row;

use super::{bind_new_job, decode, notify, JobStore, NewJob, StoreError};
use crate::jobs::model::{now_ms, BatchPhase, Job};

/// A batch about to be inserted with its member jobs.
#[derive(Debug, Clone)]
pub struct NewBatch {
    pub id: String,
    pub owner: String,
    pub pooled: bool,
    /// Canonical JSON of the params given.
    pub params: String,
}

/// One batch row, decoded.
#[derive(Debug, Clone)]
pub struct BatchRow {
    pub id: String,
    pub owner: String,
    pub pooled: bool,
    pub params: String,
    pub inputs: i64,
    /// Pooled: the storage key of the pooled eigen system, once computed.
    pub system_key: Option<String>,
    pub error_code: Option<String>,
    pub error_message: Option<String>,
    pub created_at: i64,
}

fn batch_row(r: &AnyRow) -> Result<BatchRow, StoreError> {
    let id: String = r.try_get("id")?;
    let statistics: String = r.try_get("statistics")?;
    Ok(BatchRow {
        owner: r.try_get("owner")?,
        pooled: match statistics.as_str() {
            "pooled" => true,
            "each" => false,
            _ => return Err(StoreError::Corrupt { id, what: "batch statistics".into() }),
        },
        params: r.try_get("params")?,
        inputs: r.try_get("inputs")?,
        system_key: r.try_get("system_key")?,
        error_code: r.try_get("error_code")?,
        error_message: r.try_get("error_message")?,
        created_at: r.try_get("created_at")?,
        id,
    })
}

impl JobStore {
    /// Inserts the batch and its member jobs (queued; a pooled batch's in phase `statistics`) in one
    /// durable transaction: a client that has its answer has every job, or none on failure.
    pub async fn insert_batch(&self, batch: &NewBatch, members: &[NewJob]) -> Result<BatchRow, StoreError> {
        let now = now_ms();
        let mut tx = self.durable.begin().await?;
        sqlx::query(
            "INSERT INTO batches (id, owner, statistics, params, inputs, created_at) VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&batch.id)
        .bind(&batch.owner)
        .bind(if batch.pooled { "pooled" } else { "each" })
        .bind(&batch.params)
        .bind(members.len() as i64)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        let phase = batch.pooled.then_some(BatchPhase::Statistics.as_str());
        for (position, new) in members.iter().enumerate() {
            let input = serde_json::to_string(&new.input).expect("input summary serialises");
            let insert = sqlx::query(
                "INSERT INTO jobs (id, owner, params, digest, content_digest, upload_sha256, input, input_kind, input_location,
                                   status, progress, created_at, attempts, batch_id, batch_position, batch_phase)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'queued', 0, $10, 0, $11, $12, $13)",
            );
            bind_new_job(insert, new, &input)
                // Same time: the claim then takes them by id (UUID v7, made in the inputs' order).
                .bind(now)
                .bind(&batch.id)
                .bind(position as i64)
                .bind(phase)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        self.notify(notify::Event::Queued).await;
        self.get_batch(&batch.id)
            .await?
            .ok_or_else(|| StoreError::Corrupt { id: batch.id.clone(), what: "inserted batch vanished".into() })
    }

    pub async fn get_batch(&self, id: &str) -> Result<Option<BatchRow>, StoreError> {
        let row = sqlx::query("SELECT * FROM batches WHERE id = $1").bind(id).fetch_optional(&self.pool).await?;
        row.map(|r| batch_row(&r)).transpose()
    }

    /// Batches of `owner`, newest first, strictly older than `after` when given.
    pub async fn list_batches(&self, owner: &str, limit: u32, after: Option<&str>) -> Result<Vec<BatchRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT * FROM batches WHERE owner = $1 AND (CAST($2 AS TEXT) IS NULL OR id < $2) ORDER BY id DESC LIMIT $3",
        )
        .bind(owner)
        .bind(after)
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(batch_row).collect()
    }

    /// The member jobs of a batch, in the order of its inputs.
    pub async fn batch_jobs(&self, id: &str) -> Result<Vec<Job>, StoreError> {
        let rows = sqlx::query("SELECT * FROM jobs WHERE batch_id = $1 ORDER BY batch_position")
            .bind(id)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(decode).collect()
    }

    /// Ends the statistics run of pooled member `id` (run under `lease`): queued again, in phase
    /// `project`, waiting for the pooled system. False when the job is no longer this holder's.
    pub async fn statistics_done(&self, id: &str, lease_owner: &str) -> Result<bool, StoreError> {
        let r = sqlx::query(
            "UPDATE jobs SET status = 'queued', batch_phase = 'project', stage = 'waiting for the pooled statistics',
                             progress = 0.5, lease_owner = NULL, lease_expires_at = NULL
             WHERE id = $1 AND status = 'running' AND lease_owner = $2 AND batch_phase = 'statistics'",
        )
        .bind(id)
        .bind(lease_owner)
        .execute(&self.durable)
        .await?;
        Ok(r.rows_affected() == 1)
    }

    /// Pooled batches that can have their system computed now: every member has its statistics, no
    /// system is stored yet, and the batch has not failed.
    pub async fn batches_awaiting_system(&self) -> Result<Vec<BatchRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT * FROM batches b WHERE b.statistics = 'pooled' AND b.system_key IS NULL AND b.error_code IS NULL
               AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.batch_id = b.id
                                 AND (j.batch_phase = 'statistics' OR j.status IN ('failed', 'canceled')))",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(batch_row).collect()
    }

    /// Pooled batches without a system that can no longer have one: a member failed or was canceled
    /// before the system was computed (a member that failed its statistics run fails the batch
    /// itself; this finds the others, a member canceled by its own DELETE say). With the position and
    /// status of the first such member.
    pub async fn broken_batches(&self) -> Result<Vec<(BatchRow, i64, String)>, StoreError> {
        let rows = sqlx::query(
            "SELECT b.*, j.batch_position AS member_position, j.status AS member_status FROM batches b JOIN jobs j ON j.batch_id = b.id
             WHERE b.statistics = 'pooled' AND b.system_key IS NULL AND b.error_code IS NULL AND j.status IN ('failed', 'canceled')
             ORDER BY b.id, j.batch_position",
        )
        .fetch_all(&self.pool)
        .await?;
        let mut out: Vec<(BatchRow, i64, String)> = Vec::new();
        for r in &rows {
            let row = batch_row(r)?;
            if out.last().is_none_or(|(b, _, _)| b.id != row.id) {
                out.push((row, r.try_get("member_position")?, r.try_get("member_status")?));
            }
        }
        Ok(out)
    }

    /// Records the pooled system of batch `id`; false when one was recorded first (another instance
    /// computed the same system) or the batch is gone. Wakes the workers: its members can be claimed.
    pub async fn set_batch_system(&self, id: &str, key: &str) -> Result<bool, StoreError> {
        let r = sqlx::query("UPDATE batches SET system_key = $1 WHERE id = $2 AND system_key IS NULL AND error_code IS NULL")
            .bind(key)
            .bind(id)
            .execute(&self.durable)
            .await?;
        let done = r.rows_affected() == 1;
        if done {
            self.notify(notify::Event::Queued).await;
        }
        Ok(done)
    }

    /// A pooled batch whose system cannot be computed (a member failed or was canceled, or the pooled
    /// statistics are degenerate): recorded on the batch, and its members that have not finished fail
    /// with `batch_failed` (a member still computing its statistics finds itself failed when it ends).
    /// Returns the members failed here.
    pub async fn fail_batch(&self, id: &str, code: &str, message: &str) -> Result<Vec<String>, StoreError> {
        sqlx::query("UPDATE batches SET error_code = $1, error_message = $2 WHERE id = $3 AND error_code IS NULL")
            .bind(code)
            .bind(message)
            .bind(id)
            .execute(&self.durable)
            .await?;
        let ids: Vec<String> = sqlx::query("SELECT id FROM jobs WHERE batch_id = $1 AND status IN ('queued', 'running')")
            .bind(id)
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|r| r.try_get("id"))
            .collect::<Result<_, _>>()?;
        let mut failed = Vec::new();
        for job in ids {
            let r = sqlx::query(
                "UPDATE jobs SET status = 'failed', error_code = 'batch_failed', error_message = $1, stage = NULL,
                                 finished_at = $2, lease_expires_at = NULL
                 WHERE id = $3 AND status IN ('queued', 'running')",
            )
            .bind(message)
            .bind(now_ms())
            .bind(&job)
            .execute(&self.durable)
            .await?;
            if r.rows_affected() == 1 {
                // A member running on another instance stops there (its lease is no longer its).
                self.notify(notify::Event::Canceled(job.clone())).await;
                failed.push(job);
            }
        }
        Ok(failed)
    }

    /// Deletes the batch row (its members are deleted one by one by the caller, with their files).
    pub async fn delete_batch(&self, id: &str) -> Result<bool, StoreError> {
        let r = sqlx::query("DELETE FROM batches WHERE id = $1").bind(id).execute(&self.pool).await?;
        Ok(r.rows_affected() == 1)
    }
}

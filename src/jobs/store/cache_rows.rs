//! The rows behind the job cache: jobs by their handle (SQLite's rowid, PostgreSQL's `seq`: the result
//! level's handles), and the stored eigen systems (the statistics level's handles and files).

use sqlx::any::AnyRow;
use sqlx::Row;

use super::{decode, JobStore, StoreError};
use crate::jobs::model::{now_ms, Job};

/// A stored eigen system, with the owner of the job that computed it.
#[derive(Debug, Clone)]
pub struct EigenRow {
    pub id: i64,
    /// Hex statistics key.
    pub digest: String,
    pub job_id: String,
    pub owner: String,
    pub storage_key: String,
    pub format_version: i64,
    pub backend: String,
}

/// An eigen system about to be recorded.
#[derive(Debug, Clone)]
pub struct NewEigenRow {
    pub digest: String,
    pub job_id: String,
    pub storage_key: String,
    pub format_version: i64,
    pub backend: String,
    pub bytes: i64,
}

fn eigen_row(r: &AnyRow) -> Result<EigenRow, StoreError> {
    Ok(EigenRow {
        id: r.try_get("id")?,
        digest: r.try_get("digest")?,
        job_id: r.try_get("job_id")?,
        owner: r.try_get("owner")?,
        storage_key: r.try_get("storage_key")?,
        format_version: r.try_get("format_version")?,
        backend: r.try_get("backend")?,
    })
}

const EIGEN_COLUMNS: &str = "e.id, e.digest, e.job_id, j.owner, e.storage_key, e.format_version, e.backend";

impl JobStore {
    /// The row id of job `id` (the result level's handle of a job).
    pub async fn rowid_of(&self, id: &str) -> Result<Option<i64>, StoreError> {
        let col = self.dialect.handle_column();
        let row = sqlx::query(&format!("SELECT {col} FROM jobs WHERE id = $1")).bind(id).fetch_optional(&self.pool).await?;
        Ok(row.map(|r| r.try_get(0)).transpose()?)
    }

    pub async fn get_by_rowid(&self, rowid: i64) -> Result<Option<Job>, StoreError> {
        let col = self.dialect.handle_column();
        let row = sqlx::query(&format!("SELECT * FROM jobs WHERE {col} = $1")).bind(rowid).fetch_optional(&self.pool).await?;
        row.map(|r| decode(&r)).transpose()
    }

    /// (row id, job id, owner, digest) of every succeeded job, oldest first: what the result level is
    /// rebuilt from at start (the most recent end up the most recently used).
    pub async fn succeeded_for_cache(&self) -> Result<Vec<(i64, String, String, String)>, StoreError> {
        let col = self.dialect.handle_column();
        let rows = sqlx::query(&format!(
            "SELECT {col}, id, owner, digest FROM jobs WHERE status = 'succeeded' ORDER BY finished_at, id"
        ))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?, r.try_get(3)?)))
            .collect()
    }

    /// Records a stored eigen system. `Ok(None)` when another job's system with the same key is
    /// already recorded (two jobs computed it at the same time); an error when the job no longer
    /// exists. The same job recording it again (it was killed after recording it, before it was
    /// marked succeeded, and ran again) gets its row back, updated: its file was just rewritten.
    pub async fn insert_eigen(&self, new: &NewEigenRow) -> Result<Option<i64>, StoreError> {
        let row = sqlx::query(
            "INSERT INTO eigen_systems (digest, job_id, storage_key, format_version, backend, bytes, created_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (digest) DO UPDATE SET
                 storage_key = excluded.storage_key, format_version = excluded.format_version,
                 backend = excluded.backend, bytes = excluded.bytes
             WHERE eigen_systems.job_id = excluded.job_id
             RETURNING id",
        )
        .bind(&new.digest)
        .bind(&new.job_id)
        .bind(&new.storage_key)
        .bind(new.format_version)
        .bind(&new.backend)
        .bind(new.bytes)
        .bind(now_ms())
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| r.try_get(0)).transpose()?)
    }

    pub async fn eigen_by_id(&self, id: i64) -> Result<Option<EigenRow>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {EIGEN_COLUMNS} FROM eigen_systems e JOIN jobs j ON j.id = e.job_id WHERE e.id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| eigen_row(&r)).transpose()
    }

    /// Every stored eigen system of format `version`, oldest first (the statistics level at start).
    pub async fn eigen_for_cache(&self, version: i64) -> Result<Vec<EigenRow>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {EIGEN_COLUMNS} FROM eigen_systems e JOIN jobs j ON j.id = e.job_id
             WHERE e.format_version = $1 ORDER BY e.created_at, e.id"
        ))
        .bind(version)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(eigen_row).collect()
    }

    /// The result-level entry of one succeeded job (handle, owner, digest): what another instance's
    /// notification that the job succeeded adds to this instance's index.
    pub async fn succeeded_cache_entry(&self, id: &str) -> Result<Option<(i64, String, String)>, StoreError> {
        let col = self.dialect.handle_column();
        let row = sqlx::query(&format!("SELECT {col}, owner, digest FROM jobs WHERE id = $1 AND status = 'succeeded'"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?))).transpose()
    }

    /// The stored eigen systems of format `version` that job `job_id` computed.
    pub async fn eigen_of_job(&self, job_id: &str, version: i64) -> Result<Vec<EigenRow>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {EIGEN_COLUMNS} FROM eigen_systems e JOIN jobs j ON j.id = e.job_id
             WHERE e.job_id = $1 AND e.format_version = $2 ORDER BY e.id"
        ))
        .bind(job_id)
        .bind(version)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(eigen_row).collect()
    }

    /// Forgets a stored eigen system whose file turned out unusable (the file is the caller's).
    pub async fn delete_eigen(&self, id: i64) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM eigen_systems WHERE id = $1").bind(id).execute(&self.pool).await?;
        Ok(())
    }

    /// Forgets every eigen system job `job_id` stored (its results are gone; the files are the
    /// caller's).
    pub async fn delete_eigen_of_job(&self, job_id: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM eigen_systems WHERE job_id = $1").bind(job_id).execute(&self.pool).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::store::testing::each_store;
    use crate::jobs::NewJob;

    fn eigen(job_id: &str, digest: &str) -> NewEigenRow {
        NewEigenRow {
            digest: digest.into(),
            job_id: job_id.into(),
            storage_key: format!("results/{job_id}/eigen-system.bin"),
            format_version: 1,
            backend: "cpu".into(),
            bytes: 10,
        }
    }

    #[tokio::test]
    async fn eigen_rows_live_and_die_with_their_job() {
        each_store(|s| async move {
            s.insert(NewJob::for_test("j1")).await.unwrap();
            let rowid = s.rowid_of("j1").await.unwrap().unwrap();
            let j = s.get_by_rowid(rowid).await.unwrap().unwrap();
            assert_eq!((j.id.as_str(), j.content_digest.as_deref()), ("j1", Some("ab".repeat(32).as_str())));
            assert!(s.succeeded_for_cache().await.unwrap().is_empty(), "queued jobs are not results");
            assert!(s.succeeded_cache_entry("j1").await.unwrap().is_none());

            let id = s.insert_eigen(&eigen("j1", "k1")).await.unwrap().unwrap();
            assert_eq!(s.insert_eigen(&eigen("j1", "k1")).await.unwrap(), Some(id), "the same job again: its row");
            s.insert(NewJob::for_test("j2")).await.unwrap();
            assert_eq!(s.insert_eigen(&eigen("j2", "k1")).await.unwrap(), None, "one row per key");
            assert!(s.insert_eigen(&eigen("no-such-job", "k2")).await.is_err());
            let row = s.eigen_by_id(id).await.unwrap().unwrap();
            assert_eq!((row.digest.as_str(), row.owner.as_str(), row.job_id.as_str()), ("k1", "alice", "j1"));
            assert_eq!(s.eigen_for_cache(1).await.unwrap().len(), 1);
            assert!(s.eigen_for_cache(2).await.unwrap().is_empty());
            assert_eq!(s.eigen_of_job("j1", 1).await.unwrap().len(), 1);
            assert!(s.eigen_of_job("j2", 1).await.unwrap().is_empty());

            assert!(s.delete("j1").await.unwrap());
            assert!(s.eigen_by_id(id).await.unwrap().is_none(), "deleting the job deletes its eigen systems");
            assert!(s.get_by_rowid(rowid).await.unwrap().is_none());
        })
        .await;
    }
}

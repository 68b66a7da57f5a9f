//! The rows of imported eigen systems (`POST /v1/systems`): one per system file stored under
//! `systems/<id>/`, owner-scoped like jobs.

use sqlx::any::AnyRow;
use sqlx::Row;

use super::{JobStore, StoreError};

/// An imported system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemRow {
    pub id: String,
    pub owner: String,
    /// `SystemFile::identity`.
    pub identity: String,
    /// The input's band count B.
    pub bands: i64,
    /// u, the bands used.
    pub bands_used: i64,
    pub storage_key: String,
    pub bytes: i64,
    pub created_at: i64,
}

fn system_row(r: &AnyRow) -> Result<SystemRow, StoreError> {
    Ok(SystemRow {
        id: r.try_get("id")?,
        owner: r.try_get("owner")?,
        identity: r.try_get("identity")?,
        bands: r.try_get("bands")?,
        bands_used: r.try_get("bands_used")?,
        storage_key: r.try_get("storage_key")?,
        bytes: r.try_get("bytes")?,
        created_at: r.try_get("created_at")?,
    })
}

impl JobStore {
    pub async fn insert_system(&self, row: &SystemRow) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO systems (id, owner, identity, bands, bands_used, storage_key, bytes, created_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(&row.id)
        .bind(&row.owner)
        .bind(&row.identity)
        .bind(row.bands)
        .bind(row.bands_used)
        .bind(&row.storage_key)
        .bind(row.bytes)
        .bind(row.created_at)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn get_system(&self, id: &str) -> Result<Option<SystemRow>, StoreError> {
        let row = sqlx::query("SELECT * FROM systems WHERE id = $1").bind(id).fetch_optional(&self.pool).await?;
        row.map(|r| system_row(&r)).transpose()
    }

    /// The owner's systems, newest first (at most `limit`).
    pub async fn list_systems(&self, owner: &str, limit: i64) -> Result<Vec<SystemRow>, StoreError> {
        let rows = sqlx::query("SELECT * FROM systems WHERE owner = $1 ORDER BY created_at DESC, id DESC LIMIT $2")
            .bind(owner)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(system_row).collect()
    }

    /// Whether the row was there to delete.
    pub async fn delete_system(&self, id: &str) -> Result<bool, StoreError> {
        let done = sqlx::query("DELETE FROM systems WHERE id = $1").bind(id).execute(&self.pool).await?;
        Ok(done.rows_affected() > 0)
    }
}

//! The memo of referenced objects' content digests (table `reference_digests`): the worker records
//! what it read, the API looks it up at submit. Owner-independent: it says what bytes the objects at
//! these versions hold, not who asked.

use sqlx::Row;

use super::{JobStore, StoreError};
use crate::jobs::model::now_ms;

/// A memo entry: the hex content digest and, where the cube carries metadata into its results, the
/// hex digest of that metadata (`CubeMeta::carried_digest`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReferenceDigest {
    pub content: String,
    pub carried: Option<String>,
}

impl JobStore {
    /// Records (or replaces) the digests of the objects `key` names (`reference::Stored::memo_key`).
    pub async fn remember_reference(&self, key: &str, content: &str, carried: Option<&str>) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO reference_digests (reference, content_digest, carried_digest, created_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (reference) DO UPDATE SET content_digest = excluded.content_digest, carried_digest = excluded.carried_digest, created_at = excluded.created_at",
        )
        .bind(key)
        .bind(content)
        .bind(carried)
        .bind(now_ms())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The digests recorded for `key`, if a job read those objects before.
    pub async fn find_reference(&self, key: &str) -> Result<Option<ReferenceDigest>, StoreError> {
        let row = sqlx::query("SELECT content_digest, carried_digest FROM reference_digests WHERE reference = $1").bind(key).fetch_optional(&self.pool).await?;
        row.map(|r| Ok(ReferenceDigest { content: r.try_get(0)?, carried: r.try_get(1)? })).transpose()
    }
}

//! What instances sharing a PostgreSQL store tell each other, through `NOTIFY` on one channel: a job
//! was queued (wake an idle worker), canceled (stop it wherever it runs), succeeded (add it to the
//! job cache's index) or deleted (drop it from the index). On SQLite there is one instance, and these
//! are no-ops: the API tells its own workers directly.
//!
//! Notifications are a shortcut, never the truth: a missed one costs an idle worker its poll interval,
//! a running job its next heartbeat, and the cache a miss that the database lookup behind it answers.

use sqlx::postgres::PgListener;

pub use super::event::Event;
use super::{Dialect, JobStore};

/// The channel every instance listens on.
pub const CHANNEL: &str = "hypermnf_jobs";

impl JobStore {
    /// Tells the other instances (PostgreSQL only). A failure is logged: see the module doc.
    pub(super) async fn notify(&self, event: Event) {
        if self.dialect != Dialect::Postgres {
            return;
        }
        let r = sqlx::query("SELECT pg_notify($1, $2)").bind(CHANNEL).bind(event.payload()).execute(&self.pool).await;
        if let Err(e) = r {
            tracing::warn!(?event, "cannot notify the other instances: {e}");
        }
    }

    /// A listener on the instances' channel, or None on SQLite. It reconnects by itself when its
    /// connection drops (notifications sent meanwhile are lost: see the module doc).
    pub async fn listen(&self) -> Result<Option<PgListener>, sqlx::Error> {
        if self.dialect != Dialect::Postgres {
            return Ok(None);
        }
        let mut listener = PgListener::connect(&self.url).await?;
        listener.listen(CHANNEL).await?;
        Ok(Some(listener))
    }
}

//! Waiting for the database while `hypermnf serve` starts.
//!
//! A service started beside its database (a compose file brought up again, a node rebooted) may
//! reach PostgreSQL while it still refuses connections or answers slowly: its health check can pass
//! before a new client's first connection completes within the pool's sub-second acquire timeout
//! (`PG_ACQUIRE_TIMEOUT`, short so that requests hear of an outage at once; it includes resolving the
//! host name, which on a container network's DNS can take longer just after the containers start).
//! At start there is no request waiting, so the start-up steps retry such an error for a while
//! instead of exiting; any other error (a bad URL, a failed migration, a corrupt row) ends the start
//! at once. In CI on 2026-11-28 an instance of docker/compose.cluster.yaml exited on that timeout;
//! in the next run, with these retries, one took 35 s and then 54 s to become healthy (why was not
//! logged; scripts/lib/container.sh now prints a slow start's warnings): hence two minutes.

use std::future::Future;
use std::time::{Duration, Instant};

use super::StoreError;

/// How long `hypermnf serve` waits for an unreachable database before it gives up.
pub const START_WAIT: Duration = Duration::from_secs(120);

/// Runs `step` until it succeeds, fails with an error that is not [`StoreError::is_unavailable`],
/// or `wait` has passed since the first try (then the last error). Pauses grow from 100 ms to 2 s.
pub async fn retry_while_unavailable<T, F, Fut>(what: &str, wait: Duration, mut step: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let started = Instant::now();
    let mut pause = Duration::from_millis(100);
    loop {
        match step().await {
            Err(e) if e.is_unavailable() && started.elapsed() + pause < wait => {
                tracing::warn!(step = what, error = %e, retry_in_ms = pause.as_millis() as u64, "database unavailable at start; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn an_unavailable_database_is_retried_until_it_answers() {
        let tries = AtomicU32::new(0);
        let got = retry_while_unavailable("test", Duration::from_secs(10), || async {
            if tries.fetch_add(1, Ordering::SeqCst) < 2 {
                Err(StoreError::Db(sqlx::Error::PoolTimedOut))
            } else {
                Ok(7)
            }
        })
        .await;
        assert_eq!(got.unwrap(), 7);
        assert_eq!(tries.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn any_other_error_ends_the_start_at_once() {
        let tries = AtomicU32::new(0);
        let got: Result<(), _> = retry_while_unavailable("test", Duration::from_secs(10), || async {
            tries.fetch_add(1, Ordering::SeqCst);
            Err(StoreError::UnsupportedUrl("mysql://x".into()))
        })
        .await;
        assert!(matches!(got, Err(StoreError::UnsupportedUrl(_))));
        assert_eq!(tries.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn the_wait_is_bounded_and_the_last_error_returned() {
        let tries = AtomicU32::new(0);
        let started = Instant::now();
        let got: Result<(), _> = retry_while_unavailable("test", Duration::from_millis(500), || async {
            tries.fetch_add(1, Ordering::SeqCst);
            Err(StoreError::Db(sqlx::Error::PoolTimedOut))
        })
        .await;
        assert!(got.unwrap_err().is_unavailable());
        assert!(started.elapsed() < Duration::from_secs(2), "waited {:?}", started.elapsed());
        // 0, 100, 300 ms: the next pause (400 ms) would pass the wait.
        assert_eq!(tries.load(Ordering::SeqCst), 3);
    }
}

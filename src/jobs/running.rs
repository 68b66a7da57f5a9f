//! The jobs running in this process: the places they hold (one per worker; a job run outside the
//! workers, started early or on a resident cube, takes an idle worker's place) and their cancel
//! flags. Shared by the `Runner` (`worker`) and the runs it starts outside its workers
//! (`early_start`), which need no more of the runner than this.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub struct Running {
    /// The cancel flags of the jobs running here, by job id (started early ones too).
    flags: Mutex<HashMap<String, Arc<AtomicBool>>>,
    /// One permit per worker started: a worker holds one while it claims and runs a job, and a job
    /// started early holds one instead of a worker, so that no more jobs run at once than there
    /// are workers.
    places: Arc<Semaphore>,
}

impl Running {
    pub(super) fn new() -> Running {
        Running { flags: Mutex::new(HashMap::new()), places: Arc::new(Semaphore::new(0)) }
    }

    /// Adds the places of `n` workers.
    pub(super) fn add_places(&self, n: usize) {
        self.places.add_permits(n);
    }

    /// A worker's place, once one is free.
    pub(super) async fn take_place(&self) -> Option<OwnedSemaphorePermit> {
        self.places.clone().acquire_owned().await.ok()
    }

    /// An idle worker's place, for a job run outside the workers until the permit is dropped; None
    /// when every worker is busy.
    pub(super) fn try_take_place(&self) -> Option<OwnedSemaphorePermit> {
        self.places.clone().try_acquire_owned().ok()
    }

    /// Whether a worker is idle now.
    pub(super) fn has_idle_place(&self) -> bool {
        self.places.available_permits() > 0
    }

    fn flags(&self) -> MutexGuard<'_, HashMap<String, Arc<AtomicBool>>> {
        self.flags.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets the cancel flag of job `id`, if it runs here.
    pub(super) fn cancel(&self, id: &str) {
        if let Some(flag) = self.flags().get(id) {
            flag.store(true, Ordering::Relaxed);
        }
    }

    /// Counts `flag`'s job as running here (`cancel` reaches it).
    pub(super) fn track(&self, id: &str, flag: Arc<AtomicBool>) {
        self.flags().insert(id.to_string(), flag);
    }

    /// The job no longer runs here (only this run's flag: after a lapsed lease the job may run again).
    pub(super) fn untrack(&self, id: &str, flag: &Arc<AtomicBool>) {
        let mut flags = self.flags();
        if flags.get(id).is_some_and(|f| Arc::ptr_eq(f, flag)) {
            flags.remove(id);
        }
    }
}

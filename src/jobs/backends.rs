//! The compute backends of the service's jobs: one set per backend choice, shared by every job, with
//! the devices of `--devices` handed to the jobs in turn (see [`Backends`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::backend::devices::{select_devices, DeviceSelection};
use crate::backend::split::{SplitBackend, SplitMode};
use crate::backend::{Backend, BackendError};
use crate::mnf::BackendChoice;

/// The compute backends, one set per choice, created on first use and shared by every job (the CUDA
/// backend holds a context and compiled kernels): one backend per device of `--devices`, handed to
/// the jobs in turn (round robin per job), or with `--split-cube` one backend that runs every job on
/// all of them. With several devices, a job whose cube does not fit its device's free memory is
/// split over all of them (its device first).
pub struct Backends {
    default: BackendChoice,
    devices: DeviceSelection,
    split: bool,
    made: Mutex<HashMap<BackendChoice, Arc<DeviceSet>>>,
}

/// The backends of one choice.
struct DeviceSet {
    devices: Vec<Arc<dyn Backend>>,
    split: Option<Arc<dyn Backend>>,
    next: AtomicUsize,
}

impl Backends {
    /// Every device, no split; see [`Backends::with_devices`].
    pub fn new(default: BackendChoice) -> Result<Backends, BackendError> {
        Self::with_devices(default, DeviceSelection::All, false)
    }

    /// Creates the default backends now (so that a bad device list fails at start, and `/readyz`
    /// can say they are initialised) and the others on demand.
    pub fn with_devices(default: BackendChoice, devices: DeviceSelection, split: bool) -> Result<Backends, BackendError> {
        let b = Backends { default, devices, split, made: Mutex::new(HashMap::new()) };
        b.set(BackendChoice::Auto)?;
        Ok(b)
    }

    /// `devices` as the backends of `default` (tests: a pretend device that computes on the CPU).
    #[cfg(test)]
    pub(crate) fn given(default: BackendChoice, devices: Vec<Arc<dyn Backend>>) -> Backends {
        let set = Arc::new(DeviceSet { devices, split: None, next: AtomicUsize::new(0) });
        let made = Mutex::new(HashMap::from([(default, set)]));
        Backends { default, devices: DeviceSelection::All, split: false, made }
    }

    fn set(&self, choice: BackendChoice) -> Result<Arc<DeviceSet>, BackendError> {
        let choice = if choice == BackendChoice::Auto { self.default } else { choice };
        let mut made = self.made.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(b) = made.get(&choice) {
            return Ok(b.clone());
        }
        let mut devices = select_devices(choice, &self.devices)?;
        let split: Option<Arc<dyn Backend>> = if self.split && devices.len() > 1 {
            Some(Arc::new(SplitBackend::new(devices.clone(), SplitMode::Always)?))
        } else {
            None
        };
        if split.is_none() && devices.len() > 1 {
            // Device i, then the others: it runs the job alone unless the cube is too large for it.
            let all = devices.clone();
            devices = (0..all.len())
                .map(|i| -> Result<Arc<dyn Backend>, BackendError> {
                    let order: Vec<_> = all[i..].iter().chain(&all[..i]).cloned().collect();
                    Ok(Arc::new(SplitBackend::new(order, SplitMode::WhenTooLarge)?))
                })
                .collect::<Result<_, _>>()?;
        }
        let set = Arc::new(DeviceSet { devices, split, next: AtomicUsize::new(0) });
        made.insert(choice, set.clone());
        Ok(set)
    }

    /// The backend for a job's choice (`auto` means the server's `--backend`): the next device in
    /// turn, or the split backend.
    pub fn get(&self, choice: BackendChoice) -> Result<Arc<dyn Backend>, BackendError> {
        let set = self.set(choice)?;
        if let Some(s) = &set.split {
            return Ok(s.clone());
        }
        let i = set.next.fetch_add(1, Ordering::Relaxed) % set.devices.len();
        Ok(set.devices[i].clone())
    }

    /// Whether this server can run jobs of `choice` at all (`cuda` without a device cannot).
    pub fn available(&self, choice: BackendChoice) -> Result<(), BackendError> {
        self.set(choice).map(|_| ())
    }

    /// Every backend a job of `choice` may be given (the split backend, or each device's), without
    /// taking a turn.
    pub fn candidates(&self, choice: BackendChoice) -> Vec<Arc<dyn Backend>> {
        match self.set(choice) {
            Ok(set) => match &set.split {
                Some(s) => vec![s.clone()],
                None => set.devices.clone(),
            },
            Err(_) => Vec::new(),
        }
    }

    /// Whether jobs of `choice` run on a device (a GPU) rather than the host's cores.
    pub fn on_device(&self, choice: BackendChoice) -> bool {
        self.set(choice).is_ok_and(|s| s.devices.iter().all(|d| d.memory_in_use().is_some()))
    }

    /// The first backend used for `auto` jobs (health and metrics report it; takes no turn).
    pub fn default_backend(&self) -> Arc<dyn Backend> {
        self.set(BackendChoice::Auto).expect("the default backend was created at start").devices[0].clone()
    }

    /// Every device backend used for `auto` jobs.
    pub fn default_devices(&self) -> Vec<Arc<dyn Backend>> {
        self.set(BackendChoice::Auto).map(|s| s.devices.clone()).unwrap_or_default()
    }
}

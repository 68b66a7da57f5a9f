//! A prepared cube that outlives the job that prepared it: the item of the device-resident level.
//!
//! A backend's prepared cube borrows the cube and the backend (`Backend::prepare<'c>`), so on its own
//! it cannot be kept after the job's stack frame is gone. A [`ResidentCube`] owns both (through `Arc`s,
//! whose contents never move) together with the prepared cube, and drops the prepared cube first.
//! Next to it, the eigen systems recently computed or used for this cube, so that a re-projection needs
//! neither the disk nor the statistics index.

use std::sync::{Arc, Mutex, OnceLock};

use super::Digest;
use crate::backend::{Backend, BackendError, PreparedCube};
use crate::cube::Cube;
use crate::mnf::result::EigenSystem;
use crate::mnf::Monitor;

/// Eigen systems kept per resident cube (requests that change the noise model of one cube are rare;
/// the statistics level keeps them all anyway).
const SYSTEMS_PER_CUBE: usize = 4;

/// An eigen system and the job that computed it.
#[derive(Debug)]
pub struct SystemRecord {
    pub system: EigenSystem,
    pub job_id: String,
    pub owner: String,
    /// Its stored form (`eigen_file::encode`), made once: every job keeps a copy of the system it
    /// projected with beside its results, and the checksum of a 425-band system took ~8 ms a job.
    encoded: OnceLock<bytes::Bytes>,
}

impl SystemRecord {
    pub fn new(system: EigenSystem, job_id: String, owner: String) -> SystemRecord {
        SystemRecord { system, job_id, owner, encoded: OnceLock::new() }
    }

    /// A record of a system decoded from `encoded` (read from storage), which is kept as its stored form.
    pub fn with_encoded(system: EigenSystem, job_id: String, owner: String, encoded: bytes::Bytes) -> SystemRecord {
        SystemRecord { system, job_id, owner, encoded: OnceLock::from(encoded) }
    }

    /// `eigen_file::encode(&self.system)`, computed at the first call.
    pub fn encoded(&self) -> bytes::Bytes {
        self.encoded.get_or_init(|| super::eigen_file::encode(&self.system).into()).clone()
    }
}

type Prepared = Box<dyn PreparedCube + Send + 'static>;

pub struct ResidentCube {
    // Declared (so dropped) before `cube` and `backend`, which it borrows; `Drop` also takes it out
    // explicitly, so the order does not rest on declaration order alone.
    prepared: Mutex<Option<Prepared>>,
    systems: Mutex<Vec<(Digest, Arc<SystemRecord>)>>,
    cube: Arc<Cube>,
    backend: Arc<dyn Backend>,
}

impl std::fmt::Debug for ResidentCube {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResidentCube")
            .field("backend", &self.backend.name())
            .field("lines", &self.cube.lines())
            .field("samples", &self.cube.samples())
            .field("bands", &self.cube.bands())
            .finish()
    }
}

impl ResidentCube {
    /// Prepares `cube` on `backend` (the CUDA backend uploads it during the first pass).
    pub fn prepare(cube: Arc<Cube>, backend: Arc<dyn Backend>, monitor: &Monitor) -> Result<ResidentCube, BackendError> {
        let prepared = backend.prepare(&cube, monitor)?;
        // SAFETY: the prepared cube borrows only `*cube` and `*backend`. Both live on the heap behind
        // `Arc`s that this struct owns and never replaces or hands out mutably, so the borrowed data
        // stays in place and alive for as long as the struct; the prepared cube is dropped before
        // them (see `Drop`), and the 'static lifetime never escapes: callers only get it as
        // `&mut dyn PreparedCube` for the duration of `with_prepared`.
        let prepared: Prepared = unsafe { std::mem::transmute::<Box<dyn PreparedCube + Send + '_>, Prepared>(prepared) };
        Ok(ResidentCube { prepared: Mutex::new(Some(prepared)), systems: Mutex::new(Vec::new()), cube, backend })
    }

    pub fn cube(&self) -> &Arc<Cube> {
        &self.cube
    }

    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// Runs `f` on the prepared cube; jobs on the same resident cube take turns.
    pub fn with_prepared<R>(&self, f: impl FnOnce(&mut dyn PreparedCube) -> R) -> R {
        let mut guard = self.prepared.lock().unwrap_or_else(|p| p.into_inner());
        let prepared = guard.as_mut().expect("present until drop");
        f(prepared.as_mut())
    }

    /// Device bytes held between passes (0 for a cube the backend streams, or the CPU).
    pub fn resident_bytes(&self) -> u64 {
        self.with_prepared(|p| p.resident_bytes())
    }

    /// The eigen system of statistics key `key`, if one was kept with this cube.
    pub fn system(&self, key: &Digest) -> Option<Arc<SystemRecord>> {
        let systems = self.systems.lock().unwrap_or_else(|p| p.into_inner());
        systems.iter().find(|(k, _)| k == key).map(|(_, s)| s.clone())
    }

    /// Keeps `record` as the eigen system of `key` (the oldest goes when there are too many).
    pub fn keep_system(&self, key: Digest, record: Arc<SystemRecord>) {
        let mut systems = self.systems.lock().unwrap_or_else(|p| p.into_inner());
        systems.retain(|(k, _)| *k != key);
        if systems.len() >= SYSTEMS_PER_CUBE {
            systems.remove(0);
        }
        systems.push((key, record));
    }
}

impl Drop for ResidentCube {
    fn drop(&mut self) {
        // The prepared cube (device buffers, streams) goes while the cube and backend still exist.
        let prepared = self.prepared.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        drop(prepared);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cube::synthetic::{generate, SyntheticSpec};
    use crate::mnf::{pipeline, MnfParams};
    use std::collections::BTreeMap;

    /// A resident cube outlives the scope that made it, and projecting from it later gives the
    /// bytes of a cold run (on the CPU backend here; tests/gpu_cache.rs does it on the device).
    #[test]
    fn a_kept_prepared_cube_projects_like_a_cold_run() {
        let cube = Arc::new(generate(&SyntheticSpec::small(24, 20, 12)));
        let backend: Arc<dyn Backend> = Arc::new(crate::backend::cpu::CpuBackend::new());
        let monitor = Monitor::silent();
        let kept = {
            let r = ResidentCube::prepare(cube.clone(), backend.clone(), &monitor).unwrap();
            let p5: MnfParams = serde_json::from_str(r#"{"components": 5}"#).unwrap();
            let system = r.with_prepared(|p| pipeline::analyse_on(&cube, &p5, p, &monitor, &mut BTreeMap::new())).unwrap();
            r.keep_system([1; 32], Arc::new(SystemRecord::new(system, "j".into(), "o".into())));
            Arc::new(r)
        };
        drop(cube);
        let p3: MnfParams = serde_json::from_str(r#"{"components": 3, "inverse": true}"#).unwrap();
        let rec = kept.system(&[1; 32]).unwrap();
        assert!(kept.system(&[2; 32]).is_none());
        let warm = kept
            .with_prepared(|p| pipeline::apply_on(kept.cube(), &p3, &rec.system, kept.backend().as_ref(), p, &monitor, BTreeMap::new()))
            .unwrap();
        let cold = crate::mnf::run(kept.cube(), &p3, backend.as_ref(), &monitor).unwrap();
        assert_eq!(warm.components.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), cold.components.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
        assert_eq!(warm.denoised.as_ref().map(|d| d.len()), cold.denoised.as_ref().map(|d| d.len()));
        assert!(warm.denoised.unwrap().iter().zip(cold.denoised.unwrap()).all(|(a, b)| a.to_bits() == b.to_bits()));
        assert_eq!(kept.resident_bytes(), 0, "the CPU keeps nothing on a device");
    }

    #[test]
    fn keeps_a_bounded_number_of_systems() {
        let cube = Arc::new(generate(&SyntheticSpec::small(8, 8, 6)));
        let r = ResidentCube::prepare(cube.clone(), Arc::new(crate::backend::cpu::CpuBackend::new()), &Monitor::silent()).unwrap();
        let monitor = Monitor::silent();
        let system = r.with_prepared(|p| pipeline::analyse_on(&cube, &MnfParams::default(), p, &monitor, &mut BTreeMap::new())).unwrap();
        for i in 0..SYSTEMS_PER_CUBE as u8 + 2 {
            r.keep_system([i; 32], Arc::new(SystemRecord::new(system.clone(), format!("{i}"), "o".into())));
        }
        assert!(r.system(&[0; 32]).is_none() && r.system(&[1; 32]).is_none());
        assert_eq!(r.system(&[5; 32]).unwrap().job_id, "5");
        // Keeping a key again replaces it rather than adding a second copy.
        r.keep_system([5; 32], Arc::new(SystemRecord::new(system, "again".into(), "o".into())));
        assert_eq!(r.system(&[5; 32]).unwrap().job_id, "again");
        assert!(r.system(&[2; 32]).is_some());
    }
}

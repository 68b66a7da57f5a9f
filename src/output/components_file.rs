//! A components `.npy` (a job's, or `hypermnf run`'s), written while the projection computes them.
//!
//! The projection hands each chunk of the components over once it is final (8 MB pieces on a GPU,
//! straight from pinned memory, while the device computes the next); writing it then overlaps the
//! write with the projection instead of following it. On the H100 host the 37 MB of a
//! 14-component re-projection of the benchmark cube took ~4 ms of projection and then ~8 ms of
//! writing; now projection and write take 7–8.5 ms together. A backend that has the components only
//! at the end (the CPU) hands them over once, which is the write as it was.

use std::path::PathBuf;

use crate::backend::BackendError;
use crate::cube::npy::F32NpyPieces;
use crate::cube::CubeError;
use crate::mnf::pipeline::ComponentSink;

pub struct ComponentsFile {
    path: PathBuf,
    pieces: Option<F32NpyPieces>,
    failed: Option<CubeError>,
    /// Time spent writing pieces (debug timing: how much of the projection the write took).
    pub writing: std::time::Duration,
}

impl ComponentsFile {
    /// The file at `path`, created when the projection says the components' shape.
    pub fn new(path: PathBuf) -> ComponentsFile {
        ComponentsFile { path, pieces: None, failed: None, writing: std::time::Duration::ZERO }
    }

    /// Whether every value of the components is in the file (the job does not write it again).
    pub fn complete(&self) -> bool {
        self.failed.is_none() && self.pieces.as_ref().is_some_and(F32NpyPieces::is_complete)
    }

    /// Why the file could not be written, if it could not: the job's failure (a full disk is not the
    /// backend's fault, and is reported as the disk condition it is).
    pub fn take_error(&mut self) -> Option<CubeError> {
        self.failed.take()
    }

    fn fail(&mut self, e: CubeError) -> BackendError {
        let message = format!("the result file could not be written: {e}");
        self.failed = Some(e);
        BackendError::Invalid(message)
    }
}

impl ComponentSink for ComponentsFile {
    fn begin(&mut self, shape: [usize; 3]) -> Result<(), BackendError> {
        // A projection run again (after a device error) starts the file again.
        self.pieces = None;
        self.failed = None;
        match F32NpyPieces::create(&self.path, &shape) {
            Ok(p) => {
                self.pieces = Some(p);
                Ok(())
            }
            Err(e) => Err(self.fail(e)),
        }
    }

    fn put(&mut self, first: usize, values: &[f32]) -> Result<(), BackendError> {
        let t = std::time::Instant::now();
        let written = match self.pieces.as_mut() {
            Some(p) => p.put(first, values),
            None => return Err(BackendError::Invalid("components handed over before their shape".into())),
        };
        self.writing += t.elapsed();
        written.map_err(|e| self.fail(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pieces in any order give the bytes of `npy::write_f32`; a missing piece leaves it incomplete.
    #[test]
    fn pieces_give_the_bytes_of_one_write() {
        let dir = tempfile::tempdir().unwrap();
        let shape = [3usize, 5, 7];
        let values: Vec<f32> = (0..105).map(|i| (i as f32 * 0.37).sin() * 1e3 - 3.0).collect();
        let whole = dir.path().join("whole.npy");
        crate::cube::npy::write_f32(&whole, &shape, &values).unwrap();

        let mut f = ComponentsFile::new(dir.path().join("pieces.npy"));
        f.begin(shape).unwrap();
        for (first, len) in [(70, 35), (0, 30), (30, 40)] {
            assert!(!f.complete());
            f.put(first, &values[first..first + len]).unwrap();
        }
        assert!(f.complete());
        assert_eq!(std::fs::read(&whole).unwrap(), std::fs::read(dir.path().join("pieces.npy")).unwrap());

        // Begun again (a second attempt): incomplete until every piece came again.
        f.begin(shape).unwrap();
        f.put(0, &values[..100]).unwrap();
        assert!(!f.complete());
        let err = f.put(100, &values[..10]).unwrap_err();
        assert!(err.to_string().contains("beyond"), "{err}");
        assert!(!f.complete(), "a failed piece leaves the file incomplete");
        assert!(f.take_error().is_some());
    }

    /// A directory that does not exist: the begin fails with the file's error kept for the job.
    #[test]
    fn an_unwritable_place_is_an_error_kept_for_the_job() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = ComponentsFile::new(dir.path().join("missing").join("c.npy"));
        assert!(f.begin([2, 2, 2]).is_err());
        assert!(f.put(0, &[1.0]).is_err());
        assert!(!f.complete());
    }
}

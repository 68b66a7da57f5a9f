//! NumPy .npy input and output. (stub: being written)
use std::path::Path;
use super::{Cube, CubeError};

pub fn read(path: &Path) -> Result<Cube, CubeError> {
    Err(CubeError::Unsupported(format!("{}: .npy reader not written yet", path.display())))
}

pub fn write_f32(path: &Path, shape: &[usize], values: &[f32]) -> Result<(), CubeError> {
    let _ = (path, shape, values);
    Err(CubeError::Unsupported(".npy writer not written yet".into()))
}

pub fn write_f32_to(w: &mut dyn std::io::Write, shape: &[usize], values: &[f32]) -> std::io::Result<()> {
    let _ = (w, shape, values);
    Err(std::io::Error::other(".npy writer not written yet"))
}

//! The checks every backend makes of what it is given, with the same errors.

use std::ops::Range;

use crate::cube::Cube;
use crate::mnf::compute::BackendError;
use crate::mnf::stats::StatsSpec;

/// Checks the noise window of `spec` against the `samples` × `lines` image a statistics pass runs on.
pub(crate) fn check_window(spec: &StatsSpec, samples: usize, lines: usize) -> Result<(), BackendError> {
    match spec.window {
        Some(w) if !w.fits(samples, lines) => Err(BackendError::Invalid(format!(
            "noise window {},{},{},{} lies outside the {samples} x {lines} image",
            w.x0, w.y0, w.x1, w.y1
        ))),
        _ => Ok(()),
    }
}

/// Checks a line range of `cube` given to `prepare_lines`.
pub(crate) fn check_line_range(cube: &Cube, lines: &Range<usize>) -> Result<(), BackendError> {
    if lines.is_empty() || lines.end > cube.lines() {
        return Err(BackendError::Invalid(format!(
            "lines {}..{} are not a non-empty range of the cube's {} lines",
            lines.start,
            lines.end,
            cube.lines()
        )));
    }
    Ok(())
}

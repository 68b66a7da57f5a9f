//! The MNF algorithm, independent of where it runs: parameters, statistics and their merge, band
//! selection, the generalized eigenproblem (float64, host), the result and its metadata, and the
//! pipeline that drives a compute backend through the statistics and projection passes. What the
//! pipeline needs from a backend is defined here (`compute`); the backends implement it, and
//! nothing here depends on them.

pub mod bands;
pub mod compute;
pub mod eigen;
mod error;
pub mod params;
pub mod pipeline;
pub mod pooled;
pub mod result;
pub mod stats;
pub mod system_file;

pub use compute::{Monitor, Stage};
pub use error::MnfError;
pub use params::{BackendChoice, MnfParams, NoiseEstimator, Window};
pub use pipeline::{run, MnfOutput};
pub use result::{Metadata, ReuseSource, StatisticsReuse};

//! hypermnf: Maximum Noise Fraction reduction of hyperspectral cubes, on the GPU (CUDA through cudarc)
//! or the CPU, as an HTTP service (`hypermnf serve`), a command-line tool (`hypermnf run`) and a Rust
//! library on `ndarray` ([`Mnf`], module [`library`]).
//!
//! ```
//! use hypermnf::{Backend, Mnf, NoiseEstimator};
//! use ndarray::Array3;
//!
//! // Any (lines, samples, bands) array of integer or float samples; here a smooth two-dimensional
//! // signal over 6 bands plus a deterministic pseudo-random noise.
//! let mut state = 1u64;
//! let cube = Array3::from_shape_fn((40, 30, 6), |(l, s, b)| {
//!     state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
//!     let noise = (state >> 40) as f64 / (1u64 << 24) as f64 - 0.5;
//!     let (x, y) = (l as f64 / 40.0, s as f64 / 30.0);
//!     (100.0 * x * (b + 1) as f64 + 80.0 * y * (6 - b) as f64 + noise) as f32
//! });
//! let fit = Mnf::new()
//!     .components(2)
//!     .noise(NoiseEstimator::ShiftDifference)
//!     .backend(Backend::Cpu)
//!     .fit(cube.view())?;
//! assert_eq!(fit.components().dim(), (40, 30, 2));
//! assert_eq!(fit.eigenvalues().len(), 6);
//! assert!(fit.snr()[1] > 100.0 * fit.snr()[2].abs(), "SNR {}", fit.snr());
//! # Ok::<(), hypermnf::Error>(())
//! ```

pub mod api;
pub mod backend;
pub mod bench;
pub mod cache;
pub mod config;
pub mod cube;
pub mod hashtable;
pub mod jobs;
pub mod library;
pub mod mnf;
pub mod output;
pub mod storage;

pub use library::{Backend, Error, Mnf, MnfFit, NoiseEstimator, Sample, Window};

//! hypermnf: Maximum Noise Fraction reduction of hyperspectral cubes, on the GPU (CUDA through cudarc)
//! or the CPU, as an HTTP service (`hypermnf serve`), a command-line tool (`hypermnf run`) and a Rust
//! library on `ndarray` ([`Mnf`], module [`library`]).
//!
//! ```
//! use hypermnf::library::cube_to_array;
//! use hypermnf::{Backend, Mnf, NoiseEstimator};
//!
//! // Any (lines, samples, bands) array of integer or float samples; here an AVIRIS chip read from ENVI.
//! let cube = hypermnf::cube::open("tests/data/salinasA_224_bip_be.hdr".as_ref())?;
//! let x: ndarray::Array3<i16> = cube_to_array(&cube)?;
//! let fit = Mnf::new()
//!     .components(10)
//!     .noise(NoiseEstimator::ShiftDifference)
//!     .backend(Backend::Auto) // CUDA when a device is found, else the CPU
//!     .fit(x.view())?;
//! assert_eq!(fit.components().dim(), (83, 86, 10)); // Array3<f32>
//! println!("SNR {}", fit.snr()); // Array1<f64>: λ − 1 per band used, descending
//! let t = fit.transform_matrix(); // Array2<f64>: bands used × 10
//! let lower = fit.transform(x.slice(ndarray::s![40.., .., ..]))?; // the fitted system on other pixels
//! # assert_eq!(t.dim().1, 10);
//! # assert_eq!(lower.dim(), (43, 86, 10));
//! # Ok::<(), hypermnf::Error>(())
//! ```

pub mod api;
pub mod backend;
pub mod bench;
pub mod job_cache;
pub mod config;
pub mod cube;
pub mod write_to_disk;
pub mod hashtable;
pub mod jobs;
pub mod library;
pub mod mnf;
pub mod output;
pub mod reference;
pub mod storage;

pub use library::{Backend, Error, Mnf, MnfFit, NoiseEstimator, Sample, Window};

//! hypermnf: Maximum Noise Fraction reduction of hyperspectral cubes, on the GPU (CUDA through cudarc)
//! or the CPU, as an HTTP service (`hypermnf serve`) and a command-line tool (`hypermnf run`).

pub mod api;
pub mod backend;
pub mod bench;
pub mod cache;
pub mod config;
pub mod cube;
pub mod hashtable;
pub mod jobs;
pub mod mnf;
pub mod output;
pub mod storage;

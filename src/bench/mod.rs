//! Benchmark programs (`hypermnf bench ...`): numbers for BENCHMARKS.md, never timed tests.
pub mod cpu;
pub mod gpu;
pub mod hashtable;
pub mod service;

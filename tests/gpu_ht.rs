//! Crate root for packing the hash-table GPU tests alone (`gpu-pack gpu_ht`); tests/gpu.rs includes
//! the same module.
mod gpu_hashtable;

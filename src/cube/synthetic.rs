//! Synthetic cubes with a known signal subspace plus white noise. (stub: being written)

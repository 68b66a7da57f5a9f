//! Band selection. (stub: being written)

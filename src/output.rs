//! Writing a result to disk. (stub: being written)

//! Generalized symmetric eigenproblem. (stub: being written)

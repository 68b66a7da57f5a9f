//! The job cache (being written).

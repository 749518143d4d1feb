//! The training loop (being built).

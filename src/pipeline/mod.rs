//! The pipeline engine (being built).

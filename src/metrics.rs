//! Stage metrics (being built).

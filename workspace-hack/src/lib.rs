//! No code: this crate only gives shared dependencies the features CI's other
//! builds give them, so that each is compiled once (`Cargo.toml` here, and
//! `scripts/workspace-hack.py`, which writes it).

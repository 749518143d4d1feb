//! `tfpipe bench` on small generated files.

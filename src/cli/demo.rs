//! `tfpipe demo`.

use super::Status;

/// Arguments of `tfpipe demo`.
#[derive(Debug, Default, clap::Args)]
pub struct Args {}

/// Runs `tfpipe demo`.
pub fn run(_args: Args) -> anyhow::Result<Status> {
    anyhow::bail!("demo: not yet built")
}

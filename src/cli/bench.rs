//! `tfpipe bench`.

use super::Status;

/// Arguments of `tfpipe bench`.
#[derive(Debug, Default, clap::Args)]
pub struct Args {}

/// Runs `tfpipe bench`.
pub fn run(_args: Args) -> anyhow::Result<Status> {
    anyhow::bail!("bench: not yet built")
}

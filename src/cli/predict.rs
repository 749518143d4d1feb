//! `tfpipe predict`.

use super::Status;

/// Arguments of `tfpipe predict`.
#[derive(Debug, Default, clap::Args)]
pub struct Args {}

/// Runs `tfpipe predict`.
pub fn run(_args: Args) -> anyhow::Result<Status> {
    anyhow::bail!("predict: not yet built")
}

//! `tfpipe train`.

use super::Status;

/// Arguments of `tfpipe train`.
#[derive(Debug, Default, clap::Args)]
pub struct Args {}

/// Runs `tfpipe train`.
pub fn run(_args: Args) -> anyhow::Result<Status> {
    anyhow::bail!("train: not yet built")
}

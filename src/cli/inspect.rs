//! `tfpipe inspect`.

use super::Status;

/// Arguments of `tfpipe inspect`.
#[derive(Debug, Default, clap::Args)]
pub struct Args {}

/// Runs `tfpipe inspect`.
pub fn run(_args: Args) -> anyhow::Result<Status> {
    anyhow::bail!("inspect: not yet built")
}

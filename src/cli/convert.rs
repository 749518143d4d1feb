//! `tfpipe convert`.

use super::Status;

/// Arguments of `tfpipe convert`.
#[derive(Debug, Default, clap::Args)]
pub struct Args {}

/// Runs `tfpipe convert`.
pub fn run(_args: Args) -> anyhow::Result<Status> {
    anyhow::bail!("convert: not yet built")
}

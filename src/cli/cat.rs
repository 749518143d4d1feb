//! `tfpipe cat`.

use super::Status;

/// Arguments of `tfpipe cat`.
#[derive(Debug, Default, clap::Args)]
pub struct Args {}

/// Runs `tfpipe cat`.
pub fn run(_args: Args) -> anyhow::Result<Status> {
    anyhow::bail!("cat: not yet built")
}

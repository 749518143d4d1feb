//! The `tfpipe` command: thin on purpose; the work lives in `cli/` and the library.

use std::process::ExitCode;

mod cli;

fn main() -> ExitCode {
    cli::main()
}

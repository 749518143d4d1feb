//! The `tfpipe` command line: one file per subcommand, parsed with clap derive.
//!
//! Exit codes: 0 success, 1 problems found in the data (corruption, bad rows),
//! 2 usage or I/O errors, 128 + the signal when interrupted (130 SIGINT, 143
//! SIGTERM, 129 SIGHUP; see [`interrupt`]). A closed stdout (`| head`) exits 0.

use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};

mod bench;
mod cat;
mod convert;
mod demo;
mod index;
mod inspect;
pub mod interrupt;
mod predict;
mod rank;
mod train;

/// A fast, honest streaming dataset engine for TFRecord files.
///
/// With no subcommand, runs the demo: MNIST digits to TFRecord, trained,
/// evaluated, checkpointed and reloaded, with the reports.
#[derive(Debug, Parser)]
#[command(name = "tfpipe", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print each record as one JSON object per line.
    Cat(cat::Args),
    /// Validate files and print counts and the inferred schema.
    Inspect(inspect::Args),
    /// Convert CSV, JSON, MNIST IDX or image folders to sharded TFRecord.
    Convert(Box<convert::Args>),
    /// Run the input pipeline to the end and report its throughput.
    Bench(bench::Args),
    /// Train a model fed by the pipeline, reporting stall versus compute.
    Train(Box<train::Args>),
    /// Load a checkpoint and predict, reporting latency.
    Predict(predict::Args),
    /// The end-to-end demo on the bundled MNIST sample (the default).
    Demo(demo::Args),
    /// Write a record index (FILE.idx, DALI's format) for each TFRecord file.
    Index(index::Args),
}

/// Process exit statuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Everything worked.
    Ok = 0,
    /// The command ran, and found problems in the data.
    Problems = 1,
    /// Usage or I/O error.
    Error = 2,
    // Interrupted: a command returns `Err(interrupt::Interrupted)`, and
    // `main` exits with 128 + the signal.
}

impl From<Status> for ExitCode {
    fn from(status: Status) -> ExitCode {
        ExitCode::from(status as u8)
    }
}

/// When `main` was entered: the "process start" of start-up reports. (The
/// kernel's start time in `/proc/self/stat` has only 10 ms resolution; what
/// precedes `main` here is the dynamic loader, well under a millisecond.)
pub(crate) static PROCESS_START: OnceLock<Instant> = OnceLock::new();

/// [`PROCESS_START`], set now if it was not.
pub(crate) fn process_start() -> Instant {
    *PROCESS_START.get_or_init(Instant::now)
}

/// Time since [`PROCESS_START`].
pub(crate) fn process_elapsed() -> Duration {
    process_start().elapsed()
}

/// Parses the command line, runs the command, prints errors as `tfpipe: ...`.
pub fn main() -> ExitCode {
    process_start();
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Cat(args)) => cat::run(args),
        Some(Command::Inspect(args)) => inspect::run(args),
        Some(Command::Convert(args)) => convert::run(*args),
        Some(Command::Bench(args)) => bench::run(args),
        Some(Command::Train(args)) => train::run(*args),
        Some(Command::Predict(args)) => predict::run(args),
        Some(Command::Demo(args)) => demo::run(args),
        Some(Command::Index(args)) => index::run(args),
        None => demo::run(demo::Args::default()),
    };
    match result {
        Ok(status) => status.into(),
        Err(err) if is_broken_pipe(&err) => Status::Ok.into(),
        Err(err) => {
            eprintln!("tfpipe: {err:#}");
            exit_code(&err)
        }
    }
}

/// The exit status for an error a command returned: 128 + the signal once a
/// signal arrived (whatever the error: it is a consequence of stopping), 2
/// for everything else.
fn exit_code(err: &anyhow::Error) -> ExitCode {
    let interrupted = err
        .chain()
        .find_map(|cause| cause.downcast_ref::<interrupt::Interrupted>().copied())
        .or_else(interrupt::received);
    if let Some(interrupted) = interrupted {
        return ExitCode::from(interrupted.exit_code());
    }
    Status::Error.into()
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

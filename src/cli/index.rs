//! `tfpipe index`: write a record index (`FILE.idx`, DALI's `tfrecord2idx`
//! format: one `offset size` line per record) for each TFRecord file, or
//! check existing ones against their files.

use std::path::PathBuf;

use anyhow::Context as _;
use tfpipe::storage;
use tfpipe::{IndexError, IndexedFiles, RecordIndex, index_path};

use super::{Status, interrupt};

/// Arguments of `tfpipe index`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Write the index files into DIR (as `DIR/NAME.idx`) instead of beside
    /// each data file.
    #[arg(long, value_name = "DIR")]
    pub output_dir: Option<PathBuf>,
    /// Check the existing index files instead of writing them: each must tile
    /// its file exactly and every record it points to must be intact. Exits 1
    /// if one does not match.
    #[arg(long)]
    pub check: bool,
    /// Uncompressed TFRecord files: paths, globs or object-store URLs.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<String>,
}

/// Runs `tfpipe index`.
pub fn run(args: Args) -> anyhow::Result<Status> {
    // A signal stops the run between two files: the index being written is
    // finished and renamed into place (or, if the signal came first, never
    // started), so no temporary file is left behind.
    let interrupt = interrupt::install().context("installing the signal handlers")?;
    // Re-indexing `'out/train-*'` matches the indexes written last time too.
    super::note_skipped_indexes(&args.files)?;
    let files = storage::resolve(&args.files)?;
    if let Some(dir) = &args.output_dir
        && !storage::is_url(dir)
    {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("{}: cannot create the directory", dir.display()))?;
    }
    let mut status = Status::Ok;
    for file in &files {
        if interrupt.is_set() {
            let note = if args.check {
                "the files before it were checked"
            } else {
                "the indexes written before it are complete"
            };
            return Err(interrupt.error().note(note).into());
        }
        let index_file = index_path(file, args.output_dir.as_deref());
        if args.check {
            match check(file, &index_file) {
                Ok(records) => println!(
                    "{}: {records} records, index {} matches",
                    file.display(),
                    index_file.display()
                ),
                Err(e) if is_data_problem(&e) => {
                    eprintln!("tfpipe: {e}");
                    status = Status::Problems;
                }
                Err(e) => return Err(e.into()),
            }
            continue;
        }
        let index = match RecordIndex::build(file) {
            Ok(index) => index,
            Err(e) if is_data_problem(&e) => {
                eprintln!("tfpipe: {e}");
                status = Status::Problems;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        index.write(&index_file)?;
        println!(
            "{}: {} records -> {}",
            file.display(),
            index.len(),
            index_file.display()
        );
    }
    Ok(status)
}

/// Loads the index and reads every record through it.
fn check(file: &std::path::Path, index_file: &std::path::Path) -> Result<u64, IndexError> {
    let index = RecordIndex::load(file, index_file)?;
    let files = IndexedFiles::from_parts(vec![(file.to_path_buf(), index)])?;
    for global in 0..files.len() {
        if let Some(position) = files.position(global) {
            files.read(position)?;
        }
    }
    Ok(files.len())
}

/// Problems with the data or the index (exit 1), as opposed to I/O errors (exit 2).
fn is_data_problem(error: &IndexError) -> bool {
    error.is_data_error()
}

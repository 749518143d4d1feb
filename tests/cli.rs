//! The `tfpipe` binary as a whole: exit codes, signals, closed pipes, flags
//! shared by every subcommand.

use std::path::{Path, PathBuf};
use std::process::{Command as StdCommand, Stdio};

fn tfpipe_path() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tfpipe"))
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// SIGINT, SIGTERM and SIGHUP each stop a conversion with 128 + the signal,
/// say so, and leave no output. The input is a FIFO, so the signal arrives
/// while tfpipe waits for the first bytes, after its handlers are installed
/// (it opens the input after installing them, and opening the writing end
/// waits for that); the data follows the signal.
#[cfg(unix)]
#[test]
fn a_signal_stops_convert_with_128_plus_the_signal_and_leaves_nothing() {
    use std::io::{Read, Write};
    for (name, code) in [("INT", 130), ("TERM", 143), ("HUP", 129)] {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("in.csv");
        let made = StdCommand::new("mkfifo").arg(&fifo).status().unwrap();
        assert!(made.success());
        let mut child = StdCommand::new(tfpipe_path())
            .args(["convert", "csv"])
            .arg(&fifo)
            .arg("--output")
            .arg(dir.path().join("p"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut writer = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
        let killed = StdCommand::new("kill")
            .arg(format!("-{name}"))
            .arg(child.id().to_string())
            .status()
            .unwrap();
        assert!(killed.success());
        // Only now the data: until it comes, tfpipe waits in its first read.
        writer.write_all(b"a,b\n1,2\n3,4\n").unwrap();
        drop(writer);
        let status = child.wait().unwrap();
        let mut stderr = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        assert_eq!(status.code(), Some(code), "SIG{name}: {status:?} {stderr}");
        assert!(
            stderr.contains(&format!("interrupted by SIG{name}")),
            "{stderr}"
        );
        assert_eq!(files_in(dir.path()), ["in.csv"], "SIG{name}: {stderr}");
    }
}

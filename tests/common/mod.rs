//! Helpers the `train` and `predict` integration tests share.

use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

/// Waits until `ready()` holds (polling every 20 ms, for at most 60 s), then
/// sends `SIG{signal}` (`"INT"`, `"TERM"`, ...) to `child` and returns its
/// output. A child that never gets ready is killed before the test fails,
/// so no long run outlives it.
#[cfg(unix)]
pub fn signal_when_ready(
    mut child: Child,
    signal: &str,
    not_ready: &str,
    ready: impl Fn() -> bool,
) -> Output {
    let start = Instant::now();
    while !ready() {
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("SIG{signal}: {not_ready} after 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let killed = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(child.id().to_string())
        .status()
        .expect("running kill");
    assert!(killed.success(), "kill -{signal} failed");
    child.wait_with_output().expect("waiting for the child")
}

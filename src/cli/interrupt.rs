//! Interrupts: SIGINT, SIGTERM and SIGHUP all set one flag that remembers
//! which signal came first; the command stops at its next check, discards the
//! outputs it was writing, and exits with 128 + the signal (130, 143, 129).
//!
//! The library never installs handlers. A command that writes outputs calls
//! [`install`] before its work starts and passes [`Interrupt::flag`] to the
//! library, which polls it (for example `convert::OutputOptions::cancel`).
//! When the library stops because of the flag, the command returns
//! [`Interrupt::error`] (an [`Interrupted`]), and `main` turns it into the exit
//! status. Code in `cli/` that loops by itself calls [`Interrupt::check`].
//!
//! ```ignore
//! let interrupt = interrupt::install()?;
//! let options = OutputOptions { cancel: Some(interrupt.flag()), ..OutputOptions::new(out) };
//! match convert::convert(&format, &inputs, &options) {
//!     Err(ConvertError::Interrupted) => Err(interrupt.error().into()),
//!     // ...
//! }
//! ```
//!
//! Commands that write nothing but stdout (`cat`, `inspect`) do not install
//! handlers: the default action, death by the signal, is already right for
//! them, and the shell reports it as 128 + the signal.
//!
//! A second signal ends the process at once with the same status, without
//! waiting for the current check: the way out of a command that is stuck. Its
//! temporary files may then be left behind (under a temporary name, never a
//! final one).

use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use signal_hook::consts::{SIGINT, SIGTERM};

/// The signals handled: everything that asks a command politely to stop.
#[cfg(unix)]
const SIGNALS: [i32; 3] = [SIGINT, SIGTERM, signal_hook::consts::SIGHUP];
#[cfg(not(unix))]
const SIGNALS: [i32; 2] = [SIGINT, SIGTERM];

/// The process's interrupt state, made once by [`install`] (a lock, so two
/// threads installing at once register the handlers once).
static INSTALLED: Mutex<Option<Interrupt>> = Mutex::new(None);

/// A handle on the process's interrupt flag. Cheap to clone; every clone
/// sees the same flag.
#[derive(Debug, Clone)]
pub struct Interrupt {
    /// Set by the first of the handled signals.
    flag: Arc<AtomicBool>,
    /// The first signal's number; 0 until one arrives.
    signal: Arc<AtomicUsize>,
}

/// Installs the handlers for SIGINT, SIGTERM and SIGHUP (once per process;
/// later calls return the same handle).
///
/// From then on these signals no longer end the process by themselves: the
/// command must poll the flag (through the library or [`Interrupt::check`])
/// often enough that stopping feels immediate.
pub fn install() -> io::Result<Interrupt> {
    let mut installed = INSTALLED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(interrupt) = &*installed {
        return Ok(interrupt.clone());
    }
    let interrupt = Interrupt {
        flag: Arc::new(AtomicBool::new(false)),
        signal: Arc::new(AtomicUsize::new(0)),
    };
    for signal in SIGNALS {
        // Registered first, so it runs first: when the flag is already set,
        // this is the second signal, and the process ends now.
        signal_hook::flag::register_conditional_shutdown(
            signal,
            i32::from(exit_code(signal)),
            interrupt.flag.clone(),
        )?;
        // Then, on the first signal only (a second one ended the process
        // above): which signal, and the flag.
        signal_hook::flag::register_usize(signal, interrupt.signal.clone(), signal as usize)?;
        signal_hook::flag::register(signal, interrupt.flag.clone())?;
    }
    *installed = Some(interrupt.clone());
    Ok(interrupt)
}

/// The interrupt, if handlers are installed and a signal has arrived. `main`
/// asks this about every failed command: an error that comes back after a
/// signal is a consequence of stopping (a cut-short read, a cancelled
/// stage), so the exit status is 128 + the signal whatever the error says.
pub fn received() -> Option<Interrupted> {
    let installed = INSTALLED.lock().unwrap_or_else(PoisonError::into_inner);
    let interrupt = installed.as_ref()?;
    interrupt.is_set().then(|| interrupt.error())
}

#[allow(
    dead_code,
    reason = "check and is_set are for commands that loop by themselves"
)]
impl Interrupt {
    /// The flag to hand to library code that polls for cancellation: `true`
    /// once a signal arrived.
    pub fn flag(&self) -> Arc<AtomicBool> {
        self.flag.clone()
    }

    /// Whether a signal has arrived.
    pub fn is_set(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    /// `Err` once a signal has arrived: the error to return from the command.
    pub fn check(&self) -> Result<(), Interrupted> {
        if self.is_set() {
            Err(self.error())
        } else {
            Ok(())
        }
    }

    /// The error for the signal that arrived, to return when the library
    /// stopped because of the flag. (SIGINT if the flag was set some other way.)
    pub fn error(&self) -> Interrupted {
        match self.signal.load(Ordering::SeqCst) {
            0 => Interrupted::of(SIGINT),
            signal => Interrupted::of(signal as i32),
        }
    }
}

/// The command stopped because of a signal. `main` exits with
/// [`Interrupted::exit_code`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interrupted {
    signal: i32,
    /// What became of the outputs, for the message.
    note: Option<&'static str>,
}

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "interrupted by {}", self.name())?;
        match self.note {
            Some(note) => write!(f, "; {note}"),
            None => Ok(()),
        }
    }
}

impl std::error::Error for Interrupted {}

impl Interrupted {
    /// Adds what became of the outputs to the message, as in
    /// `interrupted by SIGTERM; no output was written`.
    pub fn note(self, note: &'static str) -> Interrupted {
        Interrupted {
            note: Some(note),
            ..self
        }
    }

    /// 128 + the signal's number: 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP.
    pub fn exit_code(&self) -> u8 {
        exit_code(self.signal)
    }

    /// The signal's name, such as `SIGTERM`.
    pub fn name(&self) -> &'static str {
        signal_name(self.signal)
    }
}

impl Interrupted {
    fn of(signal: i32) -> Interrupted {
        Interrupted { signal, note: None }
    }
}

fn exit_code(signal: i32) -> u8 {
    u8::try_from(128 + signal).unwrap_or(u8::MAX)
}

fn signal_name(signal: i32) -> &'static str {
    match signal {
        SIGINT => "SIGINT",
        SIGTERM => "SIGTERM",
        #[cfg(unix)]
        signal_hook::consts::SIGHUP => "SIGHUP",
        _ => "a signal",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    const SIGHUP_OR_INT: i32 = signal_hook::consts::SIGHUP;
    #[cfg(not(unix))]
    const SIGHUP_OR_INT: i32 = SIGINT;

    #[test]
    fn exit_codes_are_128_plus_the_signal() {
        assert_eq!(Interrupted::of(SIGINT).exit_code(), 130);
        assert_eq!(Interrupted::of(SIGTERM).exit_code(), 143);
        #[cfg(unix)]
        assert_eq!(
            Interrupted::of(signal_hook::consts::SIGHUP).exit_code(),
            129
        );
        assert_eq!(
            Interrupted::of(SIGTERM).to_string(),
            "interrupted by SIGTERM"
        );
        assert_eq!(
            Interrupted::of(SIGHUP_OR_INT)
                .note("no output was written")
                .to_string(),
            format!(
                "interrupted by {}; no output was written",
                signal_name(SIGHUP_OR_INT)
            )
        );
    }

    /// Raising a signal in this test process sets the flag and records the
    /// signal. (Only this test raises a signal in the binary's unit tests, and
    /// only once: a second one would end the test process, as designed.)
    #[cfg(unix)]
    #[test]
    fn a_signal_sets_the_flag_and_remembers_which() {
        let interrupt = install().unwrap();
        assert!(install().unwrap().flag().load(Ordering::SeqCst) == interrupt.is_set());
        assert!(interrupt.check().is_ok());
        signal_hook::low_level::raise(SIGTERM).unwrap();
        // raise() returns after the handler ran in this thread.
        assert!(interrupt.is_set());
        assert_eq!(interrupt.check(), Err(Interrupted::of(SIGTERM)));
        assert_eq!(install().unwrap().error().exit_code(), 143);
    }
}

//! Running out of file descriptors without going silent.
//!
//! Clients are capped below the open-file limit (`--max-connections` is clamped to leave
//! [`crate::FD_HEADROOM`]), and each HTTP listener serves a bounded number of connections,
//! so neither side can take the descriptors the other needs. Should the process run out
//! anyway (the system's file table is full, or something embedding the gateway opens files),
//! every listener keeps a reserve descriptor: given up, it lets the listener take one waiting
//! connection (a client, to refuse it with BYE(server_full); an HTTP probe, to answer it)
//! instead of leaving it in the backlog with no answer.

use std::io;

/// `EMFILE`, this process has no descriptor left, on Linux and the BSDs alike.
const EMFILE: i32 = 24;

/// `ENFILE`, the system's file table is full, on Linux and the BSDs alike.
const ENFILE: i32 = 23;

/// True when `e` says there is no descriptor left to accept with.
pub(crate) fn is_out_of_descriptors(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(EMFILE | ENFILE))
}

/// A descriptor held back for the moment the process runs out; see the module documentation.
#[derive(Debug)]
pub(crate) struct Reserve(Option<std::fs::File>);

// === impl Reserve ===

impl Reserve {
    pub(crate) fn open() -> Reserve {
        Reserve(std::fs::File::open("/dev/null").ok())
    }

    /// Gives the descriptor up; false if there was none to give.
    pub(crate) fn release(&mut self) -> bool {
        self.0.take().is_some()
    }

    /// Takes the descriptor again if it was given up and one is free now.
    pub(crate) fn reopen(&mut self) {
        if self.0.is_none() {
            *self = Reserve::open();
        }
    }
}

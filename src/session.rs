//! One logged-in session: the handle shared by its connection task and whoever ends it.
//!
//! A session ends once, with the first reason given: an expiry from the ticker, a kick from
//! a newer login, or the connection's own close. The connection task learns of an ending it
//! did not cause through [`Session::ended`].

use std::sync::atomic::{AtomicU8, Ordering};

use tokio::sync::Notify;

use crate::frame::CloseReason;

/// Value of `end` while the session is live.
const LIVE: u8 = 0;

/// A uid's session on one connection; see the module documentation.
#[derive(Debug)]
pub struct Session {
    uid: u64,
    /// `LIVE`, or the [`CloseReason`] code (its discriminant) of the first ending.
    end: AtomicU8,
    ended: Notify,
}

// === impl Session ===

impl Session {
    pub(crate) fn new(uid: u64) -> Session {
        Session { uid, end: AtomicU8::new(LIVE), ended: Notify::new() }
    }

    /// The uid this session logged in as.
    pub fn uid(&self) -> u64 {
        self.uid
    }

    /// Ends the session with `reason` unless it already ended; returns whether this call
    /// ended it. Wakes the connection task either way it matters.
    pub(crate) fn end(&self, reason: CloseReason) -> bool {
        let won = self.end.compare_exchange(LIVE, reason as u8, Ordering::AcqRel, Ordering::Acquire).is_ok();
        if won {
            self.ended.notify_one();
        }
        won
    }

    /// Why the session ended, or `None` while it is live.
    pub fn end_reason(&self) -> Option<CloseReason> {
        match self.end.load(Ordering::Acquire) {
            LIVE => None,
            code => CloseReason::ALL.get(usize::from(code) - 1).copied(),
        }
    }

    /// Resolves once the session has ended, whoever ended it.
    pub async fn ended(&self) -> CloseReason {
        loop {
            if let Some(reason) = self.end_reason() {
                return reason;
            }
            // `notify_one` stores a permit, so an ending between the check and this await
            // is not lost.
            self.ended.notified().await;
        }
    }
}

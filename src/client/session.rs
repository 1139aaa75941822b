//! One logged-in session: the handle shared by its connection task, the registry, the ticker
//! and the backend API.
//!
//! A session ends once, with the first reason given: an expiry from the ticker, a kick from
//! a newer login or the API, or the connection's own close. Backends push to it through a
//! small outbox that holds frames only while they wait for the connection task; the task
//! learns of both a push and an ending it did not cause through one wake-up.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Mutex, PoisonError};

use bytes::Bytes;
use tokio::sync::Notify;

use crate::client::frame::CloseReason;

/// Value of `end` while the session is live.
const LIVE: u8 = 0;

/// A uid's session on one connection; see the module documentation.
#[derive(Debug)]
pub struct Session {
    uid: u64,
    /// Opaque id that pairs this session's online and offline events.
    id: u64,
    /// Unix milliseconds of the LOGIN.
    since_ms: u64,
    /// `LIVE`, or the [`CloseReason`] code (its discriminant) of the first ending.
    end: AtomicU8,
    /// Set, under the event log's lock, once this session's offline event is in the log.
    reported: AtomicBool,
    /// Wakes the connection task for an ending or a push.
    wake: Notify,
    /// PUSH payloads the connection task has not taken yet; unallocated while empty.
    outbox: Mutex<Vec<Bytes>>,
}

/// What [`Session::push`] did with a payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    /// Queued for the connection, which writes it next.
    Queued,
    /// The session has ended; nothing was queued.
    Ended,
    /// The outbox is over its bound: the client does not read. Nothing was queued.
    Full,
}

// === impl Session ===

impl Session {
    pub(crate) fn new(uid: u64, id: u64, since_ms: u64) -> Session {
        Session {
            uid,
            id,
            since_ms,
            end: AtomicU8::new(LIVE),
            reported: AtomicBool::new(false),
            wake: Notify::new(),
            outbox: Mutex::new(Vec::new()),
        }
    }

    /// The uid this session logged in as.
    pub fn uid(&self) -> u64 {
        self.uid
    }

    /// The id its online and offline events carry.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Unix milliseconds of its LOGIN.
    pub fn since_ms(&self) -> u64 {
        self.since_ms
    }

    /// True until the session ends.
    pub fn is_live(&self) -> bool {
        self.end.load(Ordering::Acquire) == LIVE
    }

    /// Ends the session with `reason` unless it already ended; returns whether this call
    /// ended it. Wakes the connection task either way it matters.
    pub(crate) fn end(&self, reason: CloseReason) -> bool {
        let won = self.end.compare_exchange(LIVE, reason as u8, Ordering::AcqRel, Ordering::Acquire).is_ok();
        if won {
            self.wake.notify_one();
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
    #[cfg(test)]
    pub async fn ended(&self) -> CloseReason {
        loop {
            if let Some(reason) = self.end_reason() {
                return reason;
            }
            // `notify_one` stores a permit, so an ending between the check and this await
            // is not lost.
            self.wake.notified().await;
        }
    }

    /// Resolves when the session ended or a push arrived since the last call; the
    /// connection task checks which.
    pub(crate) async fn woken(&self) {
        self.wake.notified().await;
    }

    /// Queues `payload` for the connection unless it would take the queued bytes past
    /// `max_queued` (frame headers counted).
    pub(crate) fn push(&self, payload: &Bytes, max_queued: usize) -> Pushed {
        if !self.is_live() {
            return Pushed::Ended;
        }
        let mut outbox = self.outbox.lock().unwrap_or_else(PoisonError::into_inner);
        let queued: usize = outbox.iter().map(|p| PUSH_OVERHEAD + p.len()).sum();
        if queued + PUSH_OVERHEAD + payload.len() > max_queued {
            return Pushed::Full;
        }
        outbox.push(payload.clone());
        drop(outbox);
        self.wake.notify_one();
        Pushed::Queued
    }

    /// Takes every queued push, oldest first; leaves the outbox unallocated.
    pub(crate) fn take_pushes(&self) -> Vec<Bytes> {
        std::mem::take(&mut *self.outbox.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Marks the offline event as logged; returns false if it already was. Called only under
    /// the event log's lock, which is what makes the offline event exactly-once.
    pub(crate) fn mark_reported(&self) -> bool {
        !self.reported.swap(true, Ordering::Relaxed)
    }
}

/// Bytes a PUSH frame adds around its payload: the length prefix and the kind byte.
const PUSH_OVERHEAD: usize = 5;

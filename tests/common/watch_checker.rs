//! A checker of what watchers see against the event stream, knowing nothing of the gateway:
//! it reads the stream's user events as a backend sees them (`user_online`, `user_offline`,
//! `status`, by uid, in order) and each watcher's PRESENCE entries as its client got them,
//! and holds them to docs/PROTOCOL.md's promise:
//!
//! - a watcher's first entry for a uid is a snapshot, equal to the uid's state at some point
//!   of the stream;
//! - each change after it is the uid's next transition in the stream, once, in order: a
//!   `user_online` (online, no status), a `user_offline` (offline), or a `status` that
//!   changes the status of an online uid;
//! - a resync (or a later snapshot) is the uid's state at some later point;
//! - once everything has been delivered, the watcher's view is the stream's last state.
//!
//! Where several points of the stream have the same state, every alignment is kept, and a
//! violation is only reported when none is left.

use std::collections::{BTreeSet, HashMap};

/// A uid's state as a watcher sees it: online, and its status.
pub type View = (bool, String);

/// What a watcher got for one uid, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// A snapshot answering a WATCH, or a resync: the state at some point.
    State(View),
    /// A change: the next transition.
    Change(View),
}

/// One stream event, as the checker reads it.
#[derive(Debug, Clone)]
pub enum StreamUserEvent {
    Online,
    Offline,
    Status(String),
}

/// Each uid's states through the stream: the first is "never seen" (offline, no status),
/// then one per transition.
pub fn states(events: &[(u64, StreamUserEvent)]) -> HashMap<u64, Vec<View>> {
    let mut by_uid: HashMap<u64, Vec<View>> = HashMap::new();
    for (uid, event) in events {
        let states = by_uid.entry(*uid).or_insert_with(|| vec![(false, String::new())]);
        let (online, status) = states.last().cloned().expect("a first state");
        let next = match event {
            StreamUserEvent::Online if !online => Some((true, String::new())),
            StreamUserEvent::Offline if online => Some((false, String::new())),
            StreamUserEvent::Status(text) if online && *text != status => Some((true, text.clone())),
            _ => None,
        };
        states.extend(next);
    }
    by_uid
}

/// Every violation of the promise for one watcher's view of `uid`: `seen` against the
/// uid's `states` (from [`states`]; a uid absent from the stream has only the first).
pub fn check(uid: u64, seen: &[Seen], states: &[View]) -> Vec<String> {
    let never = [(false, String::new())];
    let states = if states.is_empty() { &never[..] } else { states };
    let mut at: BTreeSet<usize> = BTreeSet::new();
    let mut found = Vec::new();
    for (i, got) in seen.iter().enumerate() {
        let next: BTreeSet<usize> = match got {
            Seen::State(view) => {
                // At or after the earliest point still possible (the first: anywhere).
                let from = if i == 0 { 0 } else { at.first().copied().unwrap_or(0) };
                (from..states.len()).filter(|&k| states[k] == *view).collect()
            }
            Seen::Change(view) => {
                if i == 0 {
                    found.push(format!("uid {uid}: a change before any snapshot: {got:?}"));
                    return found;
                }
                at.iter().map(|k| k + 1).filter(|&k| k < states.len() && states[k] == *view).collect()
            }
        };
        if next.is_empty() {
            let from = at.first().copied().unwrap_or(0);
            found.push(format!(
                "uid {uid}: entry {i} ({got:?}) matches no point of the stream after {at:?}; the stream's states from {from}: {:?}; seen: {seen:?}",
                &states[from..]
            ));
            return found;
        }
        at = next;
    }
    if !seen.is_empty() && !at.contains(&(states.len() - 1)) {
        found.push(format!(
            "uid {uid}: the view ends at {at:?}, not at the stream's last state {:?} (of {}); seen: {seen:?}",
            states.last(),
            states.len()
        ));
    }
    found
}

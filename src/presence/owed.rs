//! PRESENCE entries waiting for their watcher's connection, one queue per session, held only
//! while entries are pending: a session that watches nothing, or has been told everything,
//! costs no queue.
//!
//! The fan-out task (`fanout.rs`) queues and wakes the session; the connection takes the
//! whole queue and writes it as PRESENCE frames. Changes owed past a bound (a watcher that
//! does not read) are replaced by one resync of the watcher's whole list, so what it missed
//! is never skipped in silence and the queue never holds more than its list and the bound.

use dashmap::DashMap;
use foldhash::fast::RandomState;

use crate::presence::Session;
use crate::proto::{Frame, PresenceEntry, PresenceKind};

/// Bytes of entries in one PRESENCE frame, at most (one entry more, if a single entry is
/// larger): a resync of a long list goes out as several frames, each far under any
/// client's frame limit, instead of one frame as large as the list.
const FRAME_BYTES: usize = 16 * 1024;

/// Bytes `entry` takes in a PRESENCE frame.
pub(crate) fn entry_bytes(entry: &PresenceEntry) -> usize {
    // uid, state, at_ms, the status's length and the status, last_seen_ms when offline.
    8 + 1 + 8 + 1 + entry.status.len() + if entry.online { 0 } else { 8 }
}

/// One session's pending entries, in the order they are owed.
#[derive(Debug, Default)]
struct Queue {
    frames: Vec<(PresenceKind, Vec<PresenceEntry>)>,
    /// Bytes of the changes queued since the last resync: what the bound counts. A snapshot
    /// or a resync is as long as the list it answers, which `--max-watch` bounds.
    changes: usize,
}

/// Every watcher's pending entries; see the module documentation.
#[derive(Debug, Default)]
pub struct Owed {
    queued: DashMap<u64, Queue, RandomState>,
}

// === impl Owed ===

impl Owed {
    /// Owes `session` the `entries` of a snapshot (answering its WATCH) or a resync, after
    /// what it is owed already.
    pub fn answer(&self, session: &Session, kind: PresenceKind, entries: Vec<PresenceEntry>) {
        if !session.is_live() {
            return;
        }
        self.queued.entry(session.id()).or_default().frames.push((kind, entries));
        self.woke(session);
    }

    /// Owes `session` a change, unless it is owed more than `max_owed` bytes of changes
    /// already: then nothing is queued and false is returned (the caller owes it a resync).
    pub fn change(&self, session: &Session, entry: PresenceEntry, max_owed: usize) -> bool {
        if !session.is_live() {
            return true;
        }
        {
            let mut queue = self.queued.entry(session.id()).or_default();
            let bytes = entry_bytes(&entry);
            if queue.changes.saturating_add(bytes) > max_owed {
                return false;
            }
            queue.changes += bytes;
            match queue.frames.last_mut() {
                Some((PresenceKind::Change, entries)) => entries.push(entry),
                _ => queue.frames.push((PresenceKind::Change, vec![entry])),
            }
        }
        self.woke(session);
        true
    }

    /// Owes `session` a resync of its whole list (`entries`) in place of the changes and any
    /// resync it is owed; snapshots answering its WATCHes stay, before it.
    pub fn resync(&self, session: &Session, entries: Vec<PresenceEntry>) {
        if !session.is_live() {
            return;
        }
        {
            let mut queue = self.queued.entry(session.id()).or_default();
            queue.frames.retain(|(kind, _)| *kind == PresenceKind::Snapshot);
            queue.frames.push((PresenceKind::Resync, entries));
            queue.changes = 0;
        }
        self.woke(session);
    }

    /// Takes everything `session` is owed, as PRESENCE frames in order.
    pub fn take(&self, session: &Session) -> Vec<Frame> {
        let Some((_, queue)) = self.queued.remove(&session.id()) else { return Vec::new() };
        let mut frames = Vec::with_capacity(queue.frames.len());
        for (kind, entries) in queue.frames {
            let mut chunk = Vec::new();
            let mut bytes = 0;
            for entry in entries {
                let size = entry_bytes(&entry);
                if !chunk.is_empty() && (bytes + size > FRAME_BYTES || chunk.len() == usize::from(u16::MAX)) {
                    frames.push(Frame::Presence { kind, entries: std::mem::take(&mut chunk) });
                    bytes = 0;
                }
                bytes += size;
                chunk.push(entry);
            }
            // The last chunk (empty only when they all were: a snapshot of nothing is still
            // answered).
            frames.push(Frame::Presence { kind, entries: chunk });
        }
        frames
    }

    /// Forgets what `session` is owed: it closed.
    pub fn forget(&self, session_id: u64) {
        self.queued.remove(&session_id);
    }

    /// Queues held now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.queued.len()
    }

    fn woke(&self, session: &Session) {
        if session.is_live() {
            session.wake();
        } else {
            // Ended while we queued: its connection may already have taken its last entries.
            self.queued.remove(&session.id());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presence::Handle;
    use crate::proto::CloseReason;

    fn entry(uid: u64, status: &str) -> PresenceEntry {
        PresenceEntry { uid, online: true, at_ms: 1, status: status.into(), last_seen_ms: None }
    }

    #[test]
    fn queues_exist_only_while_entries_are_owed_and_a_long_list_splits_into_frames() {
        let owed = Owed::default();
        let s = Session::new(1, 7, 0, Handle::NONE);
        let long: Vec<PresenceEntry> = (0..1000).map(|uid| entry(uid, &"x".repeat(64))).collect();
        owed.answer(&s, PresenceKind::Snapshot, long);
        assert!(owed.change(&s, entry(5, ""), 1 << 20));
        assert!(owed.change(&s, entry(6, ""), 1 << 20));
        assert_eq!(owed.len(), 1);
        let frames = owed.take(&s);
        assert_eq!(owed.len(), 0);
        let entries = |f: &Frame| match f {
            Frame::Presence { kind, entries } => (*kind, entries.len()),
            _ => unreachable!(),
        };
        let (snapshots, changes): (Vec<_>, Vec<_>) =
            frames.iter().map(entries).partition(|(kind, _)| *kind == PresenceKind::Snapshot);
        assert!(snapshots.len() > 1, "1000 entries of 82 bytes split into frames of 16 KiB");
        assert_eq!(snapshots.iter().map(|(_, n)| n).sum::<usize>(), 1000);
        assert_eq!(changes, [(PresenceKind::Change, 2)], "changes gather in one frame");
        for frame in &frames {
            let mut buf = bytes::BytesMut::new();
            frame.encode(&mut buf);
            assert!(buf.len() <= FRAME_BYTES + 8, "{}", buf.len());
        }
        assert!(owed.take(&s).is_empty());
    }

    #[test]
    fn a_bound_turns_changes_into_a_resync_and_an_ended_session_gets_nothing() {
        let owed = Owed::default();
        let s = Session::new(1, 7, 0, Handle::NONE);
        let one = entry_bytes(&entry(5, ""));
        owed.answer(&s, PresenceKind::Snapshot, vec![entry(5, "")]);
        assert!(owed.change(&s, entry(5, ""), 2 * one));
        assert!(owed.change(&s, entry(5, ""), 2 * one));
        assert!(!owed.change(&s, entry(5, ""), 2 * one), "over the bound");
        owed.resync(&s, vec![entry(5, "now")]);
        let kinds: Vec<PresenceKind> = owed
            .take(&s)
            .iter()
            .map(|f| match f {
                Frame::Presence { kind, .. } => *kind,
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(kinds, [PresenceKind::Snapshot, PresenceKind::Resync]);
        s.end(CloseReason::Logout);
        owed.answer(&s, PresenceKind::Snapshot, vec![entry(5, "")]);
        assert!(owed.change(&s, entry(5, ""), 1));
        assert_eq!(owed.len(), 0);
    }
}

//! This process's own event log: every online, offline and data event, in order, in
//! memory and bounded. The ordering lock (`events.rs`) decides what is recorded and when;
//! this file keeps it and hands it to readers.
//!
//! Each consumer keeps its own position (a sequence number), so a consumer that stops
//! reading costs nothing: the log drops its oldest events once it holds `capacity` events
//! or `max_bytes` of what they carry (payloads and topics, wills, claims, origins: every
//! byte a client or a token decides), and that consumer later learns how many it missed.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;

use crate::presence::events::{within_batch_budget, Batch, Event, EventId, What, Will};
use crate::presence::session::PackedOrigin;
use crate::presence::Claims;
use crate::proto::{CloseReason, Device};

/// The kept events; see the module documentation.
#[derive(Debug)]
pub(crate) struct LocalLog {
    /// Oldest first, with consecutive sequence numbers ending at `next_seq - 1`: an event's
    /// id follows from its place, so it is not stored.
    events: VecDeque<Logged>,
    /// Sequence number the next event gets.
    next_seq: u64,
    /// Bytes the held events carry beyond their fixed part ([`Logged::held_bytes`]).
    bytes: usize,
    capacity: usize,
    max_bytes: usize,
}

/// An event as the log keeps it: without its id, which its place gives, and with the
/// user-level event it caused folded in. Every logged-in connection's online event is kept
/// for replay, so each byte here is a byte a connection.
#[derive(Debug)]
struct Logged {
    at_ms: u64,
    uid: u64,
    kept: Kept,
}

/// The event itself, in the log's compact form.
#[derive(Debug, Clone)]
pub(crate) enum Kept {
    /// An online event; `user_online` follows when `first`.
    /// Its origin is boxed and packed: 19 bytes inline would widen every kept event, and an
    /// `Origin` boxed would take a 48-byte allocation instead of 32.
    /// Its timeout (`timeout_ms`) fits the padding beside `first`.
    Online {
        session: u64,
        device: Device,
        first: bool,
        timeout_ms: u32,
        claims: Option<Arc<Claims>>,
        origin: Option<Box<PackedOrigin>>,
    },
    /// An offline event; `user_offline` follows when `last`.
    /// An MQTT session's will rides along (boxed: most sessions have none).
    Offline {
        session: u64,
        device: Device,
        reason: CloseReason,
        last: bool,
        will: Option<Box<Will>>,
        claims: Option<Arc<Claims>>,
    },
    /// `bytes` holds an MQTT PUBLISH's topic (its first `topic_len` bytes, UTF-8, never
    /// empty by MQTT's rules) before the payload; `topic_len` 0 for a DATA frame. One buffer,
    /// not a second pointer: every connection's online event is kept, and a wider variant
    /// would widen them all.
    Data { bytes: Bytes, topic_len: u16 },
    /// A `user_offline` of its own, not folded into an offline event: the uid's offline
    /// grace ran out; its last session ended at `ended_ms`.
    UserOffline { reason: CloseReason, ended_ms: u64 },
    /// The user set its status (empty: cleared).
    Status { status: Arc<str> },
}

impl Kept {
    /// A data event's compact form: the topic, if any (MQTT bounds it to a u16 length), in
    /// front of the payload.
    pub(crate) fn data(payload: Bytes, topic: Option<&str>) -> Kept {
        match topic.filter(|t| !t.is_empty()).map(|t| &t.as_bytes()[..t.len().min(usize::from(u16::MAX))]) {
            None => Kept::Data { bytes: payload, topic_len: 0 },
            Some(topic) => {
                let mut bytes = bytes::BytesMut::with_capacity(topic.len() + payload.len());
                bytes.extend_from_slice(topic);
                bytes.extend_from_slice(&payload);
                Kept::Data { bytes: bytes.freeze(), topic_len: topic.len() as u16 }
            }
        }
    }
}

/// What the log keeps of each online event: the entry's size, and its boxed origin's.
#[cfg(test)]
pub(crate) fn kept_online_event_bytes() -> (usize, usize) {
    (std::mem::size_of::<Logged>(), std::mem::size_of::<PackedOrigin>())
}

impl Logged {
    /// The session (or data) event.
    fn event(&self, id: EventId) -> Event {
        let what = match &self.kept {
            Kept::Online { session, device, claims, origin, timeout_ms, .. } => What::Online {
                session: *session,
                device: device.clone(),
                node: None,
                claims: claims.clone(),
                origin: origin.as_deref().map(|o| o.unpack()).unwrap_or_default(),
                superseded: false,
                timeout_ms: *timeout_ms,
            },
            Kept::Offline { session, device, reason, will, claims, .. } => {
                let will = will.as_deref().map(|w| Arc::new(w.clone()));
                let claims = claims.clone();
                What::Offline { session: *session, device: device.clone(), reason: *reason, will, claims }
            }
            Kept::Data { bytes, topic_len } => {
                let at = usize::from(*topic_len);
                let topic = (at > 0).then(|| Arc::from(String::from_utf8_lossy(&bytes[..at]).as_ref()));
                What::Data { payload: bytes.slice(at..), topic }
            }
            Kept::UserOffline { reason, ended_ms } => What::UserOffline { reason: *reason, ended_ms: *ended_ms },
            Kept::Status { status } => What::Status { status: status.clone() },
        };
        Event { id, at_ms: self.at_ms, uid: self.uid, what }
    }

    /// The user-level event it caused, if any.
    fn user_event(&self, id: EventId) -> Option<Event> {
        let what = match &self.kept {
            Kept::Online { first: true, .. } => What::UserOnline,
            Kept::Offline { last: true, reason, .. } => What::UserOffline { reason: *reason, ended_ms: self.at_ms },
            _ => return None,
        };
        Some(Event { id, at_ms: self.at_ms, uid: self.uid, what })
    }

    /// Whether it caused a user-level event (`user_online` or `user_offline`), told after it.
    fn causes_user_event(&self) -> bool {
        matches!(self.kept, Kept::Online { first: true, .. } | Kept::Offline { last: true, .. })
    }

    /// What it carries beyond its fixed part, each counted where it is kept: a data event's
    /// topic and payload, an MQTT will's topic and payload, a JWT's claims (shared with the
    /// session while it lives, and counted here all the same: the log may outlive it), a
    /// boxed origin. The fixed part is bounded by `capacity`.
    fn held_bytes(&self) -> usize {
        let claims = |claims: &Option<Arc<Claims>>| claims.as_ref().map_or(0, |c| c.as_json().len());
        match &self.kept {
            Kept::Data { bytes, .. } => bytes.len(),
            Kept::Online { claims: c, origin, .. } => {
                claims(c) + origin.as_ref().map_or(0, |_| std::mem::size_of::<PackedOrigin>())
            }
            Kept::Offline { will, claims: c, .. } => {
                claims(c) + will.as_ref().map_or(0, |w| std::mem::size_of::<Will>() + w.topic.len() + w.payload.len())
            }
            Kept::UserOffline { .. } => 0,
            Kept::Status { status } => status.len(),
        }
    }
}

// === impl LocalLog ===

impl LocalLog {
    /// An empty log holding at most `capacity` events and `max_bytes` of what they carry.
    pub(crate) fn new(capacity: usize, max_bytes: usize) -> LocalLog {
        LocalLog { events: VecDeque::new(), next_seq: 1, bytes: 0, capacity: capacity.max(1), max_bytes }
    }

    /// Events held.
    pub(crate) fn len(&self) -> usize {
        self.events.len()
    }

    /// Bytes the held events carry, which `max_bytes` bounds.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Appends an event under the next sequence number, dropping the oldest past the bounds.
    pub(crate) fn append(&mut self, at_ms: u64, uid: u64, kept: Kept) {
        let event = Logged { at_ms, uid, kept };
        self.next_seq += 1;
        self.bytes += event.held_bytes();
        self.events.push_back(event);
        while self.events.len() > self.capacity || self.bytes > self.max_bytes {
            match self.events.pop_front() {
                Some(dropped) => self.bytes -= dropped.held_bytes(),
                None => break,
            }
        }
    }

    /// The next events after `after` (ids of the run that began at `boot_ms`), at most
    /// [`crate::presence::READ_BATCH`]: see [`crate::presence::EventLog::read`].
    pub(crate) fn read(&self, after: EventId, boot_ms: u64) -> Batch {
        let id = |seq: u64| EventId { ms: boot_ms, seq };
        let oldest = self.next_seq - self.events.len() as u64;
        let newest = self.next_seq - 1;
        let (after_seq, earlier_process) = match after.ms.cmp(&boot_ms) {
            std::cmp::Ordering::Less => (0, true),
            std::cmp::Ordering::Equal => (after.seq.min(2 * newest + 1), false),
            std::cmp::Ordering::Greater => (2 * newest + 1, false),
        };
        // An even id is an entry's session event whose user-level event follows: that
        // entry's second half is next.
        let split = (after_seq % 2 == 0).then_some(after_seq / 2).filter(|&at| at >= oldest && at >= 1);
        let next = after_seq / 2 + 1;
        let from = next.max(oldest);
        let held = |at: u64| &self.events[(at - oldest) as usize];
        let halves = split.and_then(|at| held(at).user_event(id(2 * at + 1)));
        let entries = self.events.range((from - oldest) as usize..).zip(from..).flat_map(|(e, at)| {
            let user = e.user_event(id(2 * at + 1));
            let first = e.event(id(if user.is_some() { 2 * at } else { 2 * at + 1 }));
            std::iter::once(first).chain(user)
        });
        // A batch the budget ends between an entry's halves ends on an even id, from which
        // the next read starts with the second half.
        let events = within_batch_budget(halves.into_iter().chain(entries)).collect();
        Batch { missed: from - next, earlier_process, earlier_stream: false, gap_id: id(2 * (from - 1) + 1), events }
    }

    /// The sequence `n` entries before the newest, never before the oldest still held.
    pub(crate) fn recent(&self, n: usize) -> u64 {
        let oldest = self.next_seq - self.events.len() as u64;
        let mut left = n;
        // Back from the newest entry, each one or two events (a session event and the
        // user-level event it caused), until `n` events are counted.
        for (i, logged) in self.events.iter().enumerate().rev() {
            let p = oldest + i as u64;
            if left == 0 {
                return 2 * p + 1;
            }
            let events = 1 + usize::from(logged.causes_user_event());
            if events > left {
                // Only the entry's user-level event: resume after its session event.
                return 2 * p;
            }
            left -= events;
        }
        2 * oldest.saturating_sub(1) + 1
    }

    /// The sequence after the newest event.
    pub(crate) fn last_seq(&self) -> u64 {
        2 * (self.next_seq - 1) + 1
    }
}

#[cfg(test)]
mod footprint {
    use super::*;

    #[test]
    fn a_kept_event_stays_small_and_a_topic_comes_back_whole() {
        // Every logged-in connection keeps its online event: its size is per connection.
        assert!(std::mem::size_of::<Logged>() <= 56, "{} bytes", std::mem::size_of::<Logged>());
        let logged = |kept| Logged { at_ms: 0, uid: 1, kept };
        let id = EventId { ms: 0, seq: 1 };
        let with = logged(Kept::data(Bytes::from_static(b"21.5"), Some("sensors/\u{fc}"))).event(id);
        let What::Data { payload, topic } = with.what else { panic!("{with:?}") };
        assert_eq!((payload.as_ref(), topic.as_deref()), (&b"21.5"[..], Some("sensors/\u{fc}")));
        let without = logged(Kept::data(Bytes::from_static(b"x"), None)).event(id);
        assert!(matches!(without.what, What::Data { topic: None, .. }), "{without:?}");
    }
}

#[cfg(test)]
mod bound {
    use super::*;

    /// Issue 48, defect 6: `--event-log-bytes` counted DATA payloads only, so 20,000
    /// dropped MQTT sessions with 5 KB wills held 102 MiB past a 1 MiB bound. Wills and
    /// claims count now, and the oldest events go to keep the bound.
    #[test]
    fn wills_and_claims_count_against_the_byte_bound() {
        const BOUND: usize = 64 * 1024;
        let mut log = LocalLog::new(1_000_000, BOUND);
        let claims = Some(Arc::new(Claims::from_json(format!(r#"{{"name":"{}"}}"#, "a".repeat(1_000)))));
        for session in 0..200u64 {
            let origin = Some(Box::new(PackedOrigin::pack(crate::presence::Origin::default())));
            log.append(
                session,
                session,
                Kept::Online {
                    session,
                    device: Device::DEFAULT,
                    first: true,
                    timeout_ms: 30_000,
                    claims: claims.clone(),
                    origin,
                },
            );
            let will = Some(Box::new(Will { topic: "status/gone".into(), payload: Bytes::from(vec![b'w'; 5_000]) }));
            let offline = Kept::Offline {
                session,
                device: Device::DEFAULT,
                reason: CloseReason::Disconnect,
                last: true,
                will,
                claims: claims.clone(),
            };
            log.append(session, session, offline);
        }
        assert!(log.bytes <= BOUND, "{} bytes held", log.bytes);
        assert!(log.len() < 40, "the oldest went: {} events held", log.len());
        let held: usize = log.events.iter().map(Logged::held_bytes).sum();
        assert_eq!(held, log.bytes, "the count is what the events hold");
    }
}

#[cfg(test)]
mod tail {
    use super::*;

    /// `?tail=n` is n events, whether or not a session event caused a user-level one.
    #[test]
    fn recent_counts_events_not_entries() {
        let mut log = LocalLog::new(100, 1 << 20);
        let online = Kept::Online {
            session: 1,
            device: Device::DEFAULT,
            first: true,
            timeout_ms: 30_000,
            claims: None,
            origin: None,
        };
        log.append(1, 7, online);
        log.append(2, 7, Kept::data(Bytes::from_static(b"d"), None));
        let offline = Kept::Offline {
            session: 1,
            device: Device::DEFAULT,
            reason: CloseReason::Logout,
            last: true,
            will: None,
            claims: None,
        };
        log.append(3, 7, offline);
        let names = |n: usize| -> Vec<&'static str> {
            let after = EventId { ms: 9, seq: log.recent(n) };
            log.read(after, 9).events.iter().map(|e| e.what.name()).collect()
        };
        assert_eq!(names(0), Vec::<&str>::new());
        assert_eq!(names(1), ["user_offline"]);
        assert_eq!(names(2), ["offline", "user_offline"]);
        assert_eq!(names(3), ["data", "offline", "user_offline"]);
        assert_eq!(names(4), ["user_online", "data", "offline", "user_offline"]);
        assert_eq!(names(5), ["online", "user_online", "data", "offline", "user_offline"]);
        assert_eq!(names(50).len(), 5, "no more than the log holds");
    }
}

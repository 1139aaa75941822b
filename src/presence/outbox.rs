//! Pushes waiting for their connection, one queue per session, held only while a push is
//! pending: an idle session costs no queue, and a burst of pushes costs what it queues.
//!
//! The pusher queues and wakes the session; the connection task takes the whole queue and
//! writes it. A session that ended gets nothing queued, and a push that raced with the end
//! is taken back by its pusher, so no queue outlives its session.

use std::sync::Arc;

use bytes::Bytes;
use dashmap::DashMap;
use foldhash::fast::RandomState;

use crate::presence::Session;

/// Bytes a PUSH frame adds around its payload: the length prefix and the kind byte.
const PUSH_OVERHEAD: usize = 5;

/// One push from the backend: its payload, and the topic an MQTT session receives it on
/// (`POST /v1/push`'s `topic`, by default `--mqtt-push-topic`); other doors send only the
/// payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Push {
    pub topic: Arc<str>,
    pub payload: Bytes,
}

/// Whom one push reached of one uid's sessions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reach {
    /// Sessions it was handed to.
    pub sessions: usize,
    /// Live MQTT sessions that did not take it: none of their subscriptions matches its topic.
    pub unsubscribed: usize,
}

/// What [`Outboxes::push`] did with a payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    /// Queued for the connection, which writes it next.
    Queued,
    /// The session has ended; nothing was queued.
    Ended,
    /// The queue is over its bound: the client does not read. Nothing was queued.
    Full,
}

/// Every session's pending pushes; see the module documentation.
#[derive(Debug, Default)]
pub struct Outboxes {
    /// Session id -> payloads not yet taken by its connection, oldest first.
    queued: DashMap<u64, Vec<Push>, RandomState>,
}

/// Bytes `push` takes written to `session`'s connection: a PUSH frame, or (an MQTT session)
/// a PUBLISH on its topic. WebSocket's message header (at most 10 bytes) is not counted.
fn encoded_len(session: &Session, push: &Push) -> usize {
    if session.filters_pushes() {
        crate::proto::mqtt::publish_len(push.topic.len(), push.payload.len(), true)
    } else {
        PUSH_OVERHEAD + push.payload.len()
    }
}

// === impl Outboxes ===

impl Outboxes {
    /// Queues `push` for `session` unless it has ended or the queue would pass `max_queued`
    /// bytes as its door writes them (an MQTT session's PUBLISH carries the topic in every
    /// copy), and wakes its connection.
    pub fn push(&self, session: &Session, push: &Push, max_queued: usize) -> Pushed {
        if !session.is_live() {
            return Pushed::Ended;
        }
        {
            let mut queue = self.queued.entry(session.id()).or_default();
            let queued: usize = queue.iter().map(|p| encoded_len(session, p)).sum();
            if queued + encoded_len(session, push) > max_queued {
                return Pushed::Full;
            }
            queue.push(push.clone());
        }
        if !session.is_live() {
            // Ended while we queued: its connection may already have taken its last pushes.
            self.queued.remove(&session.id());
            return Pushed::Ended;
        }
        session.wake();
        Pushed::Queued
    }

    /// Takes every push queued for `session`, oldest first.
    pub fn take(&self, session: &Session) -> Vec<Push> {
        self.queued.remove(&session.id()).map(|(_, queue)| queue).unwrap_or_default()
    }

    /// Sessions with pushes pending.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.queued.len()
    }

    /// True when no push is pending.
    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.queued.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::CloseReason;

    fn push(payload: &'static [u8]) -> Push {
        Push { topic: Arc::from("t"), payload: Bytes::from_static(payload) }
    }

    #[test]
    fn queues_exist_only_while_pushes_are_pending() {
        let outboxes = Outboxes::default();
        let s = Session::new(1, 7, 0, crate::presence::Handle::NONE);
        assert_eq!(outboxes.push(&s, &push(b"a"), 100), Pushed::Queued);
        assert_eq!(outboxes.push(&s, &push(b"b"), 100), Pushed::Queued);
        assert_eq!(outboxes.len(), 1);
        assert_eq!(outboxes.take(&s), [push(b"a"), push(b"b")]);
        assert!(outboxes.is_empty());
        assert!(outboxes.take(&s).is_empty());
    }

    #[test]
    fn a_full_queue_refuses_and_an_ended_session_gets_nothing() {
        let outboxes = Outboxes::default();
        let s = Session::new(1, 7, 0, crate::presence::Handle::NONE);
        let ten = push(b"0123456789");
        assert_eq!(outboxes.push(&s, &ten, 30), Pushed::Queued);
        assert_eq!(outboxes.push(&s, &ten, 30), Pushed::Queued);
        assert_eq!(outboxes.push(&s, &ten, 30), Pushed::Full);
        assert_eq!(outboxes.take(&s).len(), 2);
        s.end(CloseReason::Logout);
        assert_eq!(outboxes.push(&s, &ten, 30), Pushed::Ended);
        assert!(outboxes.is_empty());
    }

    /// An MQTT session is sent the topic with every push: a long topic fills its queue.
    #[test]
    fn an_mqtt_session_s_queue_counts_the_topic_of_every_push() {
        let outboxes = Outboxes::default();
        let mqtt = Session::new(1, 7, 0, crate::presence::Handle::NONE).filtering_pushes();
        let long = Push { topic: Arc::from("t".repeat(1_000)), payload: Bytes::from_static(b"0123456789") };
        // 1 + 2 (the remaining length) + 2 + 1,000 + 1 + 10 = 1,016 bytes a PUBLISH.
        for _ in 0..4 {
            assert_eq!(outboxes.push(&mqtt, &long, 5_000), Pushed::Queued);
        }
        assert_eq!(outboxes.push(&mqtt, &long, 5_000), Pushed::Full);
    }
}

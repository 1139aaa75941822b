//! Which pushes an MQTT session takes: its subscriptions' topic filters, by session id.
//!
//! A session of the idlegate protocol takes every push, as it always has, and has no entry
//! here. An MQTT session takes a push only when one of its filters matches the push's topic
//! (`POST /v1/push`'s `topic`); a push it does not take is not counted as reaching it. The
//! filters live here, not in the connection, because the push's answer is decided where the
//! push is queued, before any connection sees it. An MQTT session with no subscription has
//! no entry either: it is marked on the session itself ([`crate::presence::Session::filters_pushes`]),
//! so an idle device costs this map nothing.

use std::collections::HashSet;

use dashmap::DashMap;
use foldhash::fast::RandomState;

use crate::proto::mqtt::{publish_len, topic_matches};

/// Every MQTT session's topic filters; see the module documentation.
#[derive(Debug, Default)]
pub struct Subscriptions {
    /// Session id -> its filters, a set: a SUBSCRIBE costs what it adds, never a scan of
    /// what the session already holds (that scan, under the shard's lock, let one session
    /// with a few hundred thousand filters delay everyone's ticks).
    filters: DashMap<u64, Held, RandomState>,
}

/// One session's filters, and the largest packet its client takes.
#[derive(Debug)]
struct Held {
    filters: HashSet<Box<str>, RandomState>,
    /// MQTT 5's Maximum Packet Size from its CONNECT (`u32::MAX` when it named none): a push
    /// whose PUBLISH would be larger is not for this session ([MQTT-3.1.2-24]).
    max_packet: u32,
}

// === impl Subscriptions ===

impl Subscriptions {
    /// Adds `filters` to session `id`'s, holding at most `max` in all, for a client that
    /// takes packets of up to `max_packet` bytes; returns, filter by filter, whether the
    /// session holds it now (one held already is granted again; a new one past `max` is
    /// refused).
    pub fn subscribe(&self, id: u64, filters: &[String], max: usize, max_packet: u32) -> Vec<bool> {
        let mut entry = self.filters.entry(id).or_insert_with(|| Held { filters: HashSet::default(), max_packet });
        let held = &mut entry.value_mut().filters;
        let granted = filters
            .iter()
            .map(|filter| held.contains(filter.as_str()) || (held.len() < max && held.insert(filter.as_str().into())))
            .collect();
        debug_assert!(held.len() <= max.max(1), "session {id} holds {} filters, over {max}", held.len());
        let empty = held.is_empty();
        drop(entry);
        if empty {
            self.filters.remove_if(&id, |_, held| held.filters.is_empty());
        }
        granted
    }

    /// Takes `filters` out of session `id`'s; the entry goes with its last filter.
    pub fn unsubscribe(&self, id: u64, filters: &[String]) {
        self.filters.remove_if_mut(&id, |_, held| {
            for gone in filters {
                held.filters.remove(gone.as_str());
            }
            held.filters.is_empty()
        });
    }

    /// Forgets session `id`, whose connection has closed.
    pub fn forget(&self, id: u64) {
        self.filters.remove(&id);
    }

    /// Whether session `id` takes a push of `payload_len` bytes on `topic`: one of its
    /// filters matches, and its PUBLISH fits the client's Maximum Packet Size.
    pub fn takes(&self, id: u64, topic: &str, payload_len: usize) -> bool {
        self.filters.get(&id).is_some_and(|held| {
            publish_len(topic.len(), payload_len, true) <= held.max_packet as usize
                && held.filters.iter().any(|f| topic_matches(topic, f))
        })
    }

    /// Sessions holding a subscription.
    pub fn len(&self) -> usize {
        self.filters.len()
    }

    /// True when no session holds a subscription.
    pub fn is_empty(&self) -> bool {
        self.filters.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn filters_are_kept_once_and_go_with_their_last_one() {
        let subs = Subscriptions::default();
        assert!(!subs.takes(7, "idlegate/push", 0), "no subscription: nothing matches");
        subs.subscribe(7, &strings(&["idlegate/+", "alerts/#"]), 8, u32::MAX);
        subs.subscribe(7, &strings(&["idlegate/+"]), 8, u32::MAX);
        assert!(subs.takes(7, "idlegate/push", 0));
        assert!(subs.takes(7, "alerts/fire/now", 0));
        assert!(!subs.takes(8, "idlegate/push", 0), "another session's filters are its own");
        subs.unsubscribe(7, &strings(&["idlegate/+"]));
        assert!(!subs.takes(7, "idlegate/push", 0), "unsubscribed once, gone, though subscribed twice");
        assert_eq!(subs.len(), 1);
        subs.unsubscribe(7, &strings(&["alerts/#", "never/held"]));
        assert!(subs.is_empty(), "the entry goes with its last filter");
        subs.subscribe(9, &strings(&["#"]), 8, u32::MAX);
        subs.forget(9);
        assert!(subs.is_empty());
    }

    #[test]
    fn a_session_holds_at_most_its_bound_and_held_filters_are_granted_again() {
        let subs = Subscriptions::default();
        assert_eq!(subs.subscribe(7, &strings(&["a", "b", "c"]), 2, u32::MAX), [true, true, false]);
        assert_eq!(subs.subscribe(7, &strings(&["b", "d", "a"]), 2, u32::MAX), [true, false, true]);
        assert!(!subs.takes(7, "c", 0) && !subs.takes(7, "d", 0));
        subs.unsubscribe(7, &strings(&["a"]));
        assert_eq!(subs.subscribe(7, &strings(&["d"]), 2, u32::MAX), [true], "room again after an UNSUBSCRIBE");
        assert_eq!(subs.subscribe(8, &strings(&["x"]), 0, u32::MAX), [false]);
        assert_eq!(subs.len(), 1, "a session refused everything holds no entry");
    }

    #[test]
    fn a_push_over_the_client_s_maximum_packet_size_is_not_taken() {
        let subs = Subscriptions::default();
        // A PUBLISH on "t" with n payload bytes is 6 + n bytes whole (MQTT 5).
        subs.subscribe(7, &strings(&["t"]), 8, 16);
        assert!(subs.takes(7, "t", 10));
        assert!(!subs.takes(7, "t", 11));
        assert!(!subs.takes(7, "u", 1), "and a filter must match");
    }
}

//! Which pushes an MQTT session takes: its subscriptions' topic filters, by session id.
//!
//! A session of the idlegate protocol takes every push, as it always has, and has no entry
//! here. An MQTT session takes a push only when one of its filters matches the push's topic
//! (`POST /v1/push`'s `topic`); a push it does not take is not counted as reaching it. The
//! filters live here, not in the connection, because the push's answer is decided where the
//! push is queued, before any connection sees it. An MQTT session with no subscription has
//! no entry either: it is marked on the session itself ([`crate::presence::Session::filters_pushes`]),
//! so an idle device costs this map nothing.

use dashmap::DashMap;
use foldhash::fast::RandomState;

use crate::proto::mqtt::topic_matches;

/// Every MQTT session's topic filters; see the module documentation.
#[derive(Debug, Default)]
pub struct Subscriptions {
    /// Session id -> its filters, each once, in the order first subscribed.
    filters: DashMap<u64, Box<[Box<str>]>, RandomState>,
}

// === impl Subscriptions ===

impl Subscriptions {
    /// Adds `filters` to session `id`'s (a filter it holds already stays once).
    pub fn subscribe(&self, id: u64, filters: &[String]) {
        let mut entry = self.filters.entry(id).or_default();
        let mut all = std::mem::take(entry.value_mut()).into_vec();
        for filter in filters {
            if !all.iter().any(|f| **f == **filter) {
                all.push(filter.as_str().into());
            }
        }
        *entry.value_mut() = all.into_boxed_slice();
    }

    /// Takes `filters` out of session `id`'s; the entry goes with its last filter.
    pub fn unsubscribe(&self, id: u64, filters: &[String]) {
        self.filters.remove_if_mut(&id, |_, held| {
            let mut all = std::mem::take(held).into_vec();
            all.retain(|f| !filters.iter().any(|gone| **gone == **f));
            *held = all.into_boxed_slice();
            held.is_empty()
        });
    }

    /// Forgets session `id`, whose connection has closed.
    pub fn forget(&self, id: u64) {
        self.filters.remove(&id);
    }

    /// Whether one of session `id`'s filters matches `topic`.
    pub fn matches(&self, id: u64, topic: &str) -> bool {
        self.filters.get(&id).is_some_and(|filters| filters.iter().any(|f| topic_matches(topic, f)))
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
        assert!(!subs.matches(7, "idlegate/push"), "no subscription: nothing matches");
        subs.subscribe(7, &strings(&["idlegate/+", "alerts/#"]));
        subs.subscribe(7, &strings(&["idlegate/+"]));
        assert!(subs.matches(7, "idlegate/push"));
        assert!(subs.matches(7, "alerts/fire/now"));
        assert!(!subs.matches(8, "idlegate/push"), "another session's filters are its own");
        subs.unsubscribe(7, &strings(&["idlegate/+"]));
        assert!(!subs.matches(7, "idlegate/push"), "unsubscribed once, gone, though subscribed twice");
        assert_eq!(subs.len(), 1);
        subs.unsubscribe(7, &strings(&["alerts/#", "never/held"]));
        assert!(subs.is_empty(), "the entry goes with its last filter");
        subs.subscribe(9, &strings(&["#"]));
        subs.forget(9);
        assert!(subs.is_empty());
    }
}

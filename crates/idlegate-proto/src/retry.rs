//! Retry hints: when a client told to go away should come back.
//!
//! BYE(server_full) and BYE(shutdown) carry `retry_after_ms=<n>` at the start of their text
//! (then, optionally, `; ` and words for humans). Each hint is drawn at random over a spread,
//! so a fleet refused or shut out at the same moment comes back over seconds, not in one
//! instant that would refuse it again.

use std::hash::BuildHasher;
use std::time::Duration;

/// Prefix of a BYE text that carries a retry hint.
pub const RETRY_HINT: &str = "retry_after_ms=";

/// Shortest wait a refused client is told: long enough for the gateway to drain what it is
/// busy with.
pub const REFUSED_RETRY_BASE: Duration = Duration::from_secs(1);

/// Spread of refused clients' waits beyond the base.
pub const REFUSED_RETRY_SPREAD: Duration = Duration::from_secs(2);

/// Shortest wait a client is told at shutdown: a restart takes about this long.
pub const SHUTDOWN_RETRY_BASE: Duration = Duration::from_secs(1);

/// Spread of the waits at shutdown: 19,000 clients coming back over ten seconds are about
/// 2,000 logins a second, well within one gateway's rate.
pub const SHUTDOWN_RETRY_SPREAD: Duration = Duration::from_secs(10);

/// A BYE text with a retry hint of `ms` milliseconds and `text` for humans.
pub fn retry_text(ms: u64, text: &str) -> String {
    if text.is_empty() {
        format!("{RETRY_HINT}{ms}")
    } else {
        format!("{RETRY_HINT}{ms}; {text}")
    }
}

/// The retry hint a BYE text carries, if any.
pub fn retry_hint(text: &str) -> Option<u64> {
    let rest = text.strip_prefix(RETRY_HINT)?;
    rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// `base` plus a uniformly random share of `spread`, in milliseconds.
pub fn jittered_ms(base: Duration, spread: Duration) -> u64 {
    let random = std::hash::RandomState::new().hash_one(0u8);
    let spread_ms = spread.as_millis() as u64;
    base.as_millis() as u64 + if spread_ms == 0 { 0 } else { random % spread_ms }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_hints_round_trip_and_plain_texts_have_none() {
        assert_eq!(retry_hint(&retry_text(1500, "busy")), Some(1500));
        assert_eq!(retry_hint(&retry_text(0, "")), Some(0));
        assert_eq!(retry_hint("10 connections open"), None);
        assert_eq!(retry_hint("retry_after_ms=x"), None);
    }

    #[test]
    fn jitter_stays_in_its_spread_and_spreads() {
        let hints: Vec<u64> = (0..1000).map(|_| jittered_ms(Duration::from_secs(1), Duration::from_secs(10))).collect();
        assert!(hints.iter().all(|&h| (1000..11_000).contains(&h)));
        let distinct: std::collections::BTreeSet<u64> = hints.iter().map(|h| h / 1000).collect();
        assert_eq!(distinct.len(), 10, "every second of the spread is used: {distinct:?}");
    }
}

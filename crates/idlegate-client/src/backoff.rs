//! When to try again: full-jitter exponential backoff that never comes back before the
//! gateway's retry hint.
//!
//! A fleet cut off at the same instant (a gateway restart, a network blip) must not come
//! back at the same instant. Attempt `n` waits a uniformly random time in
//! `[0, min(cap, base * 2^n)]` ("full jitter"), so the fleet spreads over the whole window
//! rather than bunching at its edges; and when the gateway said `retry_after_ms` (its BYE
//! at shutdown or when full, itself drawn at random over a spread), the wait is at least
//! that.

use std::time::Duration;

/// Default first window: a lone client that lost its connection is back within a second
/// (half a second on average), and a fleet cut off at once with no hint (a gateway killed)
/// spreads its first attempts over that second. Half a second was measured to bring a
/// killed gateway's 19,000 clients back all within one second: some before its successor
/// listened, some reset by its overflowing accept queue (docs/BENCHMARKS.md, section 7).
pub const DEFAULT_BASE: Duration = Duration::from_secs(1);

/// Default largest window: a client of a gateway that is down for long tries about twice a
/// minute, and a fleet of 20,000 then costs a gateway under 700 connects a second.
pub const DEFAULT_CAP: Duration = Duration::from_secs(30);

/// The reconnect policy: full-jitter exponential backoff; see the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Window of the first attempt after a loss.
    pub base: Duration,
    /// Largest window, however many attempts failed.
    pub cap: Duration,
}

// === impl Backoff ===

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff { base: DEFAULT_BASE, cap: DEFAULT_CAP }
    }
}

impl Backoff {
    /// The window of attempt `attempt` (0 for the first after a loss): `min(cap, base *
    /// 2^attempt)`.
    pub fn window(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// The wait before attempt `attempt`, given the gateway's hint if it gave one, for a
    /// random `unit` in `[0, 1)`: pure, so the arithmetic is tested without chance.
    pub fn delay_at(&self, attempt: u32, hint: Option<Duration>, unit: f64) -> Duration {
        debug_assert!((0.0..1.0).contains(&unit), "unit={unit}");
        let jittered = self.window(attempt).mul_f64(unit);
        hint.map_or(jittered, |hint| jittered.max(hint))
    }

    /// The wait before attempt `attempt`, drawn at random.
    pub fn delay(&self, attempt: u32, hint: Option<Duration>) -> Duration {
        self.delay_at(attempt, hint, fastrand::f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_double_up_to_the_cap_and_never_overflow() {
        let b = Backoff { base: Duration::from_millis(100), cap: Duration::from_secs(5) };
        let windows: Vec<u128> = (0..8).map(|n| b.window(n).as_millis()).collect();
        assert_eq!(windows, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        assert_eq!(b.window(u32::MAX), Duration::from_secs(5));
        assert_eq!(Backoff { base: Duration::MAX, cap: Duration::MAX }.window(40), Duration::MAX);
    }

    #[test]
    fn delays_fill_the_window_and_never_undercut_a_hint() {
        let b = Backoff::default();
        assert_eq!(b.delay_at(0, None, 0.0), Duration::ZERO);
        assert_eq!(b.delay_at(0, None, 0.5), Duration::from_millis(500));
        assert_eq!(b.delay_at(3, None, 0.5), Duration::from_secs(4));
        let hint = Some(Duration::from_millis(4_200));
        assert_eq!(b.delay_at(0, hint, 0.999), Duration::from_millis(4_200), "the hint is the floor");
        assert_eq!(b.delay_at(4, hint, 0.5), Duration::from_secs(8), "a longer draw wins");
    }

    #[test]
    fn random_delays_spread_over_the_whole_window() {
        let b = Backoff { base: Duration::from_secs(1), cap: Duration::from_secs(1) };
        let tenths: std::collections::BTreeSet<u128> = (0..2_000).map(|_| b.delay(0, None).as_millis() / 100).collect();
        assert_eq!(tenths.into_iter().collect::<Vec<_>>(), (0..10).collect::<Vec<_>>());
    }
}

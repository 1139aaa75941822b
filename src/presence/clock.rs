//! Time, in the two forms the gateway uses, and nothing else converts between them.
//!
//! - [`Clock`]: monotonic tokio time as ring ticks, for expiry. A wall-clock jump moves
//!   neither the ring nor anyone's deadline.
//! - [`unix_ms`]: the wall clock, for event timestamps and `since_ms` only (token expiry
//!   reads it through `proto`'s `unix_now`).
//!
//! As tokio keeps `runtime/time/source.rs` apart from its wheel, the ring never sees an
//! `Instant`: callers ask the clock which tick it is.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// Converts between tokio instants and ring ticks; see the module documentation.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    start: Instant,
    tick: Duration,
    /// `tick` in nanoseconds, so the per-frame division is a 64-bit one (a 128-bit division
    /// is a library call, several times slower).
    tick_nanos: u64,
}

// === impl Clock ===

impl Clock {
    /// Tick 0 starts at `start`; each tick lasts `tick`.
    pub fn new(start: Instant, tick: Duration) -> Clock {
        assert!(!tick.is_zero(), "a tick must last some time");
        let tick_nanos = u64::try_from(tick.as_nanos()).expect("a tick shorter than 584 years");
        Clock { start, tick, tick_nanos }
    }

    /// The tick a frame read now belongs to.
    pub fn now(&self) -> u64 {
        self.tick_at(Instant::now())
    }

    /// The tick `at` falls in.
    pub fn tick_at(&self, at: Instant) -> u64 {
        // 2^64 ns is 584 years of uptime: saturating there changes nothing real.
        let since = u64::try_from(at.saturating_duration_since(self.start).as_nanos()).unwrap_or(u64::MAX);
        since / self.tick_nanos
    }

    /// When tick `tick` begins.
    pub fn instant_of(&self, tick: u64) -> Instant {
        self.start + self.ticks(tick)
    }

    /// Milliseconds from tick 0 to `at` (0 before it): a deadline in one word.
    pub fn millis_at(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.start).as_millis()).unwrap_or(u64::MAX)
    }

    /// The instant `ms` milliseconds after tick 0.
    pub fn instant_of_millis(&self, ms: u64) -> Instant {
        self.start + Duration::from_millis(ms)
    }

    /// The first tick to begin at or after the wall-clock moment `at_unix_ms`, reckoned from
    /// `now`, which the wall clock read as `now_unix_ms`: where a token's expiry falls on the
    /// ring's ticks. A later wall-clock jump moves it no more than it moves anything else
    /// the ticks keep; a moment already past is the current tick's end.
    pub fn first_tick_at_or_after_unix(&self, now: Instant, now_unix_ms: u64, at_unix_ms: u64) -> u64 {
        let at = now + Duration::from_millis(at_unix_ms.saturating_sub(now_unix_ms));
        let since = u64::try_from(at.saturating_duration_since(self.start).as_nanos()).unwrap_or(u64::MAX);
        since.div_ceil(self.tick_nanos).max(self.tick_at(now) + 1)
    }

    /// How long one tick lasts.
    pub fn tick(&self) -> Duration {
        self.tick
    }

    /// The duration of `n` ticks.
    pub fn ticks(&self, n: u64) -> Duration {
        let nanos = self.tick.as_nanos().saturating_mul(u128::from(n));
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// Whole seconds in `n` ticks, for the per-second silence series.
    pub fn whole_seconds(&self, n: u64) -> u64 {
        self.ticks(n).as_secs()
    }

    /// Time since tick `tick` began: the longest a uid last heard on that tick can have been
    /// silent, at most one tick more than it was.
    pub fn since(&self, tick: u64) -> Duration {
        Instant::now().saturating_duration_since(self.instant_of(tick))
    }
}

/// Milliseconds since the Unix epoch, for event timestamps (wall-clock time, unlike ticks).
pub fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_converts_both_ways() {
        let start = Instant::now();
        let clock = Clock::new(start, Duration::from_millis(100));
        for tick in [0u64, 1, 7, 1_000_000] {
            let at = clock.instant_of(tick);
            assert_eq!(clock.tick_at(at), tick);
            assert_eq!(clock.tick_at(at + Duration::from_millis(99)), tick);
        }
        assert_eq!(clock.whole_seconds(299), 29);
    }

    #[test]
    fn a_wall_clock_moment_falls_on_the_first_tick_at_or_after_it() {
        let start = Instant::now();
        let clock = Clock::new(start, Duration::from_millis(1000));
        let now = start + Duration::from_millis(2500);
        let unix = 1_700_000_000_000;
        // 10.5 s on: tick 13 begins 0.5 s after it, at 13 s.
        assert_eq!(clock.first_tick_at_or_after_unix(now, unix, unix + 10_500), 13);
        // On a boundary: that tick.
        assert_eq!(clock.first_tick_at_or_after_unix(now, unix, unix + 500), 3);
        // Already past: the next tick.
        assert_eq!(clock.first_tick_at_or_after_unix(now, unix, unix - 5_000), 3);
    }
}

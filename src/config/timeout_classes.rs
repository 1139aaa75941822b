//! Timeout classes: the few timeouts sessions may have, each a ring of its own.
//!
//! `--timeout` is the default class; `--timeout-classes` (or, by default, a set spaced by
//! at most [`DEFAULT_SPACING`] from `--min-timeout` to `--max-timeout`) the others. A
//! session asks for a timeout (a LOGIN's field, an MQTT keepalive) and gets a class: never a
//! timer of its own, so expiry stays one ring slot a tick per class.
//!
//! Everything here is in ticks and milliseconds; the rings (`presence::class_rings`) know
//! classes only by their index, [`Class`].

use std::time::Duration;

use crate::error::ConfigError;

/// Default `--min-timeout`: below it a phone or a device pings so often that its radio
/// never sleeps, and the gateway does a ring move per client every few ticks.
pub const DEFAULT_MIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Default `--max-timeout`: the longest battery-saving keepalives devices use (MQTT
/// firmware up to 20 min, push channels of phones up to about half an hour).
pub const DEFAULT_MAX_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// Most classes a gateway may have: each tick advances one ring per class in every shard, so
/// their number bounds the sweep's fixed cost, and an index fits a byte.
pub const MAX_CLASSES: usize = 64;

/// Ratio between neighbouring classes of the default set, at most: a session that asks for
/// a timeout gets at most 25 % more, and every MQTT keepalive K within the bounds finds a
/// class in `[K + tick, 1.5 K]` (the spec's limit is 1.5 K; 1.5 / 1.25 leaves room for the
/// tick).
pub const DEFAULT_SPACING: f64 = 1.25;

/// A timeout class: an index into [`TimeoutClasses`], shortest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Class(u8);

impl Class {
    /// The shortest class, which every gateway has.
    pub const FIRST: Class = Class(0);

    /// The class's index, shortest class first.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// The classes a gateway runs with, shortest first, in ticks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimeoutClasses {
    /// Each class's timeout in ticks, strictly increasing; at least one.
    windows: Box<[u64]>,
    tick_ms: u64,
    /// The class of `--timeout`: what a session that asks for nothing gets.
    default: Class,
}

impl TimeoutClasses {
    /// One class only: `timeout`, every session's.
    pub fn single(timeout: Duration, tick: Duration) -> TimeoutClasses {
        let tick_ms = tick.as_millis().max(1) as u64;
        let window = (timeout.as_millis() as u64 / tick_ms).max(1);
        TimeoutClasses { windows: Box::new([window]), tick_ms, default: Class(0) }
    }

    /// The classes of `--timeout-classes` (`listed`, or the default set between `min` and
    /// `max` when empty) with `timeout` among them, checked: each a whole multiple of the
    /// tick within `[min, max]`, at most `max_window` ticks, at most [`MAX_CLASSES`].
    pub fn new(
        timeout: Duration,
        tick: Duration,
        min: Duration,
        max: Duration,
        listed: &[Duration],
        max_window: u64,
    ) -> Result<TimeoutClasses, ConfigError> {
        let tick_ms = tick.as_millis() as u64;
        if tick_ms == 0 {
            return Err(ConfigError::new("--tick", "must be at least 1ms"));
        }
        let ticks_of = |flag: &'static str, d: Duration| -> Result<u64, ConfigError> {
            if d.is_zero() || !d.as_nanos().is_multiple_of(tick.as_nanos()) {
                return Err(ConfigError::new(
                    flag,
                    format!("{d:?} is not a whole multiple (at least 1x) of the tick, {tick:?}"),
                ));
            }
            let ticks = (d.as_nanos() / tick.as_nanos()) as u64;
            if ticks > max_window {
                return Err(ConfigError::new(
                    flag,
                    format!("{d:?} is {ticks} ticks; a ring holds at most {max_window}: use a longer tick"),
                ));
            }
            Ok(ticks)
        };
        let (lo, hi) = (ticks_of("--min-timeout", min)?, ticks_of("--max-timeout", max)?);
        if lo > hi {
            return Err(ConfigError::new("--min-timeout", format!("{min:?} is above --max-timeout ({max:?})")));
        }
        let default = ticks_of("--timeout", timeout)?;
        if !(lo..=hi).contains(&default) {
            return Err(ConfigError::new(
                "--timeout",
                format!("{timeout:?} is outside --min-timeout and --max-timeout ({min:?} to {max:?})"),
            ));
        }
        let mut windows = Vec::new();
        if listed.is_empty() {
            windows = spaced(lo, hi);
        } else {
            for &d in listed {
                let w = ticks_of("--timeout-classes", d)?;
                if !(lo..=hi).contains(&w) {
                    return Err(ConfigError::new(
                        "--timeout-classes",
                        format!("{d:?} is outside --min-timeout and --max-timeout ({min:?} to {max:?})"),
                    ));
                }
                windows.push(w);
            }
            // The bounds are classes too: a session asking for less or more gets them.
            windows.extend([lo, hi]);
        }
        windows.push(default);
        windows.sort_unstable();
        windows.dedup();
        if windows.len() > MAX_CLASSES {
            return Err(ConfigError::new(
                "--timeout-classes",
                format!("{} classes; at most {MAX_CLASSES} (each costs a ring sweep a tick)", windows.len()),
            ));
        }
        let default = Class(windows.binary_search(&default).unwrap_or(0) as u8);
        Ok(TimeoutClasses { windows: windows.into_boxed_slice(), tick_ms, default })
    }

    /// How many classes there are.
    pub fn len(&self) -> usize {
        self.windows.len()
    }

    /// Always false: there is at least one class.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Every class, shortest first.
    pub fn iter(&self) -> impl Iterator<Item = Class> + '_ {
        (0..self.windows.len()).map(|i| Class(i as u8))
    }

    /// The class of `--timeout`.
    pub fn default_class(&self) -> Class {
        self.default
    }

    /// A class's timeout in ticks: its ring's window.
    pub fn window(&self, class: Class) -> u64 {
        self.windows[class.index()]
    }

    /// A class's timeout in milliseconds, as WELCOME and the events carry it.
    pub fn timeout_ms(&self, class: Class) -> u64 {
        self.window(class) * self.tick_ms
    }

    /// The longest class's window, in ticks.
    pub fn longest_window(&self) -> u64 {
        self.windows[self.windows.len() - 1]
    }

    /// The class a session asking for `asked_ms` gets: the shortest at or above it, but
    /// never above `cap_ms` (a token's cap): then the longest at or below the cap, or the
    /// shortest class when even that is above the cap. Below the shortest class a session
    /// gets the shortest; above the longest, the longest.
    pub fn for_asked(&self, asked_ms: u64, cap_ms: Option<u64>) -> Class {
        let at_or_above = self.windows.partition_point(|&w| w * self.tick_ms < asked_ms).min(self.windows.len() - 1);
        let mut class = at_or_above;
        if let Some(cap) = cap_ms {
            while class > 0 && self.windows[class] * self.tick_ms > cap {
                class -= 1;
            }
        }
        Class(class as u8)
    }

    /// The class for an MQTT keepalive of `keep_alive_s` seconds, if one fits: the longest
    /// class that still expires the client within 1.5 times its keepalive
    /// ([MQTT-3.1.2-24]) and never while it keeps its keepalive (at least a tick above it,
    /// since a session goes offline after more than its timeout minus a tick of silence).
    pub fn for_keep_alive(&self, keep_alive_s: u16, cap_ms: Option<u64>) -> Option<Class> {
        let k_ms = u64::from(keep_alive_s) * 1000;
        if k_ms == 0 {
            return None;
        }
        let (lo, hi) = (k_ms + self.tick_ms, k_ms * 3 / 2);
        let hi = cap_ms.map_or(hi, |cap| hi.min(cap));
        (0..self.windows.len())
            .rev()
            .map(|i| (i, self.windows[i] * self.tick_ms))
            .find(|&(_, ms)| ms >= lo && ms <= hi)
            .map(|(i, _)| Class(i as u8))
    }

    /// The keepalive, in seconds, that a class holds an MQTT 5 client to when the gateway
    /// chooses it (Server Keep Alive): the shortest whose 1.5 times reaches the class's
    /// timeout, so the class disconnects within what the spec allows, and pinging on it
    /// keeps the client online (it is at least a tick below the timeout).
    pub fn keep_alive_for(&self, class: Class) -> u16 {
        self.keep_alive_for_ms(self.timeout_ms(class))
    }

    /// [`TimeoutClasses::keep_alive_for`] of a timeout in milliseconds.
    pub fn keep_alive_for_ms(&self, ms: u64) -> u16 {
        let k = (ms * 2).div_ceil(3).div_ceil(1000);
        let k = k.min((ms.saturating_sub(self.tick_ms)) / 1000).max(1);
        u16::try_from(k).unwrap_or(u16::MAX)
    }

    /// Whether a client keeping an MQTT keepalive of `keep_alive_s` is held to it by a
    /// timeout of `ms`: never expired while it keeps it, and within 1.5 times it when silent.
    pub fn holds_keep_alive(&self, keep_alive_s: u16, ms: u64) -> bool {
        let k_ms = u64::from(keep_alive_s) * 1000;
        k_ms > 0 && k_ms + self.tick_ms <= ms && ms <= k_ms * 3 / 2
    }

    /// The shortest class's timeout and the longest's, in milliseconds.
    pub fn bounds_ms(&self) -> (u64, u64) {
        (self.windows[0] * self.tick_ms, self.longest_window() * self.tick_ms)
    }

    /// The tick in milliseconds.
    pub fn tick_ms(&self) -> u64 {
        self.tick_ms
    }
}

/// The default set from `lo` to `hi` ticks: each class the largest whole tick count at most
/// [`DEFAULT_SPACING`] times the one before (a tick more when that is the same), so
/// neighbours are never further apart than the spacing.
fn spaced(lo: u64, hi: u64) -> Vec<u64> {
    let mut windows = vec![lo];
    let mut w = lo;
    while w < hi {
        let next = ((w as f64 * DEFAULT_SPACING).floor() as u64).max(w + 1).min(hi);
        windows.push(next);
        w = next;
    }
    windows
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn defaults() -> TimeoutClasses {
        TimeoutClasses::new(30 * S, S, DEFAULT_MIN_TIMEOUT, DEFAULT_MAX_TIMEOUT, &[], 100_000).unwrap()
    }

    #[test]
    fn the_default_set_is_spaced_by_at_most_a_quarter_and_holds_the_timeout() {
        let c = defaults();
        let ms: Vec<u64> = c.iter().map(|k| c.timeout_ms(k)).collect();
        assert_eq!(ms[0], 5_000);
        assert_eq!(*ms.last().unwrap(), 1_800_000);
        assert!(ms.contains(&30_000));
        assert_eq!(c.timeout_ms(c.default_class()), 30_000);
        for pair in ms.windows(2) {
            assert!(pair[1] as f64 <= pair[0] as f64 * DEFAULT_SPACING, "{pair:?}");
        }
        assert!(c.len() <= MAX_CLASSES);
    }

    #[test]
    fn a_session_gets_the_shortest_class_at_or_above_what_it_asked_within_the_bounds() {
        let c = TimeoutClasses::new(30 * S, S, 5 * S, 600 * S, &[10 * S, 60 * S], 100_000).unwrap();
        let got = |asked: u64, cap: Option<u64>| c.timeout_ms(c.for_asked(asked, cap));
        assert_eq!(got(1, None), 5_000);
        assert_eq!(got(5_000, None), 5_000);
        assert_eq!(got(5_001, None), 10_000);
        assert_eq!(got(30_000, None), 30_000);
        assert_eq!(got(30_001, None), 60_000);
        assert_eq!(got(3_600_000, None), 600_000);
        // A cap below what was asked: the longest class at or below the cap.
        assert_eq!(got(600_000, Some(59_999)), 30_000);
        assert_eq!(got(600_000, Some(1_000)), 5_000);
    }

    #[test]
    fn an_mqtt_keepalive_gets_a_class_within_one_and_a_half_times_it() {
        let c = defaults();
        for k in 5..1800u16 {
            let class = c.for_keep_alive(k, None).unwrap_or_else(|| panic!("keepalive {k}: no class"));
            let ms = c.timeout_ms(class);
            assert!(ms > u64::from(k) * 1000 && ms <= u64::from(k) * 1500, "keepalive {k}: {ms} ms");
        }
        assert_eq!(c.for_keep_alive(0, None), None);
        assert_eq!(c.for_keep_alive(2, None), None, "no class in [3 s, 3 s]");
        assert_eq!(c.for_keep_alive(1800, None), None, "no class a tick above 1800 s");
        // A cap (a token's) bounds it too.
        assert_eq!(c.for_keep_alive(60, Some(30_000)), None);
        assert!(c.for_keep_alive(60, Some(75_000)).is_some_and(|k| c.timeout_ms(k) <= 75_000));
    }

    #[test]
    fn a_gateway_chosen_keepalive_holds_its_class_within_the_spec() {
        let c = defaults();
        for class in c.iter() {
            let ms = c.timeout_ms(class);
            let k = u64::from(c.keep_alive_for(class)) * 1000;
            assert!(k + c.tick_ms() <= ms, "{ms} ms: keepalive {k} ms leaves no tick");
            assert!(ms <= k * 3 / 2, "{ms} ms: keepalive {k} ms lets the class wait too long");
        }
    }

    #[test]
    fn bad_sets_name_their_flag() {
        let flag = |r: Result<TimeoutClasses, ConfigError>| r.unwrap_err().flag;
        assert_eq!(flag(TimeoutClasses::new(30 * S, S, 40 * S, 60 * S, &[], 100_000)), "--timeout");
        assert_eq!(flag(TimeoutClasses::new(30 * S, S, 60 * S, 10 * S, &[], 100_000)), "--min-timeout");
        assert_eq!(
            flag(TimeoutClasses::new(30 * S, S, 5 * S, 60 * S, &[Duration::from_millis(7500)], 100_000)),
            "--timeout-classes"
        );
        assert_eq!(flag(TimeoutClasses::new(30 * S, S, 5 * S, 60 * S, &[90 * S], 100_000)), "--timeout-classes");
        assert_eq!(flag(TimeoutClasses::new(30 * S, S, 5 * S, 3600 * S, &[], 1_000)), "--max-timeout");
        let many: Vec<Duration> = (6..80).map(|s| s * S).collect();
        assert_eq!(flag(TimeoutClasses::new(30 * S, S, 5 * S, 100 * S, &many, 100_000)), "--timeout-classes");
    }
}

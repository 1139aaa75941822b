//! Watch lists and status (`--watch-policy` and its bounds): who may watch whom, and how
//! much each session and this node may hold.

use std::str::FromStr;

use crate::error::ConfigError;
use crate::proto::MAX_STATUS_WIRE_BYTES;

/// Default `--max-watch`: a contact list of a chat app, with room to spare; a WATCH's
/// snapshot and a resync are as long as the list.
pub const DEFAULT_MAX_WATCH: usize = 1_000;

/// Default `--max-watch-entries`: 19,000 sessions watching 200 uids each fit, at about a
/// hundred bytes an entry (docs/BENCHMARKS.md), in well under a gigabyte.
pub const DEFAULT_MAX_WATCH_ENTRIES: usize = 4_000_000;

/// Default `--max-status-bytes`: "away", "busy", or a line of custom text.
pub const DEFAULT_MAX_STATUS_BYTES: usize = 64;

/// Default MQTT topic prefix of presence (`--mqtt-presence-topic`): SUBSCRIBE to
/// `<prefix>/<uid>`.
pub const DEFAULT_MQTT_PRESENCE_TOPIC: &str = "idlegate/presence";

/// Default MQTT topic a PUBLISH to sets the user's status (`--mqtt-status-topic`).
pub const DEFAULT_MQTT_STATUS_TOPIC: &str = "idlegate/status";

/// Who may watch whom (`--watch-policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WatchPolicy {
    /// Only the uids the backend listed for the user (`PUT /v1/watchlists/{uid}`), or that
    /// its token's `--jwt-watch-claim` lists; any other reads as a uid that never logged in.
    #[default]
    Listed,
    /// Any uid.
    Open,
    /// Nobody: WATCH, UNWATCH and STATUS are refused.
    None,
}

impl FromStr for WatchPolicy {
    type Err = String;

    fn from_str(text: &str) -> Result<WatchPolicy, String> {
        match text {
            "listed" => Ok(WatchPolicy::Listed),
            "open" => Ok(WatchPolicy::Open),
            "none" => Ok(WatchPolicy::None),
            other => Err(format!("{other:?}: expected listed, open or none")),
        }
    }
}

impl std::fmt::Display for WatchPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WatchPolicy::Listed => "listed",
            WatchPolicy::Open => "open",
            WatchPolicy::None => "none",
        })
    }
}

/// Watch lists' and status's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchConfig {
    /// `--watch-policy`; `None` when not given: `listed` (see [`WatchConfig::policy`]).
    pub policy: Option<WatchPolicy>,
    /// uids one session may watch at once (`--max-watch`), and one backend list may hold.
    pub max_watch: usize,
    /// Watch entries this node holds at most, over all its sessions (`--max-watch-entries`);
    /// the uids of the backend's lists count against the same number again.
    pub max_entries: usize,
    /// Longest status, in UTF-8 bytes (`--max-status-bytes`).
    pub max_status_bytes: usize,
    /// MQTT: SUBSCRIBE to `<prefix>/<uid>` watches the uid (`--mqtt-presence-topic`).
    pub mqtt_presence_topic: String,
    /// MQTT: a PUBLISH here sets the user's status (`--mqtt-status-topic`).
    pub mqtt_status_topic: String,
}

impl Default for WatchConfig {
    fn default() -> WatchConfig {
        WatchConfig {
            policy: None,
            max_watch: DEFAULT_MAX_WATCH,
            max_entries: DEFAULT_MAX_WATCH_ENTRIES,
            max_status_bytes: DEFAULT_MAX_STATUS_BYTES,
            mqtt_presence_topic: DEFAULT_MQTT_PRESENCE_TOPIC.into(),
            mqtt_status_topic: DEFAULT_MQTT_STATUS_TOPIC.into(),
        }
    }
}

impl WatchConfig {
    /// The policy in force: the one given, or `listed`, alone and in a cluster alike.
    pub fn policy(&self) -> WatchPolicy {
        self.policy.unwrap_or(WatchPolicy::Listed)
    }

    /// Checks the bounds.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_watch == 0 || self.max_watch > usize::from(u16::MAX) {
            return Err(ConfigError::new("--max-watch", format!("{}: expected 1 to 65535", self.max_watch)));
        }
        if self.max_entries < self.max_watch {
            return Err(ConfigError::new(
                "--max-watch-entries",
                format!("{} is less than --max-watch ({})", self.max_entries, self.max_watch),
            ));
        }
        if self.max_status_bytes > MAX_STATUS_WIRE_BYTES {
            return Err(ConfigError::new(
                "--max-status-bytes",
                format!("{}: a PRESENCE entry carries at most {MAX_STATUS_WIRE_BYTES}", self.max_status_bytes),
            ));
        }
        for (flag, topic) in
            [("--mqtt-presence-topic", &self.mqtt_presence_topic), ("--mqtt-status-topic", &self.mqtt_status_topic)]
        {
            if let Err(e) = crate::proto::mqtt::check_topic_name(topic) {
                return Err(ConfigError::new(flag, e.to_string()));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_checked_and_the_policy_is_listed_unless_given() {
        assert!(WatchConfig::default().validate().is_ok());
        assert_eq!(WatchConfig::default().policy(), WatchPolicy::Listed);
        let open = WatchConfig { policy: Some(WatchPolicy::Open), ..WatchConfig::default() };
        assert_eq!((open.policy(), open.validate()), (WatchPolicy::Open, Ok(())));
        let bad = |c: WatchConfig| c.validate().unwrap_err().flag;
        assert_eq!(bad(WatchConfig { max_watch: 0, ..WatchConfig::default() }), "--max-watch");
        assert_eq!(bad(WatchConfig { max_entries: 10, ..WatchConfig::default() }), "--max-watch-entries");
        assert_eq!(bad(WatchConfig { max_status_bytes: 256, ..WatchConfig::default() }), "--max-status-bytes");
        assert_eq!(
            bad(WatchConfig { mqtt_presence_topic: "a/+".into(), ..WatchConfig::default() }),
            "--mqtt-presence-topic"
        );
        assert_eq!("open".parse(), Ok(WatchPolicy::Open));
        assert!("all".parse::<WatchPolicy>().is_err());
    }
}

//! What the gateway runs with, checked once at start so a bad value fails loudly and names
//! its flag instead of misbehaving later.

use std::sync::Arc;
use std::time::Duration;

use crate::proto::Auth;
mod file;
mod jwks;
mod jwt;
mod jwt_ring;
mod live;
pub(crate) mod outbound;
mod proxy_protocol;
mod redis_target;
mod timeout_classes;
mod tls;
mod watch;
mod webhook;

use crate::error::ConfigError;
use crate::proto::DEFAULT_MAX_FRAME_BYTES;
pub use file::{ConfigFile, FlagSpec};
pub use jwks::{parse_refresh as parse_jwks_refresh, JwksConfig, JwksSource};
pub use jwt::{JwtAuth, JwtRules, KeysStatus, DEFAULT_JWT_LEEWAY, DEFAULT_JWT_UID_CLAIM};
pub use jwt_ring::provider as jwt_ring_provider;
pub use live::{AllowedOrigins, Live};
pub use proxy_protocol::ProxyProtocol;
pub use redis_target::RedisTarget;
pub(crate) use redis_target::FORBIDDEN_IN_NODE_ID;
pub use timeout_classes::{Class, TimeoutClasses, DEFAULT_MAX_TIMEOUT, DEFAULT_MIN_TIMEOUT};
pub use tls::TlsIdentity;
pub use watch::{
    WatchConfig, WatchPolicy, DEFAULT_MAX_STATUS_BYTES, DEFAULT_MAX_WATCH, DEFAULT_MAX_WATCH_ENTRIES,
    DEFAULT_MQTT_PRESENCE_TOPIC, DEFAULT_MQTT_STATUS_TOPIC,
};
pub use webhook::{
    parse_events as parse_webhook_events, WebhookConfig, WebhookSecrets, DEFAULT_WEBHOOK_BATCH, DEFAULT_WEBHOOK_EVENTS,
    DEFAULT_WEBHOOK_LINGER, DEFAULT_WEBHOOK_MAX_BACKOFF, DEFAULT_WEBHOOK_TIMEOUT,
};

/// Smallest `--max-frame-bytes` that still fits a LOGIN: a kind byte and the 8-byte uid.
const MIN_FRAME_BYTES: u32 = 9;

/// Most slots a ring may have (`timeout / tick + 1`): each slot costs a vector per ring
/// shard, and a sub-millisecond resolution on a multi-second timeout buys nothing.
const MAX_WINDOW_TICKS: u64 = 100_000;

/// Replies and pushes a client may leave unread before it is closed as a slow consumer:
/// about a thousand PONGs, far more than a healthy client lags. Raised to two largest frames
/// when `--max-frame-bytes` is bigger, so one large push never counts as lagging.
const MAX_QUEUED_BYTES: usize = 64 * 1024;

/// Default `--max-pending-logins`: a second of logins at the rate one core sustains with
/// room to spare; a reconnect storm beyond it is told to come back instead of timing out.
pub const DEFAULT_MAX_PENDING_LOGINS: usize = 4096;

/// Default `--max-devices`: one session per uid, a newer login taking over, as before
/// devices existed.
pub const DEFAULT_MAX_DEVICES: usize = 1;

/// Most `--max-devices` allowed: every login of a uid looks at all its sessions, so their
/// number stays small; a person's phones, computers and tabs fit many times over.
pub const MAX_DEVICES: usize = 64;

/// Default `--max-pending-logins-per-ip`: connections from one source address waiting to
/// log in. A carrier NAT puts thousands of users behind one address; even when they all
/// reconnect within a few seconds (the retry hints spread them), a LOGIN takes a round trip,
/// so a few hundred wait at once. This leaves room for that, while one address can hold at
/// most an eighth of the default global bound.
pub const DEFAULT_MAX_PENDING_LOGINS_PER_IP: usize = 512;

/// Default `--max-data-rate`: DATA frames a second one session may send. Far above a chat
/// client or a telemetry device (a few a second); low enough that one client cannot fill
/// the event log for everyone.
pub const DEFAULT_MAX_DATA_RATE: u32 = 100;

/// Default `--max-data-burst`: DATA frames a session may send at once above the rate.
pub const DEFAULT_MAX_DATA_BURST: u32 = 200;

/// Largest `--max-data-burst`: the bucket keeps its tokens in 32 bits.
const MAX_DATA_BURST: u32 = 4_000_000;

/// Most file descriptors kept back from clients (`--max-connections` is clamped to the
/// open-file limit minus this, or minus a quarter of the limit when that is less): the three
/// listeners and their reserves, the admin endpoint's and the API's connections (256 each at
/// most: a hundred open status pages hold two apiece), the runtime's own, and room to accept
/// an over-limit client long enough to tell it BYE(server_full).
pub const FD_HEADROOM: u64 = 600;

/// Default `--node-lease`: a dead node's uids look offline within this, and it is long
/// enough that a node stalled for a few seconds (or Redis paused as long) is not taken
/// for dead.
pub const DEFAULT_NODE_LEASE: Duration = Duration::from_secs(10);

/// Session changes held for Redis while it is away before the queue compacts, per
/// connection allowed: a login and an end each, the most a compacted queue needs.
const REDIS_QUEUE_PER_CONNECTION: usize = 2;

/// The floor of that queue, so a small gateway rides out a burst of short sessions during
/// an outage without compacting.
const REDIS_QUEUE_MIN: usize = 65_536;

/// Default `--event-log-capacity`: a minute of a busy gateway's events, about 64 MB of
/// entries before payloads.
pub const DEFAULT_EVENT_LOG_CAPACITY: usize = 1_000_000;

/// Default `--event-log-bytes`: DATA payloads can be large, so the count alone does not bound
/// memory; the oldest events go once their payloads pass this.
pub const DEFAULT_EVENT_LOG_BYTES: usize = 256 * 1024 * 1024;

/// Default `--redis-queue-bytes`: what a node's queued changes carry for Redis (DATA,
/// MQTT wills, JWT claims) while Redis is away or slow. A second of a busy node's data at 64 MiB/s; beyond it data is worth less than
/// the memory, and the oldest goes first (consumers see the gap).
pub const DEFAULT_REDIS_QUEUE_BYTES: usize = 64 * 1024 * 1024;

/// Settings of one gateway; see `idlegate serve --help` for each.
#[derive(Debug, Clone)]
pub struct Config {
    /// Silence after which a uid goes offline: the default timeout class.
    pub timeout: Duration,
    /// Shortest timeout a session may get (`--min-timeout`); none:
    /// [`DEFAULT_MIN_TIMEOUT`], or `timeout` when that is shorter.
    pub min_timeout: Option<Duration>,
    /// Longest timeout a session may get (`--max-timeout`); none: [`DEFAULT_MAX_TIMEOUT`]
    /// (or `timeout` when that is longer), at most what a ring of [`MAX_WINDOW_TICKS`]
    /// holds.
    pub max_timeout: Option<Duration>,
    /// The timeout classes (`--timeout-classes`); empty: a set spaced by at most 25 % from
    /// the shortest to the longest.
    pub timeout_classes: Vec<Duration>,

    /// Resolution of idle detection: one ring slot.
    pub tick: Duration,
    /// Time a new connection has to send a valid LOGIN.
    pub login_timeout: Duration,
    /// Open connections beyond which new ones get BYE(server_full).
    pub max_connections: usize,
    /// Connections waiting to log in beyond which new ones are shed with BYE(server_full)
    /// and a retry hint: when the gateway cannot keep up, it refuses early and explicitly
    /// instead of failing clients late.
    pub max_pending_logins: usize,
    /// Connections from one source address waiting to log in beyond which that address's
    /// next ones are refused with BYE(server_full), so one source cannot lock others out.
    pub max_pending_logins_per_ip: usize,
    /// Sessions one uid may hold at once, one per device; a login beyond it ends the uid's
    /// least recently active session.
    pub max_devices: usize,
    /// Largest frame length accepted (kind byte plus payload).
    pub max_frame_bytes: u32,
    /// DATA frames a second one session may send (0: no limit); over it the session ends
    /// with BYE(protocol_error) saying so.
    pub max_data_rate: u32,
    /// DATA frames a session may send at once above `max_data_rate`.
    pub max_data_burst: u32,
    /// Token checking; `None` accepts any token.
    pub auth: Option<Auth>,
    /// JWT logins (`--jwt-key-file`, `--jwt-secret-file`): a token in a JWT's compact form
    /// is checked here, any other by `auth`. With neither, any token is accepted.
    pub jwt: Option<Arc<JwtAuth>>,
    /// JWT keys fetched from the identity provider (`--jwt-jwks-url`, `--jwt-issuer-url`),
    /// into `jwt` (which must then be built with keys by URL: [`JwtAuth::load_with`]).
    pub jwks: Option<JwksConfig>,
    /// End a session when the token it logged in (or last refreshed) with expires
    /// (`--enforce-token-expiry`): BYE(token_expired) within a tick of it. Off, a token is
    /// checked at login only.
    pub enforce_token_expiry: bool,
    /// Time shutdown waits for connections to take their BYE and close.
    pub drain_timeout: Duration,
    /// This gateway's name in presence answers and online events.
    pub node_id: String,
    /// Bearer token the backend API requires; `None` leaves it open (loopback only).
    pub api_token: Option<String>,
    /// Most events the event log holds.
    pub event_log_capacity: usize,
    /// Most DATA payload bytes the event log holds.
    pub event_log_bytes: usize,
    /// The cluster's Redis; `None` runs alone.
    pub redis: Option<RedisTarget>,
    /// How long a node's lease lasts: the longest a dead node's uids look online.
    pub node_lease: Duration,
    /// Most DATA payload bytes held for Redis while it is away; past it the oldest data
    /// events are dropped (never a login or an end) and consumers see the gap.
    pub redis_queue_bytes: usize,
    /// Replicas that must acknowledge a batch (`WAIT`) before it counts as written.
    pub redis_min_replicas: u32,
    /// The certificate and key TLS listeners present (`--tls-cert`, `--tls-key`).
    pub tls: Option<Arc<TlsIdentity>>,
    /// Serve the backend API over HTTPS (`--api-tls`).
    pub api_tls: bool,
    /// Serve the admin listener over HTTPS (`--admin-tls`).
    pub admin_tls: bool,
    /// Origins a WebSocket upgrade may come from (`--ws-allowed-origins`); `None` allows any.
    /// An upgrade without an `Origin` header (not a browser) is always allowed.
    pub ws_allowed_origins: Option<Vec<String>>,
    /// Read a PROXY protocol header on every client door from these balancers
    /// (`--proxy-protocol`, `--proxy-protocol-from`); `None`: no header is read.
    pub proxy_protocol: Option<ProxyProtocol>,
    /// The topic an MQTT session receives pushes on when one of its subscriptions matches
    /// it (`--mqtt-push-topic`).
    pub mqtt_push_topic: String,
    /// Topic filters one MQTT session may hold (`--mqtt-max-subscriptions`); a SUBSCRIBE
    /// past it is refused filter by filter.
    pub mqtt_max_subscriptions: usize,
    /// Ping a WebSocket session silent for more than a third of the timeout
    /// (`--ws-keepalive-pings`): its client's WebSocket stack answers, so a browser tab whose
    /// timers are throttled stays online. Off, only what the client sends keeps it alive.
    pub ws_keepalive_pings: bool,
    /// Records one TLS key protects before it changes (TLS 1.3) or the session closes (TLS
    /// 1.2), instead of the suite's confidentiality limit: a test's way to make the rare
    /// case happen in a few frames (the hidden `--tls-record-limit`).
    #[doc(hidden)]
    pub tls_record_limit: Option<u64>,
    /// Presence events delivered to a backend's URL, signed (`--webhook-url` and the rest
    /// of `--webhook-*`); `None`: no relay.
    pub webhook: Option<WebhookConfig>,
    /// How long a uid's `user_offline` waits after its last session ended
    /// (`--offline-grace`): a login within it cancels both that `user_offline` and the
    /// `user_online` it would have caused. Zero: user events follow session events at once.
    pub offline_grace: Duration,
    /// Offline uids whose last-seen time this process remembers (`--last-seen-capacity`),
    /// the least recently seen forgotten first; 0 remembers none.
    pub last_seen_capacity: usize,
    /// How long a cluster's Redis keeps a uid's last-seen time (`--last-seen-ttl`).
    pub last_seen_ttl: Duration,
    /// Watch lists and status (`--watch-policy` and its bounds).
    pub watch: WatchConfig,
}

/// Default `--last-seen-capacity`: a million uids, about 35 MB (`presence/last_seen.rs`).
pub const DEFAULT_LAST_SEEN_CAPACITY: usize = 1_000_000;

/// Default `--last-seen-ttl`: how long a cluster's Redis keeps a uid's last-seen time.
pub const DEFAULT_LAST_SEEN_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// Longest `--offline-grace`: a reconnect after a network switch takes seconds; a grace of
/// minutes already hides a user who truly left, and every uid in grace is held in memory
/// (or in Redis) for all of it.
pub const MAX_OFFLINE_GRACE: Duration = Duration::from_secs(300);

/// Default `--mqtt-max-subscriptions`: a device subscribes to a handful of topics; a few
/// hundred leaves room for any real client while a push's match stays a short scan and a
/// session's filters a few KiB.
pub const DEFAULT_MQTT_MAX_SUBSCRIPTIONS: usize = 256;

/// Default `--mqtt-push-topic`.
pub const DEFAULT_MQTT_PUSH_TOPIC: &str = "idlegate/push";

impl Default for Config {
    fn default() -> Config {
        Config {
            timeout: Duration::from_secs(30),
            min_timeout: None,
            max_timeout: None,
            timeout_classes: Vec::new(),
            tick: Duration::from_secs(1),
            login_timeout: Duration::from_secs(10),
            max_connections: 10_000,
            max_pending_logins: DEFAULT_MAX_PENDING_LOGINS,
            max_devices: DEFAULT_MAX_DEVICES,
            max_pending_logins_per_ip: DEFAULT_MAX_PENDING_LOGINS_PER_IP,
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            max_data_rate: DEFAULT_MAX_DATA_RATE,
            max_data_burst: DEFAULT_MAX_DATA_BURST,
            auth: None,
            jwt: None,
            jwks: None,
            enforce_token_expiry: false,
            drain_timeout: Duration::from_secs(5),
            node_id: "idlegate".into(),
            api_token: None,
            event_log_capacity: DEFAULT_EVENT_LOG_CAPACITY,
            event_log_bytes: DEFAULT_EVENT_LOG_BYTES,
            redis: None,
            node_lease: DEFAULT_NODE_LEASE,
            redis_queue_bytes: DEFAULT_REDIS_QUEUE_BYTES,
            redis_min_replicas: 0,
            tls: None,
            api_tls: false,
            admin_tls: false,
            ws_allowed_origins: None,
            proxy_protocol: None,
            mqtt_push_topic: DEFAULT_MQTT_PUSH_TOPIC.to_string(),
            mqtt_max_subscriptions: DEFAULT_MQTT_MAX_SUBSCRIPTIONS,
            ws_keepalive_pings: true,
            tls_record_limit: None,
            webhook: None,
            offline_grace: Duration::ZERO,
            last_seen_capacity: DEFAULT_LAST_SEEN_CAPACITY,
            last_seen_ttl: DEFAULT_LAST_SEEN_TTL,
            watch: WatchConfig::default(),
        }
    }
}

// === impl Config ===

impl Config {
    /// Checks every value; the error names the flag at fault.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let whole_ms = |d: Duration| d.as_nanos().is_multiple_of(1_000_000);
        if let Some(webhook) = &self.webhook {
            webhook.validate()?;
        }
        self.watch.validate()?;
        if let Some(jwks) = &self.jwks {
            jwks.validate()?;
            if self.jwt.is_none() {
                return Err(ConfigError::new(jwks.source.flag(), "set, but no JWT is checked with its keys"));
            }
        }
        if let Err(e) = crate::proto::mqtt::check_topic_name(&self.mqtt_push_topic) {
            return Err(ConfigError::new("--mqtt-push-topic", e.to_string()));
        }
        if self.tick < Duration::from_millis(1) || !whole_ms(self.tick) {
            return Err(ConfigError::new(
                "--tick",
                format!("{:?} is not a whole number of milliseconds >= 1ms", self.tick),
            ));
        }
        if self.timeout < self.tick || !self.timeout.as_nanos().is_multiple_of(self.tick.as_nanos()) {
            return Err(ConfigError::new(
                "--timeout",
                format!("{:?} is not a whole multiple (at least 1x) of the tick, {:?}", self.timeout, self.tick),
            ));
        }
        if u32::try_from(self.timeout.as_millis()).is_err() {
            return Err(ConfigError::new(
                "--timeout",
                format!("{:?} does not fit WELCOME's u32 milliseconds", self.timeout),
            ));
        }
        if self.window() > MAX_WINDOW_TICKS {
            return Err(ConfigError::new(
                "--tick",
                format!("timeout / tick = {} slots; at most {MAX_WINDOW_TICKS}: use a longer tick", self.window()),
            ));
        }
        self.classes()?;
        if self.login_timeout.is_zero() {
            return Err(ConfigError::new("--login-timeout", "must be longer than zero"));
        }
        if self.max_connections == 0 {
            return Err(ConfigError::new("--max-connections", "must be at least 1"));
        }
        if self.max_pending_logins == 0 {
            return Err(ConfigError::new("--max-pending-logins", "must be at least 1"));
        }
        if !(1..=MAX_DEVICES).contains(&self.max_devices) {
            return Err(ConfigError::new("--max-devices", format!("must be 1 to {MAX_DEVICES}")));
        }
        if self.max_data_rate > 0 && !(1..=MAX_DATA_BURST).contains(&self.max_data_burst) {
            return Err(ConfigError::new("--max-data-burst", format!("must be 1 to {MAX_DATA_BURST}")));
        }
        if (self.api_tls || self.admin_tls) && self.tls.is_none() {
            let flag = if self.api_tls { "--api-tls" } else { "--admin-tls" };
            return Err(ConfigError::new("--tls-cert", format!("{flag} needs --tls-cert and --tls-key")));
        }
        if self.max_pending_logins_per_ip == 0 {
            return Err(ConfigError::new("--max-pending-logins-per-ip", "must be at least 1"));
        }
        if self.max_frame_bytes < MIN_FRAME_BYTES {
            return Err(ConfigError::new(
                "--max-frame-bytes",
                format!("{} is too small for a LOGIN; at least {MIN_FRAME_BYTES}", self.max_frame_bytes),
            ));
        }
        if self.event_log_capacity == 0 {
            return Err(ConfigError::new("--event-log-capacity", "must be at least 1"));
        }
        if self.node_id.is_empty() {
            return Err(ConfigError::new("--node-id", "must not be empty"));
        }
        if self.redis.is_some() {
            if let Some(c) = self.node_id.chars().find(|c| FORBIDDEN_IN_NODE_ID.contains(c) || c.is_whitespace()) {
                return Err(ConfigError::new(
                    "--node-id",
                    format!(
                        "{:?} contains {c:?}; in a cluster a node id may not contain '|', '#' or spaces",
                        self.node_id
                    ),
                ));
            }
            if self.node_lease < 2 * self.tick {
                return Err(ConfigError::new(
                    "--node-lease",
                    format!(
                        "{:?} is shorter than two ticks ({:?}): a node would lose its lease between refreshes",
                        self.node_lease,
                        2 * self.tick
                    ),
                ));
            }
        }
        if self.offline_grace > MAX_OFFLINE_GRACE || !self.offline_grace.as_nanos().is_multiple_of(self.tick.as_nanos())
        {
            return Err(ConfigError::new(
                "--offline-grace",
                format!(
                    "{:?} is not a whole multiple of the tick ({:?}) of at most {MAX_OFFLINE_GRACE:?}",
                    self.offline_grace, self.tick
                ),
            ));
        }
        if self.api_token.as_deref() == Some("") {
            return Err(ConfigError::new("--api-token", "must not be empty; leave it unset for no token"));
        }
        Ok(())
    }

    /// `--offline-grace` in ticks (0: none).
    pub fn grace_ticks(&self) -> u64 {
        (self.offline_grace.as_nanos() / self.tick.as_nanos().max(1)) as u64
    }

    /// Session changes held for Redis while it is away before the queue compacts.
    pub fn redis_queue_capacity(&self) -> usize {
        (self.max_connections * REDIS_QUEUE_PER_CONNECTION).max(REDIS_QUEUE_MIN)
    }

    /// Bytes of replies and pushes a client may leave unread; see [`MAX_QUEUED_BYTES`].
    pub fn max_queued_bytes(&self) -> usize {
        max_queued_bytes(self.max_frame_bytes)
    }

    /// The largest payload a PUSH may carry: a frame's limit less its kind byte.
    pub fn max_push_bytes(&self) -> usize {
        self.max_frame_bytes as usize - 1
    }

    /// The timeout classes, checked; the error names the flag at fault.
    pub fn classes(&self) -> Result<TimeoutClasses, ConfigError> {
        let tick = self.tick.max(Duration::from_millis(1));
        // The defaults fit any tick: rounded to whole ticks (a `--tick 10s` gateway's least
        // timeout is 10 s, not the 5 s no ring of it can hold), within what the ring holds.
        let whole_ticks = |d: Duration, up: bool| -> Duration {
            let (n, t) = (d.as_nanos(), tick.as_nanos());
            let ticks = if up { n.div_ceil(t) } else { n / t }.max(1);
            tick.saturating_mul(u32::try_from(ticks).unwrap_or(u32::MAX))
        };
        let min = self.min_timeout.unwrap_or_else(|| whole_ticks(DEFAULT_MIN_TIMEOUT, true).min(self.timeout));
        let ring_holds = tick.saturating_mul(u32::try_from(MAX_WINDOW_TICKS).unwrap_or(u32::MAX));
        let max = self
            .max_timeout
            .unwrap_or_else(|| whole_ticks(DEFAULT_MAX_TIMEOUT, false).max(self.timeout).min(ring_holds));
        TimeoutClasses::new(self.timeout, tick, min, max, &self.timeout_classes, MAX_WINDOW_TICKS)
    }

    /// The timeout classes of a validated config (one class, `--timeout`, for a config
    /// [`Config::validate`] would refuse: the gateway never starts with one).
    pub fn timeout_classes(&self) -> TimeoutClasses {
        self.classes().unwrap_or_else(|_| TimeoutClasses::single(self.timeout, self.tick))
    }

    /// Timeout in ticks: the default class's ring window, its slot count minus one.
    pub fn window(&self) -> u64 {
        (self.timeout.as_nanos() / self.tick.as_nanos().max(1)) as u64
    }

    /// The timeout in whole seconds, rounded up: the number of per-second silence series.
    pub fn timeout_secs_ceil(&self) -> u64 {
        self.timeout.as_millis().div_ceil(1000) as u64
    }

    /// The timeout in milliseconds, as WELCOME carries it.
    pub fn timeout_ms(&self) -> u32 {
        u32::try_from(self.timeout.as_millis()).unwrap_or(u32::MAX)
    }

    /// The tick in milliseconds, as WELCOME carries it.
    pub fn tick_ms(&self) -> u32 {
        u32::try_from(self.tick.as_millis()).unwrap_or(u32::MAX)
    }
}

/// Bytes of replies and pushes a client may leave unread with frames of up to
/// `max_frame_bytes`; see [`MAX_QUEUED_BYTES`].
pub(crate) fn max_queued_bytes(max_frame_bytes: u32) -> usize {
    MAX_QUEUED_BYTES.max(2 * (max_frame_bytes as usize + 4))
}

/// `--max-connections`' default for an open-file limit of `nofile`.
pub fn default_max_connections(nofile: u64) -> usize {
    nofile.saturating_sub(FD_HEADROOM.min(nofile / 4)).max(1) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(f: impl FnOnce(&mut Config)) -> Result<(), ConfigError> {
        let mut c = Config::default();
        f(&mut c);
        c.validate()
    }

    #[test]
    fn defaults_are_valid_and_give_31_slots() {
        assert_eq!(with(|_| {}), Ok(()));
        assert_eq!(Config::default().window() + 1, 31);
    }

    /// The default bounds of the timeout classes fit any tick: a `--tick 10s` or `--tick
    /// 2s` gateway starts without naming `--min-timeout` (a 5 s default is no multiple of
    /// either), its least class a whole number of ticks.
    #[test]
    fn the_default_timeout_bounds_fit_any_tick() {
        for (tick, timeout, least) in [(10, 600, 10), (2, 46, 6), (7, 7, 7), (1, 30, 5)] {
            let c =
                Config { tick: Duration::from_secs(tick), timeout: Duration::from_secs(timeout), ..Config::default() };
            assert_eq!(c.validate(), Ok(()), "--tick {tick}s --timeout {timeout}s");
            let classes = c.classes().unwrap();
            assert_eq!(classes.bounds_ms().0, least * 1000, "--tick {tick}s");
            assert!(classes.bounds_ms().1 <= 30 * 60 * 1000, "--tick {tick}s");
        }
    }

    #[test]
    fn each_bad_value_names_its_flag() {
        let flag = |r: Result<(), ConfigError>| r.unwrap_err().flag;
        assert_eq!(flag(with(|c| c.timeout = Duration::from_millis(2500))), "--timeout");
        assert_eq!(flag(with(|c| c.timeout = Duration::from_millis(500))), "--timeout");
        assert_eq!(flag(with(|c| c.tick = Duration::ZERO)), "--tick");
        assert_eq!(flag(with(|c| c.tick = Duration::from_micros(1500))), "--tick");
        assert_eq!(
            flag(with(|c| {
                c.tick = Duration::from_millis(1);
                c.timeout = Duration::from_secs(200);
            })),
            "--tick"
        );
        assert_eq!(flag(with(|c| c.login_timeout = Duration::ZERO)), "--login-timeout");
        assert_eq!(flag(with(|c| c.max_connections = 0)), "--max-connections");
        assert_eq!(flag(with(|c| c.max_pending_logins = 0)), "--max-pending-logins");
        assert_eq!(flag(with(|c| c.max_frame_bytes = 8)), "--max-frame-bytes");
        assert_eq!(flag(with(|c| c.event_log_capacity = 0)), "--event-log-capacity");
        assert_eq!(flag(with(|c| c.node_id.clear())), "--node-id");
        assert_eq!(flag(with(|c| c.api_token = Some(String::new()))), "--api-token");
        let redis = || Some(RedisTarget::parse("redis://127.0.0.1:6379", false).unwrap());
        assert_eq!(
            flag(with(|c| {
                c.redis = redis();
                c.node_id = "a|b".into();
            })),
            "--node-id"
        );
        assert_eq!(
            flag(with(|c| {
                c.redis = redis();
                c.node_lease = Duration::from_secs(1);
            })),
            "--node-lease"
        );
    }

    #[test]
    fn max_connections_default_leaves_headroom() {
        assert_eq!(default_max_connections(20_000), 19_400);
        assert_eq!(default_max_connections(300), 225);
        assert_eq!(default_max_connections(1), 1);
    }
}

//! Prometheus metrics: what operators scrape to see who is online and whether detection is
//! healthy.
//!
//! Every labelled child is resolved once here, so the per-frame path only bumps atomics.
//! Each gateway owns its own [`prometheus::Registry`], so several gateways (in tests) can
//! live in one process. Scraping walks no sessions: the silence picture is refreshed by the
//! ticker from the ring's slot sizes, once a tick.

#[cfg(target_os = "linux")]
mod process;

use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

use crate::config::Config;
use crate::proto::{kind, CloseReason, Transport};

/// Buckets of `idlegate_ring_expired_per_sweep`: decades, from a quiet tick to a mass expiry.
const EXPIRED_PER_SWEEP_BUCKETS: [f64; 8] = [0.0, 1.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6];

/// Buckets of the sweep-duration and tick-lag histograms, in seconds: from 10 µs (a quiet
/// sweep) to 10 s (a badly stalled process), roughly three per decade.
const SECONDS_BUCKETS: [f64; 19] = [
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Client frame kinds counted by `idlegate_frames_received_total`: (kind byte, label).
const FRAME_KINDS: [(u8, &str); 4] =
    [(kind::LOGIN, "login"), (kind::PING, "ping"), (kind::DATA, "data"), (kind::LOGOUT, "logout")];

/// How a door's handshake (TLS, the WebSocket upgrade, or both) ended, as
/// `idlegate_handshakes_total{result}` names it: done; refused for a bad or unwanted
/// handshake; not finished before the login deadline; or the client went away during it.
pub const HANDSHAKE_RESULTS: [&str; 4] = ["ok", "error", "timeout", "closed"];

/// Buckets of the handshake-duration histogram, in seconds: a loopback handshake takes
/// about a millisecond, one over a mobile network a few hundred.
const HANDSHAKE_BUCKETS: [f64; 12] = [5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];

use crate::proto::EventKind;

/// How a webhook request ended (`idlegate_webhook_requests_total{result}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebhookResult {
    /// A 2xx: the batch was acknowledged.
    Ok,
    /// Any other status.
    Status,
    /// No answer within `--webhook-timeout`.
    Timeout,
    /// The connection was refused, reset or never made.
    Connect,
    /// The TLS handshake failed (a certificate not trusted).
    Tls,
}

impl WebhookResult {
    /// Every result, in the order of their discriminants.
    pub const ALL: [WebhookResult; 5] =
        [WebhookResult::Ok, WebhookResult::Status, WebhookResult::Timeout, WebhookResult::Connect, WebhookResult::Tls];

    fn label(self) -> &'static str {
        match self {
            WebhookResult::Ok => "ok",
            WebhookResult::Status => "status",
            WebhookResult::Timeout => "timeout",
            WebhookResult::Connect => "connect",
            WebhookResult::Tls => "tls",
        }
    }
}

/// Buckets of the API's latency, in seconds: a presence answer from this process takes tens
/// of microseconds, one through Redis a round trip or two, one asked of another node up to
/// its inbox's deadline.
const API_LATENCY_BUCKETS: [f64; 12] =
    [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 2.5];

/// The gateway's metrics; see the module documentation.
pub struct Metrics {
    registry: Registry,
    /// uids with at least one session now.
    pub online_users: IntGauge,
    /// uids in their offline grace: no session, their `user_offline` still held.
    pub grace_users: IntGauge,
    /// Sessions now: one per device of each uid online.
    pub online_sessions: IntGauge,
    /// Client connections open now on every door, logged in or not (the sum of
    /// `idlegate_connections_open{transport}`, kept as one figure for the limit's checks).
    pub connections_open: IntGauge,
    open_by_transport: Vec<IntGauge>,
    handshakes: Vec<[IntCounter; HANDSHAKE_RESULTS.len()]>,
    handshake_duration: Vec<Histogram>,
    /// SIGHUP reloads of `--tls-cert` and `--tls-key`, good and refused.
    pub tls_reloads_ok: IntCounter,
    pub tls_reloads_error: IntCounter,
    /// SIGHUP reloads of the JWT keys, by result, and the keys in use.
    pub jwt_reloads_ok: IntCounter,
    pub jwt_reloads_error: IntCounter,
    pub jwt_keys: IntGauge,
    /// Fetches of the JWT keys by URL (`--jwt-jwks-url`, `--jwt-issuer-url`), by what asked
    /// for them and how they ended; see [`Metrics::jwks_fetch`].
    jwks_fetches: IntCounterVec,
    /// Fetches an unknown `kid` asked for that `--jwt-jwks-min-interval` held back.
    pub jwks_refetches_limited: IntCounter,
    /// Keys in use from the URL, and when they were fetched (unix seconds; 0 before).
    pub jwks_keys: IntGauge,
    pub jwks_fetched_seconds: IntGauge,
    /// Whether the last fetch of the keys by URL worked (1) or failed (0; why is in the
    /// fetches' `result` and in `/status.json`).
    pub jwks_last_fetch_ok: IntGauge,
    /// REFRESH frames (and MQTT 5 re-authentications), by result.
    pub refreshes_ok: IntCounter,
    pub refreshes_refused: IntCounter,
    /// Sessions whose token expiry the gateway holds (`--enforce-token-expiry`).
    pub token_expiries: IntGauge,
    /// Logins whose `--jwt-claims-to-events` claims were left out of their events for size.
    pub claims_too_large: IntCounter,
    /// When the certificate served now stops being valid (Unix seconds).
    pub tls_cert_expiry: IntGauge,
    /// Connections accepted, including those refused as server_full.
    pub connections_accepted: IntCounter,
    /// By reason, then by door.
    closed: Vec<Vec<IntCounter>>,
    /// Connections refused before their login (a bad token, a late LOGIN, an MQTT 3.1.1
    /// keepalive the window cannot honour), by door and why.
    refused_logins: IntCounterVec,
    /// Connections closed for their PROXY protocol header, by door and why.
    proxy_refused: IntCounterVec,
    /// Configurations read again at a SIGHUP, by result.
    config_reloads: IntCounterVec,
    /// Successful logins.
    pub logins: IntCounter,
    frames: Vec<IntCounter>,
    /// uids taken out of the ring by sweeps.
    pub ring_expired: IntCounter,
    /// uids in the ring; equals online users when healthy.
    pub ring_tracked: IntGauge,
    /// Webhook requests, by [`WebhookResult`].
    webhook_requests: Vec<IntCounter>,
    /// Events webhook receivers acknowledged.
    pub webhook_events: IntCounter,
    /// Age of the oldest event the relay read and a receiver has not acknowledged.
    pub webhook_lag_seconds: Gauge,
    /// Events the relay read and a receiver has not acknowledged.
    pub webhook_backlog: IntGauge,
    silence: Vec<IntGauge>,
    /// Per timeout class, shortest first: its timeout in ms, its sessions, and its sessions
    /// expired.
    by_class: Vec<(u64, IntGauge, IntCounter)>,
    /// Time to sweep the slots of one tick, notifications included.
    pub sweep_duration: Histogram,
    /// uids expired by one tick's sweep.
    pub expired_per_sweep: Histogram,
    /// How late each tick ran against its schedule.
    pub tick_lag: Histogram,
    /// From the tick that expired a session to its BYE written and the socket shut down:
    /// offline is decided on the tick, and this is how long its client waits to hear it.
    pub expiry_bye_delay: Histogram,
    /// Connections accepted and not logged in yet.
    pub pending_logins: IntGauge,
    /// Connections refused at accept because the limit of open connections was reached.
    pub shed_max_connections: IntCounter,
    /// Connections refused at accept because too many were waiting to log in.
    pub shed_pending_logins: IntCounter,
    /// Pushes handed to a connection, and pushes to a uid that was offline.
    pub pushes_sent: IntCounter,
    pub pushes_offline: IntCounter,
    /// Pushes to a uid online only on MQTT sessions not subscribed to the push's topic.
    pub pushes_unsubscribed: IntCounter,
    events: Vec<IntCounter>,
    /// Events the event log holds now.
    pub event_log_events: IntGauge,
    pub event_log_bytes: IntGauge,
    /// Consumers following the event stream now.
    pub event_consumers: IntGauge,
    /// Watch entries (uids on sessions' watch lists, summed), uids watched, and uids on
    /// backends' lists, now.
    pub watch_entries: IntGauge,
    pub watched_uids: IntGauge,
    pub watchlist_entries: IntGauge,
    /// PRESENCE entries owed to watchers: changes, snapshots answering WATCHes, resyncs.
    pub presence_changes: IntCounter,
    pub presence_snapshots: IntCounter,
    pub presence_resyncs: IntCounter,
    /// WATCHes refused for a bound: per session (`--max-watch`), per node
    /// (`--max-watch-entries`).
    pub watch_refused_session: IntCounter,
    pub watch_refused_node: IntCounter,
    api_requests: IntCounterVec,
    api_latency: prometheus::HistogramVec,
    /// 1 while Redis answers (cluster mode; 0 alone or while unreachable).
    pub redis_up: IntGauge,
    /// Redis calls that failed.
    redis_errors: IntCounterVec,
    /// Session changes waiting to reach Redis.
    pub redis_queue_depth: IntGauge,
    pub redis_queue_bytes: IntGauge,
    /// Session changes dropped by compaction while Redis was away.
    pub redis_compacted: IntCounter,
    /// Redis round trips (a pipeline or a group of concurrent commands is one).
    pub redis_round_trips: IntCounter,
    /// Redis commands sent.
    pub redis_commands: IntCounter,
    /// Time of one Redis round trip.
    pub redis_rtt: Histogram,
    /// Times this node found it had been reaped while cut off, and rejoined.
    pub redis_fenced: IntCounter,
    /// Signs that Redis lost writes it had acknowledged (epoch change, applied marker behind).
    pub redis_lost_writes: IntCounter,
    /// Times the connections to a Redis Cluster were opened anew after failing too long.
    pub redis_reopens: IntCounter,
    /// `WAIT`s that came back with fewer replicas than `--redis-min-replicas`.
    pub redis_replica_waits: IntCounter,
    /// Sessions this node reaped from dead members, logged `node_lost`.
    pub redis_reaped: IntCounter,
}

// === impl Metrics ===

impl Metrics {
    /// Counts one fetch of the JWT keys by URL: `trigger` is what asked for it, `result`
    /// `ok` or why it failed.
    pub fn jwks_fetch(&self, trigger: &str, result: &str) {
        self.jwks_fetches.with_label_values(&[trigger, result]).inc();
    }

    /// Metrics for a gateway running with `config`: one silence series per whole second of
    /// its timeout, and its limits exported so alerts can compare against them.
    pub fn new(config: &Config) -> Metrics {
        let timeout_secs = config.timeout_secs_ceil();
        let registry = Registry::new();
        let reg = |c: Box<dyn prometheus::core::Collector>| {
            registry.register(c).expect("metric names are unique and valid");
        };

        let gauge = |name: &str, help: &str| {
            let g = IntGauge::new(name, help).expect("valid gauge");
            reg(Box::new(g.clone()));
            g
        };
        let counter = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).expect("valid counter");
            reg(Box::new(c.clone()));
            c
        };
        let histogram = |name: &str, help: &str, buckets: &[f64]| {
            let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))
                .expect("valid histogram");
            reg(Box::new(h.clone()));
            h
        };

        let online_users = gauge("idlegate_online_users", "uids with at least one session now");
        let grace_users = gauge(
            "idlegate_offline_grace_users",
            "uids whose last session ended within --offline-grace: their user_offline still waits (this node's; 0 in a cluster, whose graces are in Redis)",
        );
        let online_sessions = gauge("idlegate_online_sessions", "sessions now: one per logged-in device of each uid");
        // The total is not exported under its own name: the labelled series sum to it.
        let connections_open = IntGauge::new("connections_open", "all doors").expect("valid gauge");
        let open_vec = IntGaugeVec::new(
            Opts::new("idlegate_connections_open", "client connections open now, logged in or not, by door"),
            &["transport"],
        )
        .expect("valid gauge vec");
        let open_by_transport = Transport::ALL.iter().map(|t| open_vec.with_label_values(&[t.label()])).collect();
        reg(Box::new(open_vec));
        let handshakes_vec = IntCounterVec::new(
            Opts::new(
                "idlegate_handshakes_total",
                "TLS and WebSocket handshakes, by door and how they ended (ok, error, timeout, closed)",
            ),
            &["transport", "result"],
        )
        .expect("valid counter vec");
        let handshakes = Transport::ALL
            .iter()
            .map(|t| HANDSHAKE_RESULTS.map(|r| handshakes_vec.with_label_values(&[t.label(), r])))
            .collect();
        reg(Box::new(handshakes_vec));
        let duration_vec = prometheus::HistogramVec::new(
            HistogramOpts::new(
                "idlegate_handshake_duration_seconds",
                "from accept to a finished TLS handshake or WebSocket upgrade, by door",
            )
            .buckets(HANDSHAKE_BUCKETS.to_vec()),
            &["transport"],
        )
        .expect("valid histogram vec");
        let handshake_duration = Transport::ALL.iter().map(|t| duration_vec.with_label_values(&[t.label()])).collect();
        reg(Box::new(duration_vec));
        let reloads_vec = IntCounterVec::new(
            Opts::new("idlegate_tls_reloads_total", "SIGHUP reloads of --tls-cert and --tls-key, by result"),
            &["result"],
        )
        .expect("valid counter vec");
        let tls_reloads_ok = reloads_vec.with_label_values(&["ok"]);
        let tls_reloads_error = reloads_vec.with_label_values(&["error"]);
        reg(Box::new(reloads_vec));
        let jwt_reloads_vec = IntCounterVec::new(
            Opts::new(
                "idlegate_jwt_key_reloads_total",
                "SIGHUP reloads of --jwt-key-file and --jwt-secret-file, by result (an error keeps the keys in use)",
            ),
            &["result"],
        )
        .expect("valid counter vec");
        let jwt_reloads_ok = jwt_reloads_vec.with_label_values(&["ok"]);
        let jwt_reloads_error = jwt_reloads_vec.with_label_values(&["error"]);
        reg(Box::new(jwt_reloads_vec));
        let jwt_keys = gauge("idlegate_jwt_keys", "JWT verification keys and secrets in use");
        let jwks_fetches = IntCounterVec::new(
            Opts::new(
                "idlegate_jwt_jwks_fetches_total",
                "fetches of the JWT keys by URL, by trigger (start, scheduled, unknown_kid, shared: taken from another node through Redis) and result (ok, or why it failed: status, too_large, timeout, tls, connect, redirect, invalid, discovery); a failure keeps the keys in use",
            ),
            &["trigger", "result"],
        )
        .expect("valid counter vec");
        reg(Box::new(jwks_fetches.clone()));
        let jwks_refetches_limited = counter(
            "idlegate_jwt_jwks_refetches_limited_total",
            "fetches of the JWT keys that tokens naming an unknown kid asked for, held back by --jwt-jwks-min-interval",
        );
        let jwks_keys =
            gauge("idlegate_jwt_jwks_keys", "JWT verification keys in use from --jwt-jwks-url (or the issuer's)");
        let jwks_fetched_seconds = gauge(
            "idlegate_jwt_jwks_fetched_timestamp_seconds",
            "when the JWT keys in use from the URL were fetched, unix seconds (0: not yet)",
        );
        let jwks_last_fetch_ok = gauge(
            "idlegate_jwt_jwks_last_fetch_ok",
            "1 if the last fetch of the JWT keys by URL worked, 0 if it failed (the keys in use stay; /status.json says why)",
        );
        let refreshes_vec = IntCounterVec::new(
            Opts::new(
                "idlegate_token_refreshes_total",
                "REFRESH frames and MQTT 5 re-authentications, by result (refused ends the session as auth_failed)",
            ),
            &["result"],
        )
        .expect("valid counter vec");
        let refreshes_ok = refreshes_vec.with_label_values(&["ok"]);
        let refreshes_refused = refreshes_vec.with_label_values(&["refused"]);
        reg(Box::new(refreshes_vec));
        let token_expiries = gauge(
            "idlegate_token_expiries",
            "sessions whose token expiry this node enforces (--enforce-token-expiry): each ends as token_expired unless refreshed",
        );
        let claims_too_large = counter(
            "idlegate_jwt_claims_too_large_total",
            "logins whose --jwt-claims-to-events claims took more than 1 KiB: their events carry none",
        );
        let tls_cert_expiry = gauge(
            "idlegate_tls_cert_expiry_timestamp_seconds",
            "when the TLS certificate served now expires (Unix seconds; 0 without TLS)",
        );
        let connections_accepted = counter(
            "idlegate_connections_accepted_total",
            "TCP connections accepted, including those refused with BYE(server_full)",
        );
        let closed_vec = IntCounterVec::new(
            Opts::new(
                "idlegate_connections_closed_total",
                "TCP connections closed, by the reason they ended and their door",
            ),
            &["reason", "door"],
        )
        .expect("valid counter vec");
        reg(Box::new(closed_vec.clone()));
        let closed = CloseReason::ALL
            .iter()
            .map(|r| Transport::ALL.iter().map(|t| closed_vec.with_label_values(&[r.label(), t.label()])).collect())
            .collect();
        let refused_logins = IntCounterVec::new(
            Opts::new(
                "idlegate_refused_logins_total",
                "connections closed before a login, by door and why: auth_failed, mqtt_keepalive (a 3.1.1 keepalive the window cannot honour), login_timeout, protocol_error, server_full, shutdown",
            ),
            &["door", "why"],
        )
        .expect("valid counter vec");
        reg(Box::new(refused_logins.clone()));
        let proxy_refused = IntCounterVec::new(
            Opts::new(
                "idlegate_proxy_protocol_refused_total",
                "connections closed for their PROXY protocol header (--proxy-protocol), by door and why: missing (none from a trusted balancer), malformed, untrusted (one from an address not in --proxy-protocol-from), timeout, closed",
            ),
            &["door", "why"],
        )
        .expect("valid counter vec");
        reg(Box::new(proxy_refused.clone()));
        let config_reloads = IntCounterVec::new(
            Opts::new(
                "idlegate_config_reloads_total",
                "the configuration read again at a SIGHUP, by result: ok (what may change applied), error (nothing changed)",
            ),
            &["result"],
        )
        .expect("valid counter vec");
        reg(Box::new(config_reloads.clone()));
        let logins = counter("idlegate_logins_total", "successful logins");
        let frames_vec = IntCounterVec::new(
            Opts::new("idlegate_frames_received_total", "valid frames received from clients, by kind"),
            &["kind"],
        )
        .expect("valid counter vec");
        reg(Box::new(frames_vec.clone()));
        let frames = FRAME_KINDS.iter().map(|(_, k)| frames_vec.with_label_values(&[k])).collect();
        let ring_expired = counter(
            "idlegate_ring_expired_total",
            "uids taken out of the ring by sweeps; closes for idle_timeout are at most this, the difference being \
             clients that left (logout, disconnect) between the sweep and their close",
        );
        let webhook_vec = IntCounterVec::new(
            Opts::new("idlegate_webhook_requests_total", "webhook deliveries attempted, by result"),
            &["result"],
        )
        .expect("valid counter vec");
        let webhook_requests = WebhookResult::ALL.iter().map(|r| webhook_vec.with_label_values(&[r.label()])).collect();
        reg(Box::new(webhook_vec));
        let webhook_events = counter("idlegate_webhook_events_total", "events webhook receivers acknowledged");
        let webhook_lag_seconds = Gauge::new(
            "idlegate_webhook_lag_seconds",
            "age of the oldest event the webhook relay read and no receiver acknowledged yet (0 when none)",
        )
        .expect("valid gauge");
        reg(Box::new(webhook_lag_seconds.clone()));
        let webhook_backlog =
            gauge("idlegate_webhook_backlog_events", "events the webhook relay read and no receiver acknowledged yet");
        let ring_tracked = gauge(
            "idlegate_ring_tracked_uids",
            "sessions in the ring, one per device of each online uid (equals idlegate_online_sessions when healthy)",
        );
        let silence_vec = IntGaugeVec::new(
            Opts::new(
                "idlegate_ring_silence_uids",
                "uids silent for at least age_seconds and fewer than age_seconds + 1 seconds, read off the ring's slots",
            ),
            &["age_seconds"],
        )
        .expect("valid gauge vec");
        reg(Box::new(silence_vec.clone()));
        let silence = (0..timeout_secs.max(1)).map(|s| silence_vec.with_label_values(&[&s.to_string()])).collect();
        let class_sessions = IntGaugeVec::new(
            Opts::new("idlegate_sessions_by_timeout", "sessions in the ring of each timeout class, by its timeout"),
            &["timeout_seconds"],
        )
        .expect("valid gauge vec");
        reg(Box::new(class_sessions.clone()));
        let class_expired = IntCounterVec::new(
            Opts::new("idlegate_expired_by_timeout_total", "sessions that went offline silent, by their timeout class"),
            &["timeout_seconds"],
        )
        .expect("valid counter vec");
        reg(Box::new(class_expired.clone()));
        let classes = config.timeout_classes();
        let by_class = classes
            .iter()
            .map(|class| {
                // Seconds as Prometheus prefers them, fractions for a sub-second tick's.
                let label = (classes.timeout_ms(class) as f64 / 1000.0).to_string();
                let ms = classes.timeout_ms(class);
                (ms, class_sessions.with_label_values(&[&label]), class_expired.with_label_values(&[&label]))
            })
            .collect();
        let sweep_duration = histogram(
            "idlegate_ring_sweep_duration_seconds",
            "time to sweep one tick's slots, notifications included",
            &SECONDS_BUCKETS,
        );
        let expired_per_sweep =
            histogram("idlegate_ring_expired_per_sweep", "uids expired by one sweep", &EXPIRED_PER_SWEEP_BUCKETS);
        let tick_lag = histogram(
            "idlegate_ring_tick_lag_seconds",
            "how late each tick ran against its schedule",
            &SECONDS_BUCKETS,
        );
        let expiry_bye_delay = histogram(
            "idlegate_expiry_bye_delay_seconds",
            "from the tick that expired a session to its BYE(idle_timeout) written and the socket shut down",
            &SECONDS_BUCKETS,
        );

        let pending_logins = gauge("idlegate_pending_logins", "connections accepted and not logged in yet");
        let shed_vec = IntCounterVec::new(
            Opts::new(
                "idlegate_connections_shed_total",
                "connections refused at accept with BYE(server_full) and a retry hint, by why: max_connections \
                 (--max-connections open) or pending_logins (--max-pending-logins waiting to log in: overload)",
            ),
            &["why"],
        )
        .expect("valid counter vec");
        reg(Box::new(shed_vec.clone()));
        let shed_max_connections = shed_vec.with_label_values(&["max_connections"]);
        let shed_pending_logins = shed_vec.with_label_values(&["pending_logins"]);
        let pushes_vec = IntCounterVec::new(
            Opts::new(
                "idlegate_pushes_total",
                "pushes by result: sent (handed to the uid's connection), offline (no live session) \
                 or unsubscribed (only MQTT sessions, none subscribed to the push's topic)",
            ),
            &["result"],
        )
        .expect("valid counter vec");
        reg(Box::new(pushes_vec.clone()));
        let pushes_sent = pushes_vec.with_label_values(&["sent"]);
        let pushes_offline = pushes_vec.with_label_values(&["offline"]);
        let pushes_unsubscribed = pushes_vec.with_label_values(&["unsubscribed"]);
        let events_vec = IntCounterVec::new(Opts::new("idlegate_events_total", "events logged, by type"), &["type"])
            .expect("valid counter vec");
        reg(Box::new(events_vec.clone()));
        let events = EventKind::ALL.iter().map(|k| events_vec.with_label_values(&[k.name()])).collect();
        let event_log_events = gauge("idlegate_event_log_events", "events the in-memory event log holds");
        let event_log_bytes = gauge(
            "idlegate_event_log_bytes",
            "bytes the in-memory event log's events carry (payloads, topics, wills, claims), which --event-log-bytes bounds",
        );
        let event_consumers = gauge("idlegate_event_consumers", "consumers following /v1/events now");
        let watch_entries = gauge("idlegate_watch_entries", "uids on sessions' watch lists, summed over sessions");
        let watched_uids = gauge("idlegate_watched_uids", "uids at least one session of this node watches");
        let watchlist_entries =
            gauge("idlegate_watchlist_entries", "uids on the backend's watch lists (PUT /v1/watchlists), summed");
        let presence_vec = IntCounterVec::new(
            Opts::new(
                "idlegate_presence_entries_total",
                "PRESENCE entries owed to watchers, by kind: change (a transition of a watched uid), snapshot \
                 (answering a WATCH) or resync (a watcher's whole list, after it fell behind or the stream broke)",
            ),
            &["kind"],
        )
        .expect("valid counter vec");
        reg(Box::new(presence_vec.clone()));
        let presence_changes = presence_vec.with_label_values(&["change"]);
        let presence_snapshots = presence_vec.with_label_values(&["snapshot"]);
        let presence_resyncs = presence_vec.with_label_values(&["resync"]);
        let watch_refused_vec = IntCounterVec::new(
            Opts::new(
                "idlegate_watch_refused_total",
                "WATCHes refused, by bound: session (--max-watch) or node (--max-watch-entries)",
            ),
            &["bound"],
        )
        .expect("valid counter vec");
        reg(Box::new(watch_refused_vec.clone()));
        let watch_refused_session = watch_refused_vec.with_label_values(&["session"]);
        let watch_refused_node = watch_refused_vec.with_label_values(&["node"]);
        let api_requests = IntCounterVec::new(
            Opts::new("idlegate_api_requests_total", "backend API requests, by route and status code"),
            &["route", "code"],
        )
        .expect("valid counter vec");
        reg(Box::new(api_requests.clone()));
        let api_latency = prometheus::HistogramVec::new(
            HistogramOpts::new(
                "idlegate_api_request_duration_seconds",
                "backend API requests, by route: the time from the request to its response's head (for /v1/events, until the stream starts)",
            )
            .buckets(API_LATENCY_BUCKETS.to_vec()),
            &["route"],
        )
        .expect("valid histogram vec");
        reg(Box::new(api_latency.clone()));

        let redis_up = gauge("idlegate_redis_up", "1 while the cluster's Redis answers; 0 alone or while unreachable");
        let redis_errors = IntCounterVec::new(
            Opts::new(
                "idlegate_redis_errors_total",
                "Redis calls and connection attempts that failed, by kind: unreachable, auth (the credentials in --redis refused), permission (ACL NOPERM), replicas, other",
            ),
            &["kind"],
        )
        .expect("valid counter vec");
        for kind in ["unreachable", "auth", "permission", "replicas", "other"] {
            redis_errors.with_label_values(&[kind]);
        }
        reg(Box::new(redis_errors.clone()));
        let redis_queue_depth =
            gauge("idlegate_redis_queue_depth", "session changes waiting to reach Redis (grows while it is away)");
        let redis_queue_bytes = gauge(
            "idlegate_redis_queue_bytes",
            "bytes the changes waiting for Redis carry (DATA, MQTT wills, JWT claims): bounded by --redis-queue-bytes",
        );
        let redis_compacted = counter(
            "idlegate_redis_compacted_total",
            "session changes dropped by compaction while Redis was away (data events, sessions Redis never saw)",
        );
        let redis_round_trips =
            counter("idlegate_redis_round_trips_total", "Redis round trips: a pipeline or a batch of commands is one");
        let redis_commands = counter("idlegate_redis_commands_total", "Redis commands sent");
        let redis_rtt = histogram("idlegate_redis_rtt_seconds", "time of one Redis round trip", &SECONDS_BUCKETS);
        let redis_fenced =
            counter("idlegate_redis_fenced_total", "times this node found it was reaped while cut off, and rejoined");
        let redis_lost_writes = counter(
            "idlegate_redis_lost_writes_total",
            "signs that Redis lost acknowledged writes (stream epoch changed, applied marker behind); each reconciles",
        );
        let redis_reopens = counter(
            "idlegate_redis_reopens_total",
            "times the connections to a Redis Cluster were opened anew after no call got an answer for half the lease",
        );
        let redis_replica_waits = counter(
            "idlegate_redis_replica_waits_total",
            "WAITs answered by fewer replicas than --redis-min-replicas (the batch is retried)",
        );
        let redis_reaped =
            counter("idlegate_redis_reaped_total", "sessions of dead nodes this node ended as node_lost");

        let build =
            IntGaugeVec::new(Opts::new("idlegate_build_info", "build of the running gateway; value 1"), &["version"])
                .expect("valid gauge vec");
        build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        reg(Box::new(build));
        // Settings as gauges, so alert rules compare tick lag with the tick and open
        // connections with the limit instead of hard-coding either.
        let setting = |name: &str, help: &str, value: f64| {
            let g = prometheus::Gauge::new(name, help).expect("valid gauge");
            g.set(value);
            reg(Box::new(g));
        };
        setting("idlegate_config_tick_seconds", "the --tick setting", config.tick.as_secs_f64());
        setting("idlegate_config_timeout_seconds", "the --timeout setting", config.timeout.as_secs_f64());
        setting("idlegate_config_max_connections", "the --max-connections setting", config.max_connections as f64);
        setting("idlegate_config_max_devices", "the --max-devices setting", config.max_devices as f64);
        setting(
            "idlegate_config_max_pending_logins",
            "the --max-pending-logins setting",
            config.max_pending_logins as f64,
        );

        #[cfg(target_os = "linux")]
        reg(Box::new(process::ProcessCollector::new()));

        Metrics {
            registry,
            online_users,
            grace_users,
            online_sessions,
            connections_open,
            open_by_transport,
            handshakes,
            handshake_duration,
            tls_reloads_ok,
            tls_reloads_error,
            jwt_reloads_ok,
            jwt_reloads_error,
            jwt_keys,
            jwks_fetches,
            jwks_refetches_limited,
            jwks_keys,
            jwks_fetched_seconds,
            jwks_last_fetch_ok,
            refreshes_ok,
            refreshes_refused,
            token_expiries,
            claims_too_large,
            tls_cert_expiry,
            connections_accepted,
            closed,
            refused_logins,
            proxy_refused,
            config_reloads,
            logins,
            frames,
            ring_expired,
            ring_tracked,
            webhook_requests,
            webhook_events,
            webhook_lag_seconds,
            webhook_backlog,
            silence,
            by_class,
            sweep_duration,
            expired_per_sweep,
            tick_lag,
            expiry_bye_delay,
            pending_logins,
            shed_max_connections,
            shed_pending_logins,
            pushes_sent,
            pushes_offline,
            pushes_unsubscribed,
            events,
            event_log_events,
            event_log_bytes,
            event_consumers,
            watch_entries,
            watched_uids,
            watchlist_entries,
            presence_changes,
            presence_snapshots,
            presence_resyncs,
            watch_refused_session,
            watch_refused_node,
            api_requests,
            api_latency,
            redis_up,
            redis_errors,
            redis_queue_depth,
            redis_queue_bytes,
            redis_compacted,
            redis_round_trips,
            redis_commands,
            redis_rtt,
            redis_fenced,
            redis_lost_writes,
            redis_reopens,
            redis_replica_waits,
            redis_reaped,
        }
    }

    /// A client connection opened on `transport`.
    pub fn opened_on(&self, transport: Transport) {
        self.connections_open.inc();
        self.open_by_transport[transport.index()].inc();
    }

    /// A client connection on `transport` closed.
    pub fn closed_on(&self, transport: Transport) {
        self.connections_open.dec();
        self.open_by_transport[transport.index()].dec();
    }

    /// Connections open now on `transport`.
    pub fn open_on(&self, transport: Transport) -> i64 {
        self.open_by_transport[transport.index()].get()
    }

    /// A handshake on `transport` ended with `result` (one of [`HANDSHAKE_RESULTS`]) after
    /// `seconds`; only finished ones are timed.
    pub fn handshake(&self, transport: Transport, result: &str, seconds: f64) {
        let Some(i) = HANDSHAKE_RESULTS.iter().position(|r| *r == result) else {
            debug_assert!(false, "unknown handshake result {result}");
            return;
        };
        self.handshakes[transport.index()][i].inc();
        if i == 0 {
            self.handshake_duration[transport.index()].observe(seconds);
        }
    }

    /// Handshakes on `transport` that ended with `result`.
    pub fn handshakes(&self, transport: Transport, result: &str) -> u64 {
        HANDSHAKE_RESULTS.iter().position(|r| *r == result).map_or(0, |i| self.handshakes[transport.index()][i].get())
    }

    /// Counts a webhook request by its result.
    pub fn webhook_request(&self, result: WebhookResult) {
        self.webhook_requests[result as usize].inc();
    }

    /// Counts a closed connection of `door`.
    pub fn closed(&self, reason: CloseReason, door: Transport) {
        if let Some(c) = self.closed.get(reason.index()).and_then(|by_door| by_door.get(door.index())) {
            c.inc();
        }
    }

    /// Counts a connection of `door` refused before its login, for `why`.
    pub fn refused_login(&self, door: Transport, why: &str) {
        self.refused_logins.with_label_values(&[door.label(), why]).inc();
    }

    /// Counts a configuration read again at a SIGHUP, with its `result`.
    pub fn config_reload(&self, result: &str) {
        self.config_reloads.with_label_values(&[result]).inc();
    }

    /// Counts a connection of `door` closed for its PROXY header, for `why`.
    pub fn proxy_refused(&self, door: Transport, why: &str) {
        self.proxy_refused.with_label_values(&[door.label(), why]).inc();
    }

    /// Connections of `door` refused before their login for `why`, so far.
    pub fn refused_login_count(&self, door: Transport, why: &str) -> u64 {
        self.refused_logins.with_label_values(&[door.label(), why]).get()
    }

    /// Counts a failed Redis call or connection attempt of `kind`.
    pub fn redis_error(&self, kind: &str) {
        self.redis_errors.with_label_values(&[kind]).inc();
    }

    /// Failed Redis calls so far of `kind`.
    pub fn redis_error_count(&self, kind: &str) -> u64 {
        self.redis_errors.with_label_values(&[kind]).get()
    }

    /// Closed connections so far for `reason`.
    pub fn closed_count(&self, reason: CloseReason) -> u64 {
        self.closed.get(reason.index()).map_or(0, |by_door| by_door.iter().map(IntCounter::get).sum())
    }

    /// Counts a frame of kind byte `kind` received (a command the same as one, on doors
    /// that do not speak frames); kinds clients do not send are not counted.
    pub fn frame_of_kind(&self, kind: u8) {
        if let Some(index) = FRAME_KINDS.iter().position(|&(k, _)| k == kind) {
            self.frames[index].inc();
        }
    }

    /// Frames of kind byte `kind` received so far.
    pub fn frame_count(&self, kind: u8) -> u64 {
        FRAME_KINDS.iter().position(|&(k, _)| k == kind).map_or(0, |i| self.frames[i].get())
    }

    /// Counts a logged event of `kind`.
    pub fn event(&self, kind: EventKind) {
        self.events[kind.index()].inc();
    }

    /// Events of `kind` logged so far.
    pub fn event_count(&self, kind: EventKind) -> u64 {
        self.events[kind.index()].get()
    }

    /// Creates the series of `route` answering `code` at 0, before any request.
    pub(crate) fn api_request_series(&self, route: &str, code: u16) {
        let _ = self.api_requests.with_label_values(&[route, &code.to_string()]);
        let _ = self.api_latency.with_label_values(&[route]);
    }

    /// How long a routed request took to its response's head.
    pub(crate) fn api_latency(&self, route: &str, seconds: f64) {
        self.api_latency.with_label_values(&[route]).observe(seconds);
    }

    /// Counts a backend API request by its route pattern and status code.
    pub fn api_request(&self, route: &str, code: u16) {
        self.api_requests.with_label_values(&[route, &code.to_string()]).inc();
    }

    /// Sets each timeout class's session count, shortest class first.
    pub fn set_sessions_by_class(&self, counts: &[u64]) {
        for ((_, gauge, _), &n) in self.by_class.iter().zip(counts) {
            gauge.set(n as i64);
        }
    }

    /// Counts a session of class `index` that went offline silent.
    pub fn expired_in_class(&self, index: usize) {
        if let Some((_, _, counter)) = self.by_class.get(index) {
            counter.inc();
        }
    }

    /// Each timeout class, shortest first: its timeout in ms, its sessions as last
    /// refreshed, and its silent expiries so far.
    pub fn classes(&self) -> Vec<(u64, i64, u64)> {
        self.by_class.iter().map(|(ms, sessions, expired)| (*ms, sessions.get(), expired.get())).collect()
    }

    /// Sets the silence picture: `by_age[s]` uids silent for `s` whole seconds.
    pub fn set_silence(&self, by_age: &[i64]) {
        for (gauge, &n) in self.silence.iter().zip(by_age) {
            gauge.set(n);
        }
    }

    /// The silence picture as last refreshed: uids by whole seconds of silence.
    pub fn silence(&self) -> Vec<i64> {
        self.silence.iter().map(IntGauge::get).collect()
    }

    /// Number of silence series (whole seconds of the timeout).
    pub fn silence_series(&self) -> usize {
        self.silence.len()
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut buf).expect("text encoding into a Vec cannot fail");
        String::from_utf8(buf).expect("the text format is UTF-8")
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").field("online_users", &self.online_users.get()).finish_non_exhaustive()
    }
}

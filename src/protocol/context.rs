//! What the protocol machine (and the driver around it) may reach: the registry, the clock,
//! the metrics, the shutdown signal, and the rules it enforces, worked out from the
//! configuration once. Nothing else of the gateway: not the cluster, not the HTTP side.
//!
//! Built by the composition root (`server.rs`) and shared by every connection as an `Arc`,
//! one pointer in each connection's task.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::{Config, JwtAuth, Live, WatchPolicy};
use crate::metrics::Metrics;
use crate::presence::{data_bucket, Clock, Registry, WatchLists, Watches};

/// The protocol's view of the gateway; see the module documentation.
#[derive(Debug)]
pub(crate) struct Context {
    pub(crate) registry: Arc<Registry>,
    pub(crate) clock: Clock,
    pub(crate) metrics: Arc<Metrics>,
    /// Cancelled when shutdown begins: connections send BYE(shutdown).
    pub(crate) shutdown: CancellationToken,
    pub(crate) rules: Rules,
    /// Watch lists: the fan-out's handle, and whom each user may watch.
    pub(crate) watches: Arc<Watches>,
    pub(crate) watch_lists: Arc<WatchLists>,
}

/// The configuration as the machine applies it.
#[derive(Debug, Clone)]
pub(crate) struct Rules {
    /// What a SIGHUP may change: the HMAC token secrets checked at LOGIN (`--auth-secret`),
    /// the DATA rate (`--max-data-rate`, `--max-data-burst`).
    pub(crate) live: Arc<Live>,
    /// JWT check on LOGIN (`--jwt-key-file`, `--jwt-secret-file`), if any.
    pub(crate) jwt: Option<Arc<JwtAuth>>,
    /// End sessions when their token expires (`--enforce-token-expiry`).
    pub(crate) enforce_token_expiry: bool,
    /// For the WELCOME: the tick (the timeout is the session's class's).
    pub(crate) tick_ms: u32,
    /// From accept to a successful LOGIN, handshakes included (`--login-timeout`).
    pub(crate) login_timeout: Duration,
    /// The tick, in which the DATA bucket refills.
    pub(crate) tick: Duration,
    /// Topic filters one MQTT session may hold (`--mqtt-max-subscriptions`).
    pub(crate) mqtt_max_subscriptions: usize,
    /// Sessions one uid may hold (`--max-devices`), for the text of an eviction's BYE.
    pub(crate) max_devices: usize,
    /// Whether WebSocket sessions silent for a third of the timeout are pinged.
    pub(crate) ws_keepalive_pings: bool,
    /// Who may watch whom (`--watch-policy`).
    pub(crate) watch_policy: WatchPolicy,
    /// Longest status, in bytes (`--max-status-bytes`).
    pub(crate) max_status_bytes: usize,
}

// === impl Rules ===

impl Rules {
    /// `--max-data-rate` in the session bucket's units (per tick, burst) if limited, with
    /// the rate and burst as configured for a close's text.
    pub(crate) fn data_bucket(&self) -> Option<((u64, u64), (u32, u32))> {
        let (rate, burst) = self.live.data_rate();
        data_bucket(rate, burst, self.tick).map(|bucket| (bucket, (rate, burst)))
    }
}

impl Rules {
    pub(crate) fn new(config: &Config, live: Arc<Live>) -> Rules {
        Rules {
            live,
            jwt: config.jwt.clone(),
            enforce_token_expiry: config.enforce_token_expiry,
            tick_ms: config.tick_ms(),
            login_timeout: config.login_timeout,
            tick: config.tick,
            mqtt_max_subscriptions: config.mqtt_max_subscriptions,
            max_devices: config.max_devices,
            ws_keepalive_pings: config.ws_keepalive_pings,
            watch_policy: config.watch.policy(),
            max_status_bytes: config.watch.max_status_bytes,
        }
    }
}

// === impl Context ===

impl Context {
    /// A context alone (a registry with a local event log, a clock starting now), for the
    /// machine's and the doors' unit tests. Its watch lists' fan-out does not run: WATCHes
    /// are counted and never answered.
    #[cfg(test)]
    pub(crate) fn for_test(config: &Config) -> Arc<Context> {
        use crate::presence::{EventLog, Local};
        let metrics = Arc::new(Metrics::new(config));
        let events = EventLog::new(config.event_log_capacity, config.event_log_bytes, metrics.clone());
        let registry =
            Registry::with_classes(config.timeout_classes(), config.max_devices, Arc::new(events), metrics.clone());
        let registry = Arc::new(if config.enforce_token_expiry { registry.with_token_expiry() } else { registry });
        let clock = Clock::new(tokio::time::Instant::now(), config.tick);
        let directory = Arc::new(Local::of(registry.clone(), clock, config, &metrics));
        let watch = &config.watch;
        let store = Arc::new(crate::presence::LocalLists::new(watch.max_watch, watch.max_entries));
        let watch_lists = Arc::new(WatchLists::new(store));
        let lists = Some(watch_lists.clone());
        let (watches, _fan_out) = Watches::new(
            watch.max_watch,
            watch.max_entries,
            config.max_queued_bytes(),
            directory,
            lists,
            metrics.clone(),
        );
        Arc::new(Context {
            registry,
            clock,
            metrics,
            shutdown: CancellationToken::new(),
            rules: Rules::new(config, Arc::new(Live::new(config))),
            watches,
            watch_lists,
        })
    }
}

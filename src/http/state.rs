//! What the HTTP side may reach of the gateway: the directory it asks, the metrics it
//! shows, the gateway's health, the settings its answers need, and the budget of bytes its
//! event streams share. Not the registry, not the cluster: both listeners serve the same
//! API alone or clustered, through the [`Directory`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, JwtAuth, TlsIdentity, WatchPolicy};
use crate::metrics::Metrics;
use crate::presence::{Clock, Directory, StoreTrouble, WatchLists, Watches};

/// Most bytes of event-stream chunks all consumers together hold: 64 consumers' worth of
/// the largest chunk. Past it, consumers take turns instead of adding memory.
pub(crate) const EVENT_STREAMS_BYTES: usize = 64 * 1024 * 1024;

/// The HTTP side's view of the gateway; see the module documentation.
#[derive(Debug)]
pub(crate) struct State {
    /// Presence, push, kicks and events, from this process or the cluster.
    pub(crate) directory: Arc<dyn Directory>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) health: Health,
    pub(crate) settings: Settings,
    /// The clock of the ring: the status page's uptime.
    pub(crate) clock: Clock,
    /// Bytes of event-stream chunks held for consumers across both HTTP listeners, in
    /// permits of one byte: a consumer whose next chunk does not fit waits (it is behind,
    /// not lost), so slow consumers together hold at most [`EVENT_STREAMS_BYTES`].
    pub(crate) stream_budget: Arc<Semaphore>,
    /// The backend's watch lists (`/v1/watchlists`), and the fan-out, which a list that
    /// shrinks revokes watches through.
    pub(crate) watches: Arc<Watches>,
    pub(crate) watch_lists: Arc<WatchLists>,
}

/// What liveness and readiness answer from.
pub(crate) struct Health {
    /// Set if the ticker died: nobody goes offline any more.
    pub(crate) expiry_stopped: Arc<AtomicBool>,
    /// Cancelled when shutdown begins.
    pub(crate) draining: CancellationToken,
    /// Why the cluster's store cannot be used now, while it cannot; `None` alone.
    pub(crate) store_trouble: Option<Arc<dyn Fn() -> Option<StoreTrouble> + Send + Sync>>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("expiry_stopped", &self.expiry_stopped())
            .field("draining", &self.draining.is_cancelled())
            .field("store_trouble", &self.store_trouble())
            .finish()
    }
}

/// The configuration the HTTP answers need.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) node_id: String,
    /// TLS on the listeners (`--admin-tls`, `--api-tls`), with this identity.
    pub(crate) tls: Option<Arc<TlsIdentity>>,
    pub(crate) admin_tls: bool,
    pub(crate) api_tls: bool,
    /// Whether a webhook relay runs (`--webhook-url`): the status page shows its lag.
    pub(crate) webhook: bool,
    /// The JWT keys, whose sources and freshness the status page shows.
    pub(crate) jwt: Option<Arc<JwtAuth>>,
    /// The bearer token the API and the event stream require (`--api-token`).
    pub(crate) api_token: Option<String>,
    pub(crate) max_push_bytes: usize,
    /// The topic of a push that names none (`--mqtt-push-topic`).
    pub(crate) push_topic: Arc<str>,
    pub(crate) timeout_ms: u32,
    pub(crate) tick_ms: u32,
    pub(crate) max_connections: usize,
    pub(crate) max_devices: usize,
    /// Who may watch whom (`--watch-policy`): a backend's list only counts under `listed`.
    pub(crate) watch_policy: WatchPolicy,
}

// === impl Health ===

impl Health {
    /// Whether the ticker died.
    pub(crate) fn expiry_stopped(&self) -> bool {
        self.expiry_stopped.load(Ordering::Acquire)
    }

    /// Why the cluster's store cannot be used now (never alone).
    pub(crate) fn store_trouble(&self) -> Option<StoreTrouble> {
        self.store_trouble.as_ref().and_then(|trouble| trouble())
    }
}

// === impl Settings ===

impl Settings {
    pub(crate) fn new(config: &Config) -> Settings {
        Settings {
            node_id: config.node_id.clone(),
            tls: config.tls.clone(),
            admin_tls: config.admin_tls,
            api_tls: config.api_tls,
            webhook: config.webhook.is_some(),
            jwt: config.jwt.clone(),
            api_token: config.api_token.clone(),
            max_push_bytes: config.max_push_bytes(),
            push_topic: Arc::from(config.mqtt_push_topic.as_str()),
            timeout_ms: config.timeout_ms(),
            tick_ms: config.tick_ms(),
            max_connections: config.max_connections,
            max_devices: config.max_devices,
            watch_policy: config.watch.policy(),
        }
    }
}

//! What every task of one gateway shares: its settings, who is online, its metrics, its
//! clock, the shutdown signal, and the directory the backend API asks.
//!
//! Built once by [`crate::Server::new`]; connection handlers, the ticker and both HTTP
//! listeners hold an `Arc` of it. It depends on the three sides, and none of them on each
//! other through it.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cluster::{Cluster, ClusterDirectory, Settings};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::presence::Pending;
use crate::presence::{Clock, Directory, EventLog, Local, Registry};

/// One gateway's shared state; see the module documentation.
#[derive(Debug)]
pub(crate) struct Gateway {
    pub(crate) config: Config,
    pub(crate) registry: Arc<Registry>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) clock: Clock,
    /// Cancelled when shutdown begins: connections send BYE(shutdown), readyz says 503.
    pub(crate) shutdown: CancellationToken,
    /// Presence, push, kicks and events for the backend API.
    pub(crate) directory: Arc<dyn Directory>,
    /// Set if the ticker died: nobody goes offline any more, and `/healthz` says so.
    pub(crate) expiry_stopped: AtomicBool,
    /// This node's place in a cluster, with `--redis`.
    pub(crate) cluster: Option<Arc<Cluster>>,
    /// Bytes of event-stream chunks held for consumers across both HTTP listeners, in
    /// permits of one byte: a consumer whose next chunk does not fit waits (it is behind,
    /// not lost), so slow consumers together hold at most [`EVENT_STREAMS_BYTES`].
    pub(crate) event_stream_bytes: Arc<Semaphore>,
    /// Connections waiting to log in, bounded in all and per source address.
    pub(crate) pending: Arc<Pending>,
    /// `--max-data-rate` in the session bucket's units, worked out once.
    pub(crate) data_bucket: Option<(u64, u64)>,
    /// The topic of a push that names none (`--mqtt-push-topic`), shared by every push.
    pub(crate) push_topic: Arc<str>,
}

/// Most bytes of event-stream chunks all consumers together hold: 64 consumers' worth of
/// the largest chunk. Past it, consumers take turns instead of adding memory.
pub(crate) const EVENT_STREAMS_BYTES: usize = 64 * 1024 * 1024;

// === impl Gateway ===

impl Gateway {
    /// A gateway with `config`, which must have passed [`Config::validate`]; its clock starts
    /// now.
    pub(crate) fn new(config: Config) -> Arc<Gateway> {
        debug_assert!(config.validate().is_ok(), "Gateway::new with an invalid config: {:?}", config.validate());
        let metrics = Arc::new(Metrics::new(&config));
        let push_topic: Arc<str> = Arc::from(config.mqtt_push_topic.as_str());
        let cluster = config.redis.clone().map(|target| {
            let settings = Settings {
                node: config.node_id.clone(),
                lease: config.node_lease,
                tick: config.tick,
                stream_cap: config.event_log_capacity,
                stream_bytes: config.event_log_bytes,
                max_queued: config.max_queued_bytes(),
                min_replicas: config.redis_min_replicas,
                max_devices: config.max_devices,
                push_topic: push_topic.clone(),
            };
            let (capacity, bytes) = (config.redis_queue_capacity(), config.redis_queue_bytes);
            Arc::new(Cluster::new(target, settings, metrics.clone(), capacity, bytes))
        });
        let mut events = EventLog::new(config.event_log_capacity, config.event_log_bytes, metrics.clone());
        if let Some(cluster) = &cluster {
            events = events.with_sink(cluster.sink());
        }
        let registry =
            Arc::new(Registry::with_devices(config.window(), config.max_devices, Arc::new(events), metrics.clone()));
        let clock = Clock::new(Instant::now(), config.tick);
        let data_bucket = crate::presence::data_bucket(config.max_data_rate, config.max_data_burst, config.tick);
        let pending = Arc::new(Pending::new(config.max_pending_logins, config.max_pending_logins_per_ip));
        let directory: Arc<dyn Directory> = match &cluster {
            Some(cluster) => {
                cluster.attach(registry.clone(), clock);
                Arc::new(ClusterDirectory::new(cluster.clone()))
            }
            None => Arc::new(Local::new(
                registry.clone(),
                clock,
                config.node_id.clone(),
                config.max_queued_bytes(),
                metrics.connections_open.clone(),
            )),
        };
        Arc::new(Gateway {
            config,
            registry,
            metrics,
            clock,
            shutdown: CancellationToken::new(),
            directory,
            expiry_stopped: AtomicBool::new(false),
            cluster,
            event_stream_bytes: Arc::new(Semaphore::new(EVENT_STREAMS_BYTES)),
            pending,
            data_bucket,
            push_topic,
        })
    }
}

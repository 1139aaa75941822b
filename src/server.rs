//! The composition root: the one place that builds the gateway's parts and wires them
//! together, then accepts connections, runs the ticker, the cluster and the HTTP listeners,
//! and drains on shutdown.
//!
//! Built bottom up, each part handed only what it needs: the metrics; then presence (the
//! clock, the event log, the registry), with a cluster's queue built first so the log
//! forwards to it from the start; then the cluster on that registry (a [`Backplane`], the
//! only thing here that names Redis); then the narrow handles the sides hold: the
//! protocol's [`protocol::Context`], the doors' [`Doors`], the HTTP side's [`http::State`].
//! No part below holds the whole.
//!
//! Its inputs are injected, as in mini-redis: the caller binds the listeners and passes the
//! shutdown future, so tests run servers on `127.0.0.1:0` and end them when they like.

use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::{timeout_at, Instant};
use tokio_util::sync::CancellationToken;

use crate::cluster::{Joining, Settings};
use crate::config::{Config, JwtAuth, Live, TlsIdentity, WatchPolicy, WebhookSecrets};
use crate::http::{self, serve_admin, serve_api, EVENT_STREAMS_BYTES};
use crate::jwks::Refresher;
use crate::metrics::Metrics;
use crate::presence::{
    Backplane, Clock, Directory, EventLog, FanOut, ListStore, Local, LocalLists, Registry, StoreTrouble, Ticker,
    WatchLists, Watches,
};
use crate::proto::{CloseReason, Transport};
use crate::protocol::{self, Rules};
use crate::transport::Doors;
use crate::webhook::Relay;

/// The sockets a gateway serves, bound by the caller.
#[derive(Debug)]
pub struct Listeners {
    /// Where clients connect over plain TCP.
    pub clients: TcpListener,
    /// Where clients connect over TLS (`--tls-listen`); needs [`Config::tls`].
    pub tls: Option<TcpListener>,
    /// Where clients connect over WebSocket (`--ws-listen`).
    pub ws: Option<TcpListener>,
    /// Where clients connect over WebSocket in TLS (`--wss-listen`); needs [`Config::tls`].
    pub wss: Option<TcpListener>,
    /// Where MQTT clients connect (`--mqtt-listen`).
    pub mqtt: Option<TcpListener>,
    /// Where MQTT clients connect over TLS (`--mqtts-listen`); needs [`Config::tls`].
    pub mqtts: Option<TcpListener>,
    /// `/healthz`, `/readyz`, `/metrics`, if wanted.
    pub admin: Option<TcpListener>,
    /// The backend API, if wanted.
    pub api: Option<TcpListener>,
}

// === impl Listeners ===

impl Listeners {
    /// Clients only, no HTTP.
    pub fn clients(clients: TcpListener) -> Listeners {
        Listeners { clients, tls: None, ws: None, wss: None, mqtt: None, mqtts: None, admin: None, api: None }
    }

    /// The client listeners given, each with its door's name (one line per door), and the
    /// admin and API listeners.
    #[allow(clippy::type_complexity)]
    fn split(self) -> (Vec<(TcpListener, Transport)>, Option<TcpListener>, Option<TcpListener>) {
        let wanted = [
            (Some(self.clients), Transport::Tcp),
            (self.tls, Transport::Tls),
            (self.ws, Transport::Ws),
            (self.wss, Transport::Wss),
            (self.mqtt, Transport::Mqtt),
            (self.mqtts, Transport::Mqtts),
        ];
        let doors = wanted.into_iter().filter_map(|(listener, transport)| Some((listener?, transport))).collect();
        (doors, self.admin, self.api)
    }
}

/// An idlegate gateway, ready to run; see the module documentation.
#[derive(Debug)]
pub struct Server {
    config: Config,
    /// What a SIGHUP may change.
    live: Arc<Live>,
    metrics: Arc<Metrics>,
    registry: Arc<Registry>,
    clock: Clock,
    /// The cluster's shared store, with `--redis`.
    backplane: Option<Arc<dyn Backplane>>,
    directory: Arc<dyn Directory>,
    /// Cancelled when shutdown begins: connections send BYE(shutdown), readyz says 503.
    shutdown: CancellationToken,
    /// Set if the ticker died: nobody goes offline any more, and `/healthz` says so.
    expiry_stopped: Arc<AtomicBool>,
    /// The fetcher of the JWT keys by URL, once built ([`Server::fetch_jwt_keys`], or `run`).
    jwks: OnceLock<Arc<Refresher>>,
    /// Watch lists: the fan-out's handle, the task until `run` starts it, and whom each
    /// user may watch.
    watches: Arc<Watches>,
    fan_out: Mutex<Option<FanOut>>,
    watch_lists: Arc<WatchLists>,
}

// === impl Server ===

impl Server {
    /// A gateway with `config`, which must have passed [`Config::validate`]; its clock starts
    /// now.
    pub fn new(config: Config) -> Server {
        debug_assert!(config.validate().is_ok(), "Server::new with an invalid config: {:?}", config.validate());
        let metrics = Arc::new(Metrics::new(&config));
        // A cluster's queue comes first: the event log forwards every change to it.
        let joining = config.redis.clone().map(|target| {
            let settings = Settings {
                node: config.node_id.clone(),
                lease: config.node_lease,
                tick: config.tick,
                stream_cap: config.event_log_capacity,
                stream_bytes: config.event_log_bytes,
                max_queued: config.max_queued_bytes(),
                min_replicas: config.redis_min_replicas,
                max_devices: config.max_devices,
                push_topic: Arc::from(config.mqtt_push_topic.as_str()),
                offline_grace: config.offline_grace,
                last_seen_ttl: config.last_seen_ttl,
            };
            let (capacity, bytes) = (config.redis_queue_capacity(), config.redis_queue_bytes);
            Joining::new(target, settings, metrics.clone(), capacity, bytes)
        });
        // Alone, last-seen times live here; a cluster's live in Redis, where every node
        // answers from.
        let last_seen = if joining.is_some() { 0 } else { config.last_seen_capacity };
        let mut events = EventLog::new(config.event_log_capacity, config.event_log_bytes, metrics.clone())
            .remembering_last_seen(last_seen);
        if let Some(joining) = &joining {
            events = events.replicating_to(joining.replica());
        }
        let clock = Clock::new(Instant::now(), config.tick);
        let registry =
            Registry::with_classes(config.timeout_classes(), config.max_devices, Arc::new(events), metrics.clone());
        // A cluster's graces live in Redis, where they outlive the node that began them.
        let grace = if joining.is_some() { 0 } else { config.grace_ticks() };
        let registry = registry.with_offline_grace(grace, clock);
        let registry = Arc::new(if config.enforce_token_expiry { registry.with_token_expiry() } else { registry });
        // The one line that picks the backplane: Redis with `--redis`, none alone.
        let backplane = joining.map(|joining| joining.join(registry.clone(), clock) as Arc<dyn Backplane>);
        let directory: Arc<dyn Directory> = match &backplane {
            Some(backplane) => backplane.clone().directory(),
            None => Arc::new(Local::of(registry.clone(), clock, &config, &metrics)),
        };
        let watch = &config.watch;
        // The backend's watch lists: here alone, in Redis for a cluster, where a change made
        // through another node reaches this node's fan-out (wired once it exists).
        let fan_out_handle: Arc<OnceLock<Arc<Watches>>> = Arc::new(OnceLock::new());
        let store: Arc<dyn ListStore> = match &backplane {
            Some(backplane) => {
                let handle = fan_out_handle.clone();
                let changed = Arc::new(move |user: u64| {
                    if let Some(watches) = handle.get() {
                        watches.revoke(user);
                    }
                });
                backplane.clone().watch_lists(watch.max_watch, changed)
            }
            None => Arc::new(LocalLists::new(watch.max_watch, watch.max_entries)),
        };
        let watch_lists = Arc::new(WatchLists::new(store));
        let (watches, fan_out) = Watches::new(
            watch.max_watch,
            watch.max_entries,
            config.max_queued_bytes(),
            directory.clone(),
            (watch.policy() == WatchPolicy::Listed).then(|| watch_lists.clone()),
            metrics.clone(),
        );
        let _ = fan_out_handle.set(watches.clone());
        Server {
            live: Arc::new(Live::new(&config)),
            watches,
            fan_out: Mutex::new(Some(fan_out)),
            watch_lists,
            config,
            metrics,
            registry,
            clock,
            backplane,
            directory,
            shutdown: CancellationToken::new(),
            expiry_stopped: Arc::new(AtomicBool::new(false)),
            jwks: OnceLock::new(),
        }
    }

    /// The fetcher of the JWT keys by URL (`--jwt-jwks-url`, `--jwt-issuer-url`), built on
    /// first use; `None` without keys by URL.
    fn jwks(&self) -> Result<Option<Arc<Refresher>>, String> {
        let (Some(config), Some(jwt)) = (&self.config.jwks, &self.config.jwt) else { return Ok(None) };
        if let Some(built) = self.jwks.get() {
            return Ok(Some(built.clone()));
        }
        let shared = self.backplane.clone().map(|b| b.shared_keys());
        let built = Refresher::new(config.clone(), jwt.clone(), self.metrics.clone(), shared, &self.config.node_id)
            .map_err(|e| format!("--jwt-jwks-ca-file: {e}"))?;
        Ok(Some(self.jwks.get_or_init(|| built).clone()))
    }

    /// Fetches the JWT keys by URL once, before serving: how many keys are in use after, or
    /// why none could be fetched, the flag named (`idlegate serve` exits 2 on it unless
    /// `--jwt-jwks-optional`; `run` keeps trying either way). `Ok(None)` without keys by URL.
    pub async fn fetch_jwt_keys(&self) -> Result<Option<usize>, String> {
        match self.jwks()? {
            Some(jwks) => jwks.first().await.map(Some),
            None => Ok(None),
        }
    }

    /// What a SIGHUP may change while it runs: `idlegate serve` hands a configuration read
    /// again to [`Live::apply`].
    pub fn live(&self) -> Arc<Live> {
        self.live.clone()
    }

    /// The gateway's metrics, for tests and embedding.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// The protocol's handle: what every connection reaches.
    fn protocol(&self) -> Arc<protocol::Context> {
        Arc::new(protocol::Context {
            registry: self.registry.clone(),
            clock: self.clock,
            metrics: self.metrics.clone(),
            shutdown: self.shutdown.clone(),
            rules: Rules::new(&self.config, self.live.clone()),
            watches: self.watches.clone(),
            watch_lists: self.watch_lists.clone(),
        })
    }

    /// The HTTP side's handle.
    fn http(&self) -> Arc<http::State> {
        let store_trouble = self.backplane.clone().map(|backplane| {
            let trouble: Arc<dyn Fn() -> Option<StoreTrouble> + Send + Sync> = Arc::new(move || backplane.trouble());
            trouble
        });
        Arc::new(http::State {
            directory: self.directory.clone(),
            metrics: self.metrics.clone(),
            health: http::Health {
                expiry_stopped: self.expiry_stopped.clone(),
                draining: self.shutdown.clone(),
                store_trouble,
            },
            settings: http::Settings::new(&self.config),
            clock: self.clock,
            stream_budget: Arc::new(Semaphore::new(EVENT_STREAMS_BYTES)),
            watches: self.watches.clone(),
            watch_lists: self.watch_lists.clone(),
        })
    }

    /// Serves clients (and, if given, the admin endpoint and the backend API) until
    /// `shutdown` resolves, then sends every connection BYE(shutdown) and waits up to the
    /// drain timeout for them to close.
    pub async fn run(self, listeners: Listeners, shutdown: impl Future) -> io::Result<()> {
        let doors = Arc::new(Doors::new(&self.config, self.protocol()));
        let (open, admin, api) = listeners.split();
        if let Some((_, transport)) = open.iter().find(|(_, transport)| !doors.can_open(*transport)) {
            return Err(io::Error::other(format!("a {transport} listener needs --tls-cert and --tls-key")));
        }
        let background = CancellationToken::new();
        let ticker = Ticker::new(self.registry.clone(), self.metrics.clone(), self.clock, self.config.window());
        let ticker = tokio::spawn(ticker.run(background.clone()));
        let mut tasks = Vec::new();
        let fan_out = self.fan_out.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        if let Some(fan_out) = fan_out {
            tasks.push(tokio::spawn(fan_out.run(background.clone())));
        }
        if let Some(backplane) = &self.backplane {
            tasks.push(tokio::spawn(backplane.clone().run(background.clone())));
        }
        let http = self.http();
        if let Some(admin) = admin {
            tasks.push(tokio::spawn(serve_admin(admin, http.clone(), background.clone())));
        }
        if let Some(api) = api {
            tasks.push(tokio::spawn(serve_api(api, http, background.clone())));
        }
        if let Some(jwks) = self.jwks().map_err(io::Error::other)? {
            tasks.push(tokio::spawn(jwks.run(background.clone())));
        }
        let webhook_secrets = self.config.webhook.as_ref().map(|w| w.secrets.clone());
        if self.config.tls.is_some() || self.config.jwt.is_some() || webhook_secrets.is_some() {
            let files = Reloadable { identity: self.config.tls.clone(), jwt: self.config.jwt.clone(), webhook_secrets };
            tasks.push(tokio::spawn(reload_on_sighup(files, self.metrics.clone(), background.clone())));
        }
        // The relay follows the log from its first event: started before any door opens.
        let (finish_relay, relay_finishing) = tokio::sync::watch::channel(None);
        let relay = match self.config.webhook.clone() {
            Some(webhook) => {
                let shared = self.backplane.clone().map(|b| (b.relay_turn(), self.config.node_lease));
                let relay =
                    Relay::new(webhook, self.directory.clone(), shared, self.metrics.clone(), &self.config.node_id)
                        .map_err(io::Error::other)?;
                Some(tokio::spawn(relay.run(relay_finishing)))
            }
            None => None,
        };
        let loops = open.iter().map(|(listener, transport)| Box::pin(doors.accept(listener, *transport)));
        let mut ticker = ticker;
        let mut failure = None;
        tokio::select! {
            res = futures_util::future::try_join_all(loops) => { res?; }
            _ = shutdown => {}
            ended = &mut ticker => failure = Some(self.ticker_stopped(ended)),
        }

        drop(open);
        // One deadline for the whole shutdown, whatever Redis or a consumer does: a
        // supervisor waiting `--drain-timeout` (plus its own margin) never has to kill us.
        let deadline = Instant::now() + self.config.drain_timeout;
        let slots = doors.slots();
        tracing::info!(open = slots.open(), "shutting down: stopped accepting, sending BYE(shutdown)");
        self.shutdown.cancel();
        self.registry.end_all(CloseReason::Shutdown);
        if timeout_at(deadline, slots.all_closed()).await.is_err() {
            tracing::warn!(
                left = slots.open(),
                drain_timeout = ?self.config.drain_timeout,
                "drain timed out; dropping the connections left"
            );
        }
        if let Some(mut relay) = relay {
            // Every session has ended: the relay delivers their offline events (reason
            // shutdown) and whatever else the log holds, by the deadline.
            let _ = finish_relay.send(Some(deadline));
            if timeout_at(deadline + SHUTDOWN_GRACE, &mut relay).await.is_err() {
                relay.abort();
            }
        }
        if let Some(backplane) = &self.backplane {
            // Every session has ended: their offline events (reason shutdown) reach the
            // store before this node leaves, instead of when its lease runs out. What
            // cannot be written by the deadline is left to the lease and the reaper.
            backplane.leave(deadline.saturating_duration_since(Instant::now())).await;
        }
        background.cancel();
        if failure.is_none() {
            let _ = timeout_at(deadline + SHUTDOWN_GRACE, &mut ticker).await;
        }
        for mut task in tasks {
            if timeout_at(deadline + SHUTDOWN_GRACE, &mut task).await.is_err() {
                tracing::warn!("a listener or event stream outlived the drain deadline; stopping it");
                task.abort();
            }
        }
        match failure {
            Some(e) => Err(e),
            None => {
                tracing::info!("shut down");
                Ok(())
            }
        }
    }

    /// The ticker ended while the gateway was serving, which it never does unless it
    /// panicked: nobody would go offline any more. Marks the gateway unhealthy (`/healthz`
    /// answers 503) and returns the error `run` ends with, after draining, so a supervisor
    /// restarts the process instead of keeping one that looks alive and expires no one.
    fn ticker_stopped(&self, ended: Result<(), tokio::task::JoinError>) -> io::Error {
        self.expiry_stopped.store(true, Ordering::Release);
        let why = match ended {
            Err(e) if e.is_panic() => "it panicked",
            Err(_) => "it was cancelled",
            Ok(()) => "it returned",
        };
        tracing::error!(why, "the ticker stopped: expiry no longer runs; draining and exiting");
        io::Error::other(format!("the ticker stopped ({why}): expiry no longer runs"))
    }
}

/// What the background tasks get past the drain deadline to notice the stop and finish
/// what they were writing (an event stream's last chunk, a metrics answer) before they
/// are aborted: the whole shutdown stays within `--drain-timeout` plus this.
const SHUTDOWN_GRACE: Duration = Duration::from_millis(500);

/// The files a SIGHUP reads again.
struct Reloadable {
    identity: Option<Arc<TlsIdentity>>,
    jwt: Option<Arc<JwtAuth>>,
    webhook_secrets: Option<Arc<WebhookSecrets>>,
}

/// Reads `--tls-cert` and `--tls-key`, the JWT keys and `--webhook-secret-file` again on
/// every SIGHUP; a bad file is logged, counted and what was in use stays. Connections open
/// keep the session they have; a live session is never checked again against the new keys.
async fn reload_on_sighup(files: Reloadable, metrics: Arc<Metrics>, stop: CancellationToken) {
    let Reloadable { identity, jwt, webhook_secrets } = files;
    if let Some(identity) = &identity {
        metrics.tls_cert_expiry.set(identity.not_after());
    }
    if let Some(jwt) = &jwt {
        metrics.jwt_keys.set(jwt.key_count() as i64);
    }
    #[cfg(unix)]
    {
        let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
            tracing::warn!("cannot listen for SIGHUP; the TLS certificate and JWT keys are read only at start");
            return;
        };
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                got = hup.recv() => if got.is_none() { return },
            }
            if let Some(jwt) = &jwt {
                match jwt.reload() {
                    Ok(keys) => {
                        metrics.jwt_reloads_ok.inc();
                        metrics.jwt_keys.set(keys as i64);
                        tracing::info!(keys, "SIGHUP: JWT keys read again; new logins are checked against them");
                    }
                    Err(e) => {
                        metrics.jwt_reloads_error.inc();
                        tracing::error!(error = %e, "SIGHUP: keeping the JWT keys in use until now");
                    }
                }
            }
            if let Some(secrets) = &webhook_secrets {
                match secrets.reload() {
                    Ok(count) => tracing::info!(
                        secrets = count,
                        "SIGHUP: webhook secrets read again; the next deliveries are signed with them"
                    ),
                    Err(e) => tracing::error!(error = %e, "SIGHUP: keeping the webhook secrets in use until now"),
                }
            }
            let Some(identity) = &identity else { continue };
            match identity.reload() {
                Ok(()) => {
                    metrics.tls_reloads_ok.inc();
                    metrics.tls_cert_expiry.set(identity.not_after());
                    tracing::info!("SIGHUP: TLS certificate and key read again; new handshakes present them");
                }
                Err(e) => {
                    metrics.tls_reloads_error.inc();
                    tracing::error!(error = %e, "SIGHUP: keeping the TLS certificate served until now");
                }
            }
        }
    }
    #[cfg(not(unix))]
    let _ = stop;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_dead_ticker_makes_the_gateway_unhealthy_and_ends_run_with_an_error() {
        let server = Server::new(Config::default());
        let panicked = tokio::spawn(async { panic!("a bug in the sweep") }).await;
        let error = server.ticker_stopped(panicked);
        assert!(error.to_string().contains("panicked"), "{error}");
        assert!(server.http().health.expiry_stopped());
    }

    #[tokio::test]
    async fn run_ends_with_an_error_when_the_ticker_dies() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = Server::new(Config::default());
        // The ticker panics on its first tick: an expiry bug, injected.
        server.registry.poison_for_test();
        let run = tokio::time::timeout(
            Duration::from_secs(10),
            server.run(Listeners::clients(listener), std::future::pending::<()>()),
        );
        let error = run.await.expect("run ends by itself").unwrap_err();
        assert!(error.to_string().contains("ticker stopped"), "{error}");
    }
}

//! The server: accepts connections, runs the ticker and the HTTP listeners, and drains on
//! shutdown.
//!
//! Its inputs are injected, as in mini-redis: the caller binds the listeners and passes the
//! shutdown future, so tests run servers on `127.0.0.1:0` and end them when they like.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::{sleep, timeout_at, Instant};
use tokio_util::sync::CancellationToken;

use crate::config::{Config, TlsIdentity};
use crate::descriptors::{is_out_of_descriptors, Reserve};
use crate::gateway::Gateway;
use crate::http::{serve_admin, serve_api};
use crate::metrics::Metrics;
use crate::presence::Refused;
use crate::presence::Ticker;
use crate::proto::{jittered_ms, REFUSED_RETRY_BASE, REFUSED_RETRY_SPREAD};
use crate::proto::{CloseReason, Transport};
use crate::transport::{Bound, Doors, Refusals};

/// First pause after a failed accept (EMFILE and the like); doubled on each failure in a
/// row, so a full file table costs a few wakeups a second instead of a spinning core.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);

/// Longest pause between accept attempts while accepts keep failing.
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

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
}

/// An idlegate gateway, ready to run; see the module documentation.
#[derive(Debug)]
pub struct Server {
    gateway: Arc<Gateway>,
}

// === impl Server ===

impl Server {
    /// A gateway with `config`, which must have passed [`Config::validate`]; its clock starts
    /// now.
    pub fn new(config: Config) -> Server {
        Server { gateway: Gateway::new(config) }
    }

    /// The gateway's metrics, for tests and embedding.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.gateway.metrics.clone()
    }

    /// Serves clients (and, if given, the admin endpoint and the backend API) until
    /// `shutdown` resolves, then sends every connection BYE(shutdown) and waits up to the
    /// drain timeout for them to close.
    pub async fn run(self, listeners: Listeners, shutdown: impl Future) -> io::Result<()> {
        let gateway = self.gateway;
        let wanted = [
            (Some(listeners.clients), Transport::Tcp),
            (listeners.tls, Transport::Tls),
            (listeners.ws, Transport::Ws),
            (listeners.wss, Transport::Wss),
            (listeners.mqtt, Transport::Mqtt),
            (listeners.mqtts, Transport::Mqtts),
        ];
        let mut open = Vec::new();
        for (listener, transport) in wanted {
            let Some(listener) = listener else { continue };
            if transport.is_tls() && gateway.config.tls.is_none() {
                return Err(io::Error::other(format!("a {transport} listener needs --tls-cert and --tls-key")));
            }
            open.push((listener, transport));
        }
        let background = CancellationToken::new();
        let ticker =
            Ticker::new(gateway.registry.clone(), gateway.metrics.clone(), gateway.clock, gateway.config.window());
        let ticker = tokio::spawn(ticker.run(background.clone()));
        let mut http = Vec::new();
        if let Some(cluster) = &gateway.cluster {
            tracing::info!(redis = %cluster.target.redacted(), member = %cluster.member(), "joining the cluster");
            http.push(tokio::spawn(cluster.clone().run(background.clone())));
        }
        if let Some(admin) = listeners.admin {
            http.push(tokio::spawn(serve_admin(admin, gateway.clone(), background.clone())));
        }
        if let Some(api) = listeners.api {
            http.push(tokio::spawn(serve_api(api, gateway.clone(), background.clone())));
        }
        // One permit per open connection, held by its task: the bound on connections, the
        // count of open ones, and (all permits back) the end of the drain. A `TaskTracker`
        // did the last two at 8 bytes more in every connection's task.
        let max = gateway.config.max_connections;
        let connections = Arc::new(Semaphore::new(max));

        if let Some(identity) = gateway.config.tls.clone() {
            http.push(tokio::spawn(reload_on_sighup(identity, gateway.clone(), background.clone())));
        }
        let doors = Doors::new(&gateway);
        let loops = open
            .iter()
            .map(|(listener, transport)| Box::pin(accept_loop(listener, *transport, &gateway, &connections, &doors)));
        let mut ticker = ticker;
        let mut failure = None;
        tokio::select! {
            res = futures_util::future::try_join_all(loops) => { res?; }
            _ = shutdown => {}
            ended = &mut ticker => failure = Some(ticker_stopped(&gateway, ended)),
        }

        drop(open);
        // One deadline for the whole shutdown, whatever Redis or a consumer does: a
        // supervisor waiting `--drain-timeout` (plus its own margin) never has to kill us.
        let deadline = Instant::now() + gateway.config.drain_timeout;
        let open = max - connections.available_permits();
        tracing::info!(open, "shutting down: stopped accepting, sending BYE(shutdown)");
        gateway.shutdown.cancel();
        gateway.registry.end_all(CloseReason::Shutdown);
        let all = u32::try_from(max).unwrap_or(u32::MAX);
        if timeout_at(deadline, connections.acquire_many(all)).await.is_err() {
            tracing::warn!(
                left = max - connections.available_permits(),
                drain_timeout = ?gateway.config.drain_timeout,
                "drain timed out; dropping the connections left"
            );
        }
        if let Some(cluster) = &gateway.cluster {
            // Every session has ended: their offline events (reason shutdown) reach Redis
            // before this node leaves, instead of when its lease runs out. What cannot be
            // written by the deadline is left to the lease and the reaper.
            cluster.leave(deadline.saturating_duration_since(Instant::now())).await;
        }
        background.cancel();
        if failure.is_none() {
            let _ = timeout_at(deadline + SHUTDOWN_GRACE, &mut ticker).await;
        }
        for mut task in http {
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
}

/// What the background tasks get past the drain deadline to notice the stop and finish
/// what they were writing (an event stream's last chunk, a metrics answer) before they
/// are aborted: the whole shutdown stays within `--drain-timeout` plus this.
const SHUTDOWN_GRACE: Duration = Duration::from_millis(500);

/// The ticker ended while the gateway was serving, which it never does unless it panicked:
/// nobody would go offline any more. Marks the gateway unhealthy (`/healthz` answers 503)
/// and returns the error `run` ends with, after draining, so a supervisor restarts the
/// process instead of keeping one that looks alive and expires no one.
fn ticker_stopped(gateway: &Gateway, ended: Result<(), tokio::task::JoinError>) -> io::Error {
    gateway.expiry_stopped.store(true, std::sync::atomic::Ordering::Release);
    let why = match ended {
        Err(e) if e.is_panic() => "it panicked",
        Err(_) => "it was cancelled",
        Ok(()) => "it returned",
    };
    tracing::error!(why, "the ticker stopped: expiry no longer runs; draining and exiting");
    io::Error::other(format!("the ticker stopped ({why}): expiry no longer runs"))
}

/// Accepts until the listener fails for good; never spins on a failing accept.
async fn accept_loop(
    listener: &TcpListener,
    transport: Transport,
    gateway: &Arc<Gateway>,
    limit: &Arc<Semaphore>,
    doors: &Doors,
) -> io::Result<()> {
    let config = &gateway.config;
    let mut backoff = ACCEPT_BACKOFF_MIN;
    let mut reserve = Reserve::open();
    let refusals = Refusals::default();
    // Each refused client is told a different moment to come back.
    let hint = || jittered_ms(REFUSED_RETRY_BASE, REFUSED_RETRY_SPREAD);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => {
                backoff = ACCEPT_BACKOFF_MIN;
                accepted
            }
            Err(e) if is_out_of_descriptors(&e) && reserve.release() => {
                // The reserve descriptor, given up, takes one waiting client: it is told
                // BYE(server_full) instead of hanging in the backlog with no answer.
                if let Ok((stream, _)) = listener.accept().await {
                    gateway.metrics.shed_max_connections.inc();
                    gateway.metrics.closed(CloseReason::ServerFull);
                    refusals.refuse(stream, transport, Bound::Server, hint(), "out of file descriptors");
                }
                reserve = Reserve::open();
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, ?backoff, "accept failed; backing off");
                sleep(backoff).await;
                backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                reserve.reopen();
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        gateway.metrics.connections_accepted.inc();
        let metrics = &gateway.metrics;
        // Too many from this source waiting to log in: refused now, with a time to come
        // back. When all places are taken, the oldest waiting connection makes room.
        let fd = std::os::fd::AsRawFd::as_raw_fd(&stream);
        match gateway.pending.admit_fd(peer.ip(), fd) {
            Ok(()) => {}
            Err(Refused::Source(n)) => {
                metrics.shed_pending_logins.inc();
                metrics.closed(CloseReason::ServerFull);
                let why = format!("{n} connections from this address waiting to log in");
                refusals.refuse(stream, transport, Bound::Address, hint(), &why);
                continue;
            }
        }
        match limit.clone().try_acquire_owned() {
            Ok(permit) => {
                metrics.opened_on(transport);
                metrics.pending_logins.inc();
                if !doors.spawn(transport, stream, gateway, permit) {
                    metrics.closed_on(transport);
                    metrics.pending_logins.dec();
                    drop(gateway.pending.claim(fd));
                }
            }
            Err(_) => {
                // Not served: its place among the waiting logins goes back at once.
                drop(gateway.pending.claim(fd));
                metrics.shed_max_connections.inc();
                metrics.closed(CloseReason::ServerFull);
                let why = format!("{} connections open", config.max_connections);
                refusals.refuse(stream, transport, Bound::Server, hint(), &why);
            }
        }
    }
}

/// Reads `--tls-cert` and `--tls-key` again on every SIGHUP; a bad pair is logged, counted
/// and the one served stays. Connections open keep the session they have.
async fn reload_on_sighup(identity: Arc<TlsIdentity>, gateway: Arc<Gateway>, stop: CancellationToken) {
    let metrics = &gateway.metrics;
    metrics.tls_cert_expiry.set(identity.not_after());
    #[cfg(unix)]
    {
        let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
            tracing::warn!("cannot listen for SIGHUP; the TLS certificate is read only at start");
            return;
        };
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                got = hup.recv() => if got.is_none() { return },
            }
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
        let gateway = Gateway::new(Config::default());
        let panicked = tokio::spawn(async { panic!("a bug in the sweep") }).await;
        let error = ticker_stopped(&gateway, panicked);
        assert!(error.to_string().contains("panicked"), "{error}");
        assert!(gateway.expiry_stopped.load(std::sync::atomic::Ordering::Acquire));
    }

    #[tokio::test]
    async fn run_ends_with_an_error_when_the_ticker_dies() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = Server::new(Config::default());
        // The ticker panics on its first tick: an expiry bug, injected.
        server.gateway.registry.poison_for_test();
        let run = tokio::time::timeout(
            Duration::from_secs(10),
            server.run(Listeners::clients(listener), std::future::pending::<()>()),
        );
        let error = run.await.expect("run ends by itself").unwrap_err();
        assert!(error.to_string().contains("ticker stopped"), "{error}");
    }
}

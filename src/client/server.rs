//! The server: accepts connections, runs the ticker and the HTTP listeners, and drains on
//! shutdown.
//!
//! Its inputs are injected, as in mini-redis: the caller binds the listeners and passes the
//! shutdown future, so tests run servers on `127.0.0.1:0` and end them when they like.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::{sleep, timeout};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backend::{serve_admin, serve_api, Metrics};
use crate::client::codec::put_frame;
use crate::client::frame::{CloseReason, Frame};
use crate::client::handler;
use crate::config::Config;
use crate::gateway::Gateway;
use crate::presence::Ticker;

/// First pause after a failed accept (EMFILE and the like); doubled on each failure in a
/// row, so a full file table costs a few wakeups a second instead of a spinning core.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);

/// Longest pause between accept attempts while accepts keep failing.
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Longest the server waits to hand BYE(server_full) to a client it has no room for.
const REJECT_WRITE_DEADLINE: Duration = Duration::from_millis(500);

/// The sockets a gateway serves, bound by the caller.
#[derive(Debug)]
pub struct Listeners {
    /// Where clients connect.
    pub clients: TcpListener,
    /// `/healthz`, `/readyz`, `/metrics`, if wanted.
    pub admin: Option<TcpListener>,
    /// The backend API, if wanted.
    pub api: Option<TcpListener>,
}

// === impl Listeners ===

impl Listeners {
    /// Clients only, no HTTP.
    pub fn clients(clients: TcpListener) -> Listeners {
        Listeners { clients, admin: None, api: None }
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
        let background = CancellationToken::new();
        let ticker =
            Ticker::new(gateway.registry.clone(), gateway.metrics.clone(), gateway.clock, gateway.config.window());
        let ticker = tokio::spawn(ticker.run(background.clone()));
        let mut http = Vec::new();
        if let Some(admin) = listeners.admin {
            http.push(tokio::spawn(serve_admin(admin, gateway.clone(), background.clone())));
        }
        if let Some(api) = listeners.api {
            http.push(tokio::spawn(serve_api(api, gateway.clone(), background.clone())));
        }
        let connections = TaskTracker::new();

        let listener = listeners.clients;
        tokio::select! {
            res = accept_loop(&listener, &gateway, &connections) => res?,
            _ = shutdown => {}
        }

        drop(listener);
        let open = connections.len();
        tracing::info!(open, "shutting down: stopped accepting, sending BYE(shutdown)");
        gateway.shutdown.cancel();
        gateway.registry.end_all(CloseReason::Shutdown);
        connections.close();
        if timeout(gateway.config.drain_timeout, connections.wait()).await.is_err() {
            tracing::warn!(
                left = connections.len(),
                drain_timeout = ?gateway.config.drain_timeout,
                "drain timed out; dropping the connections left"
            );
        }
        background.cancel();
        let _ = ticker.await;
        for task in http {
            let _ = task.await;
        }
        tracing::info!("shut down");
        Ok(())
    }
}

/// Accepts until the listener fails for good; never spins on a failing accept.
async fn accept_loop(listener: &TcpListener, gateway: &Arc<Gateway>, connections: &TaskTracker) -> io::Result<()> {
    let limit = Arc::new(Semaphore::new(gateway.config.max_connections));
    let mut backoff = ACCEPT_BACKOFF_MIN;
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _peer)) => {
                backoff = ACCEPT_BACKOFF_MIN;
                stream
            }
            Err(e) => {
                tracing::warn!(error = %e, ?backoff, "accept failed; backing off");
                sleep(backoff).await;
                backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let metrics = gateway.metrics.clone();
        metrics.connections_accepted.inc();
        metrics.connections_open.inc();
        match limit.clone().try_acquire_owned() {
            Ok(permit) => {
                let gateway = gateway.clone();
                connections.spawn(async move {
                    handler::serve(stream, gateway).await;
                    metrics.connections_open.dec();
                    drop(permit);
                });
            }
            Err(_) => {
                let max = gateway.config.max_connections;
                connections.spawn(async move {
                    reject_full(stream, max).await;
                    metrics.closed(CloseReason::ServerFull);
                    metrics.connections_open.dec();
                });
            }
        }
    }
}

/// Tells a client there is no room, within a short deadline, and closes.
async fn reject_full(mut stream: TcpStream, max: usize) {
    let mut out = bytes::BytesMut::new();
    let bye = Frame::Bye { reason: CloseReason::ServerFull, text: format!("{max} connections open") };
    put_frame(&bye, &mut out);
    let _ = timeout(REJECT_WRITE_DEADLINE, async {
        stream.write_all_buf(&mut out).await?;
        stream.shutdown().await
    })
    .await;
}

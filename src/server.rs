//! The server: accepts connections, runs the ticker and the admin endpoint, and drains on
//! shutdown.
//!
//! Its inputs are injected, as in mini-redis: the caller binds the listeners and passes the
//! shutdown future, so tests run servers on `127.0.0.1:0` and end them when they like.

use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::{sleep, timeout, Instant};
use tokio_util::codec::Encoder;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::codec::FrameCodec;
use crate::config::Config;
use crate::frame::{CloseReason, Frame};
use crate::metrics::Metrics;
use crate::registry::Registry;
use crate::ticker::{Clock, Ticker};
use crate::{admin, connection};

/// First pause after a failed accept (EMFILE and the like); doubled on each failure in a
/// row, so a full file table costs a few wakeups a second instead of a spinning core.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);

/// Longest pause between accept attempts while accepts keep failing.
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Longest the server waits to hand BYE(server_full) to a client it has no room for.
const REJECT_WRITE_DEADLINE: Duration = Duration::from_millis(500);

/// What every connection task, the ticker and the admin endpoint share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) config: Config,
    pub(crate) registry: Arc<Registry>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) clock: Clock,
    /// Cancelled when shutdown begins: connections send BYE(shutdown), readyz says 503.
    pub(crate) shutdown: CancellationToken,
}

// === impl Shared ===

impl Shared {
    /// The tick a frame read now belongs to.
    pub(crate) fn now_tick(&self) -> u64 {
        self.clock.tick_at(Instant::now())
    }
}

/// An idlegate gateway, ready to run; see the module documentation.
#[derive(Debug)]
pub struct Server {
    shared: Arc<Shared>,
}

// === impl Server ===

impl Server {
    /// A gateway with `config`, which must have passed [`Config::validate`]; its clock starts
    /// now.
    pub fn new(config: Config) -> Server {
        debug_assert!(config.validate().is_ok(), "Server::new with an invalid config: {:?}", config.validate());
        let metrics = Arc::new(Metrics::new(&config));
        let registry = Arc::new(Registry::new(config.window(), metrics.clone()));
        let clock = Clock::new(Instant::now(), config.tick);
        Server { shared: Arc::new(Shared { config, registry, metrics, clock, shutdown: CancellationToken::new() }) }
    }

    #[cfg(test)]
    pub(crate) fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// The gateway's metrics, for tests and embedding.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.shared.metrics.clone()
    }

    /// Serves clients on `listener` (and, if given, the admin endpoint on `admin`) until
    /// `shutdown` resolves, then sends every connection BYE(shutdown) and waits up to the
    /// drain timeout for them to close.
    pub async fn run(self, listener: TcpListener, admin: Option<TcpListener>, shutdown: impl Future) -> io::Result<()> {
        let shared = self.shared;
        let background = CancellationToken::new();
        let ticker = Ticker::new(shared.registry.clone(), shared.metrics.clone(), shared.clock, shared.config.window());
        let ticker = tokio::spawn(ticker.run(background.clone()));
        let admin = admin.map(|l| tokio::spawn(admin::serve(l, shared.clone(), background.clone())));
        let connections = TaskTracker::new();

        tokio::select! {
            res = accept_loop(&listener, &shared, &connections) => res?,
            _ = shutdown => {}
        }

        drop(listener);
        let open = connections.len();
        tracing::info!(open, "shutting down: stopped accepting, sending BYE(shutdown)");
        shared.shutdown.cancel();
        shared.registry.end_all(CloseReason::Shutdown);
        connections.close();
        if timeout(shared.config.drain_timeout, connections.wait()).await.is_err() {
            tracing::warn!(
                left = connections.len(),
                drain_timeout = ?shared.config.drain_timeout,
                "drain timed out; dropping the connections left"
            );
        }
        background.cancel();
        let _ = ticker.await;
        if let Some(admin) = admin {
            let _ = admin.await;
        }
        tracing::info!("shut down");
        Ok(())
    }
}

/// Accepts until the listener fails for good; never spins on a failing accept.
async fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>, connections: &TaskTracker) -> io::Result<()> {
    let limit = Arc::new(Semaphore::new(shared.config.max_connections));
    let next_id = AtomicU64::new(1);
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
        let conn_id = next_id.fetch_add(1, Ordering::Relaxed);
        let metrics = shared.metrics.clone();
        metrics.connections_accepted.inc();
        metrics.connections_open.inc();
        match limit.clone().try_acquire_owned() {
            Ok(permit) => {
                let shared = shared.clone();
                connections.spawn(async move {
                    connection::serve(stream, conn_id, shared).await;
                    metrics.connections_open.dec();
                    drop(permit);
                });
            }
            Err(_) => {
                let max = shared.config.max_connections;
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
    if FrameCodec::default().encode(&bye, &mut out).is_ok() {
        let _ = timeout(REJECT_WRITE_DEADLINE, async {
            stream.write_all_buf(&mut out).await?;
            stream.shutdown().await
        })
        .await;
    }
}

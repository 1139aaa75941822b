//! The connection to Redis: one server or a Redis Cluster, reached through the `redis`
//! crate, which pipelines commands on multiplexed connections, reconnects by itself and
//! follows a cluster's slots.
//!
//! The gateway starts whether or not Redis answers: [`Store::connect`] keeps trying in the
//! background and logs why it cannot connect, and every call made before it succeeds fails
//! with [`StoreError::NotConnected`]. Two connections are kept: one for commands, one for
//! the blocking read of the inbox and the event stream, so a blocking read never delays a
//! write.

use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use crate::config::RedisTarget;

/// How long a command may take before it counts as failed: long enough for a batch of
/// thousands, short enough that a paused Redis shows as down within a couple of seconds.
pub(crate) const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long one blocking read waits for news before it asks again.
pub(crate) const BLOCK: Duration = Duration::from_millis(1000);

/// Retries of one connection attempt inside the `redis` crate's connection manager.
const CONNECTION_RETRIES: usize = 1;

/// Pauses between attempts to connect at start, doubling up to the last.
const CONNECT_BACKOFF: [Duration; 5] = [
    Duration::from_millis(100),
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_secs(2),
];

/// What kind of trouble a failed call shows: what an operator must do differs (fix the
/// credentials in `--redis`, the ACL, or the network), so each is counted and said apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Trouble {
    /// No answer: refused, reset, timed out, not connected yet.
    Unreachable = 1,
    /// Redis refused the credentials of `--redis` (WRONGPASS, NOAUTH).
    Auth = 2,
    /// The ACL user of `--redis` may not run what the gateway needs (NOPERM).
    Permission = 3,
    /// Fewer replicas than `--redis-min-replicas` took a batch.
    Replicas = 4,
    /// Anything else Redis answered with an error.
    Other = 5,
}

impl Trouble {
    pub(crate) const ALL: [Trouble; 5] =
        [Trouble::Unreachable, Trouble::Auth, Trouble::Permission, Trouble::Replicas, Trouble::Other];

    /// The `kind` label of `idlegate_redis_errors_total`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Trouble::Unreachable => "unreachable",
            Trouble::Auth => "auth",
            Trouble::Permission => "permission",
            Trouble::Replicas => "replicas",
            Trouble::Other => "other",
        }
    }

    /// What readiness and the log say of it.
    pub(crate) fn text(self) -> &'static str {
        match self {
            Trouble::Unreachable => "Redis unreachable (--redis)",
            Trouble::Auth => "Redis refused the credentials in --redis",
            Trouble::Permission => "Redis refused a command to the user in --redis (ACL: NOPERM)",
            Trouble::Replicas => "fewer Redis replicas than --redis-min-replicas took a write",
            Trouble::Other => "Redis answered with an error",
        }
    }

    /// An outage of Redis itself (or of the way to it), which the other nodes see too:
    /// waiting fixes it, and the node serves clients alone meanwhile.
    pub(crate) fn is_outage(self) -> bool {
        matches!(self, Trouble::Unreachable | Trouble::Replicas)
    }

    /// A refusal, not an outage: waiting does not fix it, someone must.
    pub(crate) fn is_refusal(self) -> bool {
        matches!(self, Trouble::Auth | Trouble::Permission)
    }

    pub(crate) fn from_code(code: u8) -> Option<Trouble> {
        Trouble::ALL.into_iter().find(|t| *t as u8 == code)
    }
}

/// Why a call to Redis failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StoreError {
    #[error("not connected to Redis yet")]
    NotConnected,
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("{acked} of the {want} replicas asked for hold the batch")]
    Replicas { acked: i64, want: u32 },
}

impl StoreError {
    /// Whether no answer came within the deadline: the call may still run in Redis.
    pub(crate) fn is_timeout(&self) -> bool {
        matches!(self, StoreError::Redis(e) if e.is_timeout())
    }

    /// The kind of trouble it shows.
    pub(crate) fn trouble(&self) -> Trouble {
        match self {
            StoreError::NotConnected => Trouble::Unreachable,
            StoreError::Replicas { .. } => Trouble::Replicas,
            StoreError::Redis(e) => trouble_of(e),
        }
    }
}

/// The kind of trouble a `redis` crate error shows.
fn trouble_of(e: &redis::RedisError) -> Trouble {
    use redis::{ErrorKind, ServerErrorKind};
    let code = e.code().unwrap_or("");
    match e.kind() {
        ErrorKind::AuthenticationFailed => Trouble::Auth,
        ErrorKind::Server(ServerErrorKind::NoPerm) => Trouble::Permission,
        _ if code == "WRONGPASS" || code == "NOAUTH" => Trouble::Auth,
        _ if code == "NOPERM" => Trouble::Permission,
        _ if e.is_io_error() || e.is_timeout() || e.is_connection_refusal() || e.is_connection_dropped() => {
            Trouble::Unreachable
        }
        _ => Trouble::Other,
    }
}

/// A connection to one server or to a cluster, every call on it bounded by `deadline`.
///
/// The deadline covers the whole call, not just the reply: while the `redis` crate
/// reconnects, a command waits for that reconnection, and its retries with backoff can run
/// for many seconds. Without a bound of our own, an API request made during an outage
/// would outlive the HTTP listener's deadlines and get no answer at all, instead of 503.
#[derive(Clone)]
pub(crate) struct Conn {
    kind: ConnKind,
    deadline: Duration,
}

#[derive(Clone)]
enum ConnKind {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// The error of a call that ran past its connection's deadline.
fn past_deadline(deadline: Duration) -> redis::RedisError {
    std::io::Error::new(std::io::ErrorKind::TimedOut, format!("no answer from Redis within {deadline:?}")).into()
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let deadline = self.deadline;
        let call = match &mut self.kind {
            ConnKind::Single(c) => c.req_packed_command(cmd),
            ConnKind::Cluster(c) => c.req_packed_command(cmd),
        };
        Box::pin(async move { tokio::time::timeout(deadline, call).await.map_err(|_| past_deadline(deadline))? })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let deadline = self.deadline;
        let call = match &mut self.kind {
            ConnKind::Single(c) => c.req_packed_commands(pipeline, offset, count),
            ConnKind::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        };
        Box::pin(async move { tokio::time::timeout(deadline, call).await.map_err(|_| past_deadline(deadline))? })
    }

    fn get_db(&self) -> i64 {
        match &self.kind {
            ConnKind::Single(c) => c.get_db(),
            ConnKind::Cluster(c) => c.get_db(),
        }
    }
}

/// The two connections, once made (and made anew by [`Store::reopen`]); see the module
/// documentation.
#[derive(Clone, Default)]
pub(crate) struct Store {
    inner: Arc<RwLock<Option<(Conn, Conn)>>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("connected", &self.connected().is_some()).finish()
    }
}

// === impl Store ===

impl Store {
    fn connected(&self) -> Option<(Conn, Conn)> {
        self.inner.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The command connection, or an error before the first connect succeeded. Taken
    /// afresh for every call, so a call after [`Store::reopen`] uses the new one.
    pub(crate) fn conn(&self) -> Result<Conn, StoreError> {
        self.connected().map(|(c, _)| c).ok_or(StoreError::NotConnected)
    }

    /// The connection for blocking reads.
    pub(crate) fn blocking(&self) -> Result<Conn, StoreError> {
        self.connected().map(|(_, c)| c).ok_or(StoreError::NotConnected)
    }

    /// Opens both connections anew and puts them in place of the old ones, which end once
    /// the calls still holding them are done. For a client that stays wedged after Redis
    /// came back (a Redis Cluster client whose slot refresh hung after a failover seen
    /// through a slow link: nemesis seed 1 on a Redis Cluster with every kind); an error
    /// leaves the old connections as they were.
    pub(crate) async fn reopen(&self, target: &RedisTarget) -> Result<(), StoreError> {
        // Opening is bounded by the connection timeout per server, but a cluster client
        // opens several: one bound for the whole.
        let fresh = tokio::time::timeout(4 * RESPONSE_TIMEOUT, open(target))
            .await
            .map_err(|_| StoreError::Redis(past_deadline(4 * RESPONSE_TIMEOUT)))??;
        *self.inner.write().unwrap_or_else(PoisonError::into_inner) = Some(fresh);
        Ok(())
    }

    /// Connects to `target`, trying again until it works; each failure goes to `failed`
    /// (which counts and logs it, without the password).
    pub(crate) async fn connect(&self, target: &RedisTarget, failed: impl Fn(&StoreError, Duration)) {
        let mut attempt = 0usize;
        loop {
            match open(target).await {
                Ok(conns) => {
                    *self.inner.write().unwrap_or_else(PoisonError::into_inner) = Some(conns);
                    tracing::info!(redis = %target.redacted(), cluster = target.is_cluster(), "connected to Redis");
                    return;
                }
                Err(e) => {
                    let pause = CONNECT_BACKOFF[attempt.min(CONNECT_BACKOFF.len() - 1)];
                    failed(&StoreError::Redis(e), pause);
                    attempt += 1;
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }
}

/// Opens the command and blocking connections.
async fn open(target: &RedisTarget) -> Result<(Conn, Conn), redis::RedisError> {
    if target.is_cluster() {
        let client = |timeout: Duration| {
            ClusterClientBuilder::new(target.urls().iter().map(String::as_str))
                .connection_timeout(RESPONSE_TIMEOUT)
                .response_timeout(timeout)
                .build()
        };
        let commands = client(RESPONSE_TIMEOUT)?.get_async_connection().await?;
        let blocking = client(BLOCK + RESPONSE_TIMEOUT)?.get_async_connection().await?;
        Ok((
            Conn { kind: ConnKind::Cluster(commands), deadline: RESPONSE_TIMEOUT },
            Conn { kind: ConnKind::Cluster(blocking), deadline: BLOCK + RESPONSE_TIMEOUT },
        ))
    } else {
        let client = redis::Client::open(target.urls()[0].as_str())?;
        let config = |timeout: Duration| {
            ConnectionManagerConfig::new()
                .set_connection_timeout(Some(RESPONSE_TIMEOUT))
                .set_response_timeout(Some(timeout))
                .set_max_delay(Duration::from_secs(2))
                // Once, not the crate's six times with growing pauses: a refusal (a wrong
                // password) is then known, counted and said at once, and an outage is
                // retried by the gateway's own loop and calls.
                .set_number_of_retries(CONNECTION_RETRIES)
        };
        let commands = ConnectionManager::new_with_config(client.clone(), config(RESPONSE_TIMEOUT)).await?;
        let blocking = ConnectionManager::new_with_config(client, config(BLOCK + RESPONSE_TIMEOUT)).await?;
        Ok((
            Conn { kind: ConnKind::Single(commands), deadline: RESPONSE_TIMEOUT },
            Conn { kind: ConnKind::Single(blocking), deadline: BLOCK + RESPONSE_TIMEOUT },
        ))
    }
}

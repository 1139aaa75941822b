//! Who is online and how to reach them, as the backend API asks it.
//!
//! One trait, so the API never knows where the answers come from: [`Local`] answers from
//! this process's registry and event log; a cluster answers from shared state. Every call
//! may fail with [`DirectoryError`] for a backend that lives elsewhere; the local one never
//! does.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use futures_util::{FutureExt, StreamExt};
use prometheus::IntGauge;

use crate::config::Config;
use crate::metrics::Metrics;
use crate::presence::clock::Clock;
use crate::presence::events::{Batch, EventId, EventLog};
use crate::presence::registry::Registry;
use crate::presence::registry::Sighting;
use crate::presence::watch::UserState;
use crate::presence::{Claims, Origin, Push, Reach};
use crate::proto::Device;

/// Why a directory could not answer.
#[derive(Debug, thiserror::Error)]
pub enum DirectoryError {
    /// The shared state is out of reach; the request can be retried. Only a directory
    /// that lives outside this process (the cluster's) can fail this way.
    #[error("presence store unavailable: {0}")]
    Unavailable(String),
    /// A page cursor this directory did not hand out (or from another kind of directory).
    #[error("cursor: {0}")]
    BadCursor(&'static str),
}

/// One page of the uids online (`GET /v1/online/uids`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UidPage {
    pub uids: Vec<u64>,
    /// The next page's cursor; `None` after the last.
    pub cursor: Option<String>,
    /// The newest event when the scan began (the same on every page): replaying the stream
    /// after it onto the scan's uids gives the exact picture.
    pub as_of: EventId,
}

/// A page cursor's text: `fields` joined, versioned, base64url. Opaque to clients, who
/// hand it back as they got it.
pub(crate) fn encode_cursor(fields: &[String]) -> String {
    use base64::Engine;
    let text = format!("1.{}", fields.join("."));
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text)
}

/// The fields of a cursor made by [`encode_cursor`]: exactly `n` of them.
pub(crate) fn decode_cursor(cursor: &str, n: usize) -> Result<Vec<String>, DirectoryError> {
    use base64::Engine;
    let bad = DirectoryError::BadCursor("not one this gateway handed out");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(cursor).map_err(|_| bad)?;
    let text = String::from_utf8(bytes).map_err(|_| DirectoryError::BadCursor("not one this gateway handed out"))?;
    let mut fields: Vec<String> = text.split('.').map(str::to_string).collect();
    if fields.first().map(String::as_str) != Some("1") || fields.len() != n + 1 {
        return Err(DirectoryError::BadCursor("not one this gateway handed out"));
    }
    fields.remove(0);
    Ok(fields)
}

/// Where one session of an online uid is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    /// The node holding its connection.
    pub node: String,
    /// The device it logged in as.
    pub device: Device,
    /// Its id, as its events carry it.
    pub session: u64,
    /// Unix milliseconds of its LOGIN.
    pub since_ms: u64,
    /// Milliseconds since its last frame, coarse to one tick (never less than the truth);
    /// `None` when the node holding it did not say in time.
    pub silent_ms: Option<u64>,
    /// Its token's claims (`--jwt-claims-to-events`), when it has any and its node said.
    pub claims: Option<Arc<Claims>>,
    /// Its door and client address, when its node said.
    pub origin: Origin,
    /// Its timeout in milliseconds (its class's), when its node said.
    pub timeout_ms: Option<u32>,
}

impl Located {
    /// What `node` says of a session it holds, last heard as `sighting` tells.
    pub(crate) fn here(node: String, sighting: &Sighting, clock: &Clock) -> Located {
        let session = &sighting.session;
        Located {
            node,
            device: session.device().clone(),
            session: session.id(),
            since_ms: session.since_ms(),
            silent_ms: Some(clock.since(sighting.last_heard_tick).as_millis() as u64),
            claims: session.claims().cloned(),
            origin: session.origin(),
            timeout_ms: Some(session.timeout_ms()).filter(|&t| t > 0),
        }
    }
}

/// Logged-in uids and open connections of one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCount {
    pub node: String,
    pub online: u64,
    pub connections: u64,
}

/// Logged-in uids and open connections: the whole cluster's (one node's when alone), this
/// node's own, and each node's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OnlineCount {
    pub online: u64,
    pub connections: u64,
    pub local: NodeCount,
    pub nodes: Vec<NodeCount>,
}

/// The presence answers the API needs; see the module documentation.
pub trait Directory: Send + Sync + std::fmt::Debug {
    /// Where each session of `uid` is, oldest login first; empty while it is offline.
    fn locate(&self, uid: u64) -> BoxFuture<'_, Result<Vec<Located>, DirectoryError>>;
    /// When `uid`'s offline grace ends (unix ms), while it is in one (`--offline-grace`): it
    /// has no session, yet user-level presence counts it online until then.
    fn grace_until(&self, uid: u64) -> BoxFuture<'_, Result<Option<u64>, DirectoryError>>;
    /// When `uid`, offline, was last online (the end of its last session, unix ms), if
    /// remembered (`--last-seen-capacity`; in a cluster, Redis for `--last-seen-ttl`).
    fn last_seen(&self, uid: u64) -> BoxFuture<'_, Result<Option<u64>, DirectoryError>>;
    /// For each uid, whether it is online (in its offline grace included).
    fn query<'a>(&'a self, uids: &'a [u64]) -> BoxFuture<'a, Result<Vec<bool>, DirectoryError>>;
    /// How many are online: `online` counts uids in their offline grace, `connections`
    /// does not.
    fn online(&self) -> BoxFuture<'_, Result<OnlineCount, DirectoryError>>;
    /// One page of the uids online (their offline grace included), at most `limit`, from
    /// `cursor` (the first page without one). Every uid online during the whole scan is on
    /// some page; one that came or went during it may be on one or not, and the stream after
    /// the page's `as_of` says which.
    fn online_uids<'a>(
        &'a self,
        cursor: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<UidPage, DirectoryError>>;
    /// [`Directory::last_seen`] of each of `uids`.
    fn last_seen_of<'a>(&'a self, uids: &'a [u64]) -> BoxFuture<'a, Result<Vec<Option<u64>>, DirectoryError>> {
        async move {
            let mut out = Vec::with_capacity(uids.len());
            for &uid in uids {
                out.push(self.last_seen(uid).await?);
            }
            Ok(out)
        }
        .boxed()
    }
    /// Hands `push` to every session of each uid that takes it (only the one on `device`
    /// when given; an MQTT session only on a topic it subscribed to); for each uid, whom it
    /// reached.
    fn push<'a>(
        &'a self,
        uids: &'a [u64],
        device: Option<Device>,
        push: Push,
    ) -> BoxFuture<'a, Result<Vec<Reach>, DirectoryError>>;
    /// Ends `uid`'s sessions (only the one on `device` when given) as kicked; how many.
    fn kick(&self, uid: u64, device: Option<Device>) -> BoxFuture<'_, Result<usize, DirectoryError>>;
    /// The event stream after `after` (or from now), in batches. Ids have the shape of a
    /// Redis Stream's, so every directory takes and gives the same ones.
    fn follow(&self, after: Option<EventId>) -> BoxStream<'static, Batch>;
    /// The position `n` events before the newest (or before the oldest still held): following
    /// from it gives the last `n` events, then the live tail.
    fn recent(&self, n: usize) -> BoxFuture<'_, Result<EventId, DirectoryError>>;
    /// Each of `uids`' presence as a watcher is told it, with the position of the stream it
    /// is exact at: no event of the uid up to it is missing from it, none after it is in it
    /// (see [`Registry::user_state`]).
    fn presence_of<'a>(&'a self, uids: &'a [u64]) -> BoxFuture<'a, Result<Vec<(UserState, EventId)>, DirectoryError>>;
}

/// The directory of a gateway that runs alone.
#[derive(Debug)]
pub struct Local {
    registry: Arc<Registry>,
    events: Arc<EventLog>,
    clock: Clock,
    node: String,
    /// Bytes of pushes a client may leave unread before it counts as a slow consumer.
    max_queued: usize,
    connections: IntGauge,
}

// === impl Local ===

impl Local {
    pub fn new(registry: Arc<Registry>, clock: Clock, node: String, max_queued: usize, connections: IntGauge) -> Local {
        let events = registry.events().clone();
        Local { registry, events, clock, node, max_queued, connections }
    }

    /// The directory of a gateway alone with `config`, answering from `registry`.
    pub(crate) fn of(registry: Arc<Registry>, clock: Clock, config: &Config, metrics: &Metrics) -> Local {
        let connections = metrics.connections_open.clone();
        Local::new(registry, clock, config.node_id.clone(), config.max_queued_bytes(), connections)
    }
}

impl Directory for Local {
    fn locate(&self, uid: u64) -> BoxFuture<'_, Result<Vec<Located>, DirectoryError>> {
        let located = self
            .registry
            .sightings(uid)
            .into_iter()
            .map(|s| Located::here(self.node.clone(), &s, &self.clock))
            .collect();
        async move { Ok(located) }.boxed()
    }

    fn grace_until(&self, uid: u64) -> BoxFuture<'_, Result<Option<u64>, DirectoryError>> {
        let until = self.registry.grace_until_ms(uid);
        async move { Ok(until) }.boxed()
    }

    fn last_seen(&self, uid: u64) -> BoxFuture<'_, Result<Option<u64>, DirectoryError>> {
        let at = self.events.last_seen(uid);
        async move { Ok(at) }.boxed()
    }

    fn query<'a>(&'a self, uids: &'a [u64]) -> BoxFuture<'a, Result<Vec<bool>, DirectoryError>> {
        let online = uids
            .iter()
            .map(|&uid| self.registry.is_online(uid) || self.registry.grace_until_ms(uid).is_some())
            .collect();
        async move { Ok(online) }.boxed()
    }

    fn online_uids<'a>(
        &'a self,
        cursor: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<UidPage, DirectoryError>> {
        // A cursor: the scan's `as_of`, and the last uid handed out (pages go by uid).
        let start = match cursor {
            None => Ok((self.events.last_id(), None)),
            Some(cursor) => decode_cursor(cursor, 2).and_then(|f| {
                let as_of = f[0].parse().map_err(|()| DirectoryError::BadCursor("not one this gateway handed out"))?;
                let after = f[1].parse().map_err(|_| DirectoryError::BadCursor("not one this gateway handed out"))?;
                Ok((as_of, Some(after)))
            }),
        };
        let page = start.map(|(as_of, after): (EventId, Option<u64>)| {
            let uids = self.registry.online_uids(after, limit);
            let cursor = match uids.last() {
                Some(last) if uids.len() == limit => Some(encode_cursor(&[as_of.to_string(), last.to_string()])),
                _ => None,
            };
            UidPage { uids, cursor, as_of }
        });
        async move { page }.boxed()
    }

    fn online(&self) -> BoxFuture<'_, Result<OnlineCount, DirectoryError>> {
        let local = NodeCount {
            node: self.node.clone(),
            online: (self.registry.online() + self.registry.in_grace()) as u64,
            connections: self.connections.get().max(0) as u64,
        };
        let count =
            OnlineCount { online: local.online, connections: local.connections, nodes: vec![local.clone()], local };
        async move { Ok(count) }.boxed()
    }

    fn push<'a>(
        &'a self,
        uids: &'a [u64],
        device: Option<Device>,
        push: Push,
    ) -> BoxFuture<'a, Result<Vec<Reach>, DirectoryError>> {
        let sent = uids.iter().map(|&uid| self.registry.push(uid, device.as_ref(), &push, self.max_queued)).collect();
        async move { Ok(sent) }.boxed()
    }

    fn kick(&self, uid: u64, device: Option<Device>) -> BoxFuture<'_, Result<usize, DirectoryError>> {
        let kicked = self.registry.kick(uid, device.as_ref());
        async move { Ok(kicked) }.boxed()
    }

    fn recent(&self, n: usize) -> BoxFuture<'_, Result<EventId, DirectoryError>> {
        let at = self.events.recent(n);
        async move { Ok(at) }.boxed()
    }

    fn follow(&self, after: Option<EventId>) -> BoxStream<'static, Batch> {
        self.events.follow(after).boxed()
    }

    fn presence_of<'a>(&'a self, uids: &'a [u64]) -> BoxFuture<'a, Result<Vec<(UserState, EventId)>, DirectoryError>> {
        let states = uids.iter().map(|&uid| self.registry.user_state(uid)).collect();
        async move { Ok(states) }.boxed()
    }
}

//! What a gateway shares with the others of its cluster through, seen from the composition
//! root: a store (Redis, `cluster/`) that runs beside the gateway, answers the backend API
//! for every node ([`Directory`]), says whether it is reachable, and is left on a clean
//! shutdown. Another store would be one folder implementing this trait and one line in
//! `server.rs` choosing it; nothing below the composition root names the store.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use crate::presence::{Directory, DirectoryError, EventId, ListStore};

/// A shared store for presence, events, pushes and kicks; see the module documentation.
pub(crate) trait Backplane: Send + Sync + Debug {
    /// Runs the store's tasks (connecting, writing this node's changes, its lease, its
    /// inbox) until `stop`.
    fn run(self: Arc<Self>, stop: CancellationToken) -> BoxFuture<'static, ()>;

    /// On a clean shutdown, after every session ended: takes the last changes to the store
    /// (up to `within`) and leaves, so this node's uids go offline at once.
    fn leave(&self, within: Duration) -> BoxFuture<'_, ()>;

    /// Why the store cannot be used now (unreachable, credentials or ACL refused), while it
    /// cannot: readiness says so (503 for a refusal, see [`StoreTrouble`]).
    fn trouble(&self) -> Option<StoreTrouble>;

    /// The backend API's view of every node.
    fn directory(self: Arc<Self>) -> Arc<dyn Directory>;

    /// The webhook relay's turn: one node at a time relays the shared stream.
    fn relay_turn(self: Arc<Self>) -> Arc<dyn RelayTurn>;

    /// The JWT keys fetched by URL, shared: one fetch an unknown `kid` asks for serves the
    /// whole cluster.
    fn shared_keys(self: Arc<Self>) -> Arc<dyn SharedKeys>;

    /// The backend's watch lists, shared (one list holds at most `max_list` uids): a change
    /// made through another node calls `changed` with its user.
    fn watch_lists(self: Arc<Self>, max_list: usize, changed: Arc<dyn Fn(u64) + Send + Sync>) -> Arc<dyn ListStore>;
}

/// A JWKS document the cluster's nodes share: the last one any node fetched from the
/// identity provider, and the one refetch per interval that unknown `kid`s may ask for,
/// cluster-wide, so that tokens sent to every node cannot multiply the provider's load.
pub(crate) trait SharedKeys: Send + Sync + Debug {
    /// The document a node published last for `url`, and when it was fetched (unix ms).
    fn latest(&self, url: &str) -> BoxFuture<'_, Result<Option<(String, u64)>, DirectoryError>>;

    /// Publishes the document of `url` fetched at `fetched_ms` (unix), unless one fetched
    /// later is there already.
    fn publish(&self, url: &str, document: &str, fetched_ms: u64) -> BoxFuture<'_, Result<(), DirectoryError>>;

    /// Takes the cluster's one refetch for `interval`: false if a node took it less than
    /// `interval` ago.
    fn claim_refetch(&self, interval: Duration) -> BoxFuture<'_, Result<bool, DirectoryError>>;
}

/// Why a cluster's store cannot be used now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StoreTrouble {
    /// What readiness and the log say of it.
    pub text: &'static str,
    /// An outage (unreachable, replicas behind), which every node sees when the store
    /// itself is away: the node stays ready and serves clients alone, so a Redis outage
    /// never takes the whole cluster out of its balancer. Otherwise a refusal or a
    /// misconfiguration of this node (credentials, ACL, an error answer): not ready, so
    /// new clients go to nodes that work.
    pub outage: bool,
}

/// Where the webhook relay goes on from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Acknowledged {
    /// The position acknowledged last.
    pub after: EventId,
    /// The position was missing (the cluster's first relay, or the store lost it) and is
    /// recorded just now.
    pub recorded_now: bool,
    /// The last event of the batch a relay had in flight past that position, if any: the
    /// next relay sends that batch first, whole, so a receiver that took it sees it again
    /// only as a retry of the same `webhook-id`.
    pub sending: Option<EventId>,
    /// Redis lost writes the relaying node had seen, and kept events the receiver may have
    /// had already: `after` is the stream's end, and the receiver hears of a gap first.
    pub rewound: bool,
}

/// One webhook relay for a whole cluster: whose turn it is to deliver the shared stream's
/// events, and how far the receiver acknowledged them. Both live in the store, so when the
/// relaying node dies (or stops answering), another takes the turn once it runs out and
/// continues after the last acknowledged batch.
pub(crate) trait RelayTurn: Send + Sync + Debug {
    /// Takes the turn if nobody holds it, or keeps it if this node does, for `ttl`; true
    /// while this node holds it.
    fn hold(&self, ttl: Duration) -> BoxFuture<'_, Result<bool, DirectoryError>>;

    /// The position acknowledged last. When there is none (before the first
    /// acknowledgement ever, or the store lost it), the shared stream's newest position,
    /// recorded as acknowledged: the cluster's first relay starts from the events after it.
    fn acknowledged(&self) -> BoxFuture<'_, Result<Acknowledged, DirectoryError>>;

    /// Records every event through `through` as acknowledged and keeps the turn for `ttl`,
    /// only if this node still holds it; false if it lost it.
    fn acknowledge(&self, through: EventId, ttl: Duration) -> BoxFuture<'_, Result<bool, DirectoryError>>;

    /// Records that this node is about to send the batch ending at `last`, only if it still
    /// holds the turn; false if it lost it.
    fn sending(&self, last: EventId) -> BoxFuture<'_, Result<bool, DirectoryError>>;

    /// Gives the turn up, if this node holds it, so another node takes it at once.
    fn give_up(&self) -> BoxFuture<'_, ()>;
}

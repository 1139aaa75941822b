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

use crate::presence::Directory;

/// A shared store for presence, events, pushes and kicks; see the module documentation.
pub(crate) trait Backplane: Send + Sync + Debug {
    /// Runs the store's tasks (connecting, writing this node's changes, its lease, its
    /// inbox) until `stop`.
    fn run(self: Arc<Self>, stop: CancellationToken) -> BoxFuture<'static, ()>;

    /// On a clean shutdown, after every session ended: takes the last changes to the store
    /// (up to `within`) and leaves, so this node's uids go offline at once.
    fn leave(&self, within: Duration) -> BoxFuture<'_, ()>;

    /// Whether the store answers: readiness says "degraded" while it does not.
    fn is_up(&self) -> bool;

    /// The backend API's view of every node.
    fn directory(self: Arc<Self>) -> Arc<dyn Directory>;
}

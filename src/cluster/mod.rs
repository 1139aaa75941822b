//! The cluster: several gateways sharing presence, events, pushes and kicks through Redis.
//!
//! Each gateway stays the truth for its own clients (its registry and ring, with Redis
//! never on the per-frame path) and keeps a copy in Redis for the others to read. `keys`
//! says what lives where, `scripts` the atomic steps that change it, `store` connects,
//! `shared` holds this node's member name, its fence and the one way scripts are called.
//! `queue` and `writer` take this node's session changes to Redis in batches (and
//! reconcile after Redis was away or lost writes, telling by `ended` a session a failover
//! brought back from one whose end is on its way), `relay_turn` is the webhook relay's turn and
//! position, `shared_keys` the JWKS document fetched by URL that the nodes share, `watch_lists` the
//! backend's watch lists, `membership` keeps the node's lease and
//! reaps dead nodes, `inbox` carries kicks, pushes and lookups between nodes, `stream`
//! follows the shared event stream, and `directory` answers the backend API from all of
//! it. `node` builds the node (in two steps: its queue, then the node on the registry),
//! starts the tasks, is the only file that knows them all, and is where Redis is a
//! [`crate::presence::Backplane`]: what the composition root sees of it.
//!
//! Imports point one way: `node` -> `directory`, `writer`, `membership`, `inbox`, `relay_turn`, `shared_keys`, `watch_lists` -> `shared` -> `store`,
//! `scripts`, `keys`, `queue`; `writer` -> `ended`, `membership` (a member's lease before its first batch); `inbox` -> `stream` (the stream's newest position);
//! `directory` -> `inbox`, `membership`, `stream`, `shared`; `watch_lists` -> `inbox` (its cap).
//! A test (`tests/layout.rs`) fails on any circle.

mod directory;
mod ended;
mod inbox;
mod keys;
mod membership;
#[cfg(test)]
mod model_conformance;
mod node;
mod queue;
mod relay_turn;
mod scripts;
mod shared;
mod shared_keys;
mod store;
mod stream;
mod watch_lists;
mod writer;

pub(crate) use node::Joining;
pub(crate) use shared::Settings;

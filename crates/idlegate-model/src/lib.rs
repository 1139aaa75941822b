//! A model of idlegate's cluster protocol, checked by [stateright] over every interleaving
//! within a bound (issue 53).
//!
//! - `store`: Redis as the scripts of `src/cluster/scripts.rs` see it, each script one
//!   atomic step with the same inputs and outputs (`APPLY`, `CLAIM` with `REAP`, `LEASE`,
//!   `ROUTE_SET`);
//! - `node`: a gateway (its registry, its queue of numbered changes, the writer sending
//!   them in batches and retrying, its lease, its inbox, the fence);
//! - `system`: the [`stateright::Model`]: clients, nodes, Redis and the faults;
//! - `promises`: the promises of docs/API.md, checked on the stream the model emits.
//!
//! What is modelled, and what not yet, is in docs/RELIABILITY.md ("The cluster protocol,
//! model-checked").

pub mod node;
pub mod promises;
pub mod store;
pub mod system;

pub use system::{Bounds, Mutation, System};

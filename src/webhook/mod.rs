//! Presence events delivered to a backend's URL (`--webhook-url`), signed as the Standard
//! Webhooks specification says (`sign`), in the log's order, in batches, at least once
//! (`relay`). A backend that cannot hold `GET /v1/events` open (PHP, serverless functions,
//! a balancer that cuts long streams) gets the same events, with the same ids to
//! deduplicate by, and a `gap` where the relay fell behind the log.
//!
//! Side by side with `http/` and `cluster/`, it reads presence through the directory only,
//! and a cluster's turn (one relaying node at a time, the acknowledged position) through
//! [`crate::presence::RelayTurn`], which the composition root hands it.

mod relay;
mod sign;

pub use relay::Relay;

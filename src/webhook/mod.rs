//! Presence events delivered to a backend's URL (`--webhook-url`), signed as the Standard
//! Webhooks specification says (`sign`), in the log's order, in batches, at least once
//! (`relay`). A backend that cannot hold `GET /v1/events` open (PHP, serverless functions,
//! a balancer that cuts long streams) gets the same events, with the same ids to
//! deduplicate by, and a `gap` where the relay fell behind the log.
//!
//! Side by side with `http/` and `cluster/`, it reads presence through the directory only.
//! For now it serves a lone gateway: a cluster's relay (one node at a time, under a lease,
//! its acknowledged position in Redis) is not built, and `--webhook-url` with `--redis` is
//! refused at start.

mod relay;
mod sign;

pub use relay::Relay;

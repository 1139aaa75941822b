//! idlegate: an idle-connection timeout gateway and realtime message channel.
//!
//! Clients hold one long-lived connection each (TCP, TLS, WebSocket or WebSocket in TLS), log in with a numeric uid and send
//! keepalive and data frames; a uid silent for the timeout goes offline and its connection is
//! closed. Idle detection is a sliding slot ring ([`Ring`]) driven by one ticker, not a timer
//! per connection. Backends ask who is online, follow online/offline/data events and push to
//! clients through an HTTP API.
//!
//! # Using it
//!
//! [`Server`] runs a gateway with a [`Config`] on the [`Listeners`] you bind; [`Metrics`] is
//! what it counts. The wire vocabulary (frames, close reasons, tokens) is the
//! `idlegate-proto` crate's, which clients share.
//!
//! # Layout
//!
//! Folders by concern, imports pointing one way (`tests/layout.rs` checks the arrows), from
//! the bottom:
//!
//! - `proto`: the wire vocabulary, its own crate (`crates/idlegate-proto`, shared with the
//!   client library and the load tests): frames and their codec, close reasons, retry
//!   hints, event kinds, door names, MQTT's and WebSocket's framing, LOGIN tokens. No IO,
//!   no runtime. `error` (the configuration's errors) and `descriptors` (running out of
//!   file descriptors without going silent) sit beside it.
//! - `config`, then `metrics/`: everyone above may use them; they own their defaults.
//! - `presence/`: who is online. `ring` (pure: ticks in, expired uids out), `clock` (the one
//!   place time becomes ticks), `registry`, `session` and its push `outbox`,
//!   `subscriptions`, `ticker`, `events`, `directory` (what the backend API asks) and
//!   `backplane` (what a cluster's shared store is to the composition root).
//! - Side by side, never using each other:
//!   - `protocol/`: what doors decode clients' bytes into (`command`), the state machine
//!     that applies the rules to it with no IO, time and randomness given as inputs
//!     (`machine`), and what it may reach (`context`);
//!   - `cluster/`: several gateways sharing presence, events, pushes and kicks through
//!     Redis, a backplane;
//!   - `http/`: what servers and operators use over HTTP (`api`, `admin`, `status`, the
//!     bounded `listener`), reaching the gateway through `state` only;
//!   - `webhook/`: the events POSTed to a backend's URL, signed, in order (`relay`, `sign`);
//!   - `jwks/`: the JWT keys fetched from the identity provider's URL (`fetch`, `refresh`).
//! - `transport/`: the doors, declared once (`door`): accepting (`accept`, `admission`,
//!   one `guard` per connection, `refusal`), and driving a connection (`drive`) through the
//!   machine over a `connection` generic over a layer (`tcp`, `tls` with its `records`) and
//!   a framing (`tcp`'s frames, `ws`, `mqtt`).
//! - `server.rs`: the composition root, the one place that builds every part and hands
//!   each side a narrow handle; it runs everything and drains on shutdown.

#![forbid(unsafe_code)]

mod cluster;
mod config;
mod descriptors;
mod error;
mod http;
mod jwks;
mod metrics;
mod presence;
use idlegate_proto as proto;
mod protocol;
mod server;
mod transport;
mod webhook;

pub use config::{
    default_max_connections, parse_jwks_refresh, parse_webhook_events, Config, ConfigFile, FlagSpec, JwksConfig,
    JwksSource, JwtAuth, JwtRules, KeysStatus, Live, ProxyProtocol, RedisTarget, TimeoutClasses, TlsIdentity,
    WatchConfig, WatchPolicy, WebhookConfig, WebhookSecrets, DEFAULT_EVENT_LOG_BYTES, DEFAULT_EVENT_LOG_CAPACITY,
    DEFAULT_JWT_LEEWAY, DEFAULT_JWT_UID_CLAIM, DEFAULT_LAST_SEEN_CAPACITY, DEFAULT_LAST_SEEN_TTL,
    DEFAULT_MAX_DATA_BURST, DEFAULT_MAX_DATA_RATE, DEFAULT_MAX_DEVICES, DEFAULT_MAX_PENDING_LOGINS,
    DEFAULT_MAX_PENDING_LOGINS_PER_IP, DEFAULT_MAX_STATUS_BYTES, DEFAULT_MAX_WATCH, DEFAULT_MAX_WATCH_ENTRIES,
    DEFAULT_MQTT_MAX_SUBSCRIPTIONS, DEFAULT_MQTT_PRESENCE_TOPIC, DEFAULT_MQTT_PUSH_TOPIC, DEFAULT_MQTT_STATUS_TOPIC,
    DEFAULT_NODE_LEASE, DEFAULT_REDIS_QUEUE_BYTES, DEFAULT_WEBHOOK_BATCH, DEFAULT_WEBHOOK_EVENTS,
    DEFAULT_WEBHOOK_LINGER, DEFAULT_WEBHOOK_MAX_BACKOFF, DEFAULT_WEBHOOK_TIMEOUT, FD_HEADROOM,
};
pub use error::ConfigError;
pub use metrics::Metrics;
/// The type of [`Config::auth`], from the wire vocabulary's crate.
pub use proto::Auth;
pub use server::{Listeners, Server};

/// The presence core as the benchmarks (`benches/`) and a few tests drive it directly:
/// not part of the gateway's API, and free to change with it.
#[doc(hidden)]
pub mod bench {
    /// `ring` as `jsonwebtoken`'s verifier, as the gateway installs it (`benches/jwt.rs`).
    pub use crate::config::jwt_ring_provider;
    pub use crate::config::Class;
    pub use crate::presence::{
        Batch, ClassRings, Clock, Directory, Event, EventId, EventLog, Handle, LastSeen, Local, Registry, Ring,
        Session, Touch, What, READ_BATCH,
    };
}

/// The doors' own protocol code as the conformance suites drive it: the TLS layer beside
/// rustls's own (`tests/tls_differential.rs`, `fuzz/`), the WebSocket framing as an echo for
/// the Autobahn suite (`examples/ws_echo.rs`). Not part of the gateway's API.
#[doc(hidden)]
pub mod conformance {
    pub use crate::transport::tls::ServerLayer;
    pub use crate::transport::ws::EchoFraming;
}

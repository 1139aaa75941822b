//! idlegate: an idle-connection timeout gateway and realtime message channel.
//!
//! Clients hold one long-lived connection each (TCP, TLS, WebSocket or WebSocket in TLS), log in with a numeric uid and send
//! keepalive and data frames; a uid silent for the timeout goes offline and its connection is
//! closed. Idle detection is a sliding slot ring ([`Ring`]) driven by one ticker, not a timer
//! per connection. Backends ask who is online, follow online/offline/data events and push to
//! clients through an HTTP API.
//!
//! # Layout
//!
//! Folders by concern, imports pointing one way (`tests/layout.rs` checks the arrows):
//!
//! - `proto`: the wire vocabulary, its own crate (`crates/idlegate-proto`, shared with the
//!   client library and the load tests): `frame`, `codec` (bytes to frames, no IO), `retry`
//!   hints, `FrameError`, the `Transport` names of the doors. Imports nothing of the gateway.
//! - `config`, `metrics/`: low; everyone may use them; they own their defaults.
//! - `presence/`: who is online. `ring` (pure: ticks in, expired uids out), `clock` (the one
//!   place time becomes ticks), `registry`, `session` and its push `outbox`, `pending` (the
//!   connections waiting to log in), `ticker`, `events`, and `directory`, the trait the API
//!   asks.
//! - `protocol/`: the state machine every door drives, with no IO (`machine`).
//! - `transport/`: the doors. `connection` (a socket with no buffer of its own while idle,
//!   generic over a layer and a framing), `drive` (one connection through the machine),
//!   `tcp` (no layer, length-prefixed frames), `tls` (rustls's unbuffered API) and `ws`
//!   (WebSocket messages on `/v1/ws`).
//! - `http/`: what servers and operators use over HTTP: `api`, `admin`, `status`, and the
//!   bounded `listener`.
//! - `cluster/`: several gateways sharing presence, events, pushes and kicks through Redis
//!   (with `--redis`); the `Directory` the API asks when not alone. It and `http/` never use
//!   each other.
//! - `gateway.rs`: the state every task shares (above presence and cluster, below the
//!   protocol and the doors); `server.rs` accepts connections and runs everything: the one
//!   place that wires the gateway together. `auth`, `error` and `descriptors` (running out
//!   of file descriptors without going silent) serve all.

#![forbid(unsafe_code)]

mod auth;
mod cluster;
mod config;
mod descriptors;
mod error;
mod http;
mod metrics;
mod presence;
use idlegate_proto as proto;
mod protocol;
mod server;
mod transport;

pub use auth::{Auth, DEFAULT_MAX_TOKEN_TTL_SECS};
pub use config::{
    default_max_connections, Config, RedisTarget, TlsIdentity, DEFAULT_EVENT_LOG_BYTES, DEFAULT_EVENT_LOG_CAPACITY,
    DEFAULT_MAX_DATA_BURST, DEFAULT_MAX_DATA_RATE, DEFAULT_MAX_DEVICES, DEFAULT_MAX_PENDING_LOGINS,
    DEFAULT_MAX_PENDING_LOGINS_PER_IP, DEFAULT_MQTT_MAX_SUBSCRIPTIONS, DEFAULT_MQTT_PUSH_TOPIC, DEFAULT_NODE_LEASE,
    DEFAULT_REDIS_QUEUE_BYTES, FD_HEADROOM,
};
pub use error::{AuthError, ConfigError};
pub use metrics::Metrics;
pub use presence::{
    unix_now, Batch, Clock, Directory, Event, EventId, EventLog, Handle, Local, Registry, Ring, Session, Touch, What,
    READ_BATCH,
};
pub use proto::{
    kind, retry_hint, retry_text, CloseReason, Device, DeviceError, EventKind, Frame, FrameCodec, FrameError,
    Transport, BYE_CLOSE_BASE, DEFAULT_MAX_FRAME_BYTES, HEADER_LEN, MAX_LOGIN_FRAME_BYTES, TLS_ALPN, WS_PATH,
};
pub use server::{Listeners, Server};
pub use transport::accept_key;

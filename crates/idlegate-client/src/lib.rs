//! A client for [idlegate](https://github.com/idlegate/idlegate): one long-lived connection
//! that logs in, keeps itself alive, receives pushes and comes back after a gateway
//! restart, over TCP, TLS, WebSocket or WebSocket in TLS.
//!
//! - **Keepalive from WELCOME.** The gateway's WELCOME says its timeout; the client pings
//!   only after sending nothing for a third of it, so DATA traffic saves pings.
//! - **Reconnects that cannot stampede.** Full-jitter exponential backoff ([`Backoff`]), and
//!   never sooner than the `retry_after_ms` a gateway's BYE carries (at shutdown, when
//!   full): a fleet cut off at once comes back spread over the gateway's window.
//! - **Tokens** come from a [`TokenProvider`], asked before every login and told when the
//!   gateway refused the last one (BYE(auth_failed)), so an expired token is replaced; and
//!   asked again about a tenth of a token's lifetime before it expires (at least 5 s), for a
//!   REFRESH over the live connection: the session keeps its id, and only a refused
//!   refresh reconnects.
//! - **No reconnect** after a logout, or after BYE(kicked) (a newer login of the same
//!   device) unless [`Options::reconnect_after_kick`] says so; [`Client::reconnect`] asks.
//! - **While offline**, DATA waits in a bounded queue ([`Options::max_queued`]); past it,
//!   [`Client::try_send`] hands the message back.
//! - **Presence of others** ([`Client::watch`], [`Client::unwatch`]) and the user's own
//!   status ([`Client::set_status`]) are kept by the client and sent again on every
//!   connection, so each reconnect brings a fresh snapshot ([`Event::Presence`]).
//!
//! ```no_run
//! use idlegate_client::{Client, Event, Options, State};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let options = Options::new(42).device("phone".parse()?).token("token-from-your-backend");
//! let (client, mut events) = Client::connect("wss://gateway.example.com", options)?;
//! client.try_send(&b"hello"[..])?;
//! while let Some(event) = events.recv().await {
//!     match event {
//!         Event::State(State::Online { session, .. }) => println!("online as session {session}"),
//!         Event::State(State::Offline { reason, retry_in, .. }) => println!("offline ({reason}), retry in {retry_in:?}"),
//!         Event::State(State::Connecting { attempt }) => println!("connecting, attempt {attempt}"),
//!         Event::Push(payload) => println!("push: {payload:?}"),
//!         Event::Refreshed { expires } => println!("token refreshed, good until {expires}"),
//!         Event::Presence { entries, .. } => {
//!             for e in entries {
//!                 println!("uid {} is {}", e.uid, if e.online { "online" } else { "offline" });
//!             }
//!         }
//!     }
//! }
//! # Ok(())
//! # }
//! ```
//!
//! The wire vocabulary (frames, codec, close reasons, retry hints) is the `idlegate-proto`
//! crate, re-exported here as [`proto`].

#![forbid(unsafe_code)]

mod backoff;
mod client;
mod conn;
mod endpoint;
mod error;
mod options;
mod state;
mod token;

pub use backoff::{Backoff, DEFAULT_BASE, DEFAULT_CAP};
pub use client::{Client, Events};
pub use conn::MAX_INCOMING_FRAME_BYTES;
pub use endpoint::{Endpoint, EndpointError};
pub use error::{ClientError, SendError};
pub use idlegate_proto as proto;
pub use idlegate_proto::{CloseReason, Device, PresenceEntry, PresenceKind};
pub use options::{Options, DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_QUEUED};
pub use state::{Event, State};
pub use token::{read_expiry, TokenError, TokenFuture, TokenProvider, MIN_REFRESH_INTERVAL, MIN_REFRESH_LEAD};

//! idlegate: an idle-connection timeout gateway.
//!
//! Clients hold one long-lived TCP connection each, log in with a numeric uid and send
//! keepalive and data frames; a uid silent for the timeout goes offline and its connection is
//! closed. Idle detection is a sliding slot ring ([`Ring`]) driven by one ticker, not a timer
//! per connection.
//!
//! One frame's path, one file per step: socket -> `codec` -> `connection` -> `registry` (and
//! the `ring` inside it) -> `ticker` -> BYE back through `connection`.

mod ring;

pub use ring::{Ring, Touch};
mod admin;
mod auth;
mod codec;
mod config;
mod connection;
mod error;
mod frame;
mod metrics;
#[cfg(target_os = "linux")]
mod process;
mod registry;
mod server;
mod session;
mod ticker;

pub use auth::{unix_now, Auth};
pub use codec::{FrameCodec, DEFAULT_MAX_FRAME_BYTES, HEADER_LEN};
pub use config::{default_max_connections, Config, FD_HEADROOM};
pub use error::{AuthError, ConfigError, FrameError};
pub use frame::{kind, CloseReason, Frame};
pub use metrics::{FrameKind, Metrics};
pub use registry::{Activity, Registry};
pub use server::Server;
pub use session::Session;
pub use ticker::{Clock, Ticker};

//! The client side: bytes on a socket to frames, frames to protocol steps, and the listener
//! that accepts the sockets.
//!
//! `codec` frames bytes (no IO), `frame` names what they mean, `connection` moves frames over
//! one socket, `handler` runs the protocol for it, `session` is what a logged-in client shares
//! with the rest of the gateway, `outbox` holds pushes until its connection takes them, `retry` says when a
//! client sent away should come back, and `server` accepts connections and runs everything.

mod codec;
mod connection;
mod frame;
mod handler;
mod outbox;
mod pending;
mod retry;
mod server;
mod session;

pub use codec::{FrameCodec, DEFAULT_MAX_FRAME_BYTES, HEADER_LEN, MAX_LOGIN_FRAME_BYTES};
pub use frame::{kind, CloseReason, Frame};
pub use outbox::{Outboxes, Pushed};
pub(crate) use pending::Pending;
pub use retry::{retry_hint, retry_text};
pub use server::{Listeners, Server};
pub use session::Session;
pub(crate) use session::TOKEN;

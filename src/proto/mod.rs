//! The wire vocabulary, shared by the gateway, its transports and its clients: what a frame
//! is (`frame`), how frames become bytes and back (`codec`, no IO), what can be wrong with
//! them (`error`), how a client sent away learns when to come back (`retry`), and the doors clients
//! come in by (`transport`).
//!
//! Nothing here knows a socket, a runtime or the gateway's state: the lowest layer, which
//! every other imports and which imports nothing of them.

mod codec;
mod device;
mod error;
mod frame;
mod retry;
mod transport;

pub(crate) use codec::put_frame;
pub use codec::{FrameCodec, DEFAULT_MAX_FRAME_BYTES, HEADER_LEN, MAX_LOGIN_FRAME_BYTES};
pub use device::{Device, DeviceError, MAX_DEVICE_BYTES};
pub use error::FrameError;
pub use frame::{kind, CloseReason, Frame};
pub(crate) use retry::{
    jittered_ms, REFUSED_RETRY_BASE, REFUSED_RETRY_SPREAD, SHUTDOWN_RETRY_BASE, SHUTDOWN_RETRY_SPREAD,
};
pub use retry::{retry_hint, retry_text};
pub use transport::Transport;

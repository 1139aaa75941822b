//! idlegate's wire vocabulary, shared by the gateway, its client libraries and its load
//! tests: what a frame is (`frame`), how frames become bytes and back (`codec`, no IO),
//! what can be wrong with them (`error`), device names (`device`), how a client sent away
//! learns when to come back (`retry`), the doors clients come in by (`transport`, `door`),
//! the kinds of events backends follow (`event`), MQTT's framing for the MQTT door
//! (`mqtt`), RFC 6455's frame layout for the WebSocket door (`websocket`), and LOGIN
//! tokens (`token`).
//!
//! Nothing here knows a socket or a runtime: no tokio, no IO, only `bytes` and `thiserror`.
//! Features add what needs more: `tokio-codec` tokio-util's `Decoder` and `Encoder` for
//! [`FrameCodec`]; `token` minting and checking tokens (HMAC-SHA256); `websocket` the
//! handshake's accept key (SHA-1).
//! The byte layout, with examples, is in the gateway's docs/PROTOCOL.md.
//!
//! ```
//! use bytes::{Bytes, BytesMut};
//! use idlegate_proto::{Frame, FrameCodec};
//!
//! let mut codec = FrameCodec::default();
//! let mut wire = BytesMut::new();
//! codec.encode(&Frame::Ping(Bytes::from_static(b"t0")), &mut wire).unwrap();
//! assert_eq!(&wire[..], &[0, 0, 0, 3, 0x02, b't', b'0']);
//! assert_eq!(codec.decode(&mut wire).unwrap(), Some(Frame::Ping(Bytes::from_static(b"t0"))));
//! ```

#![forbid(unsafe_code)]

mod codec;
mod device;
mod door;
mod error;
mod event;
mod frame;
pub mod mqtt;
mod retry;
#[cfg(feature = "token")]
mod token;
#[cfg(feature = "tokio-codec")]
mod tokio_codec;
mod transport;
pub mod websocket;

pub use codec::{put_frame, FrameCodec, DEFAULT_MAX_FRAME_BYTES, HEADER_LEN, MAX_LOGIN_FRAME_BYTES, MAX_TOKEN_BYTES};
pub use device::{Device, DeviceError, MAX_DEVICE_BYTES};
pub use door::{BYE_CLOSE_BASE, TLS_ALPN, WS_PATH};
pub use error::{AuthError, FrameError};
pub use event::{EventKind, UnknownEventKind};
pub use frame::{kind, CloseReason, Frame, PresenceEntry, PresenceKind, MAX_STATUS_WIRE_BYTES};
pub use retry::{
    jittered_ms, retry_hint, retry_text, REFUSED_RETRY_BASE, REFUSED_RETRY_SPREAD, RETRY_HINT, SHUTDOWN_RETRY_BASE,
    SHUTDOWN_RETRY_SPREAD,
};
#[cfg(feature = "token")]
pub use token::{unix_now, Auth, DEFAULT_MAX_TOKEN_TTL_SECS};
pub use transport::Transport;

//! What can be wrong with bytes on the wire.

use std::io;

/// A frame the gateway cannot accept. Each one closes the connection with
/// BYE(protocol_error), except [`FrameError::Io`], which is the socket failing.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The length prefix is zero or above `--max-frame-bytes`; caught from the header alone.
    #[error("frame length {len} outside 1..={max}")]
    BadLength { len: u32, max: u32 },
    /// A body with no kind byte (only reachable through [`crate::Frame::parse`] directly).
    #[error("empty frame body")]
    Empty,
    /// A kind byte this protocol version does not define.
    #[error("unknown frame kind 0x{0:02x}")]
    UnknownKind(u8),
    /// A LOGIN whose payload cannot hold the 8-byte uid.
    #[error("LOGIN payload is {0} bytes; the uid alone takes 8")]
    ShortLogin(usize),
    /// A WELCOME whose payload is shorter than two u32 values, or whose session id is not
    /// ASCII.
    #[error("WELCOME payload of {0} bytes: expected 8, then an ASCII session id")]
    BadWelcome(usize),
    /// A REFRESHED whose payload is not the 8-byte expiry.
    #[error("REFRESHED payload of {0} bytes: expected 8")]
    BadRefreshed(usize),
    /// A LOGIN whose device name (after the 0x00) is not one.
    #[error("LOGIN device: {0}")]
    BadDevice(#[from] crate::DeviceError),
    /// A LOGIN's timeout field (version 5, after a second 0x00) that is not 4 bytes, or is
    /// zero.
    #[error("LOGIN timeout: {0} bytes after the device's 0x00; expected a u32 of milliseconds above 0")]
    BadLoginTimeout(usize),
    /// A BYE with no reason byte, or one this version does not define.
    #[error("BYE with reason {0:?}")]
    BadBye(Option<u8>),
    /// A WATCH or UNWATCH whose payload is not a whole, non-empty list of 8-byte uids.
    #[error("{0} payload of {1} bytes: expected one or more uids of 8 bytes each")]
    BadUidList(&'static str, usize),
    /// A STATUS whose text is not UTF-8.
    #[error("STATUS text is not UTF-8")]
    BadStatus,
    /// A PRESENCE that does not hold what its header says.
    #[error("PRESENCE malformed: {0}")]
    BadPresence(&'static str),
    /// The socket failed or closed in the middle of a frame.
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Why a LOGIN token was refused; the client only sees BYE(auth_failed).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    /// Not `<expiry>.<64 lowercase hex digits>`.
    #[error("token is not <expiry_unix_seconds>.<hex hmac>")]
    Malformed,
    /// The expiry has passed.
    #[error("token expired at {expiry}, now is {now}")]
    Expired { expiry: u64, now: u64 },
    /// The MAC does not match the uid and expiry under any secret.
    #[error("token signature does not match")]
    BadSignature,
    /// The expiry lies further ahead than the maximum lifetime.
    #[error("token expiry {expiry} lies more than --max-token-ttl ({max_ttl_secs} s) ahead")]
    TooLong { expiry: u64, max_ttl_secs: u64 },
}

//! The wire vocabulary: frame kinds, their payloads and the reasons a session ends.
//!
//! No IO and no length prefix here: [`Frame::parse`] reads one frame's body (kind byte and
//! payload) and [`Frame::encode`] writes one; `codec` adds the framing around them. See
//! docs/PROTOCOL.md for the byte layout with examples.

use std::num::NonZeroU32;

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::{Device, FrameError};

/// Frame kind bytes; client-to-gateway kinds have the high bit clear, gateway-to-client set.
pub mod kind {
    /// uid (u64 BE), an optional token, then optionally 0x00 and a device name, then
    /// optionally 0x00 and the timeout asked for (u32 BE milliseconds; version 5).
    pub const LOGIN: u8 = 0x01;
    /// Any payload; answered by PONG with the same payload.
    pub const PING: u8 = 0x02;
    /// Opaque application payload; counts as activity.
    pub const DATA: u8 = 0x03;
    /// Ends the session now.
    pub const LOGOUT: u8 = 0x04;
    /// A new token for the logged-in uid, replacing the LOGIN's before it expires
    /// (version 4).
    pub const REFRESH: u8 = 0x05;
    /// uids (u64 BE each, one or more) added to the session's watch list; answered by a
    /// PRESENCE snapshot of them (version 5).
    pub const WATCH: u8 = 0x06;
    /// uids (u64 BE each, one or more) taken off the session's watch list (version 5).
    pub const UNWATCH: u8 = 0x07;
    /// The user's status, UTF-8 (empty: none), which its watchers see (version 5).
    pub const STATUS: u8 = 0x08;
    /// `timeout_ms` (u32 BE), `tick_ms` (u32 BE), then the session id in ASCII.
    pub const WELCOME: u8 = 0x81;
    /// The PING's payload.
    pub const PONG: u8 = 0x82;
    /// Application bytes a backend pushed through the API; not a reply to anything.
    pub const PUSH: u8 = 0x83;
    /// The REFRESH was taken: the new token's expiry, unix seconds (u64 BE).
    pub const REFRESHED: u8 = 0x84;
    /// Watched uids' presence: what the entries are (u8: a change, a snapshot answering a
    /// WATCH, a resync of the whole list), their count (u16 BE), then each entry: uid (u64),
    /// state (u8: 0 offline, 1 online), at_ms (u64), the status's length (u8) and the
    /// status (UTF-8), and for an offline entry last_seen_ms (u64, 0 when unknown)
    /// (version 5).
    pub const PRESENCE: u8 = 0x85;
    /// A reason byte and optional UTF-8 text; the gateway closes after it.
    pub const BYE: u8 = 0x8F;
}

/// Bytes of the uid at the start of a LOGIN payload.
const UID_LEN: usize = 8;

/// Bytes of a WELCOME payload before the session id: two u32 values, all an old client reads.
const WELCOME_LEN: usize = 8;

/// Bytes of a REFRESHED payload: the expiry, unix seconds as a u64.
const REFRESHED_LEN: usize = 8;

/// Separates a LOGIN's token from its device name, and the device name from the timeout
/// asked for. Tokens are printable ASCII and device names hold no control character, so it
/// can never be part of either; a LOGIN without it is an old client's: the default device.
const DEVICE_SEPARATOR: u8 = 0x00;

/// Bytes of a LOGIN's timeout field: milliseconds as a u32, as WELCOME's.
const LOGIN_TIMEOUT_LEN: usize = 4;

/// Bytes of one uid in a WATCH or UNWATCH.
const WATCH_UID_LEN: usize = 8;

/// Bytes of a PRESENCE's header: what the entries are (u8), and how many (u16).
const PRESENCE_HEADER_LEN: usize = 3;

/// Bytes of a PRESENCE entry's fixed part: uid (u64), state (u8), at_ms (u64), and the
/// status's length (u8).
const PRESENCE_ENTRY_LEN: usize = 8 + 1 + 8 + 1;

/// Bytes of an offline entry's last_seen_ms.
const LAST_SEEN_LEN: usize = 8;

/// Longest status a PRESENCE entry can carry: its length is one byte. The gateway's own
/// bound (`--max-status-bytes`) is at most this.
pub const MAX_STATUS_WIRE_BYTES: usize = u8::MAX as usize;

/// What a PRESENCE's entries are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PresenceKind {
    /// Changes of watched uids, in the order of the event stream.
    Change = 0,
    /// The current state of each uid a WATCH added, before any change of them.
    Snapshot = 1,
    /// The current state of the whole watch list: the session fell behind (or the stream
    /// broke), and what it missed is replaced by this, never skipped in silence.
    Resync = 2,
}

/// One watched uid's presence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PresenceEntry {
    pub uid: u64,
    pub online: bool,
    /// When this state began (unix ms): the user event's time.
    pub at_ms: u64,
    /// The user's status (empty: none), at most [`MAX_STATUS_WIRE_BYTES`].
    pub status: String,
    /// For an offline uid, when it was last online (unix ms), if known.
    pub last_seen_ms: Option<u64>,
}

/// One protocol frame, in either direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// First frame of a session: who the client is, with auth on its token, which of its
    /// devices this is, and the timeout it asks for (version 5; none: the gateway's
    /// default). WELCOME says the timeout it got.
    Login { uid: u64, token: Bytes, device: Device, timeout_ms: Option<NonZeroU32> },
    /// Keepalive; the payload comes back in the PONG (clients put a timestamp there).
    Ping(Bytes),
    /// Application payload; activity without a reply.
    Data(Bytes),
    /// The client ends its session.
    Logout,
    /// A new token for the session's uid (version 4): the session goes on under it.
    Refresh(Bytes),
    /// The gateway accepted the LOGIN and tells the client how often it must speak, and the
    /// id its session has in the events (empty from a gateway older than version 3).
    Welcome { timeout_ms: u32, tick_ms: u32, session: String },
    /// Answer to a PING.
    Pong(Bytes),
    /// Application bytes from a backend.
    Push(Bytes),
    /// The REFRESH was taken; the session now ends at `expires` (unix seconds) when the
    /// gateway enforces token expiry.
    Refreshed { expires: u64 },
    /// The gateway's last frame on a connection.
    Bye { reason: CloseReason, text: String },
    /// uids to add to the session's watch list (version 5).
    Watch(Vec<u64>),
    /// uids to take off the session's watch list (version 5).
    Unwatch(Vec<u64>),
    /// The user's status (version 5); empty clears it.
    Status(String),
    /// Watched uids' presence (version 5).
    Presence { kind: PresenceKind, entries: Vec<PresenceEntry> },
}

/// The uids of a WATCH or UNWATCH payload.
fn uid_list(name: &'static str, body: &Bytes) -> Result<Vec<u64>, FrameError> {
    if body.is_empty() || !body.len().is_multiple_of(WATCH_UID_LEN) {
        return Err(FrameError::BadUidList(name, body.len()));
    }
    Ok(body.chunks_exact(WATCH_UID_LEN).map(|c| u64::from_be_bytes(c.try_into().expect("8 bytes"))).collect())
}

/// A PRESENCE payload's entries.
fn presence(mut body: Bytes) -> Result<Frame, FrameError> {
    let bad = FrameError::BadPresence;
    if body.len() < PRESENCE_HEADER_LEN {
        return Err(bad("shorter than its header"));
    }
    let kind = match body.get_u8() {
        0 => PresenceKind::Change,
        1 => PresenceKind::Snapshot,
        2 => PresenceKind::Resync,
        _ => return Err(bad("unknown kind")),
    };
    let count = body.get_u16() as usize;
    // Each entry takes its fixed part at least: a count the body cannot hold is refused
    // before anything is allocated for it.
    if count * PRESENCE_ENTRY_LEN > body.len() {
        return Err(bad("fewer bytes than its count of entries"));
    }
    let mut entries = Vec::with_capacity(count);
    for _ in 0..count {
        if body.len() < PRESENCE_ENTRY_LEN {
            return Err(bad("an entry cut short"));
        }
        let (uid, state, at_ms, len) = (body.get_u64(), body.get_u8(), body.get_u64(), body.get_u8() as usize);
        let online = match state {
            0 => false,
            1 => true,
            _ => return Err(bad("an entry's state is neither 0 nor 1")),
        };
        if body.len() < len + if online { 0 } else { LAST_SEEN_LEN } {
            return Err(bad("an entry cut short"));
        }
        let status = String::from_utf8(body.split_to(len).to_vec()).map_err(|_| bad("a status is not UTF-8"))?;
        let last_seen_ms = if online { None } else { Some(body.get_u64()).filter(|&ms| ms > 0) };
        entries.push(PresenceEntry { uid, online, at_ms, status, last_seen_ms });
    }
    if !body.is_empty() {
        return Err(bad("bytes after its last entry"));
    }
    Ok(Frame::Presence { kind, entries })
}

// === impl Frame ===

impl Frame {
    /// Parses one frame body: the kind byte and the payload after it.
    pub fn parse(mut body: Bytes) -> Result<Frame, FrameError> {
        if body.is_empty() {
            return Err(FrameError::Empty);
        }
        let kind = body.get_u8();
        Ok(match kind {
            kind::LOGIN => {
                if body.len() < UID_LEN {
                    return Err(FrameError::ShortLogin(body.len()));
                }
                let uid = body.get_u64();
                let Some(at) = body.iter().position(|&b| b == DEVICE_SEPARATOR) else {
                    return Ok(Frame::Login { uid, token: body, device: Device::DEFAULT, timeout_ms: None });
                };
                let rest = &body[at + 1..];
                let (device, timeout_ms) = match rest.iter().position(|&b| b == DEVICE_SEPARATOR) {
                    None => (Device::parse(rest).map_err(FrameError::BadDevice)?, None),
                    Some(end) => {
                        let field = &rest[end + 1..];
                        let timeout = <[u8; LOGIN_TIMEOUT_LEN]>::try_from(field)
                            .map(u32::from_be_bytes)
                            .ok()
                            .and_then(NonZeroU32::new)
                            .ok_or(FrameError::BadLoginTimeout(field.len()))?;
                        // An empty name before the timeout: the default device.
                        let device = if end == 0 {
                            Device::DEFAULT
                        } else {
                            Device::parse(&rest[..end]).map_err(FrameError::BadDevice)?
                        };
                        (device, Some(timeout))
                    }
                };
                Frame::Login { uid, token: body.slice(..at), device, timeout_ms }
            }
            kind::PING => Frame::Ping(body),
            kind::DATA => Frame::Data(body),
            kind::LOGOUT => Frame::Logout,
            kind::REFRESH => Frame::Refresh(body),
            kind::WELCOME => {
                if body.len() < WELCOME_LEN || !body[WELCOME_LEN..].is_ascii() {
                    return Err(FrameError::BadWelcome(body.len()));
                }
                let (timeout_ms, tick_ms) = (body.get_u32(), body.get_u32());
                let session = String::from_utf8_lossy(&body).into_owned();
                Frame::Welcome { timeout_ms, tick_ms, session }
            }
            kind::PONG => Frame::Pong(body),
            kind::PUSH => Frame::Push(body),
            kind::REFRESHED => {
                if body.len() != REFRESHED_LEN {
                    return Err(FrameError::BadRefreshed(body.len()));
                }
                Frame::Refreshed { expires: body.get_u64() }
            }
            kind::WATCH => Frame::Watch(uid_list("WATCH", &body)?),
            kind::UNWATCH => Frame::Unwatch(uid_list("UNWATCH", &body)?),
            kind::STATUS => Frame::Status(String::from_utf8(body.to_vec()).map_err(|_| FrameError::BadStatus)?),
            kind::PRESENCE => presence(body)?,
            kind::BYE => {
                if body.is_empty() {
                    return Err(FrameError::BadBye(None));
                }
                let code = body.get_u8();
                let reason = CloseReason::from_wire(code).ok_or(FrameError::BadBye(Some(code)))?;
                let text = String::from_utf8_lossy(&body).into_owned();
                Frame::Bye { reason, text }
            }
            other => return Err(FrameError::UnknownKind(other)),
        })
    }

    /// Length of the body [`Frame::encode`] writes: kind byte plus payload.
    pub fn body_len(&self) -> usize {
        1 + match self {
            Frame::Login { token, device, timeout_ms, .. } => {
                let device_len = if device.is_default() { 0 } else { device.len() };
                UID_LEN
                    + token.len()
                    + match timeout_ms {
                        Some(_) => 1 + device_len + 1 + LOGIN_TIMEOUT_LEN,
                        None if device.is_default() => 0,
                        None => 1 + device_len,
                    }
            }
            Frame::Ping(p) | Frame::Data(p) | Frame::Pong(p) | Frame::Push(p) | Frame::Refresh(p) => p.len(),
            Frame::Logout => 0,
            Frame::Refreshed { .. } => REFRESHED_LEN,
            Frame::Welcome { session, .. } => WELCOME_LEN + session.len(),
            Frame::Bye { text, .. } => 1 + text.len(),
            Frame::Watch(uids) | Frame::Unwatch(uids) => WATCH_UID_LEN * uids.len(),
            Frame::Status(text) => text.len(),
            Frame::Presence { entries, .. } => {
                PRESENCE_HEADER_LEN
                    + entries
                        .iter()
                        .map(|e| PRESENCE_ENTRY_LEN + e.status.len() + if e.online { 0 } else { LAST_SEEN_LEN })
                        .sum::<usize>()
            }
        }
    }

    /// Writes the body: kind byte then payload.
    pub fn encode(&self, dst: &mut BytesMut) {
        dst.reserve(self.body_len());
        match self {
            Frame::Login { uid, token, device, timeout_ms } => {
                dst.put_u8(kind::LOGIN);
                dst.put_u64(*uid);
                dst.put_slice(token);
                if !device.is_default() || timeout_ms.is_some() {
                    dst.put_u8(DEVICE_SEPARATOR);
                    if !device.is_default() {
                        dst.put_slice(device.as_str().as_bytes());
                    }
                }
                if let Some(ms) = timeout_ms {
                    dst.put_u8(DEVICE_SEPARATOR);
                    dst.put_u32(ms.get());
                }
            }
            Frame::Ping(p) => {
                dst.put_u8(kind::PING);
                dst.put_slice(p);
            }
            Frame::Data(p) => {
                dst.put_u8(kind::DATA);
                dst.put_slice(p);
            }
            Frame::Logout => dst.put_u8(kind::LOGOUT),
            Frame::Refresh(token) => {
                dst.put_u8(kind::REFRESH);
                dst.put_slice(token);
            }
            Frame::Refreshed { expires } => {
                dst.put_u8(kind::REFRESHED);
                dst.put_u64(*expires);
            }
            Frame::Welcome { timeout_ms, tick_ms, session } => {
                dst.put_u8(kind::WELCOME);
                dst.put_u32(*timeout_ms);
                dst.put_u32(*tick_ms);
                dst.put_slice(session.as_bytes());
            }
            Frame::Pong(p) => {
                dst.put_u8(kind::PONG);
                dst.put_slice(p);
            }
            Frame::Push(p) => {
                dst.put_u8(kind::PUSH);
                dst.put_slice(p);
            }
            Frame::Bye { reason, text } => {
                dst.put_u8(kind::BYE);
                // Disconnect never reaches the wire; 0 keeps encode total anyway.
                dst.put_u8(reason.wire_code().unwrap_or(0));
                dst.put_slice(text.as_bytes());
            }
            Frame::Watch(uids) | Frame::Unwatch(uids) => {
                dst.put_u8(if matches!(self, Frame::Watch(_)) { kind::WATCH } else { kind::UNWATCH });
                uids.iter().for_each(|&uid| dst.put_u64(uid));
            }
            Frame::Status(text) => {
                dst.put_u8(kind::STATUS);
                dst.put_slice(text.as_bytes());
            }
            Frame::Presence { kind: what, entries } => {
                debug_assert!(entries.len() <= u16::MAX as usize, "a PRESENCE holds at most 65,535 entries");
                dst.put_u8(kind::PRESENCE);
                dst.put_u8(*what as u8);
                dst.put_u16(entries.len() as u16);
                for e in entries {
                    debug_assert!(e.status.len() <= MAX_STATUS_WIRE_BYTES, "a status longer than its length byte");
                    dst.put_u64(e.uid);
                    dst.put_u8(u8::from(e.online));
                    dst.put_u64(e.at_ms);
                    dst.put_u8(e.status.len() as u8);
                    dst.put_slice(e.status.as_bytes());
                    if !e.online {
                        dst.put_u64(e.last_seen_ms.unwrap_or(0));
                    }
                }
            }
        }
    }
}

/// Why a session or connection ended: the BYE reasons plus `Disconnect`, which has no BYE.
///
/// The labels are the `reason` values of the closed-connections metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum CloseReason {
    IdleTimeout = 1,
    Logout = 2,
    Kicked = 3,
    ProtocolError = 4,
    LoginTimeout = 5,
    AuthFailed = 6,
    ServerFull = 7,
    Shutdown = 8,
    SlowConsumer = 9,
    /// The token the session logged in (or last refreshed) with expired, and the gateway
    /// enforces expiry (`--enforce-token-expiry`).
    TokenExpired = 10,
    /// The client closed the socket; nothing is sent.
    Disconnect = 11,
    /// The node holding the session died (cluster events only): no connection of this
    /// node closes for it, so it is not in [`CloseReason::ALL`].
    NodeLost = 12,
}

// === impl CloseReason ===

impl CloseReason {
    /// Every reason a connection of this node closes with, in code order; `ALL[i]` has
    /// code `i + 1`.
    pub const ALL: [CloseReason; 11] = [
        CloseReason::IdleTimeout,
        CloseReason::Logout,
        CloseReason::Kicked,
        CloseReason::ProtocolError,
        CloseReason::LoginTimeout,
        CloseReason::AuthFailed,
        CloseReason::ServerFull,
        CloseReason::Shutdown,
        CloseReason::SlowConsumer,
        CloseReason::TokenExpired,
        CloseReason::Disconnect,
    ];

    /// The reason byte of its BYE, or `None` for a disconnect or a lost node, which send no
    /// BYE.
    pub fn wire_code(self) -> Option<u8> {
        match self {
            CloseReason::Disconnect | CloseReason::NodeLost => None,
            other => Some(other as u8),
        }
    }

    /// The reason for a BYE reason byte.
    pub fn from_wire(code: u8) -> Option<CloseReason> {
        CloseReason::from_code(code).filter(|r| r.wire_code().is_some())
    }

    /// The reason whose discriminant is `code` (every reason, the two with no BYE too): how
    /// a reason is kept in one byte.
    pub fn from_code(code: u8) -> Option<CloseReason> {
        match code {
            1..=11 => Some(CloseReason::ALL[usize::from(code) - 1]),
            12 => Some(CloseReason::NodeLost),
            _ => None,
        }
    }

    /// Whether someone chose this ending (the client logged out, the backend kicked the
    /// session, its token expired): no reconnect is likely, so an offline grace does not
    /// hold the uid's `user_offline` back. Abrupt endings (a disconnect, a timeout, a lost
    /// node, a slow consumer, a protocol error) are held: those are what a reconnect follows.
    pub fn is_chosen(self) -> bool {
        matches!(self, CloseReason::Logout | CloseReason::Kicked | CloseReason::TokenExpired)
    }

    /// Position in [`CloseReason::ALL`], for per-reason arrays.
    pub fn index(self) -> usize {
        self as usize - 1
    }

    /// Metric label and log name.
    pub fn label(self) -> &'static str {
        match self {
            CloseReason::IdleTimeout => "idle_timeout",
            CloseReason::Logout => "logout",
            CloseReason::Kicked => "kicked",
            CloseReason::ProtocolError => "protocol_error",
            CloseReason::LoginTimeout => "login_timeout",
            CloseReason::AuthFailed => "auth_failed",
            CloseReason::ServerFull => "server_full",
            CloseReason::Shutdown => "shutdown",
            CloseReason::SlowConsumer => "slow_consumer",
            CloseReason::TokenExpired => "token_expired",
            CloseReason::Disconnect => "disconnect",
            CloseReason::NodeLost => "node_lost",
        }
    }

    /// The reason a label names, as events spell it.
    pub fn from_label(label: &str) -> Option<CloseReason> {
        CloseReason::ALL.into_iter().chain([CloseReason::NodeLost]).find(|r| r.label() == label)
    }
}

impl std::fmt::Display for CloseReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(frame: Frame) {
        let mut buf = BytesMut::new();
        frame.encode(&mut buf);
        assert_eq!(buf.len(), frame.body_len(), "{frame:?}");
        assert_eq!(Frame::parse(buf.freeze()).unwrap(), frame);
    }

    #[test]
    fn every_kind_round_trips() {
        round_trip(Frame::Login {
            uid: 42,
            token: Bytes::from_static(b"tok"),
            device: Device::DEFAULT,
            timeout_ms: None,
        });
        round_trip(Frame::Login { uid: u64::MAX, token: Bytes::new(), device: Device::DEFAULT, timeout_ms: None });
        let phone = Device::parse(b"phone").unwrap();
        round_trip(Frame::Login { uid: 7, token: Bytes::from_static(b"tok"), device: phone.clone(), timeout_ms: None });
        round_trip(Frame::Login { uid: 7, token: Bytes::new(), device: phone.clone(), timeout_ms: None });
        // Version 5: the timeout asked for, after a device or after an empty name.
        round_trip(Frame::Login {
            uid: 7,
            token: Bytes::from_static(b"tok"),
            device: phone,
            timeout_ms: NonZeroU32::new(120_000),
        });
        round_trip(Frame::Login {
            uid: 7,
            token: Bytes::new(),
            device: Device::DEFAULT,
            timeout_ms: NonZeroU32::new(1),
        });
        round_trip(Frame::Login {
            uid: 7,
            token: Bytes::new(),
            device: Device::DEFAULT,
            timeout_ms: NonZeroU32::new(0x0000_0100),
        });
        round_trip(Frame::Ping(Bytes::from_static(b"\x00\x01")));
        round_trip(Frame::Data(Bytes::new()));
        round_trip(Frame::Logout);
        round_trip(Frame::Welcome { timeout_ms: 30_000, tick_ms: 1_000, session: String::new() });
        round_trip(Frame::Welcome { timeout_ms: 30_000, tick_ms: 1_000, session: "00000000000000ff".into() });
        round_trip(Frame::Pong(Bytes::from_static(b"t")));
        round_trip(Frame::Push(Bytes::from_static(b"\x00\xffbin")));
        round_trip(Frame::Refresh(Bytes::from_static(b"a.b.c")));
        round_trip(Frame::Refreshed { expires: 1_700_000_000 });
        for reason in CloseReason::ALL.into_iter().filter(|r| r.wire_code().is_some()) {
            round_trip(Frame::Bye { reason, text: "why".into() });
        }
        // Version 5: watch lists, status and presence.
        round_trip(Frame::Watch(vec![1, u64::MAX]));
        round_trip(Frame::Unwatch(vec![7]));
        round_trip(Frame::Status("away: back at 3 ☕".into()));
        round_trip(Frame::Status(String::new()));
        let online =
            PresenceEntry { uid: 7, online: true, at_ms: 1_795_000_000_000, status: "busy".into(), last_seen_ms: None };
        let offline = PresenceEntry {
            uid: 8,
            online: false,
            at_ms: 1_795_000_001_000,
            status: String::new(),
            last_seen_ms: Some(1_795_000_000_999),
        };
        let never = PresenceEntry { uid: 9, online: false, at_ms: 0, status: String::new(), last_seen_ms: None };
        for kind in [PresenceKind::Change, PresenceKind::Snapshot, PresenceKind::Resync] {
            round_trip(Frame::Presence { kind, entries: vec![online.clone(), offline.clone(), never.clone()] });
            round_trip(Frame::Presence { kind, entries: Vec::new() });
        }
    }

    /// The bytes of docs/PROTOCOL.md's examples, and every malformed shape refused.
    #[test]
    fn watch_status_and_presence_frames_have_their_documented_bytes() {
        let mut buf = BytesMut::new();
        Frame::Watch(vec![7, 8]).encode(&mut buf);
        assert_eq!(&buf[..], b"\x06\0\0\0\0\0\0\0\x07\0\0\0\0\0\0\0\x08");
        let mut buf = BytesMut::new();
        let entry = PresenceEntry { uid: 7, online: false, at_ms: 2, status: "hi".into(), last_seen_ms: Some(1) };
        Frame::Presence { kind: PresenceKind::Snapshot, entries: vec![entry] }.encode(&mut buf);
        let want: &[u8] = &[
            0x85, 1, 0, 1, // PRESENCE, a snapshot, one entry
            0, 0, 0, 0, 0, 0, 0, 7, 0, // uid 7, offline
            0, 0, 0, 0, 0, 0, 0, 2, 2, b'h', b'i', // at_ms 2, status "hi"
            0, 0, 0, 0, 0, 0, 0, 1, // last seen at 1
        ];
        assert_eq!(&buf[..], want);
        let parse = |bytes: &'static [u8]| Frame::parse(Bytes::from_static(bytes)).unwrap_err();
        assert!(matches!(parse(b"\x06"), FrameError::BadUidList("WATCH", 0)));
        assert!(matches!(parse(b"\x07\0\0\0"), FrameError::BadUidList("UNWATCH", 3)));
        assert!(matches!(parse(b"\x08\xff"), FrameError::BadStatus));
        assert!(matches!(parse(b"\x85\x00"), FrameError::BadPresence(_)));
        assert!(matches!(parse(b"\x85\x03\0\0"), FrameError::BadPresence("unknown kind")));
        // A count of 65,535 entries in a few bytes: refused before allocating for it.
        assert!(matches!(parse(b"\x85\x00\xff\xff"), FrameError::BadPresence(_)));
        let cut: &'static [u8] = &[0x85, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 7, 1, 0, 0, 0, 0, 0, 0, 0, 2, 5, b'h'];
        assert!(matches!(parse(cut), FrameError::BadPresence("an entry cut short")));
        let state: &'static [u8] = &[0x85, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 7, 2, 0, 0, 0, 0, 0, 0, 0, 2, 0];
        assert!(matches!(parse(state), FrameError::BadPresence(_)));
        let extra: &'static [u8] = &[0x85, 0, 0, 0, 9];
        assert!(matches!(parse(extra), FrameError::BadPresence("bytes after its last entry")));
    }

    #[test]
    fn an_old_login_means_the_default_device_and_an_old_welcome_parses() {
        let old = Frame::parse(Bytes::from_static(b"\x01\x00\x00\x00\x00\x00\x00\x00\x05tok")).unwrap();
        assert_eq!(
            old,
            Frame::Login { uid: 5, token: Bytes::from_static(b"tok"), device: Device::DEFAULT, timeout_ms: None }
        );
        let named = Frame::parse(Bytes::from_static(b"\x01\x00\x00\x00\x00\x00\x00\x00\x05tok\x00tab")).unwrap();
        assert_eq!(
            named,
            Frame::Login {
                uid: 5,
                token: Bytes::from_static(b"tok"),
                device: "tab".parse().unwrap(),
                timeout_ms: None
            }
        );
        let welcome = Frame::parse(Bytes::from_static(b"\x81\x00\x00\x75\x30\x00\x00\x03\xe8")).unwrap();
        assert_eq!(welcome, Frame::Welcome { timeout_ms: 30_000, tick_ms: 1_000, session: String::new() });
    }

    #[test]
    fn reason_codes_and_indices_agree() {
        for (i, reason) in CloseReason::ALL.into_iter().enumerate() {
            assert_eq!(reason.index(), i);
            if let Some(code) = reason.wire_code() {
                assert_eq!(CloseReason::from_wire(code), Some(reason));
            }
        }
        assert_eq!(CloseReason::from_wire(0), None);
        assert_eq!(CloseReason::from_wire(10), Some(CloseReason::TokenExpired));
        assert_eq!(CloseReason::from_wire(11), None);
        assert_eq!(CloseReason::from_wire(12), None);
        for code in 1..=12 {
            assert_eq!(CloseReason::from_code(code).map(|r| r as u8), Some(code));
        }
        assert_eq!(CloseReason::from_code(13), None);
    }

    #[test]
    fn bad_bodies_are_errors() {
        let parse = |b: &'static [u8]| Frame::parse(Bytes::from_static(b)).unwrap_err();
        assert!(matches!(parse(b""), FrameError::Empty));
        assert!(matches!(parse(b"\x01\x00\x00"), FrameError::ShortLogin(2)));
        assert!(matches!(parse(b"\x09"), FrameError::UnknownKind(9)));
        assert!(matches!(parse(b"\x81\x00"), FrameError::BadWelcome(1)));
        assert!(matches!(parse(b"\x81\x00\x00\x00\x01\x00\x00\x00\x01\xff"), FrameError::BadWelcome(9)));
        assert!(matches!(parse(b"\x01\x00\x00\x00\x00\x00\x00\x00\x01tok\x00"), FrameError::BadDevice(_)));
        assert!(matches!(parse(b"\x01\x00\x00\x00\x00\x00\x00\x00\x01\x00a\x07"), FrameError::BadDevice(_)));
        assert!(matches!(parse(b"\x01\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x01"), FrameError::BadLoginTimeout(1)));
        assert!(matches!(
            parse(b"\x01\x00\x00\x00\x00\x00\x00\x00\x01\x00a\x00\x00\x00\x00\x00"),
            FrameError::BadLoginTimeout(4)
        ));
        assert!(matches!(
            parse(b"\x01\x00\x00\x00\x00\x00\x00\x00\x01\x00a\x00\x00\x00\x00\x01\x02"),
            FrameError::BadLoginTimeout(5)
        ));
        assert!(matches!(parse(b"\x8f"), FrameError::BadBye(None)));
        assert!(matches!(parse(b"\x8f\x0b"), FrameError::BadBye(Some(11))));
        assert!(matches!(parse(b"\x84\x00\x01"), FrameError::BadRefreshed(2)));
    }
}

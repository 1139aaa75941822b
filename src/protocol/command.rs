//! What every door decodes a client's bytes into: one vocabulary for the machine, whatever
//! the wire. A length-prefixed frame, a WebSocket message and an MQTT packet that mean the
//! same (a LOGIN and a CONNECT, a DATA and a PUBLISH) become the same command, so the rules
//! are written once and a new door only decodes.

use std::sync::Arc;

use bytes::Bytes;

use crate::presence::Will;
use crate::proto::{Device, Frame};

/// The timeout a login asks for; the machine grants a timeout class for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Asked {
    /// Nothing: the default class (`--timeout`).
    #[default]
    Default,
    /// A LOGIN's timeout field (version 5), in milliseconds.
    Ms(u32),
    /// An MQTT CONNECT's keepalive, in seconds (0: none).
    KeepAlive(u16),
}

/// One unit from a client, decoded by its door.
#[derive(Debug)]
pub(crate) enum Command {
    /// Log in as `uid` on `device`, asking for `timeout`. A `subscriber` (an MQTT session)
    /// takes only the pushes its subscriptions match, others every push; `will` is told in
    /// its offline event.
    Login { uid: u64, token: Bytes, device: Device, timeout: Asked, subscriber: bool, will: Option<Box<Will>> },
    /// A keepalive, answered with a PONG carrying `payload`.
    Ping(Bytes),
    /// Data for the backends, on `topic` (MQTT) or none. The payload is in a buffer of its
    /// own size: the door's read buffer is not kept alive by the event log.
    Data { payload: Bytes, topic: Option<Arc<str>> },
    /// The client leaves.
    Logout,
    /// A new token for the session's uid (a REFRESH frame; MQTT 5's re-authentication).
    Refresh(Bytes),
    /// MQTT SUBSCRIBE: topic filters, from a client that takes packets of up to
    /// `max_packet` bytes, and the uids whose presence topics it named (`watch`), whose
    /// outcomes follow the filters'.
    Subscribe { filters: Vec<String>, max_packet: u32, watch: Vec<u64> },
    /// MQTT UNSUBSCRIBE: topic filters, and the uids whose presence topics it named.
    Unsubscribe { filters: Vec<String>, unwatch: Vec<u64> },
    /// uids to add to the session's watch list (a WATCH frame; an MQTT SUBSCRIBE to a
    /// presence topic).
    Watch(Vec<u64>),
    /// uids to take off the session's watch list.
    Unwatch(Vec<u64>),
    /// The user's status (empty: none).
    Status(String),
    /// Not a frame but shows the client is there (a WebSocket ping or pong).
    Activity,
    /// Something a client must not send (a gateway-to-client frame kind), with why.
    Refused(&'static str),
}

/// A frame of the idlegate protocol as a command: the frame doors (TCP, TLS, WebSocket).
impl From<Frame> for Command {
    fn from(frame: Frame) -> Command {
        match frame {
            Frame::Login { uid, token, device, timeout_ms } => {
                let timeout = timeout_ms.map_or(Asked::Default, |ms| Asked::Ms(ms.get()));
                Command::Login { uid, token, device, timeout, subscriber: false, will: None }
            }
            Frame::Ping(payload) => Command::Ping(payload),
            // Copied to a buffer of its own size: the frame's bytes live in the worker's read
            // buffer, which the log must not keep alive.
            Frame::Data(payload) => Command::Data { payload: Bytes::copy_from_slice(&payload), topic: None },
            Frame::Logout => Command::Logout,
            Frame::Refresh(token) => Command::Refresh(token),
            Frame::Watch(uids) => Command::Watch(uids),
            Frame::Unwatch(uids) => Command::Unwatch(uids),
            Frame::Status(text) => Command::Status(text),
            Frame::Welcome { .. }
            | Frame::Pong(_)
            | Frame::Push(_)
            | Frame::Refreshed { .. }
            | Frame::Bye { .. }
            | Frame::Presence { .. } => Command::Refused("gateway-to-client frame kind sent by a client"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_frame_s_payload_is_copied_out_of_the_read_buffer() {
        let read = Bytes::from_static(b"....payload....");
        let Command::Data { payload, topic: None } = Command::from(Frame::Data(read.slice(4..11))) else {
            panic!("a DATA frame is a data command")
        };
        assert_eq!(&payload[..], b"payload");
        assert!(!read.as_ptr_range().contains(&payload.as_ptr()), "the payload still points into the read buffer");
    }

    #[test]
    fn gateway_to_client_frames_are_refused() {
        assert!(matches!(Command::from(Frame::Pong(Bytes::new())), Command::Refused(_)));
        assert!(matches!(Command::from(Frame::Logout), Command::Logout));
    }
}

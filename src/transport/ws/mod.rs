//! The WebSocket door (`--ws-listen`, `--wss-listen`): RFC 6455 on path `/v1/ws`, one protocol
//! frame per binary message (the kind byte, then the payload; no length prefix).
//!
//! Written here rather than taken from tungstenite: tungstenite keeps a read buffer per
//! connection (128 KiB by default, tungstenite-rs#480), while this framing keeps four
//! integers and, for the upgrade only, a pointer. A message arrives in the connection's
//! read buffer (the worker's while idle, see `connection.rs`); its payload is unmasked where
//! it lies, and a fragmented message is gathered at the front of that same buffer, so
//! nothing is held between messages. Permessage-deflate is not offered: its compression
//! state is tens of KiB per connection, more than the rest of an idle connection together.
//!
//! The gateway's BYE is a binary message followed by a close frame with code
//! `4000 + reason byte` and the reason's name; a text message closes with 1003, a message
//! over `--max-frame-bytes` with 1009, any other malformed frame with 4004 after its
//! BYE(protocol_error). Pings are answered with pongs; every frame counts as activity.
//!
//! A client that offers the `mqtt` subprotocol (`Sec-WebSocket-Protocol: mqtt`, as MQTT.js
//! and paho's WebSocket transports do; `mqttv3.1` too) speaks MQTT inside instead: binary
//! messages carry an MQTT byte stream, packets need not line up with messages (MQTT 5,
//! 6.0), and the MQTT door's framing (`mqtt.rs`) reads it from the front of the same buffer,
//! so nothing new is held between packets. Each packet the gateway sends is one binary
//! message.
//!
//! Three files: `upgrade` reads the HTTP upgrade and answers or refuses it; `frame` reads
//! and writes frames on `proto`'s RFC 6455 layout; this one turns messages into commands,
//! with what they carry ([`Payload`]: frames, or MQTT) agreed at the upgrade.

use std::sync::Arc;

use bytes::{Buf, BytesMut};

use crate::presence::Push;
use crate::proto::websocket::{apply_mask, opcode};
use crate::proto::{CloseReason, Frame, BYE_CLOSE_BASE, MAX_LOGIN_FRAME_BYTES};
use crate::protocol::Close;
use crate::protocol::Command;
use crate::transport::connection::{disconnect, Framing};
use crate::transport::door::Speaks;
use crate::transport::mqtt::Mqtt;

mod frame;
mod upgrade;

use frame::{
    client_header, close_message, open_message, put_close, put_header, remove, INVALID_PAYLOAD, MALFORMED,
    MAX_CONTROL_PAYLOAD, PROTOCOL_ERROR, TOO_BIG, UNSUPPORTED_DATA,
};
pub(crate) use upgrade::{put_http_refusal, WsPolicy};

/// Least a split message's buffer grows by; after that it doubles with what has arrived.
const MIN_SPLIT_GROWTH: usize = 64;

/// `refusal` after a close frame went out: nothing more may follow it.
const CLOSED: u16 = u16::MAX;

/// In MQTT mode, how many packets' worth of bytes may wait in the stream: a packet's tail
/// and the message after it (packets need not line up with messages).
const MQTT_STREAM_PACKETS: u32 = 2;

/// One WebSocket connection's framing; see the module documentation.
pub(crate) struct WebSocket {
    max_frame_bytes: u32,
    /// Bytes of a fragmented message gathered, unmasked, at the front of the buffer.
    gathered: u32,
    /// The upgrade's policy, until the upgrade is done.
    upgrade: Option<Arc<WsPolicy>>,
    /// A fragmented message is open.
    fragmented: bool,
    /// No message decoded yet: the first is a LOGIN and is bounded as one.
    first: bool,
    /// The close code (or, before the upgrade, the HTTP status) the next BYE goes out with
    /// instead of its own; [`CLOSED`] once a close frame went out.
    refusal: u16,
    /// The message being gathered is text ([`Payload::Echo`] only: the door refuses text).
    text: bool,
    /// What the messages carry, agreed at the upgrade; with MQTT, `gathered` is the MQTT
    /// stream's unread bytes.
    payload: Payload,
}

/// What a WebSocket connection's binary messages carry.
pub(crate) enum Payload {
    /// One idlegate protocol frame each.
    Frames,
    /// An MQTT byte stream (the `mqtt` subprotocol), read by the MQTT door's framing.
    Mqtt(Box<Mqtt>),
    /// Text or binary, each message sent back as it came: the framing alone, as
    /// `examples/ws_echo.rs` serves it to the Autobahn suite. No door chooses it.
    Echo,
}

impl Payload {
    fn mqtt(&self) -> Option<&Mqtt> {
        match self {
            Payload::Mqtt(mqtt) => Some(mqtt),
            Payload::Frames | Payload::Echo => None,
        }
    }

    fn mqtt_mut(&mut self) -> Option<&mut Mqtt> {
        match self {
            Payload::Mqtt(mqtt) => Some(mqtt),
            Payload::Frames | Payload::Echo => None,
        }
    }
}

// === impl WebSocket ===

impl WebSocket {
    pub(crate) fn new(max_frame_bytes: u32, policy: Arc<WsPolicy>) -> WebSocket {
        WebSocket {
            max_frame_bytes,
            gathered: 0,
            upgrade: Some(policy),
            fragmented: false,
            first: true,
            refusal: 0,
            text: false,
            payload: Payload::Frames,
        }
    }

    /// A framing that answers each message with itself (see [`Payload::Echo`]).
    pub(crate) fn echo(max_message_bytes: u32) -> WebSocket {
        let policy = Arc::new(WsPolicy::default());
        WebSocket { payload: Payload::Echo, first: false, ..WebSocket::new(max_message_bytes, policy) }
    }

    /// The close frame of the refusal that ended the connection, without the door's BYE
    /// before it; nothing if a close frame went out already.
    pub(crate) fn close_frame(&mut self, out: &mut BytesMut) {
        if self.refusal != CLOSED && self.upgrade.is_none() {
            put_close(out, Some(self.refusal), "");
            self.refusal = CLOSED;
        }
    }

    /// Fails the connection, answering with `code` (a close code, or an HTTP status before
    /// the upgrade) instead of the BYE's own.
    fn refuse(&mut self, code: u16, why: impl Into<String>) -> Close {
        // The door closes a malformed frame as its BYE(protocol_error) says, 4000 + 4; an
        // echo has no BYE, and says it in RFC 6455's words.
        self.refusal = if code == MALFORMED && matches!(self.payload, Payload::Echo) { PROTOCOL_ERROR } else { code };
        (CloseReason::ProtocolError, why.into())
    }

    /// The longest message accepted now (in MQTT mode: the stream's bytes, with it).
    fn limit(&self) -> u32 {
        if let Some(mqtt) = self.payload.mqtt() {
            return mqtt.limit().saturating_mul(MQTT_STREAM_PACKETS);
        }
        if self.first {
            self.max_frame_bytes.min(MAX_LOGIN_FRAME_BYTES)
        } else {
            self.max_frame_bytes
        }
    }

    /// Answers a client's close frame (its code echoed when valid) and ends the connection.
    fn closed_by_client(&mut self, payload: &[u8], out: &mut BytesMut) -> Close {
        let code = match payload {
            [] => None,
            [_] => Some(PROTOCOL_ERROR),
            [a, b, reason @ ..] => {
                let code = u16::from_be_bytes([*a, *b]);
                // RFC 6455 7.4.1 and the IANA registry: 1012-1014 (service restart, try again later,
                // bad gateway) are sent by real servers and proxies.
                let valid = matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999);
                Some(if std::str::from_utf8(reason).is_err() {
                    INVALID_PAYLOAD
                } else if valid {
                    code
                } else {
                    PROTOCOL_ERROR
                })
            }
        };
        put_close(out, code, "");
        self.refusal = CLOSED;
        disconnect()
    }
}

impl Framing for WebSocket {
    const SPEAKS: Speaks = Speaks::WebSocket;

    fn decode(&mut self, src: &mut BytesMut, out: &mut BytesMut) -> Result<Option<Command>, Close> {
        if let Some(policy) = &self.upgrade {
            match upgrade::upgrade(policy, self.max_frame_bytes, src, out) {
                Ok(None) => return Ok(None),
                Ok(Some(payload)) => {
                    // An echo stays one whatever the upgrade agreed.
                    if !matches!(self.payload, Payload::Echo) {
                        self.payload = payload;
                    }
                    self.upgrade = None;
                }
                Err((status, why)) => return Err(self.refuse(status, why)),
            }
        }
        loop {
            let g = self.gathered as usize;
            if let Some(mqtt) = self.payload.mqtt_mut().filter(|_| g > 0) {
                let (before, mut missing) = (src.len(), 0);
                let at = open_message(out);
                let input = mqtt.next(src, g, &mut missing, out);
                close_message(out, at);
                if let Some(input) = input? {
                    self.gathered -= (before - src.len()) as u32;
                    return Ok(Some(input));
                }
            }
            let Some(head) = client_header(&src[g..]).map_err(|why| self.refuse(MALFORMED, why))? else {
                src.reserve(MIN_SPLIT_GROWTH);
                return Ok(None);
            };
            let len = head.len;
            match head.opcode {
                opcode::CLOSE | opcode::PING | opcode::PONG => {
                    if !head.fin || len > MAX_CONTROL_PAYLOAD {
                        return Err(self.refuse(MALFORMED, "a control frame fragmented or over 125 bytes"));
                    }
                }
                opcode::TEXT if !matches!(self.payload, Payload::Echo) => {
                    return Err(
                        self.refuse(UNSUPPORTED_DATA, "a text message: send protocol frames as binary messages")
                    );
                }
                opcode::BINARY | opcode::TEXT if self.fragmented => {
                    return Err(self.refuse(MALFORMED, "a new message inside a fragmented one"));
                }
                opcode::CONTINUATION if !self.fragmented => {
                    return Err(self.refuse(MALFORMED, "a continuation frame with no message open"));
                }
                opcode::BINARY | opcode::TEXT | opcode::CONTINUATION => {
                    if head.opcode != opcode::CONTINUATION {
                        self.text = head.opcode == opcode::TEXT;
                    }
                    let limit = self.limit();
                    if (g as u64 + len as u64) > u64::from(limit) {
                        let total = g as u64 + len as u64;
                        return Err(self.refuse(TOO_BIG, format!("a {total}-byte message; at most {limit}")));
                    }
                }
                other => return Err(self.refuse(MALFORMED, format!("unknown opcode {other:#x}"))),
            }
            let whole = head.header_len + len;
            if src.len() - g < whole {
                // Grows with what has arrived, not with what the header promises.
                let missing = whole - (src.len() - g);
                src.reserve(missing.min(src.len().max(MIN_SPLIT_GROWTH)));
                return Ok(None);
            }
            let payload = g + head.header_len..g + whole;
            apply_mask(&mut src[payload.clone()], head.mask);
            if head.opcode >= opcode::CLOSE {
                let reply = match head.opcode {
                    opcode::PING => {
                        if self.refusal != CLOSED {
                            put_header(out, opcode::PONG, len);
                            out.extend_from_slice(&src[payload.clone()]);
                        }
                        Ok(Command::Activity)
                    }
                    opcode::PONG => Ok(Command::Activity),
                    _ => Err(self.closed_by_client(&src[payload.clone()], out)),
                };
                remove(src, g, whole);
                return reply.map(Some);
            }
            if g == 0 && head.fin && matches!(self.payload, Payload::Frames) {
                // A whole message in one frame: taken where it lies.
                src.advance(head.header_len);
                return self.message(src.split_to(len), out);
            }
            // A fragment (or MQTT's stream): its payload moves down over its header, next to
            // what was gathered.
            remove(src, g, head.header_len);
            self.gathered += len as u32;
            self.fragmented = !head.fin;
            if self.payload.mqtt().is_some() {
                // Read from the stream at the top of the loop, whatever the message bounds.
                continue;
            }
            if head.fin {
                let message = src.split_to(self.gathered as usize);
                self.gathered = 0;
                return self.message(message, out);
            }
        }
    }

    fn encode(&mut self, frame: &Frame, out: &mut BytesMut) {
        if self.refusal == CLOSED {
            return;
        }
        if self.upgrade.is_some() {
            // Before the upgrade only a refusal goes out, as an HTTP answer.
            if let Frame::Bye { reason, text } = frame {
                put_http_refusal(out, self.refusal, *reason, text);
                self.refusal = CLOSED;
            }
            return;
        }
        if let Some(mqtt) = self.payload.mqtt_mut() {
            let at = open_message(out);
            mqtt.encode_frame(frame, out);
            close_message(out, at);
        } else {
            put_header(out, opcode::BINARY, frame.body_len());
            frame.encode(out);
        }
        if let Frame::Bye { reason, .. } = frame {
            let code = match self.refusal {
                0 => reason.close_code().unwrap_or(BYE_CLOSE_BASE),
                code => code,
            };
            put_close(out, Some(code), reason.label());
            self.refusal = CLOSED;
        }
    }

    fn encode_push(&mut self, push: &Push, out: &mut BytesMut) {
        match self.payload.mqtt() {
            Some(mqtt) if self.refusal != CLOSED => {
                let at = open_message(out);
                mqtt.publish(&push.topic, &push.payload, out);
                close_message(out, at);
            }
            _ => self.encode(&Frame::Push(push.payload.clone()), out),
        }
    }

    fn encode_presence(&mut self, frame: &Frame, out: &mut BytesMut) {
        match (self.payload.mqtt(), frame) {
            (Some(mqtt), Frame::Presence { kind, entries }) if self.refusal != CLOSED => {
                for entry in entries {
                    let at = open_message(out);
                    mqtt.publish_presence(*kind, entry, out);
                    close_message(out, at);
                }
            }
            _ => self.encode(frame, out),
        }
    }

    fn accepted(&mut self, out: &mut BytesMut) {
        if let Some(mqtt) = self.payload.mqtt_mut() {
            let at = open_message(out);
            mqtt.acknowledge(out);
            close_message(out, at);
        }
    }

    fn encode_ping(&mut self, out: &mut BytesMut) {
        // Not after a close was sent or before the upgrade: no ping then.
        if self.ready() && self.refusal != CLOSED {
            put_header(out, opcode::PING, 0);
        }
    }

    fn subscribed(&mut self, granted: &[bool]) {
        if let Some(mqtt) = self.payload.mqtt_mut() {
            mqtt.decide(granted);
        }
    }

    fn logged(&mut self, position: u64) {
        if let Some(mqtt) = self.payload.mqtt_mut() {
            mqtt.logged(position);
        }
    }

    fn owes(&self) -> bool {
        self.payload.mqtt().is_some_and(Mqtt::owes)
    }

    fn release(&mut self, through: u64, out: &mut BytesMut) {
        if let Some(mqtt) = self.payload.mqtt_mut() {
            let at = open_message(out);
            mqtt.release(through, out);
            close_message(out, at);
        }
    }

    fn max_frame_bytes(&self) -> u32 {
        self.max_frame_bytes
    }

    fn ready(&self) -> bool {
        self.upgrade.is_none()
    }
}

impl WebSocket {
    /// A whole binary message: one protocol frame (echoed instead, in [`Payload::Echo`]).
    fn message(&mut self, message: BytesMut, out: &mut BytesMut) -> Result<Option<Command>, Close> {
        if matches!(self.payload, Payload::Echo) {
            return self.echo_message(message, out);
        }
        self.first = false;
        Frame::parse(message.freeze())
            .map(|f| Some(Command::from(f)))
            .map_err(|e| self.refuse(MALFORMED, e.to_string()))
    }
}

impl WebSocket {
    /// Answers `message` with itself, text or binary as it came ([`Payload::Echo`]).
    fn echo_message(&mut self, message: BytesMut, out: &mut BytesMut) -> Result<Option<Command>, Close> {
        if self.text && std::str::from_utf8(&message).is_err() {
            return Err(self.refuse(INVALID_PAYLOAD, "a text message that is not UTF-8"));
        }
        put_header(out, if self.text { opcode::TEXT } else { opcode::BINARY }, message.len());
        out.extend_from_slice(&message);
        Ok(Some(Command::Activity))
    }
}

/// The WebSocket door's framing serving an echo, as `examples/ws_echo.rs` runs it for the
/// Autobahn suite: the upgrade, frames, fragments, control frames, closes and limits, with
/// each message (text as well) sent back as it came. Not part of the gateway's API.
#[doc(hidden)]
pub struct EchoFraming(WebSocket);

// === impl EchoFraming ===

impl EchoFraming {
    /// An echo of messages up to `max_message_bytes` (the door's `--max-frame-bytes`).
    pub fn new(max_message_bytes: u32) -> EchoFraming {
        EchoFraming(WebSocket::echo(max_message_bytes))
    }

    /// Reads every whole unit at the front of `src`, appending the answers (the 101, pongs,
    /// echoes, a close) to `out`. `Err` once the connection must end, its close (or HTTP
    /// refusal) at the end of `out`.
    pub fn read(&mut self, src: &mut BytesMut, out: &mut BytesMut) -> Result<(), String> {
        loop {
            match self.0.decode(src, out) {
                Ok(Some(_)) => {}
                Ok(None) => return Ok(()),
                Err((reason, why)) => {
                    if self.0.ready() {
                        self.0.close_frame(out);
                    } else {
                        self.0.encode(&Frame::Bye { reason, text: why.clone() }, out);
                    }
                    return Err(why);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::BufMut;

    use super::tests_support::*;
    use super::*;
    use crate::transport::mqtt::MqttPolicy;

    #[test]
    fn fragments_interleaved_with_a_ping_gather_into_one_frame() {
        let mut ws = open_ws();
        let mut src = BytesMut::new();
        src.extend_from_slice(&masked(false, opcode::BINARY, &[0x02, b'h']));
        src.extend_from_slice(&masked(true, opcode::PING, b"p"));
        src.extend_from_slice(&masked(false, opcode::CONTINUATION, b"el"));
        src.extend_from_slice(&masked(true, opcode::CONTINUATION, b"lo"));
        let mut out = BytesMut::new();
        let mut got = Vec::new();
        // Byte by byte, as a slow network would deliver it.
        let all = src.split();
        for b in all {
            src.put_u8(b);
            while let Some(input) = ws.decode(&mut src, &mut out).unwrap() {
                got.push(match input {
                    Command::Activity => "activity".into(),
                    command => format!("{command:?}"),
                });
            }
        }
        assert_eq!(
            got,
            ["activity".to_string(), format!("{:?}", Command::from(Frame::Ping(bytes::Bytes::from_static(b"hello"))))]
        );
        assert_eq!(&out[..], &[0x8a, 0x01, b'p'], "the ping answered with a pong");
        assert!(src.is_empty());
    }

    #[test]
    fn the_bye_is_a_binary_message_then_close_4000_plus_reason() {
        let mut ws = open_ws();
        let mut out = BytesMut::new();
        ws.encode(&Frame::Bye { reason: CloseReason::IdleTimeout, text: String::new() }, &mut out);
        ws.encode(&Frame::Pong(bytes::Bytes::new()), &mut out);
        let close = [0x88, 14, 0x0f, 0xa1];
        assert_eq!(&out[..2], &[0x82, 0x02]);
        assert_eq!(&out[4..8], &close, "close 4001 after the BYE: {out:?}");
        assert_eq!(&out[8..], b"idle_timeout", "and nothing after the close");
    }

    /// MQTT inside: the subprotocol is agreed, packets are read across message bounds (a
    /// CONNECT split over two messages, a PINGREQ sharing the second) and split reads, and
    /// each packet the gateway sends is one binary message.
    #[test]
    fn the_mqtt_subprotocol_carries_an_mqtt_stream() {
        let config = crate::config::Config::default();
        let policy =
            Arc::new(WsPolicy { allowed_origins: Arc::default(), mqtt: Some(Arc::new(MqttPolicy::new(&config))) });
        let upgrade = "GET /v1/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                       Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
                       Sec-WebSocket-Protocol: chat, mqtt\r\n\r\n";
        // MQTT 3.1.1 CONNECT: uid 42, client identifier "d", keepalive 10 s.
        let mut connect = vec![0x10, 0];
        connect.extend_from_slice(&[0, 4, b'M', b'Q', b'T', b'T', 4, 0x80, 0, 10, 0, 1, b'd', 0, 2, b'4', b'2']);
        connect[1] = (connect.len() - 2) as u8;
        let mut wire = upgrade.as_bytes().to_vec();
        wire.extend(masked(true, opcode::BINARY, &connect[..5]));
        wire.extend(masked(true, opcode::BINARY, &[&connect[5..], &[0xC0, 0][..]].concat()));
        let mut upgraded = None;
        for chunk in [1, 3, 7, wire.len()] {
            let mut ws = WebSocket::new(1024, policy.clone());
            let (mut src, mut out, mut got) = (BytesMut::new(), BytesMut::new(), Vec::new());
            for piece in wire.chunks(chunk) {
                src.extend_from_slice(piece);
                while let Some(input) = ws.decode(&mut src, &mut out).unwrap() {
                    got.push(match input {
                        command @ (Command::Login { will: None, .. } | Command::Ping(_)) => format!("{command:?}"),
                        _ => "other".into(),
                    });
                }
            }
            let device = "d".parse().unwrap();
            let login = Command::Login {
                uid: 42,
                token: bytes::Bytes::new(),
                device,
                timeout: crate::protocol::Asked::KeepAlive(10),
                subscriber: true,
                will: None,
            };
            let ping = Command::Ping(bytes::Bytes::new());
            assert_eq!(got, [format!("{login:?}"), format!("{ping:?}")], "read {chunk} bytes at a time");
            assert!(src.is_empty() && ws.gathered == 0);
            let answer = String::from_utf8_lossy(&out);
            assert!(answer.contains("\r\nSec-WebSocket-Protocol: mqtt\r\n"), "{answer}");
            upgraded = Some(ws);
        }
        // The last connection, upgraded and past its CONNECT, answers.
        let mut ws = upgraded.expect("four runs");
        let mut out = BytesMut::new();
        ws.encode(&Frame::Pong(bytes::Bytes::new()), &mut out);
        assert_eq!(&out[..], &[0x82, 2, 0xD0, 0], "PINGRESP in a binary message of its own");
        out.clear();
        let push = Push { topic: Arc::from("t"), payload: bytes::Bytes::from(vec![7; 200]) };
        ws.encode_push(&push, &mut out);
        assert_eq!(&out[..4], &[0x82, 126, 0, 206], "a 206-byte PUBLISH: a 16-bit length");
        assert_eq!(&out[4..9], &[0x30, 203, 1, 0, 1], "then the PUBLISH, whole");
        assert_eq!(out.len(), 4 + 206);
    }

    #[test]
    fn text_and_oversized_messages_get_their_close_codes() {
        let mut ws = open_ws();
        let mut out = BytesMut::new();
        let mut src = BytesMut::from(&masked(true, opcode::TEXT, b"hi")[..]);
        assert!(ws.decode(&mut src, &mut out).is_err());
        assert_eq!(ws.refusal, UNSUPPORTED_DATA);

        let mut ws = open_ws();
        let mut src = BytesMut::from(&masked(true, opcode::BINARY, &[3; 2000])[..8]);
        assert!(ws.decode(&mut src, &mut out).is_err(), "refused on its header alone");
        assert_eq!(ws.refusal, TOO_BIG);
    }
}

#[cfg(test)]
mod conformance {
    //! What Autobahn's fuzzingclient checks of a server, for the cases this framing decides:
    //! ping and pong (its section 2), reserved bits (3), opcodes (4), fragmentation (5),
    //! UTF-8 in close reasons (6 and 7) and close handling (7), limits (9). Autobahn itself
    //! is Python 2 only and could not run here (docs/BENCHMARKS.md says so).

    use proptest::prelude::*;

    use super::tests_support::*;
    use super::*;

    fn outcome(frames: &[Vec<u8>]) -> (Vec<String>, BytesMut, u16) {
        let mut ws = open_ws();
        let mut src = BytesMut::new();
        for f in frames {
            src.extend_from_slice(f);
        }
        let mut out = BytesMut::new();
        let mut got = Vec::new();
        loop {
            match ws.decode(&mut src, &mut out) {
                Ok(Some(Command::Activity)) => got.push("activity".into()),
                Ok(Some(command)) => got.push(format!("{command:?}")),
                Ok(None) => break,
                Err((reason, _)) => {
                    got.push(format!("close {reason}"));
                    break;
                }
            }
        }
        (got, out, ws.refusal)
    }

    #[test]
    fn every_reserved_opcode_and_bit_fails_the_connection_with_4004() {
        for opcode in [3u8, 4, 5, 6, 7, 0xB, 0xC, 0xD, 0xE, 0xF] {
            let (_, _, code) = outcome(&[masked(true, opcode, b"")]);
            assert_eq!(code, MALFORMED, "opcode {opcode:#x}");
        }
        for rsv in [0x10u8, 0x20, 0x40] {
            let mut frame = masked(true, opcode::BINARY, &[0x02]);
            frame[0] |= rsv;
            assert_eq!(outcome(&[frame]).2, MALFORMED, "rsv {rsv:#x}");
        }
    }

    #[test]
    fn control_frames_follow_the_rules_and_close_codes_are_checked() {
        // A ping of 125 bytes is answered; of 126, or fragmented, fails.
        let (got, out, _) = outcome(&[masked(true, opcode::PING, &[7; 125])]);
        assert_eq!(got, ["activity"]);
        assert_eq!(&out[..2], &[0x8a, 125]);
        assert_eq!(outcome(&[masked(true, opcode::PING, &[7; 126])]).2, MALFORMED);
        assert_eq!(outcome(&[masked(false, opcode::PING, b"x")]).2, MALFORMED);
        // Close: echoed when valid; 1002 for a bad code or a one-byte payload; 1007 for a
        // reason that is not UTF-8; an empty close is answered with an empty close.
        let close = |payload: &[u8]| outcome(&[masked(true, opcode::CLOSE, payload)]).1.to_vec();
        assert_eq!(close(&[0x03, 0xe8]), [0x88, 2, 0x03, 0xe8]);
        assert_eq!(close(&[0x0f, 0xa0, b'o', b'k']), [0x88, 2, 0x0f, 0xa0]);
        for good in [1012u16, 1013, 1014] {
            let [hi, lo] = good.to_be_bytes();
            assert_eq!(close(&[hi, lo]), [0x88, 2, hi, lo], "code {good} is valid: echoed");
        }
        for bad in [0u16, 999, 1004, 1005, 1006, 1015, 2999, 5000] {
            assert_eq!(close(&bad.to_be_bytes()), [0x88, 2, 0x03, 0xea], "code {bad}");
        }
        assert_eq!(close(&[0x03]), [0x88, 2, 0x03, 0xea]);
        assert_eq!(close(&[0x03, 0xe8, 0xff, 0xfe]), [0x88, 2, 0x03, 0xef]);
        assert_eq!(close(&[]), [0x88, 0]);
        // Nothing is read after a close.
        let (got, _, _) = outcome(&[masked(true, opcode::CLOSE, b""), masked(true, opcode::PING, b"")]);
        assert_eq!(got, ["close disconnect"]);
    }

    proptest! {
        /// However a message is cut into fragments, with pings between them and the bytes
        /// arriving in pieces of any size, the same frame comes out, once, and every ping is
        /// answered.
        #[test]
        fn any_fragmentation_decodes_the_same_frame(
            payload in proptest::collection::vec(any::<u8>(), 0..300),
            cuts in proptest::collection::vec(0usize..300, 0..6),
            pings in proptest::collection::vec(any::<bool>(), 6),
            chunk in 1usize..64,
        ) {
            let mut body = vec![kind_data()];
            body.extend_from_slice(&payload);
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % body.len()).filter(|c| *c > 0).collect();
            cuts.sort_unstable();
            cuts.dedup();
            let mut bounds = vec![0];
            bounds.extend(cuts);
            bounds.push(body.len());
            let mut wire = Vec::new();
            let mut expected_pongs = 0;
            for (i, w) in bounds.windows(2).enumerate() {
                let opcode = if i == 0 { opcode::BINARY } else { opcode::CONTINUATION };
                wire.extend(masked(w[1] == body.len(), opcode, &body[w[0]..w[1]]));
                if pings[i % pings.len()] && w[1] != body.len() {
                    wire.extend(masked(true, opcode::PING, b"p"));
                    expected_pongs += 1;
                }
            }
            let mut ws = open_ws();
            let mut src = BytesMut::new();
            let mut out = BytesMut::new();
            let mut frames = Vec::new();
            for piece in wire.chunks(chunk) {
                src.extend_from_slice(piece);
                while let Some(input) = ws.decode(&mut src, &mut out).unwrap() {
                    if let Command::Data { payload, .. } = input {
                        frames.push(Frame::Data(payload));
                    }
                }
            }
            prop_assert_eq!(frames, vec![Frame::Data(bytes::Bytes::from(payload))]);
            prop_assert_eq!(out.len(), expected_pongs * 3);
            prop_assert!(src.is_empty());
        }
    }

    fn kind_data() -> u8 {
        crate::proto::kind::DATA
    }
}

#[cfg(test)]
mod tests_support {
    use super::*;

    /// A client frame with the given FIN bit and opcode, masked.
    pub(super) fn masked(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
        let mask = [0x37, 0xfa, 0x21, 0x3d];
        let mut out = vec![(if fin { 0x80 } else { 0 }) | opcode];
        if payload.len() < 126 {
            out.push(0x80 | payload.len() as u8);
        } else {
            out.push(0x80 | 126);
            out.extend_from_slice(&(payload.len() as u16).to_be_bytes());
        }
        out.extend_from_slice(&mask);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        out
    }

    /// A framing past its upgrade and its first message, with a 1024-byte limit.
    pub(super) fn open_ws() -> WebSocket {
        let mut ws = WebSocket::new(1024, Arc::default());
        ws.upgrade = None;
        ws.first = false;
        ws
    }
}

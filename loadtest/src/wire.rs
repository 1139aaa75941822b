//! What the clients say on the wire: idlegate's protocol (through the gateway's own codec,
//! length-prefixed, or one frame per binary message over WebSocket) or MQTT 3.1.1, behind
//! one small interface so the same load drives any of them.

use std::io;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use idlegate_proto::mqtt::{fixed_header, put_fixed_header, put_str};
use idlegate_proto::websocket::{apply_mask, opcode, Header};
use idlegate_proto::{CloseReason, Device, Frame, FrameCodec};
use tokio_util::codec::Decoder;

use crate::fleet::Protocol;
use crate::payload::data_payload;

/// MQTT control packet types (high nibble of the fixed header).
mod mqtt {
    pub use idlegate_proto::mqtt::connect_flags::{CLEAN as CLEAN_SESSION, PASSWORD, USERNAME};
    pub use idlegate_proto::mqtt::packet::{CONNACK, CONNECT, DISCONNECT, PINGREQ, PINGRESP, PUBLISH as PUBLISH_QOS0};
    pub use idlegate_proto::mqtt::LEVEL_311;
    /// Topic the DATA load is published to; nobody subscribes.
    pub const DATA_TOPIC: &[u8] = b"idlegate/load";
}

/// Something the server said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incoming {
    /// The login was accepted; the server expires after `timeout` of silence, in steps of
    /// `tick` (zero where the protocol has no such notion).
    Welcome { timeout: Duration, tick: Duration },
    /// A PING's answer, with the send timestamp it carried if the protocol echoes one.
    Pong(Option<u64>),
    /// Bytes a backend pushed.
    Push(Bytes),
    /// The server's last word before it closes, with its retry hint in milliseconds.
    Bye(CloseReason, Option<u64>),
}

/// Encodes client frames and decodes server frames for one protocol.
#[derive(Debug, Clone, Copy)]
pub struct Wire {
    protocol: Protocol,
    codec: FrameCodec,
    keepalive: Duration,
    /// MQTT: the server's own timeout and tick, when it is not a broker's 1.5 keepalives.
    mqtt_window: Option<(Duration, Duration)>,
    /// Frames travel as WebSocket binary messages (`--transport ws|wss`).
    websocket: bool,
}

/// The mask of every client WebSocket frame. RFC 6455 asks browsers for a fresh random one
/// against cache poisoning by scripts; a load generator is no browser, and the gateway
/// unmasks whatever key it gets.
const WS_MASK: [u8; 4] = [0x5a, 0x3c, 0x96, 0x0f];

// === impl Wire ===

impl Wire {
    /// A wire for `protocol`; `keepalive` is what MQTT CONNECT announces.
    pub fn new(protocol: Protocol, keepalive: Duration) -> Wire {
        Wire { protocol, codec: FrameCodec::new(u32::MAX), keepalive, mqtt_window: None, websocket: false }
    }

    /// The same wire expecting an MQTT server to expire after `window`'s timeout, in steps of
    /// its tick (idlegate's MQTT door), instead of 1.5 keepalives.
    pub fn with_mqtt_window(self, window: Option<(Duration, Duration)>) -> Wire {
        Wire { mqtt_window: window, ..self }
    }

    /// The same wire with its frames as WebSocket binary messages when `on`.
    pub fn over_websocket(self, on: bool) -> Wire {
        Wire { websocket: on, ..self }
    }

    /// True for MQTT, where a server ends a session by closing the socket without a word.
    pub fn is_mqtt(&self) -> bool {
        self.protocol == Protocol::Mqtt
    }

    /// The login: idlegate LOGIN (on `device`, or the default one), or MQTT CONNECT with the
    /// keepalive.
    /// `timeout`: what an idlegate client asks for (LOGIN version 5); MQTT asks through its
    /// keepalive instead.
    pub fn login(
        &mut self,
        uid: u64,
        device: Option<Device>,
        token: Option<&str>,
        timeout: Option<Duration>,
        out: &mut BytesMut,
    ) {
        match self.protocol {
            Protocol::Idlegate => {
                let token = token.map(|t| Bytes::copy_from_slice(t.as_bytes())).unwrap_or_default();
                // `Args::check` keeps a timeout within u32 milliseconds.
                let timeout_ms =
                    timeout.and_then(|t| std::num::NonZeroU32::new(u32::try_from(t.as_millis()).unwrap_or(u32::MAX)));
                self.frame(Frame::Login { uid, token, device: device.unwrap_or_default(), timeout_ms }, out);
            }
            Protocol::Mqtt => {
                let client_id = match device {
                    Some(device) => format!("loadtest-{uid}-{device}"),
                    None => format!("loadtest-{uid}"),
                };
                let keepalive = u16::try_from(self.keepalive.as_secs()).unwrap_or(u16::MAX);
                let username = uid.to_string();
                let mut body = BytesMut::with_capacity(48 + client_id.len());
                put_str(&mut body, b"MQTT");
                body.put_u8(mqtt::LEVEL_311);
                let password = if token.is_some() { mqtt::PASSWORD } else { 0 };
                body.put_u8(mqtt::CLEAN_SESSION | mqtt::USERNAME | password);
                body.put_u16(keepalive);
                put_str(&mut body, client_id.as_bytes());
                put_str(&mut body, username.as_bytes());
                if let Some(token) = token {
                    put_str(&mut body, token.as_bytes());
                }
                put_mqtt_packet(out, mqtt::CONNECT, &body);
            }
        }
    }

    /// A keepalive carrying `sent_nanos` where the protocol echoes it back.
    pub fn ping(&mut self, sent_nanos: u64, out: &mut BytesMut) {
        match self.protocol {
            Protocol::Idlegate => {
                self.frame(Frame::Ping(Bytes::copy_from_slice(&sent_nanos.to_be_bytes())), out);
            }
            Protocol::Mqtt => put_mqtt_packet(out, mqtt::PINGREQ, &[]),
        }
    }

    /// Application message `seq` of the client `key` names (its uid without devices):
    /// idlegate DATA, or an MQTT QoS 0 PUBLISH nobody receives.
    pub fn data(&mut self, key: u64, seq: u64, out: &mut BytesMut) {
        let payload = data_payload(key, seq);
        match self.protocol {
            Protocol::Idlegate => self.frame(Frame::Data(Bytes::copy_from_slice(&payload)), out),
            Protocol::Mqtt => {
                let mut body = BytesMut::with_capacity(2 + mqtt::DATA_TOPIC.len() + payload.len());
                put_str(&mut body, mqtt::DATA_TOPIC);
                body.put_slice(&payload);
                put_mqtt_packet(out, mqtt::PUBLISH_QOS0, &body);
            }
        }
    }

    /// The end of a session: idlegate LOGOUT, or MQTT DISCONNECT.
    pub fn logout(&mut self, out: &mut BytesMut) {
        match self.protocol {
            Protocol::Idlegate => self.frame(Frame::Logout, out),
            Protocol::Mqtt => put_mqtt_packet(out, mqtt::DISCONNECT, &[]),
        }
    }

    fn frame(&mut self, frame: Frame, out: &mut BytesMut) {
        if !self.websocket {
            // Client frames are tiny; the u32 length cannot overflow.
            let _ = self.codec.encode(&frame, out);
            return;
        }
        // One masked binary message.
        let (header, n) = Header::encode(opcode::BINARY, frame.body_len(), Some(WS_MASK));
        out.put_slice(&header[..n]);
        let start = out.len();
        frame.encode(out);
        apply_mask(&mut out[start..], WS_MASK);
    }

    /// The next frame from the gateway: length-prefixed, or the next binary message.
    fn next_frame(&mut self, src: &mut BytesMut) -> io::Result<Option<Frame>> {
        if !self.websocket {
            return self.codec.decode(src).map_err(invalid);
        }
        loop {
            let Some(Header { opcode, len, header_len: at, mask: None, fin: true, .. }) = Header::parse(src) else {
                if src.len() >= 2 && (src[0] & 0x80 == 0 || src[1] & 0x80 != 0) {
                    return Err(invalid("a gateway's WebSocket frames are whole and unmasked"));
                }
                return Ok(None);
            };
            if src.len() < at + len {
                src.reserve(at + len - src.len());
                return Ok(None);
            }
            src.advance(at);
            let payload = src.split_to(len);
            match opcode {
                opcode::BINARY => return Frame::parse(payload.freeze()).map(Some).map_err(invalid),
                // The close after a BYE, pings, pongs: the socket's end tells the rest.
                opcode::CLOSE..=opcode::PONG => continue,
                other => return Err(invalid(format!("a gateway does not send WebSocket opcode {other:#x}"))),
            }
        }
    }
}

fn put_mqtt_packet(out: &mut BytesMut, header: u8, body: &[u8]) {
    put_fixed_header(out, header, body.len());
    out.put_slice(body);
}

impl Decoder for Wire {
    type Item = Incoming;
    type Error = io::Error;

    fn decode(&mut self, src: &mut BytesMut) -> io::Result<Option<Incoming>> {
        match self.protocol {
            Protocol::Idlegate => {
                let Some(frame) = self.next_frame(src)? else {
                    return Ok(None);
                };
                Ok(Some(match frame {
                    Frame::Welcome { timeout_ms, tick_ms, .. } => Incoming::Welcome {
                        timeout: Duration::from_millis(timeout_ms.into()),
                        tick: Duration::from_millis(tick_ms.into()),
                    },
                    Frame::Pong(p) => Incoming::Pong(p.as_ref().try_into().ok().map(u64::from_be_bytes)),
                    Frame::Push(p) => Incoming::Push(p),
                    Frame::Bye { reason, text } => Incoming::Bye(reason, idlegate_proto::retry_hint(&text)),
                    other => return Err(invalid(format!("a gateway does not send {other:?}"))),
                }))
            }
            Protocol::Mqtt => loop {
                let Some((header, body_at, len)) = mqtt_header(src)? else {
                    return Ok(None);
                };
                if src.len() < body_at + len {
                    return Ok(None);
                }
                src.advance(body_at);
                let body = src.split_to(len);
                match header & 0xF0 {
                    mqtt::CONNACK => {
                        let code = body.get(1).copied().unwrap_or(0xff);
                        if code != 0 {
                            return Err(invalid(format!("broker refused CONNECT with return code {code}")));
                        }
                        // Brokers expire after 1.5 keepalives (MQTT 3.1.1, 3.1.2.10).
                        let (timeout, tick) = self.mqtt_window.unwrap_or((self.keepalive * 3 / 2, Duration::ZERO));
                        return Ok(Some(Incoming::Welcome { timeout, tick }));
                    }
                    mqtt::PINGRESP => return Ok(Some(Incoming::Pong(None))),
                    // Anything else (a PUBLISH echoed to us, say) is not part of this load.
                    _ => continue,
                }
            },
        }
    }
}

/// Parses an MQTT fixed header: (first byte, where the body starts, body length).
fn mqtt_header(src: &[u8]) -> io::Result<Option<(u8, usize, usize)>> {
    let Some(&first) = src.first() else {
        return Ok(None);
    };
    Ok(fixed_header(src).map_err(invalid)?.map(|(at, len)| (first, at, len)))
}

fn invalid(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mqtt_connect_is_byte_exact() {
        let mut wire = Wire::new(Protocol::Mqtt, Duration::from_secs(10));
        let mut out = BytesMut::new();
        wire.login(7, None, None, None, &mut out);
        let mut want = vec![0x10, 25, 0, 4, b'M', b'Q', b'T', b'T', 4, 0x82, 0, 10, 0, 10];
        want.extend_from_slice(b"loadtest-7");
        want.extend_from_slice(&[0, 1, b'7']);
        assert_eq!(&out[..], &want[..]);
        out.clear();
        wire.login(7, None, Some("tok"), None, &mut out);
        assert_eq!(&out[9..10], &[0xC2], "a username and a password");
        assert_eq!(&out[out.len() - 5..], &[0, 3, b't', b'o', b'k']);
        out.clear();
        wire.ping(0, &mut out);
        assert_eq!(&out[..], &[0xC0, 0]);
    }

    #[test]
    fn mqtt_replies_decode() {
        let mut wire = Wire::new(Protocol::Mqtt, Duration::from_secs(2));
        let mut src = BytesMut::from(&[0x20, 2, 0, 0, 0xD0, 0, 0x30][..]);
        assert_eq!(
            wire.decode(&mut src).unwrap(),
            Some(Incoming::Welcome { timeout: Duration::from_secs(3), tick: Duration::ZERO })
        );
        assert_eq!(wire.decode(&mut src).unwrap(), Some(Incoming::Pong(None)));
        assert_eq!(wire.decode(&mut src).unwrap(), None, "half a packet waits");
        let mut refused = BytesMut::from(&[0x20, 2, 0, 5][..]);
        assert!(wire.decode(&mut refused).is_err());
    }

    #[test]
    fn mqtt_remaining_length_uses_varints() {
        let mut out = BytesMut::new();
        put_mqtt_packet(&mut out, mqtt::PUBLISH_QOS0, &[0u8; 321]);
        assert_eq!(&out[..3], &[0x30, 0xC1, 0x02]);
        assert_eq!(mqtt_header(&out).unwrap(), Some((0x30, 3, 321)));
    }

    #[test]
    fn websocket_frames_are_masked_out_and_read_back() {
        let mut wire = Wire::new(Protocol::Idlegate, Duration::ZERO).over_websocket(true);
        let mut out = BytesMut::new();
        wire.ping(7, &mut out);
        assert_eq!(&out[..2], &[0x82, 0x80 | 9], "a masked binary message of 9 bytes");
        let body: Vec<u8> = out[6..].iter().enumerate().map(|(i, b)| b ^ WS_MASK[i % 4]).collect();
        assert_eq!(body[0], idlegate_proto::kind::PING);
        // The gateway's answer, a close after it, and half of the next message.
        let mut src = BytesMut::from(&[0x82, 9, idlegate_proto::kind::PONG][..]);
        src.extend_from_slice(&7u64.to_be_bytes());
        src.extend_from_slice(&[0x88, 2, 0x0f, 0xa1, 0x82]);
        assert_eq!(wire.decode(&mut src).unwrap(), Some(Incoming::Pong(Some(7))));
        assert_eq!(wire.decode(&mut src).unwrap(), None, "the close is skipped, the half waits");
        assert_eq!(&src[..], &[0x82]);
    }

    #[test]
    fn idlegate_pong_carries_the_timestamp_back() {
        let mut wire = Wire::new(Protocol::Idlegate, Duration::ZERO);
        let mut out = BytesMut::new();
        wire.ping(123_456, &mut out);
        out[4] = idlegate_proto::kind::PONG;
        assert_eq!(wire.decode(&mut out).unwrap(), Some(Incoming::Pong(Some(123_456))));
    }
}

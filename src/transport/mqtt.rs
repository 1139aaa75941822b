//! The MQTT door (`--mqtt-listen`): MQTT 3.1.1 and 5.0 clients, unchanged, as sessions of
//! the same protocol machine every door drives.
//!
//! CONNECT is the LOGIN (username: the uid in decimal, password: the token, client
//! identifier: the device), PINGREQ the PING, PUBLISH (QoS 0 or 1) the DATA, DISCONNECT the
//! LOGOUT; SUBSCRIBE and UNSUBSCRIBE are answered here and tell the registry which pushes
//! the session takes (`presence/subscriptions.rs`), as QoS 0 PUBLISHes on their topics. The gateway's frames go out as the
//! version's packets: WELCOME as CONNACK (MQTT 5 with the Server Keep Alive the window
//! needs), PONG as PINGRESP, a BYE before the session as a refusing CONNACK, after it as
//! MQTT 5's DISCONNECT with the matching reason code (3.1.1 has none: the socket closes).
//!
//! Client packets are decoded with `mqtt5-protocol` (CONNECT's and PUBLISH's properties,
//! SUBSCRIBE's options); the few the gateway sends are written here, byte for byte, because
//! the crate encodes through a temporary buffer per packet and maps a 3.1.1 refusal it has no
//! code for to MQTT 5's 0x87, which a 3.1.1 client cannot read.

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use mqtt5_protocol::packet::{FixedHeader, Packet, PacketType};
use mqtt5_protocol::QoS;

use crate::config::TimeoutClasses;
use crate::presence::{Push, Will};
use crate::proto::mqtt::{
    check_topic_filter, fixed_header, packet, put_fixed_header as put_header, put_str, put_varint, AUTH_METHOD,
};
use crate::proto::{CloseReason, Device, Frame, PresenceEntry, PresenceKind};
use crate::protocol::Close;
use crate::protocol::{Asked, Command};
use crate::transport::connection::Framing;
use crate::transport::door::Speaks;

/// How the refusal of a 3.1.1 keepalive the window cannot honour begins: counted apart
/// (`refusal_log.rs`), since the client's defaults cause it (60 s for most).
pub(crate) const KEEPALIVE_REFUSAL: &str = "MQTT 3.1.1 keepalive";

/// What a client naming another Authentication Method is told.
const AUTH_METHOD_TEXT: &str = "the one authentication method is idlegate-token";

/// MQTT's protocol levels.
const LEVEL_311: u8 = 4;
const LEVEL_5: u8 = 5;

/// Longest CONNECT read before a session: a password of up to 4 KiB (a JWT from an identity
/// provider), a 32-byte client identifier, a will of a few hundred bytes, MQTT 5's
/// properties and MQTT's framing. A connection that has not logged in costs at most this
/// much; a longer CONNECT is refused (MQTT 5: CONNACK 0x95; 3.1.1 has no code for it and is
/// closed).
pub(crate) const MAX_CONNECT_BYTES: u32 = 6 * 1024;

/// MQTT 3.1.1 CONNACK return codes (3.2.2.3).
mod code311 {
    pub const IDENTIFIER_REJECTED: u8 = 0x02;
    pub const SERVER_UNAVAILABLE: u8 = 0x03;
    pub const BAD_USERNAME_OR_PASSWORD: u8 = 0x04;
    pub const NOT_AUTHORIZED: u8 = 0x05;
    /// SUBACK: the one failure code 3.1.1 has (3.9.3).
    pub const SUBSCRIBE_FAILURE: u8 = 0x80;
}

/// MQTT 5 reason codes (2.4) the gateway sends.
mod code5 {
    pub const MALFORMED_PACKET: u8 = 0x81;
    pub const PROTOCOL_ERROR: u8 = 0x82;
    pub const CLIENT_IDENTIFIER_NOT_VALID: u8 = 0x85;
    pub const BAD_USERNAME_OR_PASSWORD: u8 = 0x86;
    pub const SERVER_BUSY: u8 = 0x89;
    pub const SERVER_SHUTTING_DOWN: u8 = 0x8B;
    pub const KEEP_ALIVE_TIMEOUT: u8 = 0x8D;
    pub const SESSION_TAKEN_OVER: u8 = 0x8E;
    pub const NOT_AUTHORIZED: u8 = 0x87;
    pub const BAD_AUTHENTICATION_METHOD: u8 = 0x8C;
    /// DISCONNECT: the token the session was let in with has expired.
    pub const MAXIMUM_CONNECT_TIME: u8 = 0xA0;
    /// AUTH: a re-authentication succeeded.
    pub const SUCCESS: u8 = 0x00;
    pub const QUOTA_EXCEEDED: u8 = 0x97;
    pub const QOS_NOT_SUPPORTED: u8 = 0x9B;
    pub const TOPIC_NAME_INVALID: u8 = 0x90;
    /// DISCONNECT: a status PUBLISH whose payload is not UTF-8.
    pub const PAYLOAD_FORMAT_INVALID: u8 = 0x99;
    pub const TOPIC_ALIAS_INVALID: u8 = 0x94;
    pub const PACKET_TOO_LARGE: u8 = 0x95;
    /// SUBACK: the filter is not a valid topic filter.
    pub const TOPIC_FILTER_INVALID: u8 = 0x8F;
    /// SUBACK: `$share/...`, as CONNACK's Shared Subscription Available 0 said.
    pub const SHARED_SUBSCRIPTIONS_NOT_SUPPORTED: u8 = 0x9E;
    /// SUBACK: granted QoS 0.
    pub const GRANTED_QOS_0: u8 = 0x00;
}

/// MQTT 5 property identifiers the gateway writes.
mod property {
    pub const SESSION_EXPIRY_INTERVAL: u8 = 0x11;
    pub const SERVER_KEEP_ALIVE: u8 = 0x13;
    pub const REASON_STRING: u8 = 0x1F;
    pub const RETAIN_AVAILABLE: u8 = 0x25;
    pub const MAXIMUM_QOS: u8 = 0x24;
    pub const SHARED_SUBSCRIPTION_AVAILABLE: u8 = 0x2A;
    pub const MAXIMUM_PACKET_SIZE: u8 = 0x27;
    pub const ASSIGNED_CLIENT_IDENTIFIER: u8 = 0x12;
    pub const AUTHENTICATION_METHOD: u8 = 0x15;
    pub const USER_PROPERTY: u8 = 0x26;
}

/// The User Property name under which an AUTH (Success) tells the new token's expiry, unix
/// seconds in decimal, as REFRESHED does on the other doors.
const EXPIRES_PROPERTY: &str = "expires";

/// What every MQTT connection of a gateway shares, built once at start: the timeout
/// classes a keepalive maps to, and the topics of watch lists and status.
#[derive(Debug)]
pub(crate) struct MqttPolicy {
    pub classes: TimeoutClasses,
    /// `--mqtt-presence-topic` and a `/`: SUBSCRIBE to it and a uid watches the uid.
    presence_prefix: String,
    /// `--mqtt-status-topic`: a PUBLISH to it sets the user's status.
    status_topic: String,
}

// === impl MqttPolicy ===

impl MqttPolicy {
    pub(crate) fn new(config: &crate::config::Config) -> MqttPolicy {
        MqttPolicy {
            classes: config.timeout_classes(),
            presence_prefix: format!("{}/", config.watch.mqtt_presence_topic),
            status_topic: config.watch.mqtt_status_topic.clone(),
        }
    }

    /// The uid whose presence `filter` names (`<--mqtt-presence-topic>/<uid>`), if it names
    /// one.
    fn presence_uid(&self, filter: &str) -> Option<u64> {
        let uid = filter.strip_prefix(&self.presence_prefix)?;
        // Decimal as the uid is written everywhere: no sign, no leading zero, no wildcard.
        let canonical =
            !uid.is_empty() && uid.bytes().all(|b| b.is_ascii_digit()) && (uid == "0" || !uid.starts_with('0'));
        canonical.then(|| uid.parse().ok()).flatten()
    }

    /// MQTT 5's Server Keep Alive for a client that asked for `asked` seconds and got a
    /// timeout of `timeout_ms`: what it asked when the timeout holds it to that
    /// ([MQTT-3.1.2-24]), else the keepalive the timeout holds it to.
    fn server_keep_alive(&self, asked: u16, timeout_ms: u64) -> u16 {
        if self.classes.holds_keep_alive(asked, timeout_ms) {
            asked
        } else {
            self.classes.keep_alive_for_ms(timeout_ms)
        }
    }
}

/// One MQTT connection's state: its version once CONNECT arrived, its subscriptions, and a
/// PUBACK owed.
pub(crate) struct Mqtt {
    policy: Arc<MqttPolicy>,
    max_packet_bytes: u32,
    /// 0 before CONNECT, then the client's protocol level.
    version: u8,
    /// CONNACK accepted the session: a BYE is now a DISCONNECT, no longer a CONNACK.
    welcomed: bool,
    /// The connection's last packet (a refusing CONNACK, a DISCONNECT) is written: the BYE
    /// that follows adds nothing.
    answered: bool,
    /// The client sent an empty client identifier: MQTT 5 is told the one it was given.
    anonymous: bool,
    /// An MQTT 5 CONNECT asked for a Session Expiry Interval: CONNACK answers 0, since no
    /// session outlives its connection (MQTT 5 3.2.2.3.2).
    asked_session_expiry: bool,
    /// The MQTT 5 CONNECT named [`AUTH_METHOD`]: the client may re-authenticate with AUTH.
    enhanced_auth: bool,
    /// The largest packet the client takes (MQTT 5's Maximum Packet Size; unbounded else).
    client_max_packet: u32,
    /// The CONNECT's keepalive, in seconds: CONNACK says whether it holds (MQTT 5).
    keep_alive: u16,
    /// A QoS 1 PUBLISH's packet id, acknowledged once the machine took the DATA.
    owed_ack: Option<u16>,
    /// What is owed beyond the next PUBACK, boxed so an idle connection pays a pointer for
    /// it: a SUBSCRIBE's SUBACK (once the machine said which filters it holds), and in a
    /// cluster the PUBACKs waiting for their data to be durable.
    owed: Option<Box<Owed>>,
}

/// See [`Mqtt::owed`].
#[derive(Default)]
struct Owed {
    suback: Option<Suback>,
    /// `(packet id, position)` in the order the PUBLISHes came: each PUBACK goes once the
    /// cluster has its data ([MQTT-4.6.0-2] keeps them in this order).
    acks: std::collections::VecDeque<(u16, u64)>,
}

/// A SUBACK being made: the packet id, a code per filter, and where the codes of the
/// filters the machine decides on go (the others failed here already).
struct Suback {
    id: u16,
    codes: Vec<u8>,
    decided: Vec<usize>,
}

// === impl Mqtt ===

impl Mqtt {
    pub(crate) fn new(max_packet_bytes: u32, policy: Arc<MqttPolicy>) -> Mqtt {
        Mqtt {
            policy,
            max_packet_bytes,
            version: 0,
            welcomed: false,
            answered: false,
            anonymous: false,
            asked_session_expiry: false,
            enhanced_auth: false,
            client_max_packet: u32::MAX,
            keep_alive: 0,
            owed_ack: None,
            owed: None,
        }
    }

    /// The longest packet accepted now: a CONNECT's bound until there is a session.
    pub(crate) fn limit(&self) -> u32 {
        if self.version == 0 {
            MAX_CONNECT_BYTES.min(self.max_packet_bytes)
        } else {
            self.max_packet_bytes
        }
    }

    /// The LOGIN a CONNECT stands for, with its will, or the refusal (a CONNACK in `out`,
    /// then the close).
    fn connect(
        &mut self,
        connect: &mqtt5_protocol::packet::connect::ConnectPacket,
        out: &mut BytesMut,
    ) -> Result<Command, Close> {
        let version = connect.protocol_version;
        if version != LEVEL_311 && version != LEVEL_5 {
            // An unknown level's client reads a 3.1.1 CONNACK (3.1.2.2).
            put_connack(out, LEVEL_311, 0x01, &[]);
            self.answered = true;
            return Err((
                CloseReason::ProtocolError,
                format!("MQTT protocol level {version}: 4 (3.1.1) and 5 are served"),
            ));
        }
        self.version = version;
        let uid = connect.username.as_deref().and_then(|u| u.parse::<u64>().ok());
        let Some(uid) = uid else {
            let code =
                if version == LEVEL_5 { code5::BAD_USERNAME_OR_PASSWORD } else { code311::BAD_USERNAME_OR_PASSWORD };
            put_connack(out, version, code, b"the username must be the uid, in decimal");
            self.answered = true;
            return Err((CloseReason::AuthFailed, "CONNECT username is not a uid".into()));
        };
        let client_id = connect.client_id.as_bytes();
        if client_id.is_empty() && version == LEVEL_311 && !connect.clean_start {
            // [MQTT-3.1.3-8]: a session the server would have to keep needs a name.
            put_connack(out, version, code311::IDENTIFIER_REJECTED, &[]);
            self.answered = true;
            return Err((
                CloseReason::ProtocolError,
                "MQTT 3.1.1: an empty client identifier needs CleanSession".into(),
            ));
        }
        self.anonymous = client_id.is_empty();
        self.asked_session_expiry = matches!(
            connect.properties.get(mqtt5_protocol::PropertyId::SessionExpiryInterval),
            Some(mqtt5_protocol::PropertyValue::FourByteInteger(asked)) if *asked > 0
        );
        if let Some(mqtt5_protocol::PropertyValue::FourByteInteger(max)) =
            connect.properties.get(mqtt5_protocol::PropertyId::MaximumPacketSize)
        {
            self.client_max_packet = (*max).max(1);
        }
        let device = match if client_id.is_empty() { Ok(Device::DEFAULT) } else { Device::parse(client_id) } {
            Ok(device) => device,
            Err(e) => {
                let code =
                    if version == LEVEL_5 { code5::CLIENT_IDENTIFIER_NOT_VALID } else { code311::IDENTIFIER_REJECTED };
                put_connack(out, version, code, e.to_string().as_bytes());
                self.answered = true;
                return Err((CloseReason::ProtocolError, format!("CONNECT client identifier: {e}")));
            }
        };
        self.keep_alive = connect.keep_alive;
        let classes = &self.policy.classes;
        if version == LEVEL_311 && classes.for_keep_alive(connect.keep_alive, None).is_none() {
            // A 3.1.1 client cannot be told another keepalive: accepting it would expire a
            // client that follows the spec, or hold one longer than 1.5 times its keepalive
            // ([MQTT-3.1.2-24]); keepalive 0 never pings at all.
            let (lo, hi) = classes.bounds_ms();
            put_connack(out, version, code311::NOT_AUTHORIZED, &[]);
            self.answered = true;
            return Err((
                CloseReason::ProtocolError,
                format!(
                    "{KEEPALIVE_REFUSAL} {} s: no timeout class a tick above it and within 1.5 times it \
                     (timeouts from {} ms to {} ms; a client's -k or keepalive setting)",
                    connect.keep_alive, lo, hi
                ),
            ));
        }
        let mut token = Bytes::from(connect.password.clone().unwrap_or_default());
        if let Some(method) = connect.properties.get_authentication_method() {
            // MQTT 5's enhanced authentication, under the one method the gateway knows: its
            // data is the token, and the session may re-authenticate (4.12).
            if method != AUTH_METHOD {
                put_connack(out, version, code5::BAD_AUTHENTICATION_METHOD, AUTH_METHOD_TEXT.as_bytes());
                self.answered = true;
                return Err((CloseReason::AuthFailed, format!("CONNECT authentication method: {AUTH_METHOD_TEXT}")));
            }
            self.enhanced_auth = true;
            if let Some(data) = connect.properties.get_authentication_data() {
                token = Bytes::copy_from_slice(data);
            }
        }
        let will = connect.will.as_ref().map(|will| {
            Box::new(Will { topic: will.topic.as_str().into(), payload: Bytes::from(will.payload.clone()) })
        });
        let timeout = Asked::KeepAlive(connect.keep_alive);
        Ok(Command::Login { uid, token, device, timeout, subscriber: true, will })
    }
}

impl Framing for Mqtt {
    const SPEAKS: Speaks = Speaks::Mqtt;

    fn decode(&mut self, src: &mut BytesMut, out: &mut BytesMut) -> Result<Option<Command>, Close> {
        let mut missing = 0;
        let input = self.next(src, src.len(), &mut missing, out)?;
        if input.is_none() {
            src.reserve(missing);
        }
        Ok(input)
    }

    fn encode(&mut self, frame: &Frame, out: &mut BytesMut) {
        self.encode_frame(frame, out);
    }

    fn encode_presence(&mut self, frame: &Frame, out: &mut BytesMut) {
        let Frame::Presence { kind, entries } = frame else { return self.encode_frame(frame, out) };
        for entry in entries {
            self.publish_presence(*kind, entry, out);
        }
    }

    fn encode_push(&mut self, push: &Push, out: &mut BytesMut) {
        self.publish(&push.topic, &push.payload, out);
    }

    fn accepted(&mut self, out: &mut BytesMut) {
        self.acknowledge(out);
    }

    fn subscribed(&mut self, granted: &[bool]) {
        self.decide(granted);
    }

    fn logged(&mut self, position: u64) {
        Mqtt::logged(self, position);
    }

    fn owes(&self) -> bool {
        Mqtt::owes(self)
    }

    fn release(&mut self, through: u64, out: &mut BytesMut) {
        Mqtt::release(self, through, out);
    }

    fn max_frame_bytes(&self) -> u32 {
        self.max_packet_bytes
    }

    fn ready(&self) -> bool {
        true
    }
}

impl Mqtt {
    /// The next packet among the first `avail` bytes of `src` (an MQTT stream: the socket's
    /// bytes, or WebSocket messages' payloads), taken off it; `None` until it has all
    /// arrived, with `missing` set to how much more to make room for. Replies the door makes
    /// by itself (SUBACK, a refusing CONNACK) go to `out`.
    pub(crate) fn next(
        &mut self,
        src: &mut BytesMut,
        avail: usize,
        missing: &mut usize,
        out: &mut BytesMut,
    ) -> Result<Option<Command>, Close> {
        debug_assert!(avail <= src.len());
        let Some((at, len)) = fixed_header(&src[..avail]).map_err(|why| self.malformed(out, &why.to_string()))? else {
            *missing = 8;
            return Ok(None);
        };
        if len > self.limit() as usize {
            return Err(self.too_large(&src[..avail], at + len, out));
        }
        if avail < at + len {
            *missing = (at + len - avail).min(avail.max(64));
            return Ok(None);
        }
        let mut whole = src.split_to(at + len);
        let fixed = FixedHeader::decode(&mut whole).map_err(|e| self.malformed(out, &e.to_string()))?;
        if !fixed.validate_flags() {
            // [MQTT-2.2.2-2] (3.1.1), 2.1.3 (5): reserved flags as the table has them, or the
            // packet is malformed and the connection closes.
            let why = format!("reserved flags {:#06b} on {:?}", fixed.flags, fixed.packet_type);
            return Err(self.malformed(out, &why));
        }
        if fixed.packet_type == PacketType::PingReq {
            return Ok(Some(Command::Ping(Bytes::new())));
        }
        let level = if self.version == 0 { LEVEL_5 } else { self.version };
        let packet = Packet::decode_from_body_with_version(fixed.packet_type, &fixed, &mut whole, level)
            .map_err(|e| self.malformed(out, &e.to_string()))?;
        if packet_identifier(&packet) == Some(0) {
            // [MQTT-2.3.1-1] (3.1.1), [MQTT-2.2.1-3] (5): a QoS 1 PUBLISH, a SUBSCRIBE and
            // an UNSUBSCRIBE carry a non-zero packet identifier.
            return Err(self.malformed(out, "packet identifier 0"));
        }
        match (self.version, packet) {
            (0, Packet::Connect(connect)) => self.connect(&connect, out).map(Some),
            (0, _) => Err((CloseReason::ProtocolError, "CONNECT must be the first packet".into())),
            (_, Packet::Connect(_)) => Err(self.refuse(out, code5::PROTOCOL_ERROR, "a second CONNECT")),
            (_, Packet::Publish(publish)) => match publish.qos {
                QoS::ExactlyOnce => Err(self.refuse(out, code5::QOS_NOT_SUPPORTED, "QoS 2 is not offered")),
                qos => {
                    if publish.properties.contains(mqtt5_protocol::PropertyId::TopicAlias) {
                        // Topic Alias Maximum is 0: CONNACK does not offer any.
                        return Err(self.refuse(out, code5::TOPIC_ALIAS_INVALID, "no topic alias was offered"));
                    }
                    if let Err(e) = crate::proto::mqtt::check_topic_name(&publish.topic_name) {
                        // [MQTT-3.3.2-2]: the connection closes.
                        return Err(self.refuse(out, code5::TOPIC_NAME_INVALID, &e.to_string()));
                    }
                    if qos == QoS::AtLeastOnce {
                        self.owed_ack = publish.packet_id;
                    }
                    if publish.topic_name == self.policy.status_topic {
                        return match String::from_utf8(publish.payload.to_vec()) {
                            Ok(status) => Ok(Some(Command::Status(status))),
                            Err(_) => {
                                Err(self.refuse(out, code5::PAYLOAD_FORMAT_INVALID, "a status that is not UTF-8"))
                            }
                        };
                    }
                    let topic = std::sync::Arc::from(publish.topic_name.as_str());
                    Ok(Some(Command::Data { payload: Bytes::from(publish.payload), topic: Some(topic) }))
                }
            },
            (_, Packet::Subscribe(subscribe)) => {
                let v5 = self.version == LEVEL_5;
                let mut suback = Suback {
                    id: subscribe.packet_id,
                    codes: Vec::with_capacity(subscribe.filters.len()),
                    decided: Vec::new(),
                };
                let mut valid = Vec::with_capacity(subscribe.filters.len());
                // Presence topics are decided after the push filters: their codes' places.
                let (mut watch, mut watch_at) = (Vec::new(), Vec::new());
                for filter in subscribe.filters {
                    if let Some(uid) = self.policy.presence_uid(&filter.filter) {
                        watch_at.push(suback.codes.len());
                        suback.codes.push(code5::GRANTED_QOS_0);
                        watch.push(uid);
                        continue;
                    }
                    let code = if filter.filter.starts_with("$share/") {
                        Some(code5::SHARED_SUBSCRIPTIONS_NOT_SUPPORTED)
                    } else if check_topic_filter(&filter.filter).is_err() {
                        Some(code5::TOPIC_FILTER_INVALID)
                    } else {
                        None
                    };
                    match code {
                        Some(code) => suback.codes.push(if v5 { code } else { code311::SUBSCRIBE_FAILURE }),
                        None => {
                            suback.decided.push(suback.codes.len());
                            suback.codes.push(code5::GRANTED_QOS_0);
                            valid.push(filter.filter);
                        }
                    }
                }
                suback.decided.extend(watch_at);
                self.owed.get_or_insert_with(Box::default).suback = Some(suback);
                Ok(Some(Command::Subscribe { filters: valid, max_packet: self.client_max_packet, watch }))
            }
            (_, Packet::Unsubscribe(unsubscribe)) => {
                let codes = if self.version == LEVEL_5 { unsubscribe.filters.len() } else { 0 };
                put_suback(
                    out,
                    self.version,
                    packet::UNSUBACK,
                    unsubscribe.packet_id,
                    &vec![code5::GRANTED_QOS_0; codes],
                );
                let (presence, filters): (Vec<String>, Vec<String>) =
                    unsubscribe.filters.into_iter().partition(|f| self.policy.presence_uid(f).is_some());
                let unwatch = presence.iter().filter_map(|f| self.policy.presence_uid(f)).collect();
                Ok(Some(Command::Unsubscribe { filters, unwatch }))
            }
            (LEVEL_5, Packet::Disconnect(d))
                if d.reason_code
                    == mqtt5_protocol::protocol::v5::reason_codes::ReasonCode::DisconnectWithWillMessage =>
            {
                // MQTT 5 3.14.2.1: the session ends and its will goes out, as when the
                // connection drops.
                self.answered = true;
                Err((CloseReason::Disconnect, "DISCONNECT with Will Message".into()))
            }
            (_, Packet::Disconnect(_)) => Ok(Some(Command::Logout)),
            (LEVEL_5, Packet::Auth(auth)) => self.auth(&auth, out).map(Some),
            // Acknowledgements of QoS the gateway never sends: nothing to do, but the client
            // is there.
            (_, Packet::PubAck(_) | Packet::PubRec(_) | Packet::PubRel(_) | Packet::PubComp(_) | Packet::Auth(_)) => {
                Ok(Some(Command::Activity))
            }
            (_, other) => {
                let why = format!("a client does not send {}", other_type(&other));
                Err(self.refuse(out, code5::PROTOCOL_ERROR, &why))
            }
        }
    }

    /// An MQTT 5 AUTH after CONNACK: a re-authentication (0x19) under [`AUTH_METHOD`], its
    /// data the new token, is the REFRESH; anything else is a protocol error (4.12: a client
    /// whose CONNECT named no method sends no AUTH, and the gateway never continues one).
    fn auth(&mut self, auth: &mqtt5_protocol::packet::auth::AuthPacket, out: &mut BytesMut) -> Result<Command, Close> {
        use mqtt5_protocol::protocol::v5::reason_codes::ReasonCode;
        if !self.enhanced_auth {
            return Err(self.refuse(out, code5::PROTOCOL_ERROR, "AUTH, but CONNECT named no authentication method"));
        }
        if auth.reason_code != ReasonCode::ReAuthenticate {
            return Err(self.refuse(out, code5::PROTOCOL_ERROR, "AUTH that is not a re-authentication (0x19)"));
        }
        if auth.properties.get_authentication_method().map(String::as_str) != Some(AUTH_METHOD) {
            return Err(self.refuse(out, code5::PROTOCOL_ERROR, "AUTH under another method than CONNECT's"));
        }
        let token = auth.properties.get_authentication_data().map(Bytes::copy_from_slice).unwrap_or_default();
        Ok(Command::Refresh(token))
    }

    /// The PUBACK a QoS 1 PUBLISH is owed, once the machine took its DATA, or the SUBACK a
    /// SUBSCRIBE is owed, once the machine decided on its filters.
    pub(crate) fn acknowledge(&mut self, out: &mut BytesMut) {
        if let Some(id) = self.owed_ack.take() {
            out.put_slice(&[packet::PUBACK, 2]);
            out.put_u16(id);
        }
        if let Some(suback) = self.owed.as_deref_mut().and_then(|owed| owed.suback.take()) {
            put_suback(out, self.version, packet::SUBACK, suback.id, &suback.codes);
        }
        self.drop_owed_if_empty();
    }

    /// The PUBLISH decoded last has its DATA at `position` (0: durable already): its PUBACK
    /// waits for [`Mqtt::release`] past it, after those before it.
    pub(crate) fn logged(&mut self, position: u64) {
        let deferred = self.owed.as_ref().is_some_and(|owed| !owed.acks.is_empty());
        if position == 0 && !deferred {
            return;
        }
        if let Some(id) = self.owed_ack.take() {
            self.owed.get_or_insert_with(Box::default).acks.push_back((id, position));
        }
    }

    /// Whether PUBACKs wait for their data.
    pub(crate) fn owes(&self) -> bool {
        self.owed.as_ref().is_some_and(|owed| !owed.acks.is_empty())
    }

    /// The PUBACKs whose data is durable through `through`, in order.
    pub(crate) fn release(&mut self, through: u64, out: &mut BytesMut) {
        if let Some(owed) = self.owed.as_deref_mut() {
            while let Some(&(id, _)) = owed.acks.front().filter(|(_, at)| *at <= through) {
                owed.acks.pop_front();
                out.put_slice(&[packet::PUBACK, 2]);
                out.put_u16(id);
            }
        }
        self.drop_owed_if_empty();
    }

    fn drop_owed_if_empty(&mut self) {
        if self.owed.as_ref().is_some_and(|owed| owed.suback.is_none() && owed.acks.is_empty()) {
            self.owed = None;
        }
    }

    /// The machine's outcome for the owed SUBACK's valid filters, in order: a filter past
    /// `--mqtt-max-subscriptions` is refused (0x97 Quota exceeded; 3.1.1's 0x80).
    pub(crate) fn decide(&mut self, granted: &[bool]) {
        let refused = if self.version == LEVEL_5 { code5::QUOTA_EXCEEDED } else { code311::SUBSCRIBE_FAILURE };
        if let Some(suback) = self.owed.as_deref_mut().and_then(|owed| owed.suback.as_mut()) {
            debug_assert_eq!(suback.decided.len(), granted.len(), "one outcome per valid filter");
            for (&at, &ok) in suback.decided.iter().zip(granted) {
                if !ok {
                    suback.codes[at] = refused;
                }
            }
        }
    }

    /// Appends `frame` as this version's packet.
    pub(crate) fn encode_frame(&mut self, frame: &Frame, out: &mut BytesMut) {
        match frame {
            Frame::Welcome { session, timeout_ms, .. } => {
                let mut props = BytesMut::new();
                if self.version == LEVEL_5 {
                    props.put_u8(property::SERVER_KEEP_ALIVE);
                    props.put_u16(self.policy.server_keep_alive(self.keep_alive, u64::from(*timeout_ms)));
                    if self.asked_session_expiry {
                        // The session ends with its connection, whatever was asked.
                        props.put_u8(property::SESSION_EXPIRY_INTERVAL);
                        props.put_u32(0);
                    }
                    // What the door does not offer, said up front.
                    props.put_slice(&[property::MAXIMUM_QOS, 1, property::RETAIN_AVAILABLE, 0]);
                    props.put_slice(&[property::SHARED_SUBSCRIPTION_AVAILABLE, 0]);
                    props.put_u8(property::MAXIMUM_PACKET_SIZE);
                    props.put_u32(self.max_packet_bytes);
                    if self.anonymous {
                        // [MQTT-3.2.2-16]. The session stays on the default device; the
                        // name is the session's id, which the backend's events show.
                        props.put_u8(property::ASSIGNED_CLIENT_IDENTIFIER);
                        put_str(&mut props, session.as_bytes());
                    }
                    if self.enhanced_auth {
                        props.put_u8(property::AUTHENTICATION_METHOD);
                        put_str(&mut props, AUTH_METHOD.as_bytes());
                    }
                }
                put_connack_props(out, self.version, 0, &props);
                self.welcomed = true;
            }
            Frame::Pong(_) => out.put_slice(&[packet::PINGRESP, 0]),
            // Pushes come through `encode_push`, with their topics.
            Frame::Push(_) => debug_assert!(false, "an MQTT push without its topic"),
            Frame::Bye { reason, text } => self.bye(*reason, text, out),
            // A re-authentication succeeded: AUTH (Success) under the method, with the new
            // expiry. Only an MQTT 5 session with enhanced authentication can refresh.
            Frame::Refreshed { expires } => {
                let mut props = BytesMut::new();
                props.put_u8(property::AUTHENTICATION_METHOD);
                put_str(&mut props, AUTH_METHOD.as_bytes());
                props.put_u8(property::USER_PROPERTY);
                put_str(&mut props, EXPIRES_PROPERTY.as_bytes());
                put_str(&mut props, expires.to_string().as_bytes());
                let mut len_bytes = BytesMut::new();
                put_varint(&mut len_bytes, props.len());
                put_header(out, packet::AUTH, 1 + len_bytes.len() + props.len());
                out.put_u8(code5::SUCCESS);
                out.put_slice(&len_bytes);
                out.put_slice(&props);
            }
            // PRESENCE comes through `encode_presence`, a PUBLISH per entry.
            Frame::Presence { .. } => debug_assert!(false, "an MQTT presence as one frame"),
            // Client frames never come back out.
            Frame::Login { .. }
            | Frame::Ping(_)
            | Frame::Data(_)
            | Frame::Logout
            | Frame::Refresh(_)
            | Frame::Watch(_)
            | Frame::Unwatch(_)
            | Frame::Status(_) => {}
        }
    }
}

/// A PRESENCE entry as an MQTT PUBLISH's payload: JSON, the fields the frame's entry has
/// (docs/PROTOCOL.md, "Presence over MQTT").
fn presence_json(kind: PresenceKind, entry: &PresenceEntry) -> String {
    let kind = match kind {
        PresenceKind::Change => "change",
        PresenceKind::Snapshot => "snapshot",
        PresenceKind::Resync => "resync",
    };
    let mut json = serde_json::json!({
        "uid": entry.uid,
        "online": entry.online,
        "at_ms": entry.at_ms,
        "status": entry.status,
        "kind": kind,
    });
    if let Some(last_seen_ms) = entry.last_seen_ms.filter(|_| !entry.online) {
        json["last_seen_ms"] = last_seen_ms.into();
    }
    json.to_string()
}

impl Mqtt {
    /// A PRESENCE entry as a QoS 0 PUBLISH on its uid's presence topic.
    pub(crate) fn publish_presence(&self, kind: PresenceKind, entry: &PresenceEntry, out: &mut BytesMut) {
        let topic = format!("{}{}", self.policy.presence_prefix, entry.uid);
        self.publish(&topic, presence_json(kind, entry).as_bytes(), out);
    }

    /// A QoS 0 PUBLISH of `payload` on `topic` (the registry queued it only for a session
    /// that subscribed to the topic, and that takes packets of its size); nothing when it is
    /// over the client's Maximum Packet Size ([MQTT-3.1.2-24]).
    pub(crate) fn publish(&self, topic: &str, payload: &[u8], out: &mut BytesMut) {
        let v5 = self.version == LEVEL_5;
        if crate::proto::mqtt::publish_len(topic.len(), payload.len(), v5) > self.client_max_packet as usize {
            return;
        }
        let topic = topic.as_bytes();
        let properties = usize::from(v5);
        put_header(out, packet::PUBLISH, 2 + topic.len() + properties + payload.len());
        put_str(out, topic);
        if properties == 1 {
            out.put_u8(0);
        }
        out.put_slice(payload);
    }

    /// The gateway's BYE as this version says it: a refusing CONNACK before the session,
    /// MQTT 5's DISCONNECT after it, nothing for 3.1.1 (its server closes without a word).
    fn bye(&mut self, reason: CloseReason, text: &str, out: &mut BytesMut) {
        if self.answered {
            return;
        }
        self.answered = true;
        let v5 = self.version == LEVEL_5;
        if !self.welcomed {
            let code = match (v5, reason) {
                (true, CloseReason::AuthFailed) => code5::BAD_USERNAME_OR_PASSWORD,
                (true, CloseReason::ServerFull) => code5::SERVER_BUSY,
                (true, CloseReason::Shutdown) => code5::SERVER_SHUTTING_DOWN,
                (true, _) => code5::PROTOCOL_ERROR,
                (false, CloseReason::AuthFailed) => code311::BAD_USERNAME_OR_PASSWORD,
                (false, CloseReason::ServerFull | CloseReason::Shutdown) => code311::SERVER_UNAVAILABLE,
                (false, _) => return,
            };
            // Before CONNECT there is no version to answer in: the socket just closes.
            if self.version != 0 {
                put_connack(out, self.version, code, text.as_bytes());
            }
            return;
        }
        if !v5 {
            return;
        }
        let code = match reason {
            CloseReason::Logout | CloseReason::Disconnect | CloseReason::NodeLost => return,
            CloseReason::Kicked => code5::SESSION_TAKEN_OVER,
            CloseReason::Shutdown | CloseReason::ServerFull => code5::SERVER_SHUTTING_DOWN,
            CloseReason::IdleTimeout => code5::KEEP_ALIVE_TIMEOUT,
            CloseReason::SlowConsumer => code5::QUOTA_EXCEEDED,
            // A refused re-authentication.
            CloseReason::AuthFailed => code5::NOT_AUTHORIZED,
            CloseReason::TokenExpired => code5::MAXIMUM_CONNECT_TIME,
            CloseReason::ProtocolError | CloseReason::LoginTimeout => code5::PROTOCOL_ERROR,
        };
        put_disconnect(out, code, text.as_bytes());
    }

    /// A packet of `len` bytes over the limit, at the front of `src`: MQTT 5 is told 0x95
    /// (a CONNECT, by CONNACK: its level is read from its first bytes); 3.1.1 has no code.
    fn too_large(&mut self, src: &[u8], len: usize, out: &mut BytesMut) -> Close {
        let why = format!("packet of {len} bytes over the limit of {}", self.limit());
        if self.version == 0 {
            if crate::proto::mqtt::connect_level(src) == crate::proto::mqtt::ConnectLevel::Known(LEVEL_5) {
                put_connack(out, LEVEL_5, code5::PACKET_TOO_LARGE, why.as_bytes());
                self.answered = true;
            }
            return (CloseReason::ProtocolError, format!("MQTT: {why}"));
        }
        self.refuse(out, code5::PACKET_TOO_LARGE, &why)
    }

    /// A packet that cannot be read: MQTT 5 is told why (DISCONNECT 0x81); the connection
    /// closes as a protocol error.
    fn malformed(&mut self, out: &mut BytesMut, why: &str) -> Close {
        self.refuse(out, code5::MALFORMED_PACKET, why)
    }

    /// Ends a connection for a client's packet: MQTT 5 gets DISCONNECT `code` (after
    /// CONNECT) with `why` as its reason string.
    fn refuse(&mut self, out: &mut BytesMut, code: u8, why: &str) -> Close {
        if self.version == LEVEL_5 && self.welcomed && !self.answered {
            put_disconnect(out, code, why.as_bytes());
            self.answered = true;
        }
        (CloseReason::ProtocolError, format!("MQTT: {why}"))
    }
}

/// The packet identifier of a packet a client sends with one (a PUBLISH of QoS 1 or 2, a
/// SUBSCRIBE, an UNSUBSCRIBE).
fn packet_identifier(packet: &Packet) -> Option<u16> {
    match packet {
        Packet::Publish(publish) => publish.packet_id,
        Packet::Subscribe(subscribe) => Some(subscribe.packet_id),
        Packet::Unsubscribe(unsubscribe) => Some(unsubscribe.packet_id),
        _ => None,
    }
}

/// The CONNACK refusing, at accept, a client whose CONNECT says protocol `level`: MQTT 5
/// reads 0x89 Server busy (0x97 Quota exceeded for the per-address bound) with `text`, the
/// retry hint, as Reason String; every other level reads 3.1.1's 0x03 Server unavailable.
pub(crate) fn put_refusal(out: &mut BytesMut, level: u8, bound: super::refusal::Bound, text: &str) {
    if level == LEVEL_5 {
        let code = match bound {
            super::refusal::Bound::Server => code5::SERVER_BUSY,
            super::refusal::Bound::Address => code5::QUOTA_EXCEEDED,
        };
        put_connack(out, LEVEL_5, code, text.as_bytes());
    } else {
        put_connack(out, LEVEL_311, code311::SERVER_UNAVAILABLE, &[]);
    }
}

/// Properties of a reason string, if there is one (MQTT 5).
fn reason_string(text: &[u8]) -> BytesMut {
    let mut props = BytesMut::new();
    if !text.is_empty() {
        // A reason string longer than a u16 says cannot be sent; the gateway's are short.
        let text = &text[..text.len().min(usize::from(u16::MAX))];
        props.put_u8(property::REASON_STRING);
        put_str(&mut props, text);
    }
    props
}

fn put_connack(out: &mut BytesMut, version: u8, code: u8, text: &[u8]) {
    put_connack_props(out, version, code, &reason_string(text));
}

fn put_connack_props(out: &mut BytesMut, version: u8, code: u8, props: &[u8]) {
    if version == LEVEL_5 {
        let mut len_bytes = BytesMut::new();
        put_varint(&mut len_bytes, props.len());
        put_header(out, packet::CONNACK, 2 + len_bytes.len() + props.len());
        out.put_slice(&[0, code]);
        out.put_slice(&len_bytes);
        out.put_slice(props);
    } else {
        out.put_slice(&[packet::CONNACK, 2, 0, code]);
    }
}

fn put_disconnect(out: &mut BytesMut, code: u8, text: &[u8]) {
    let props = reason_string(text);
    let mut len_bytes = BytesMut::new();
    put_varint(&mut len_bytes, props.len());
    put_header(out, packet::DISCONNECT, 1 + len_bytes.len() + props.len());
    out.put_u8(code);
    out.put_slice(&len_bytes);
    out.put_slice(&props);
}

/// SUBACK or UNSUBACK with a code per filter (3.1.1's UNSUBACK has none).
fn put_suback(out: &mut BytesMut, version: u8, kind: u8, id: u16, codes: &[u8]) {
    let v5 = version == LEVEL_5;
    put_header(out, kind, 2 + usize::from(v5) + codes.len());
    out.put_u16(id);
    if v5 {
        out.put_u8(0);
    }
    out.put_slice(codes);
}

fn other_type(packet: &Packet) -> &'static str {
    match packet {
        Packet::ConnAck(_) => "CONNACK",
        Packet::SubAck(_) => "SUBACK",
        Packet::UnsubAck(_) => "UNSUBACK",
        Packet::PingResp => "PINGRESP",
        _ => "this packet",
    }
}

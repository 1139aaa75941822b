//! The MQTT door against the OASIS specifications' normative statements, one test per
//! statement that binds a server which is not a broker. Each test is named by its statement
//! number (`v311_` for MQTT 3.1.1, `v5_` for MQTT 5.0). The packets are written out byte by
//! byte from the specifications' figures, and sent over a real socket to the door.
//!
//! Statements that do not apply, and why, are listed in docs/SECURITY.md ("MQTT"):
//! retained messages, QoS 2, client-to-client routing and shared subscriptions are a
//! broker's, and this gateway routes only the backend's pushes to clients. The keepalive
//! statements (3.1.1's [MQTT-3.1.2-24], 5's [MQTT-3.1.2-22]) are held by
//! `tests/mqtt.rs::mqtt_5_is_held_to_its_own_keepalive_and_a_silent_client_goes_offline_within_one_and_a_half_times_it`
//! and the ring's own tests; the will on DISCONNECT (both versions' [MQTT-3.14.4-3]) by
//! `tests/mqtt.rs::a_will_rides_in_the_offline_event_unless_the_client_disconnects_cleanly`.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::mqtt::packet;
use common::{short_config, TestServer, PATIENCE};
use idlegate::Config;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

fn config() -> Config {
    Config { timeout: Duration::from_secs(30), login_timeout: Duration::from_secs(5), ..short_config() }
}

/// A UTF-8 string or binary field: a 16-bit length, then the bytes.
fn field(bytes: &[u8]) -> Vec<u8> {
    [&(bytes.len() as u16).to_be_bytes()[..], bytes].concat()
}

/// A CONNECT of protocol `name` and `level`, connect `flags` (the user name flag, 0x80, is
/// added when `user` is given), keepalive 10 s (a timeout class holds it), client identifier
/// `id`.
fn connect_with(name: &[u8], level: u8, flags: u8, id: &str, user: Option<&str>) -> Vec<u8> {
    let mut body = field(name);
    body.push(level);
    body.push(flags | if user.is_some() { 0x80 } else { 0 });
    body.extend_from_slice(&10u16.to_be_bytes());
    if level == 5 {
        body.push(0); // no properties
    }
    body.extend(field(id.as_bytes()));
    if let Some(user) = user {
        body.extend(field(user.as_bytes()));
    }
    packet(0x10, &body)
}

/// A clean-session CONNECT of uid 7 (its user name), version `level` (4: 3.1.1, 5: 5.0).
fn connect(level: u8) -> Vec<u8> {
    connect_with(b"MQTT", level, 0x02, "device", Some("7"))
}

/// A PUBLISH on `topic` at QoS `qos` (packet identifier `id` when QoS > 0).
fn publish(level: u8, qos: u8, id: u16, topic: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut body = field(topic);
    if qos > 0 {
        body.extend_from_slice(&id.to_be_bytes());
    }
    if level == 5 {
        body.push(0);
    }
    body.extend_from_slice(payload);
    packet(0x30 | (qos << 1), &body)
}

/// A SUBSCRIBE of `filters` at QoS 0, packet identifier `id`, with fixed-header `first`.
fn subscribe_with(first: u8, level: u8, id: u16, filters: &[&str]) -> Vec<u8> {
    let mut body = id.to_be_bytes().to_vec();
    if level == 5 {
        body.push(0);
    }
    for filter in filters {
        body.extend(field(filter.as_bytes()));
        body.push(0);
    }
    packet(first, &body)
}

/// An UNSUBSCRIBE of `filters`, packet identifier `id`, with fixed-header `first`.
fn unsubscribe_with(first: u8, level: u8, id: u16, filters: &[&str]) -> Vec<u8> {
    let mut body = id.to_be_bytes().to_vec();
    if level == 5 {
        body.push(0);
    }
    for filter in filters {
        body.extend(field(filter.as_bytes()));
    }
    packet(first, &body)
}

const PINGREQ: [u8; 2] = [0xC0, 0];
const PINGRESP: [u8; 2] = [0xD0, 0];

/// A client's conversation with the door.
struct Talk {
    stream: TcpStream,
}

impl Talk {
    async fn open(addr: SocketAddr) -> Talk {
        Talk { stream: TcpStream::connect(addr).await.unwrap() }
    }

    /// A session past its CONNECT, accepted.
    async fn session(addr: SocketAddr, level: u8) -> Talk {
        let mut talk = Talk::open(addr).await;
        talk.send(&connect(level)).await;
        let connack = talk.next().await.expect("a CONNACK");
        assert_eq!((connack[0], connack[3]), (0x20, 0), "accepted: {connack:02x?}");
        talk
    }

    async fn send(&mut self, bytes: &[u8]) {
        // The door may have closed already; what it answered is what the test reads.
        let _ = self.stream.write_all(bytes).await;
    }

    /// The next whole packet, or `None` once the door closed the connection.
    async fn next(&mut self) -> Option<Vec<u8>> {
        let mut first = [0u8; 1];
        match timeout(PATIENCE, self.stream.read(&mut first)).await.expect("the door answers or closes in time") {
            Ok(1) => {}
            _ => return None,
        }
        let (mut len, mut shift, mut header) = (0usize, 0, vec![first[0]]);
        loop {
            let mut byte = [0u8; 1];
            self.stream.read_exact(&mut byte).await.ok()?;
            header.push(byte[0]);
            len |= usize::from(byte[0] & 0x7f) << shift;
            shift += 7;
            if byte[0] & 0x80 == 0 {
                break;
            }
        }
        let mut body = vec![0u8; len];
        self.stream.read_exact(&mut body).await.ok()?;
        Some([header, body].concat())
    }

    /// Whether the door closes the connection, with nothing more sent first.
    async fn closes(&mut self) -> Result<(), Vec<u8>> {
        match self.next().await {
            None => Ok(()),
            Some(packet) => Err(packet),
        }
    }

    /// Whether the door closes the connection, after an MQTT 5 DISCONNECT if it sends one:
    /// its reason code, or `None` for a close with none.
    async fn disconnects(&mut self) -> Option<u8> {
        match self.next().await {
            None => None,
            Some(packet) => {
                assert_eq!(packet[0], 0xE0, "a DISCONNECT, not {packet:02x?}");
                assert!(self.next().await.is_none(), "closed after the DISCONNECT");
                packet.get(2).copied()
            }
        }
    }
}

async fn door() -> (TestServer, SocketAddr) {
    let server = TestServer::start(config()).await;
    let addr = server.mqtt;
    (server, addr)
}

// === MQTT 3.1.1 ===

/// [MQTT-3.1.0-1] The first packet from the client MUST be a CONNECT.
#[tokio::test]
async fn v311_mqtt_3_1_0_1_the_first_packet_must_be_connect() {
    let (mut server, addr) = door().await;
    let mut talk = Talk::open(addr).await;
    talk.send(&PINGREQ).await;
    assert_eq!(talk.closes().await, Ok(()));
    server.shutdown().await;
}

/// [MQTT-3.1.0-2] A second CONNECT is a protocol violation: the server disconnects.
#[tokio::test]
async fn v311_mqtt_3_1_0_2_a_second_connect_disconnects() {
    let (mut server, addr) = door().await;
    let mut talk = Talk::session(addr, 4).await;
    talk.send(&connect(4)).await;
    assert_eq!(talk.closes().await, Ok(()));
    server.shutdown().await;
}

/// [MQTT-3.1.2-1] A protocol name other than "MQTT": the server does not go on under this
/// specification (it closes, with no CONNACK accepting it).
#[tokio::test]
async fn v311_mqtt_3_1_2_1_a_wrong_protocol_name_is_not_served() {
    let (mut server, addr) = door().await;
    let mut talk = Talk::open(addr).await;
    talk.send(&connect_with(b"MQTX", 4, 0x02, "device", Some("7"))).await;
    match talk.next().await {
        None => {}
        Some(connack) => {
            assert!(connack[0] == 0x20 && connack[3] != 0, "not accepted: {connack:02x?}");
            assert_eq!(talk.closes().await, Ok(()));
        }
    }
    server.shutdown().await;
}

/// [MQTT-3.1.2-2] A protocol level the server does not support: CONNACK 0x01, then close.
#[tokio::test]
async fn v311_mqtt_3_1_2_2_an_unsupported_level_gets_connack_1() {
    let (mut server, addr) = door().await;
    let mut talk = Talk::open(addr).await;
    talk.send(&connect_with(b"MQTT", 9, 0x02, "device", Some("7"))).await;
    assert_eq!(talk.next().await, Some(vec![0x20, 2, 0, 1]));
    assert_eq!(talk.closes().await, Ok(()));
    server.shutdown().await;
}

/// [MQTT-3.1.2-3] The CONNECT's reserved flag MUST be 0, else the server disconnects.
#[tokio::test]
async fn v311_mqtt_3_1_2_3_the_reserved_connect_flag_disconnects() {
    let (mut server, addr) = door().await;
    let mut talk = Talk::open(addr).await;
    talk.send(&connect_with(b"MQTT", 4, 0x03, "device", Some("7"))).await;
    assert_eq!(talk.closes().await, Ok(()));
    server.shutdown().await;
}

/// [MQTT-3.1.2-22] and [MQTT-3.1.4-1]: a password flag without the user name flag is not a
/// CONNECT of section 3.1; the server closes without a CONNACK.
#[tokio::test]
async fn v311_mqtt_3_1_2_22_a_password_without_a_user_name_closes() {
    let (mut server, addr) = door().await;
    let mut talk = Talk::open(addr).await;
    let mut body = field(b"MQTT");
    body.extend_from_slice(&[4, 0x42, 0, 10]);
    body.extend(field(b"device"));
    body.extend(field(b"secret"));
    talk.send(&packet(0x10, &body)).await;
    assert_eq!(talk.closes().await, Ok(()));
    server.shutdown().await;
}

/// [MQTT-3.1.3-8] A zero-byte client identifier with CleanSession 0: CONNACK 0x02, close.
#[tokio::test]
async fn v311_mqtt_3_1_3_8_an_empty_identifier_without_clean_session_gets_connack_2() {
    let (mut server, addr) = door().await;
    let mut talk = Talk::open(addr).await;
    talk.send(&connect_with(b"MQTT", 4, 0x00, "", Some("7"))).await;
    assert_eq!(talk.next().await, Some(vec![0x20, 2, 0, 2]));
    assert_eq!(talk.closes().await, Ok(()));
    server.shutdown().await;
}

/// [MQTT-3.1.4-1] A CONNECT that does not conform (its strings run past its end): closed
/// without a CONNACK.
#[tokio::test]
async fn v311_mqtt_3_1_4_1_a_malformed_connect_closes_without_connack() {
    let (mut server, addr) = door().await;
    let mut talk = Talk::open(addr).await;
    let mut body = field(b"MQTT");
    body.extend_from_slice(&[4, 0x82, 0, 10]);
    body.extend_from_slice(&[0, 40, b'd']); // a 40-byte identifier of one byte
    talk.send(&packet(0x10, &body)).await;
    assert_eq!(talk.closes().await, Ok(()));
    server.shutdown().await;
}

/// [MQTT-3.1.4-2] A client identifier already connected: the existing client is
/// disconnected.
#[tokio::test]
async fn v311_mqtt_3_1_4_2_the_same_identifier_disconnects_the_existing_client() {
    let (mut server, addr) = door().await;
    let mut first = Talk::session(addr, 4).await;
    let mut second = Talk::session(addr, 4).await;
    assert_eq!(first.closes().await, Ok(()));
    second.send(&PINGREQ).await;
    assert_eq!(second.next().await, Some(PINGRESP.to_vec()));
    server.shutdown().await;
}

/// [MQTT-3.2.0-1] The first packet the server sends is a CONNACK.
#[tokio::test]
async fn v311_mqtt_3_2_0_1_the_first_packet_from_the_server_is_connack() {
    let (mut server, addr) = door().await;
    let mut talk = Talk::open(addr).await;
    // A PINGREQ right behind the CONNECT: its PINGRESP comes after the CONNACK.
    talk.send(&[connect(4), PINGREQ.to_vec()].concat()).await;
    assert_eq!(talk.next().await, Some(vec![0x20, 2, 0, 0]));
    assert_eq!(talk.next().await, Some(PINGRESP.to_vec()));
    server.shutdown().await;
}

/// [MQTT-3.2.2-4] and [MQTT-3.2.2-5]: a CONNACK refusing has Session Present 0, and the
/// server then closes.
#[tokio::test]
async fn v311_mqtt_3_2_2_4_and_5_a_refusal_has_no_session_and_closes() {
    let (mut server, addr) = door().await;
    let mut talk = Talk::open(addr).await;
    talk.send(&connect_with(b"MQTT", 4, 0x02, "device", Some("not a uid"))).await;
    let connack = talk.next().await.expect("a CONNACK");
    assert_eq!((connack[0], connack[2]), (0x20, 0), "{connack:02x?}");
    assert_ne!(connack[3], 0, "refused: {connack:02x?}");
    assert_eq!(talk.closes().await, Ok(()));
    server.shutdown().await;
}

/// [MQTT-2.2.2-2] Invalid fixed-header flags (a PINGREQ with a flag set): closed.
#[tokio::test]
async fn v311_mqtt_2_2_2_2_invalid_flags_close() {
    let (mut server, addr) = door().await;
    let mut talk = Talk::session(addr, 4).await;
    talk.send(&[0xC1, 0]).await;
    assert_eq!(talk.closes().await, Ok(()));
    server.shutdown().await;
}

/// [MQTT-3.3.1-4] A PUBLISH with both QoS bits set: closed.
#[tokio::test]
async fn v311_mqtt_3_3_1_4_qos_3_closes() {
    let (mut server, addr) = door().await;
    let mut talk = Talk::session(addr, 4).await;
    talk.send(&publish(4, 3, 1, b"t", b"x")).await;
    assert_eq!(talk.closes().await, Ok(()));
    server.shutdown().await;
}

/// [MQTT-3.3.2-2] A PUBLISH's topic name MUST NOT hold wildcards: closed.
#[tokio::test]
async fn v311_mqtt_3_3_2_2_a_wildcard_topic_name_closes() {
    let (mut server, addr) = door().await;
    for topic in [&b"a/+"[..], b"a/#"] {
        let mut talk = Talk::session(addr, 4).await;
        talk.send(&publish(4, 0, 0, topic, b"x")).await;
        assert_eq!(talk.closes().await, Ok(()), "{}", String::from_utf8_lossy(topic));
    }
    server.shutdown().await;
}

/// [MQTT-3.3.4-1] A QoS 1 PUBLISH is answered with a PUBACK of its packet identifier.
#[tokio::test]
async fn v311_mqtt_3_3_4_1_qos_1_gets_its_puback() {
    let (mut server, addr) = door().await;
    let mut talk = Talk::session(addr, 4).await;
    talk.send(&publish(4, 1, 0x1234, b"t", b"x")).await;
    assert_eq!(talk.next().await, Some(vec![0x40, 2, 0x12, 0x34]));
    server.shutdown().await;
}

/// [MQTT-2.3.1-1] A QoS 1 PUBLISH, a SUBSCRIBE and an UNSUBSCRIBE MUST have a non-zero
/// packet identifier: with 0, closed.
#[tokio::test]
async fn v311_mqtt_2_3_1_1_packet_identifier_zero_closes() {
    let (mut server, addr) = door().await;
    for bad in [publish(4, 1, 0, b"t", b"x"), subscribe_with(0x82, 4, 0, &["t"]), unsubscribe_with(0xA2, 4, 0, &["t"])]
    {
        let mut talk = Talk::session(addr, 4).await;
        talk.send(&bad).await;
        assert_eq!(talk.closes().await, Ok(()), "{bad:02x?}");
    }
    server.shutdown().await;
}

/// [MQTT-3.8.1-1] SUBSCRIBE's fixed-header flags MUST be 0010: others close.
#[tokio::test]
async fn v311_mqtt_3_8_1_1_subscribe_flags_must_be_0010() {
    let (mut server, addr) = door().await;
    let mut talk = Talk::session(addr, 4).await;
    talk.send(&subscribe_with(0x80, 4, 1, &["t"])).await;
    assert_eq!(talk.closes().await, Ok(()));
    server.shutdown().await;
}

/// [MQTT-3.8.3-3] A SUBSCRIBE with no topic filter is a protocol violation: closed.
#[tokio::test]
async fn v311_mqtt_3_8_3_3_a_subscribe_without_filters_closes() {
    let (mut server, addr) = door().await;
    let mut talk = Talk::session(addr, 4).await;
    talk.send(&subscribe_with(0x82, 4, 1, &[])).await;
    assert_eq!(talk.closes().await, Ok(()));
    server.shutdown().await;
}

/// [MQTT-3.8.4-1], [MQTT-3.8.4-2], [MQTT-3.9.3-1]: a SUBSCRIBE gets a SUBACK of its packet
/// identifier, one return code per filter, in order.
#[tokio::test]
async fn v311_mqtt_3_8_4_1_and_2_and_3_9_3_1_suback_answers_in_order() {
    let (mut server, addr) = door().await;
    let mut talk = Talk::session(addr, 4).await;
    talk.send(&subscribe_with(0x82, 4, 0x0102, &["a/#", "b", "c/+"])).await;
    let suback = talk.next().await.expect("a SUBACK");
    assert_eq!(&suback[..4], &[0x90, 5, 0x01, 0x02], "{suback:02x?}");
    assert_eq!(suback.len(), 4 + 3, "three return codes: {suback:02x?}");
    server.shutdown().await;
}

/// [MQTT-3.10.1-1] UNSUBSCRIBE's fixed-header flags MUST be 0010: others close.
#[tokio::test]
async fn v311_mqtt_3_10_1_1_unsubscribe_flags_must_be_0010() {
    let (mut server, addr) = door().await;
    let mut talk = Talk::session(addr, 4).await;
    talk.send(&unsubscribe_with(0xA0, 4, 1, &["t"])).await;
    assert_eq!(talk.closes().await, Ok(()));
    server.shutdown().await;
}

/// [MQTT-3.10.4-4] and [MQTT-3.10.4-5]: an UNSUBSCRIBE gets an UNSUBACK of its packet
/// identifier, even when no filter matched.
#[tokio::test]
async fn v311_mqtt_3_10_4_4_and_5_unsuback_even_without_a_match() {
    let (mut server, addr) = door().await;
    let mut talk = Talk::session(addr, 4).await;
    talk.send(&unsubscribe_with(0xA2, 4, 0x0203, &["never/subscribed"])).await;
    assert_eq!(talk.next().await, Some(vec![0xB0, 2, 0x02, 0x03]));
    server.shutdown().await;
}

/// [MQTT-3.12.4-1] A PINGREQ gets a PINGRESP.
#[tokio::test]
async fn v311_mqtt_3_12_4_1_pingreq_gets_pingresp() {
    let (mut server, addr) = door().await;
    let mut talk = Talk::session(addr, 4).await;
    talk.send(&PINGREQ).await;
    assert_eq!(talk.next().await, Some(PINGRESP.to_vec()));
    server.shutdown().await;
}

/// [MQTT-1.5.3-1] and [MQTT-1.5.3-2]: a string of ill-formed UTF-8, or holding U+0000,
/// closes the connection.
#[tokio::test]
async fn v311_mqtt_1_5_3_1_and_2_bad_utf8_or_nul_in_a_topic_closes() {
    let (mut server, addr) = door().await;
    for topic in [&b"a\xff"[..], b"a\xed\xa0\x80", b"a\0b"] {
        let mut talk = Talk::session(addr, 4).await;
        talk.send(&publish(4, 0, 0, topic, b"x")).await;
        assert_eq!(talk.closes().await, Ok(()), "{topic:02x?}");
    }
    server.shutdown().await;
}

/// [MQTT-4.7.3-1] Topic names and filters are at least one character long: an empty topic
/// name in a PUBLISH closes.
#[tokio::test]
async fn v311_mqtt_4_7_3_1_an_empty_topic_name_closes() {
    let (mut server, addr) = door().await;
    let mut talk = Talk::session(addr, 4).await;
    talk.send(&publish(4, 0, 0, b"", b"x")).await;
    assert_eq!(talk.closes().await, Ok(()));
    server.shutdown().await;
}

// === MQTT 5.0 ===

/// [MQTT-3.1.0-1] The first packet from the client MUST be a CONNECT.
#[tokio::test]
async fn v5_mqtt_3_1_0_1_the_first_packet_must_be_connect() {
    let (mut server, addr) = door().await;
    let mut talk = Talk::open(addr).await;
    talk.send(&subscribe_with(0x82, 5, 1, &["t"])).await;
    assert_eq!(talk.closes().await, Ok(()));
    server.shutdown().await;
}

/// [MQTT-3.1.0-2] A second CONNECT is a protocol error: the connection closes (after a
/// DISCONNECT 0x82, Protocol Error, if one is sent).
#[tokio::test]
async fn v5_mqtt_3_1_0_2_a_second_connect_is_a_protocol_error() {
    let (mut server, addr) = door().await;
    let mut talk = Talk::session(addr, 5).await;
    talk.send(&connect(5)).await;
    let reason = talk.disconnects().await;
    assert!(matches!(reason, None | Some(0x82)), "{reason:?}");
    server.shutdown().await;
}

/// [MQTT-3.1.2-3] The CONNECT's reserved flag MUST be 0: a malformed packet, not served.
#[tokio::test]
async fn v5_mqtt_3_1_2_3_the_reserved_connect_flag_is_malformed() {
    let (mut server, addr) = door().await;
    let mut talk = Talk::open(addr).await;
    talk.send(&connect_with(b"MQTT", 5, 0x03, "device", Some("7"))).await;
    match talk.next().await {
        None => {}
        Some(connack) => {
            assert_eq!((connack[0], connack[3]), (0x20, 0x81), "Malformed Packet: {connack:02x?}");
            assert_eq!(talk.closes().await, Ok(()));
        }
    }
    server.shutdown().await;
}

/// [MQTT-3.1.3-7] An empty client identifier: the server assigns one, and returns it in
/// the CONNACK's Assigned Client Identifier (0x12).
#[tokio::test]
async fn v5_mqtt_3_1_3_7_an_empty_identifier_is_assigned_and_returned() {
    let (mut server, addr) = door().await;
    let mut talk = Talk::open(addr).await;
    talk.send(&connect_with(b"MQTT", 5, 0x02, "", Some("7"))).await;
    let connack = talk.next().await.expect("a CONNACK");
    assert_eq!((connack[0], connack[3]), (0x20, 0), "{connack:02x?}");
    let assigned = connack.windows(3).position(|w| w[0] == 0x12 && w[1] == 0 && w[2] > 0);
    assert!(assigned.is_some(), "an Assigned Client Identifier: {connack:02x?}");
    server.shutdown().await;
}

/// [MQTT-3.2.0-2] The server MUST NOT send more than one CONNACK: a second CONNECT gets
/// none.
#[tokio::test]
async fn v5_mqtt_3_2_0_2_never_a_second_connack() {
    let (mut server, addr) = door().await;
    let mut talk = Talk::session(addr, 5).await;
    talk.send(&connect(5)).await;
    while let Some(packet) = talk.next().await {
        assert_ne!(packet[0], 0x20, "a second CONNACK: {packet:02x?}");
    }
    server.shutdown().await;
}

/// [MQTT-3.3.1-4] A PUBLISH with both QoS bits set is malformed: the connection closes
/// (after DISCONNECT 0x81, Malformed Packet, if one is sent).
#[tokio::test]
async fn v5_mqtt_3_3_1_4_qos_3_is_malformed() {
    let (mut server, addr) = door().await;
    let mut talk = Talk::session(addr, 5).await;
    talk.send(&publish(5, 3, 1, b"t", b"x")).await;
    let reason = talk.disconnects().await;
    assert!(matches!(reason, None | Some(0x81)), "{reason:?}");
    server.shutdown().await;
}

/// [MQTT-3.3.2-2] A PUBLISH's topic name MUST NOT hold wildcards: DISCONNECT 0x90 (Topic
/// Name invalid).
#[tokio::test]
async fn v5_mqtt_3_3_2_2_a_wildcard_topic_name_gets_0x90() {
    let (mut server, addr) = door().await;
    let mut talk = Talk::session(addr, 5).await;
    talk.send(&publish(5, 0, 0, b"a/#", b"x")).await;
    assert_eq!(talk.disconnects().await, Some(0x90));
    server.shutdown().await;
}

/// [MQTT-3.3.4-1] A QoS 1 PUBLISH is answered with a PUBACK of its packet identifier.
#[tokio::test]
async fn v5_mqtt_3_3_4_1_qos_1_gets_its_puback() {
    let (mut server, addr) = door().await;
    let mut talk = Talk::session(addr, 5).await;
    talk.send(&publish(5, 1, 0x0a0b, b"t", b"x")).await;
    let puback = talk.next().await.expect("a PUBACK");
    assert_eq!(&puback[..4], &[0x40, puback[1], 0x0a, 0x0b], "{puback:02x?}");
    server.shutdown().await;
}

/// [MQTT-3.8.4-1] and [MQTT-3.8.4-2]: a SUBSCRIBE gets a SUBACK of its packet identifier.
#[tokio::test]
async fn v5_mqtt_3_8_4_1_and_2_suback_of_the_same_identifier() {
    let (mut server, addr) = door().await;
    let mut talk = Talk::session(addr, 5).await;
    talk.send(&subscribe_with(0x82, 5, 0x0304, &["a", "b/#"])).await;
    let suback = talk.next().await.expect("a SUBACK");
    assert_eq!((suback[0], suback[2], suback[3]), (0x90, 0x03, 0x04), "{suback:02x?}");
    // Identifier, no properties, two reason codes.
    assert_eq!(suback.len(), 2 + 2 + 1 + 2, "{suback:02x?}");
    server.shutdown().await;
}

/// [MQTT-3.10.4-4] and [MQTT-3.10.4-5]: an UNSUBSCRIBE gets an UNSUBACK of its packet
/// identifier, even when no filter matched.
#[tokio::test]
async fn v5_mqtt_3_10_4_4_and_5_unsuback_even_without_a_match() {
    let (mut server, addr) = door().await;
    let mut talk = Talk::session(addr, 5).await;
    talk.send(&unsubscribe_with(0xA2, 5, 0x0506, &["never/subscribed"])).await;
    let unsuback = talk.next().await.expect("an UNSUBACK");
    assert_eq!((unsuback[0], unsuback[2], unsuback[3]), (0xB0, 0x05, 0x06), "{unsuback:02x?}");
    server.shutdown().await;
}

/// [MQTT-3.12.4-1] A PINGREQ gets a PINGRESP.
#[tokio::test]
async fn v5_mqtt_3_12_4_1_pingreq_gets_pingresp() {
    let (mut server, addr) = door().await;
    let mut talk = Talk::session(addr, 5).await;
    talk.send(&PINGREQ).await;
    assert_eq!(talk.next().await, Some(PINGRESP.to_vec()));
    server.shutdown().await;
}

/// 2.1.3's table of reserved flags: a PINGREQ with a flag set is malformed (DISCONNECT
/// 0x81, then close).
#[tokio::test]
async fn v5_mqtt_2_1_3_reserved_flags_are_malformed() {
    let (mut server, addr) = door().await;
    let mut talk = Talk::session(addr, 5).await;
    talk.send(&[0xC1, 0]).await;
    assert_eq!(talk.disconnects().await, Some(0x81));
    server.shutdown().await;
}

/// [MQTT-2.2.1-3] A QoS 1 PUBLISH, a SUBSCRIBE and an UNSUBSCRIBE carry a non-zero packet
/// identifier: with 0, DISCONNECT 0x81 and close.
#[tokio::test]
async fn v5_mqtt_2_2_1_3_packet_identifier_zero_is_malformed() {
    let (mut server, addr) = door().await;
    for bad in [publish(5, 1, 0, b"t", b"x"), subscribe_with(0x82, 5, 0, &["t"]), unsubscribe_with(0xA2, 5, 0, &["t"])]
    {
        let mut talk = Talk::session(addr, 5).await;
        talk.send(&bad).await;
        assert_eq!(talk.disconnects().await, Some(0x81), "{bad:02x?}");
    }
    server.shutdown().await;
}

//! MQTT's framing (3.1.1 and 5, section 2.2): the fixed header with its variable-length
//! remaining length, and length-prefixed strings; and its topic rules (4.7): which names a
//! push may go out on, and which subscriptions match them. What the MQTT door, the backend
//! API and the load tests' MQTT clients share; the packets themselves are theirs.

use bytes::BufMut;

/// Largest remaining length four variable-length bytes can say (2.2.3).
pub const MAX_REMAINING: usize = 268_435_455;

/// The MQTT 5 Authentication Method under which a client gives its token as Authentication
/// Data (at CONNECT and in a re-authentication's AUTH), and with which the gateway answers:
/// the same token a LOGIN carries, a JWT or an HMAC token.
pub const AUTH_METHOD: &str = "idlegate-token";

/// A fixed header that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MqttHeaderError {
    #[error("MQTT remaining length longer than four bytes")]
    LengthTooLong,
}

/// Where a packet's body starts and how long it is, from the fixed header at the front of
/// `src`; `None` until the whole header has arrived.
pub fn fixed_header(src: &[u8]) -> Result<Option<(usize, usize)>, MqttHeaderError> {
    let mut len = 0usize;
    for (i, &byte) in src.iter().skip(1).take(4).enumerate() {
        len |= usize::from(byte & 0x7F) << (7 * i);
        if byte & 0x80 == 0 {
            return Ok(Some((i + 2, len)));
        }
    }
    if src.len() >= 5 {
        return Err(MqttHeaderError::LengthTooLong);
    }
    Ok(None)
}

/// Bytes a variable-length integer of `value` takes.
pub fn varint_len(value: usize) -> usize {
    match value {
        0..=127 => 1,
        128..=16_383 => 2,
        16_384..=2_097_151 => 3,
        _ => 4,
    }
}

/// Bytes of a QoS 0 PUBLISH of `payload_len` bytes on a topic of `topic_len` bytes, whole:
/// what a client's Maximum Packet Size (MQTT 5, 3.1.2.11.4) is compared with.
pub fn publish_len(topic_len: usize, payload_len: usize, v5: bool) -> usize {
    let remaining = 2 + topic_len + usize::from(v5) + payload_len;
    1 + varint_len(remaining) + remaining
}

/// Control packet types: the high nibble of a fixed header's first byte (2.1.2). A
/// SUBSCRIBE's, an UNSUBSCRIBE's and a PUBREL's low nibble is 0b0010.
pub mod packet {
    pub const CONNECT: u8 = 0x10;
    pub const CONNACK: u8 = 0x20;
    pub const PUBLISH: u8 = 0x30;
    pub const PUBACK: u8 = 0x40;
    pub const SUBSCRIBE: u8 = 0x80;
    pub const SUBACK: u8 = 0x90;
    pub const UNSUBSCRIBE: u8 = 0xA0;
    pub const UNSUBACK: u8 = 0xB0;
    pub const PINGREQ: u8 = 0xC0;
    pub const PINGRESP: u8 = 0xD0;
    pub const DISCONNECT: u8 = 0xE0;
    /// MQTT 5 only.
    pub const AUTH: u8 = 0xF0;
}

/// CONNECT's protocol level for MQTT 3.1.1 (3.1.2.2).
pub const LEVEL_311: u8 = 4;

/// CONNECT's protocol level for MQTT 5.
pub const LEVEL_5: u8 = 5;

/// CONNECT flags (3.1.2.3).
pub mod connect_flags {
    pub const USERNAME: u8 = 0x80;
    pub const PASSWORD: u8 = 0x40;
    pub const WILL_RETAIN: u8 = 0x20;
    pub const WILL: u8 = 0x04;
    /// Clean Session (3.1.1), Clean Start (5).
    pub const CLEAN: u8 = 0x02;
}

/// What the first bytes of an MQTT stream say of its CONNECT's protocol level (3.1.2.2),
/// as far as they have arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectLevel {
    /// The level: 4 for 3.1.1, 5 for MQTT 5.
    Known(u8),
    /// Not there yet.
    Missing,
    /// The stream does not start with a CONNECT.
    NotMqtt,
}

/// The protocol level of the CONNECT at the front of `src` (fixed header, protocol name,
/// level), read before the whole packet has arrived.
pub fn connect_level(src: &[u8]) -> ConnectLevel {
    match src.first() {
        None => return ConnectLevel::Missing,
        Some(&first) if first != packet::CONNECT => return ConnectLevel::NotMqtt,
        Some(_) => {}
    }
    let at = match fixed_header(src) {
        Ok(Some((at, _))) => at,
        Ok(None) => return ConnectLevel::Missing,
        Err(_) => return ConnectLevel::NotMqtt,
    };
    let Some(name) = src.get(at..at + 2) else { return ConnectLevel::Missing };
    let level_at = at + 2 + usize::from(u16::from_be_bytes([name[0], name[1]]));
    match src.get(level_at) {
        Some(&level) => ConnectLevel::Known(level),
        None => ConnectLevel::Missing,
    }
}

/// Appends `value` as a variable-length integer (2.2.3; MQTT 5's property lengths too).
pub fn put_varint(out: &mut impl BufMut, mut value: usize) {
    debug_assert!(value <= MAX_REMAINING, "{value} needs more than four bytes");
    loop {
        let mut byte = (value % 128) as u8;
        value /= 128;
        if value > 0 {
            byte |= 0x80;
        }
        out.put_u8(byte);
        if value == 0 {
            break;
        }
    }
}

/// Appends a fixed header: the first byte (packet type and flags), then `len`.
pub fn put_fixed_header(out: &mut impl BufMut, first: u8, len: usize) {
    out.put_u8(first);
    put_varint(out, len);
}

/// Appends a string (or binary data) with its u16 length; the caller keeps it below 64 KiB.
pub fn put_str(out: &mut impl BufMut, s: &[u8]) {
    debug_assert!(s.len() <= usize::from(u16::MAX));
    out.put_u16(s.len() as u16);
    out.put_slice(s);
}

/// Longest topic name: a u16-prefixed string (1.5.3).
pub const MAX_TOPIC_BYTES: usize = u16::MAX as usize;

/// Why a string cannot be a topic name a message is published on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopicError {
    #[error("a topic name is at least one character")]
    Empty,
    #[error("a topic name is at most {MAX_TOPIC_BYTES} bytes")]
    TooLong,
    #[error("a topic name holds no wildcard ('+' or '#'): those are for subscriptions")]
    Wildcard,
    #[error("a topic name holds no NUL character")]
    Nul,
    #[error("a wildcard stands alone in its level ('+'), and '#' only in the last")]
    MisplacedWildcard,
}

/// Checks `name` as a topic a message may be published on (4.7.3): not empty, no
/// wildcards, no NUL, short enough for its length prefix.
pub fn check_topic_name(name: &str) -> Result<(), TopicError> {
    if name.is_empty() {
        return Err(TopicError::Empty);
    }
    if name.len() > MAX_TOPIC_BYTES {
        return Err(TopicError::TooLong);
    }
    if name.contains(['+', '#']) {
        return Err(TopicError::Wildcard);
    }
    if name.contains('\0') {
        return Err(TopicError::Nul);
    }
    Ok(())
}

/// Checks `filter` as a subscription's topic filter (4.7.1): not empty, no NUL, `+` alone
/// in its level, `#` alone in the last level.
pub fn check_topic_filter(filter: &str) -> Result<(), TopicError> {
    if filter.is_empty() {
        return Err(TopicError::Empty);
    }
    if filter.len() > MAX_TOPIC_BYTES {
        return Err(TopicError::TooLong);
    }
    if filter.contains('\0') {
        return Err(TopicError::Nul);
    }
    let levels: Vec<&str> = filter.split('/').collect();
    for (i, level) in levels.iter().enumerate() {
        let wild = level.contains(['+', '#']);
        let alone = *level == "+" || (*level == "#" && i + 1 == levels.len());
        if wild && !alone {
            return Err(TopicError::MisplacedWildcard);
        }
    }
    Ok(())
}

/// Whether `topic` matches the subscription `filter` by MQTT's rules (4.7): `+` one level,
/// `#` (last) the level it stands at and everything below; a topic starting with `$` is
/// matched by no filter starting with a wildcard.
pub fn topic_matches(topic: &str, filter: &str) -> bool {
    if topic.starts_with('$') && (filter.starts_with('+') || filter.starts_with('#')) {
        return false;
    }
    let mut levels = topic.split('/');
    let mut parts = filter.split('/').peekable();
    while let Some(part) = parts.next() {
        if part == "#" {
            return parts.peek().is_none();
        }
        match levels.next() {
            Some(level) if part == "+" || part == level => {}
            _ => return false,
        }
    }
    levels.next().is_none()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// MQTT 4.7, read plainly: level by level, recursively.
    fn plain(topic: &[&str], filter: &[&str]) -> bool {
        match (topic, filter) {
            (_, ["#"]) => true,
            ([], []) => true,
            ([level, rest @ ..], [part, more @ ..]) if *part == "+" || part == level => plain(rest, more),
            _ => false,
        }
    }

    fn levels() -> impl Strategy<Value = Vec<&'static str>> {
        proptest::collection::vec(prop_oneof![Just("a"), Just("b"), Just(""), Just("$s")], 1..5)
    }

    proptest! {
        #[test]
        fn filters_match_as_the_plain_reading_says(
            topic in levels(),
            filter in proptest::collection::vec(prop_oneof![Just("a"), Just("b"), Just(""), Just("+"), Just("$s")], 0..4),
            hash in any::<bool>(),
        ) {
            let mut filter = filter;
            if hash || filter.is_empty() {
                filter.push("#");
            }
            let (t, f) = (topic.join("/"), filter.join("/"));
            let dollar = t.starts_with('$') && (f.starts_with('+') || f.starts_with('#'));
            prop_assert_eq!(topic_matches(&t, &f), plain(&topic, &filter) && !dollar, "{} against {}", t, f);
        }
    }

    #[test]
    fn filters_match_by_mqtt_s_rules() {
        for (topic, filter, want) in [
            ("idlegate/push", "idlegate/push", true),
            ("idlegate/push", "idlegate/+", true),
            ("idlegate/push", "#", true),
            ("idlegate/push", "idlegate/#", true),
            ("idlegate", "idlegate/#", true),
            ("idlegate/push", "+/+", true),
            ("idlegate/push", "+", false),
            ("idlegate/push/x", "idlegate/+", false),
            ("idlegate/push", "idlegate/push/#", true),
            ("idlegate/push", "idlegate/pus", false),
            ("$SYS/x", "#", false),
            ("$SYS/x", "$SYS/#", true),
            ("a//b", "a/+/b", true),
        ] {
            assert_eq!(topic_matches(topic, filter), want, "{topic} against {filter}");
        }
    }

    #[test]
    fn a_connect_s_level_is_read_as_far_as_it_came() {
        // CONNECT, remaining length 16, "MQTT", level 5.
        let connect = [0x10, 16, 0, 4, b'M', b'Q', b'T', b'T', 5, 0x02, 0, 60, 0, 0, 0, 0, 0, 0];
        for cut in 0..connect.len() {
            let want = if cut > 8 { ConnectLevel::Known(5) } else { ConnectLevel::Missing };
            assert_eq!(connect_level(&connect[..cut]), want, "{cut} bytes");
        }
        assert_eq!(connect_level(b"GET / HTTP/1.1\r\n"), ConnectLevel::NotMqtt);
        assert_eq!(connect_level(&[0x10, 0xff, 0xff, 0xff, 0xff, 0x01]), ConnectLevel::NotMqtt);
    }

    #[test]
    fn a_publish_s_length_counts_its_header() {
        for (topic, payload) in [(1, 0), (1, 122), (1, 123), (10, 20_000), (3, 2_100_000)] {
            let mut out = Vec::new();
            let remaining = 2 + topic + 1 + payload;
            put_fixed_header(&mut out, 0x30, remaining);
            assert_eq!(publish_len(topic, payload, true), out.len() + remaining, "{topic} {payload}");
        }
    }

    #[test]
    fn topic_filters_hold_wildcards_only_as_whole_levels() {
        for good in ["a/b", "+", "#", "a/+/c", "a/#", "+/+/#", "/", "$SYS/#"] {
            assert_eq!(check_topic_filter(good), Ok(()), "{good}");
        }
        for bad in ["a/#/b", "a+", "a/b#", "#/a", "a/+b"] {
            assert_eq!(check_topic_filter(bad), Err(TopicError::MisplacedWildcard), "{bad}");
        }
        assert_eq!(check_topic_filter(""), Err(TopicError::Empty));
        assert_eq!(check_topic_filter("a\0"), Err(TopicError::Nul));
    }

    #[test]
    fn topic_names_refuse_wildcards_and_emptiness() {
        assert_eq!(check_topic_name("idlegate/push"), Ok(()));
        assert_eq!(check_topic_name("/"), Ok(()));
        assert_eq!(check_topic_name(""), Err(TopicError::Empty));
        assert_eq!(check_topic_name("a/+"), Err(TopicError::Wildcard));
        assert_eq!(check_topic_name("a/#"), Err(TopicError::Wildcard));
        assert_eq!(check_topic_name("a\0b"), Err(TopicError::Nul));
        assert_eq!(check_topic_name(&"x".repeat(MAX_TOPIC_BYTES + 1)), Err(TopicError::TooLong));
    }

    #[test]
    fn remaining_lengths_round_trip_at_every_width() {
        for len in [0, 127, 128, 16_383, 16_384, 2_097_151, 2_097_152, MAX_REMAINING] {
            let mut out = Vec::new();
            put_fixed_header(&mut out, 0x30, len);
            assert_eq!(fixed_header(&out), Ok(Some((out.len(), len))), "{len}");
            assert_eq!(fixed_header(&out[..out.len() - 1]), Ok(None), "{len} cut short");
        }
        assert_eq!(fixed_header(&[0x30, 0xC1, 0x02]), Ok(Some((3, 321))));
        assert_eq!(fixed_header(&[0x30, 0xff, 0xff, 0xff, 0xff, 0x01]), Err(MqttHeaderError::LengthTooLong));
    }
}

//! MQTT's framing (3.1.1 and 5, section 2.2): the fixed header with its variable-length
//! remaining length, and length-prefixed strings. What the MQTT door and the load tests'
//! MQTT clients share; the packets themselves are theirs.

use bytes::BufMut;

/// Largest remaining length four variable-length bytes can say (2.2.3).
pub const MAX_REMAINING: usize = 268_435_455;

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

#[cfg(test)]
mod tests {
    use super::*;

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

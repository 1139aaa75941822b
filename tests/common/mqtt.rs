//! MQTT packets as the tests write them out by hand, from the specifications' figures.

/// A packet: its first byte, its remaining length as MQTT's variable-length integer (MQTT
/// 3.1.1 §2.2.3, MQTT 5 §1.5.5), then `body`.
pub fn packet(first: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![first];
    let mut len = body.len();
    loop {
        let byte = (len % 128) as u8;
        len /= 128;
        out.push(if len > 0 { byte | 0x80 } else { byte });
        if len == 0 {
            break;
        }
    }
    out.extend_from_slice(body);
    out
}

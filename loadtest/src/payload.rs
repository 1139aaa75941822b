//! The byte layouts of the payloads the harness sends: a client's DATA (whose it is, and
//! which), a backend's push (which, and when it was sent). Both ends of the harness read
//! them, so they sit below both.

/// The payload of DATA frame number `seq` of the client `key` names (`--uid-base` plus its
/// index: its uid without devices): both, big-endian, so the event check can tell every
/// frame apart, whichever device sent it, and see them in order.
pub fn data_payload(key: u64, seq: u64) -> [u8; 16] {
    let mut p = [0u8; 16];
    p[..8].copy_from_slice(&key.to_be_bytes());
    p[8..].copy_from_slice(&seq.to_be_bytes());
    p
}

/// The payload of push `id` sent `nanos` after the run's epoch: both, big-endian.
pub fn push_payload(id: u64, nanos: u64) -> [u8; 16] {
    let mut p = [0u8; 16];
    p[..8].copy_from_slice(&id.to_be_bytes());
    p[8..].copy_from_slice(&nanos.to_be_bytes());
    p
}

/// The id and send time a push payload carries, if it is one of ours.
pub fn parse_push(payload: &[u8]) -> Option<(u64, u64)> {
    let id = u64::from_be_bytes(payload.get(..8)?.try_into().ok()?);
    let nanos = u64::from_be_bytes(payload.get(8..16)?.try_into().ok()?);
    (payload.len() == 16).then_some((id, nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_payloads_round_trip_and_foreign_ones_are_refused() {
        assert_eq!(parse_push(&push_payload(7, 123)), Some((7, 123)));
        assert_eq!(parse_push(b"short"), None);
        assert_eq!(parse_push(&[0u8; 17]), None);
    }
}

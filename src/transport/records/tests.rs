//! The record limits, which no real session reaches in a test's time: a handshake in
//! memory between rustls's client and the door's layer, then a limit of a few records.

use std::sync::Arc;

use rustls::crypto::ring::{cipher_suite, default_provider};
use rustls::ClientConnection;

use super::*;
use crate::transport::connection::Layer;
use crate::transport::tls::Tls;

#[path = "../../../tests/common/tls_configs.rs"]
mod tls_configs;

/// A client and the door's layer with the handshake done under `suite`.
fn session(suite: SupportedCipherSuite) -> (ClientConnection, Tls) {
    let (mut client, mut tls) = handshake_until_finished(suite);
    let (tickets, _) = exchange(&mut client, &mut tls);
    client_reads(&mut client, &tickets).unwrap();
    assert!(matches!(tls, Tls::Records(_)), "the layer holds the keys");
    (client, tls)
}

/// A client of `suite` and the door's layer, before either has said a word.
fn pair(suite: SupportedCipherSuite) -> (ClientConnection, Tls) {
    let (server, client) = tls_configs::configs(suite);
    let client = ClientConnection::new(Arc::new(client), "localhost".try_into().unwrap()).unwrap();
    (client, Tls::new(Arc::new(server), None).unwrap())
}

/// Hands the client's pending bytes to the layer: what the layer answers, and the
/// plaintext it opened.
fn exchange(client: &mut ClientConnection, tls: &mut Tls) -> (BytesMut, BytesMut) {
    let mut raw = Vec::new();
    while client.wants_write() {
        client.write_tls(&mut raw).unwrap();
    }
    let (mut raw, mut plain, mut wire) = (BytesMut::from(&raw[..]), BytesMut::new(), BytesMut::new());
    tls.open(&mut raw, &mut plain, &mut wire).unwrap();
    assert!(raw.is_empty(), "every whole record taken");
    (wire, plain)
}

/// What the client reads from `wire`: its plaintext, or the error that ended it.
fn client_reads(client: &mut ClientConnection, wire: &[u8]) -> Result<Vec<u8>, rustls::Error> {
    let mut wire = wire;
    while !wire.is_empty() {
        client.read_tls(&mut wire).unwrap();
        client.process_new_packets()?;
    }
    let mut plain = Vec::new();
    let _ = std::io::Read::read_to_end(&mut client.reader(), &mut plain);
    Ok(plain)
}

/// The client's Finished and its KeyUpdate asking for ours, in one write: rustls must
/// stop at the Finished, so that the KeyUpdate reaches the records' layer and is
/// answered there. Handed both, rustls answered it itself, parked the answer where the
/// hand-over dropped it, and the gateway then sealed under keys the client was never told
/// of (issue 34).
#[test]
fn a_key_update_in_the_read_that_ends_the_handshake_is_answered() {
    let suite = cipher_suite::TLS13_AES_128_GCM_SHA256;
    let (mut client, mut tls) = handshake_until_finished(suite);
    assert!(!client.is_handshaking() && !matches!(tls, Tls::Records(_)), "the Finished not yet sent");
    client.refresh_traffic_keys().unwrap();
    std::io::Write::write_all(&mut client.writer(), b"ping").unwrap();
    let (answer, plain) = exchange(&mut client, &mut tls);
    assert_eq!(&plain[..], b"ping");
    assert!(matches!(tls, Tls::Records(_)));
    let mut wire = answer;
    tls.seal(b"pong", &mut wire).unwrap();
    assert_eq!(client_reads(&mut client, &wire).unwrap(), b"pong");
}

/// The contract with rustls's hand-over (`dangerous_into_kernel_connection`, which this
/// layer pins rustls's version for): the keys handed over are the client's, each
/// direction's sequence number counts the records already sent under them, and nothing
/// rustls queued is lost. A rustls that changed any of it fails here, not in the field.
#[test]
fn the_hand_over_keeps_rustls_keys_and_sequence_numbers() {
    // Every suite the test's ECDSA certificate can serve.
    let suites = default_provider().cipher_suites.into_iter().filter(|s| !format!("{:?}", s.suite()).contains("RSA"));
    for suite in suites {
        let (mut client, mut tls) = handshake_until_finished(suite);
        let (after, _) = exchange(&mut client, &mut tls);
        // What rustls sent after the client's Finished: TLS 1.3's tickets, or nothing.
        let mut records = 0;
        let mut rest = &after[..];
        while rest.len() >= HEADER {
            records += 1;
            rest = &rest[HEADER + usize::from(u16::from_be_bytes([rest[3], rest[4]]))..];
        }
        client_reads(&mut client, &after).unwrap();
        let Tls::Records(layer) = &tls else { panic!("{suite:?}: not handed over") };
        let secrets = client.dangerous_extract_secrets().unwrap();
        let (client_tx, client_rx) = (Keys::new(secrets.tx).unwrap(), Keys::new(secrets.rx).unwrap());
        let tls13 = suite.tls13().is_some();
        for (ours, theirs, what) in
            [(&layer.rx, &client_tx, "client to server"), (&layer.tx, &client_rx, "server to client")]
        {
            assert_eq!(ours.cipher, theirs.cipher, "{suite:?} {what}");
            assert_eq!(ours.key, theirs.key, "{suite:?} {what}: the key");
            assert_eq!(ours.iv, theirs.iv, "{suite:?} {what}: the IV");
            assert_eq!(ours.seq, theirs.seq, "{suite:?} {what}: the sequence number");
        }
        // TLS 1.2 counts the Finished under the traffic keys; TLS 1.3's keys are new.
        assert_eq!(layer.rx.seq, u64::from(!tls13), "{suite:?}");
        assert_eq!(layer.tx.seq, if tls13 { records } else { 1 }, "{suite:?}");
    }
}

/// The door's layer and a client under `suite`, the client holding its last flight.
fn handshake_until_finished(suite: SupportedCipherSuite) -> (ClientConnection, Tls) {
    let (mut client, mut tls) = pair(suite);
    for _ in 0..8 {
        let (wire, _) = exchange(&mut client, &mut tls);
        client.read_tls(&mut &wire[..]).unwrap();
        client.process_new_packets().unwrap();
        if !client.is_handshaking() {
            return (client, tls);
        }
    }
    panic!("the handshake did not finish");
}

/// Records of `content_type`, one per payload, sealed as the client would (its keys
/// are the layer's receive keys), for what rustls's client API cannot send.
fn sealed_by_client(records: &mut Records, content_type: u8, payloads: &[&[u8]]) -> BytesMut {
    let mut sent = BytesMut::new();
    let next = records.rx.seq;
    std::mem::swap(&mut records.tx, &mut records.rx);
    for payload in payloads {
        records.seal_record(content_type, payload, &mut sent);
    }
    std::mem::swap(&mut records.tx, &mut records.rx);
    records.rx.seq = next;
    sent
}

fn limit(tls: &mut Tls, records: u64) {
    let Tls::Records(r) = tls else { panic!("the handshake is over") };
    r.limit = records;
}

#[test]
fn tls13_changes_its_keys_at_the_limit_and_the_client_follows() {
    for suite in [cipher_suite::TLS13_AES_128_GCM_SHA256, cipher_suite::TLS13_CHACHA20_POLY1305_SHA256] {
        let (mut client, mut tls) = session(suite);
        limit(&mut tls, 2);
        let mut wire = BytesMut::new();
        for i in 0..7u8 {
            tls.seal(&[b'a' + i], &mut wire).unwrap();
        }
        // Seven records under keys that change every two: three KeyUpdates among them.
        assert_eq!(client_reads(&mut client, &wire).unwrap(), b"abcdefg", "{suite:?}");
        // The client's own records still open: its keys never changed.
        std::io::Write::write_all(&mut client.writer(), b"up").unwrap();
        assert_eq!(&exchange(&mut client, &mut tls).1[..], b"up");
    }
}

#[test]
fn tls12_ends_the_session_at_the_limit_with_close_notify() {
    let (mut client, mut tls) = session(cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256);
    limit(&mut tls, 2);
    let mut wire = BytesMut::new();
    tls.seal(b"a", &mut wire).unwrap();
    let (reason, why) = tls.seal(b"b", &mut wire).unwrap_err();
    assert_eq!(reason, crate::proto::CloseReason::ProtocolError);
    assert!(why.contains("record limit"), "{why}");
    // What went out: the first record, then close_notify, both readable.
    assert_eq!(client_reads(&mut client, &wire).unwrap(), b"a");
    assert!(client.process_new_packets().unwrap().peer_has_closed());
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// Whatever bytes arrive after the handshake, in whatever pieces, the layer answers
    /// with plaintext, a wait for more, or an error with its alert: never a panic, and
    /// after an error nothing more is sealed.
    #[test]
    fn any_bytes_after_the_handshake_get_an_answer_not_a_panic(
        tls13 in proptest::bool::ANY,
        chunks in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..64), 1..8),
        header in proptest::collection::vec(proptest::num::u8::ANY, 5),
    ) {
        let suite = if tls13 { cipher_suite::TLS13_AES_128_GCM_SHA256 } else { cipher_suite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256 };
        let (_client, mut tls) = session(suite);
        let (mut raw, mut plain, mut wire) = (BytesMut::new(), BytesMut::new(), BytesMut::new());
        // A plausible header first, so the bodies reach the AEAD, not only the length check.
        raw.extend_from_slice(&[APPLICATION_DATA, 3, 3, header[3] % 2, header[4]]);
        for chunk in chunks {
            raw.extend_from_slice(&chunk);
            if tls.open(&mut raw, &mut plain, &mut wire).is_err() {
                proptest::prop_assert!(tls.seal(b"x", &mut BytesMut::new()).is_err());
                break;
            }
        }
    }
}

/// rustls's client asks for a key update each time; the layer takes 32 in a row,
/// answering the requests of one read with one KeyUpdate, ends the session at the 33rd,
/// and counts afresh after application data (issue 34: 10,000 in a row were each
/// answered).
#[test]
fn a_flood_of_key_updates_ends_the_session_and_data_resets_the_count() {
    let (mut client, mut tls) = session(cipher_suite::TLS13_AES_128_GCM_SHA256);
    for _ in 0..MAX_KEY_UPDATES {
        client.refresh_traffic_keys().unwrap();
    }
    let (answers, _) = exchange(&mut client, &mut tls);
    // One record: a 5-byte header, the 5-byte KeyUpdate, its content type, a 16-byte tag.
    assert_eq!(answers.len(), HEADER + KEY_UPDATE_LEN + 1 + TAG, "one answer for the read's 32 requests");
    client_reads(&mut client, &answers).unwrap();
    std::io::Write::write_all(&mut client.writer(), b"data").unwrap();
    assert_eq!(&exchange(&mut client, &mut tls).1[..], b"data", "the count starts again after data");
    for _ in 0..=MAX_KEY_UPDATES {
        client.refresh_traffic_keys().unwrap();
    }
    let mut raw = Vec::new();
    while client.wants_write() {
        client.write_tls(&mut raw).unwrap();
    }
    let (mut raw, mut plain, mut wire) = (BytesMut::from(&raw[..]), BytesMut::new(), BytesMut::new());
    let e = tls.open(&mut raw, &mut plain, &mut wire).unwrap_err();
    assert!(e.1.contains("KeyUpdates"), "{e:?}");
    assert_eq!(
        client_reads(&mut client, &wire).unwrap_err(),
        rustls::Error::AlertReceived(rustls::AlertDescription::UnexpectedMessage)
    );
}

/// A TLS 1.3 record whose data fits 16 KiB but whose padding takes its inner plaintext
/// past 2^14 + 1 bytes: record_overflow, as rustls answers (the padding went uncounted).
/// Sealed with ring under the client's keys, around what the layer's own sealing
/// refuses to write.
#[test]
fn tls13_padding_counts_against_the_record_limit() {
    let (_client, mut tls) = session(cipher_suite::TLS13_AES_128_GCM_SHA256);
    let Tls::Records(records) = &mut tls else { panic!() };
    let mut inner = vec![b'x'; MAX_PLAINTEXT];
    inner.extend_from_slice(&[APPLICATION_DATA, 0]);
    let len = (inner.len() + TAG) as u16;
    let header = [APPLICATION_DATA, 3, 3, (len >> 8) as u8, len as u8];
    let nonce = Nonce::assume_unique_for_key(records.rx.nonce());
    records.rx.aead().seal_in_place_append_tag(nonce, Aad::from(header), &mut inner).unwrap();
    let mut raw = BytesMut::from(&header[..]);
    raw.extend_from_slice(&inner);
    let (mut plain, mut wire) = (BytesMut::new(), BytesMut::new());
    let e = records.open(&mut raw, &mut plain, &mut wire).unwrap_err();
    assert_eq!(e.alert, Some(RECORD_OVERFLOW), "{e}");
    assert!(plain.is_empty());
}

/// After our close_notify nothing more goes out, not even the KeyUpdate a client asks
/// for before it closes too.
#[test]
fn nothing_is_sealed_after_our_close() {
    let (mut client, mut tls) = session(cipher_suite::TLS13_AES_128_GCM_SHA256);
    let mut closing = BytesMut::new();
    tls.finish(&mut closing);
    assert!(!closing.is_empty(), "close_notify");
    client.refresh_traffic_keys().unwrap();
    let (answer, _) = exchange(&mut client, &mut tls);
    assert!(answer.is_empty(), "{} bytes after our close_notify", answer.len());
}

/// A TLS 1.2 handshake record after the handshake (a renegotiation) ends the session with
/// a fatal unexpected_message, not a fatal no_renegotiation, which RFC 5246 §7.2.2 makes
/// a warning.
#[test]
fn a_tls12_renegotiation_gets_a_fatal_unexpected_message() {
    let (mut client, mut tls) = session(cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256);
    let Tls::Records(records) = &mut tls else { panic!() };
    // A ClientHello's first bytes: what matters is the record's content type.
    let mut sent = sealed_by_client(records, HANDSHAKE, &[&[1, 0, 0, 0]]);
    let (mut plain, mut wire) = (BytesMut::new(), BytesMut::new());
    let e = records.open(&mut sent, &mut plain, &mut wire).unwrap_err();
    assert_eq!(e.alert, Some(UNEXPECTED_MESSAGE), "{e}");
    assert_eq!(
        client_reads(&mut client, &wire).unwrap_err(),
        rustls::Error::AlertReceived(rustls::AlertDescription::UnexpectedMessage)
    );
}

/// Warning alerts, sealed as the client would: four are taken, the fifth ends the session.
#[test]
fn more_than_four_warning_alerts_end_the_session() {
    let (_client, mut tls) = session(cipher_suite::TLS13_AES_128_GCM_SHA256);
    let Tls::Records(records) = &mut tls else { panic!() };
    let warnings = vec![&[WARNING, USER_CANCELED][..]; usize::from(MAX_WARNING_ALERTS) + 1];
    let mut sent = sealed_by_client(records, ALERT, &warnings);
    let (mut plain, mut wire) = (BytesMut::new(), BytesMut::new());
    let e = records.open(&mut sent, &mut plain, &mut wire).unwrap_err();
    assert_eq!(e.alert, Some(UNEXPECTED_MESSAGE), "{e}");
}

#[test]
fn a_key_update_with_an_unknown_request_gets_illegal_parameter() {
    let (mut client, mut tls) = session(cipher_suite::TLS13_AES_128_GCM_SHA256);
    let Tls::Records(records) = &mut tls else { panic!() };
    // A KeyUpdate with request_update 7.
    let mut sent = sealed_by_client(records, HANDSHAKE, &[&[KEY_UPDATE, 0, 0, 1, 7]]);
    let (mut plain, mut wire) = (BytesMut::new(), BytesMut::new());
    let e = records.open(&mut sent, &mut plain, &mut wire).unwrap_err();
    assert_eq!(e.alert, Some(ILLEGAL_PARAMETER), "{e}");
    assert_eq!(
        client_reads(&mut client, &wire).unwrap_err(),
        rustls::Error::AlertReceived(rustls::AlertDescription::IllegalParameter)
    );
}

/// A client's sequence numbers never wrap: past rustls's hard limit the session ends
/// instead of opening a record under a nonce used before (the counter was unchecked).
#[test]
fn the_clients_sequence_number_never_wraps() {
    let (_client, mut tls) = session(cipher_suite::TLS13_AES_128_GCM_SHA256);
    let Tls::Records(records) = &mut tls else { panic!() };
    records.rx.seq = SEQ_HARD_LIMIT - 1;
    let mut sent = sealed_by_client(records, APPLICATION_DATA, &[b"last"]);
    let (mut plain, mut wire) = (BytesMut::new(), BytesMut::new());
    let e = records.open(&mut sent, &mut plain, &mut wire).unwrap_err();
    assert_eq!(e.alert, Some(INTERNAL_ERROR), "{e}");
}

/// Our own counter changes keys before rustls's soft limit even where the suite sets no
/// confidentiality limit (ChaCha20-Poly1305's is u64::MAX).
#[test]
fn every_suite_changes_keys_before_the_counters_soft_limit() {
    for suite in [cipher_suite::TLS13_CHACHA20_POLY1305_SHA256, cipher_suite::TLS13_AES_256_GCM_SHA384] {
        let (_client, tls) = session(suite);
        let Tls::Records(records) = &tls else { panic!() };
        assert!(records.limit <= SEQ_SOFT_LIMIT, "{suite:?}: {}", records.limit);
    }
}

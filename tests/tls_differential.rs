//! The TLS door's record layer against rustls's own, record for record.
//!
//! Two sessions, one handshake each with the same server configuration: the door's layer
//! (rustls's handshake, then the hand-over to `src/transport/records.rs`), and rustls's
//! `ServerConnection`, whose record layer never hands over. A raw client
//! (`common/raw_tls.rs`: rustls's client for the handshake, then ring under the logged
//! keys) seals one generated stream of records for each, under each session's keys: valid
//! data, empty records, padding, records too long, tags that do not verify, wrong and
//! unknown content types, other header versions, alerts of every level, KeyUpdates single,
//! repeated, unknown and split over two records, other handshake messages, bytes outside
//! any record's protection; delivered to both at the same split points. Both must give the
//! same plaintext, end the same way (still open, closed by the client's close_notify, or
//! failed with the same alert), and agree on key updates: where one answers the client's
//! request, so does the other, and data sent afterwards reads under the keys the client
//! then holds. Where the door's layer answers otherwise on purpose, [`DEVIATIONS`] names
//! the case and the RFC that allows it; nothing else may differ.
//!
//! Proptest runs a few hundred streams in `cargo test`, with its failures kept in
//! `tests/tls_differential.proptest-regressions`; `fuzz/` runs the same comparison for as
//! long as one likes (docs/SECURITY.md says how).

mod common;

use std::io::Read;
use std::sync::Arc;

use bytes::BytesMut;
use common::raw_tls::{Heard, RawClient, Record, ALERT, APPLICATION_DATA, CHANGE_CIPHER_SPEC, HANDSHAKE, KEY_UPDATE};
use idlegate::conformance::ServerLayer;
use proptest::prelude::*;
use rustls::crypto::ring::{cipher_suite, default_provider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, ServerConfig, SupportedCipherSuite};

const CERT: &[u8] = include_bytes!("data/records-cert.pem");
const KEY: &[u8] = include_bytes!("data/records-key.pem");

/// The alert a policy limit ends a session with (RFC 8446 §6).
const UNEXPECTED_MESSAGE: u8 = 10;
const DECODE_ERROR: u8 = 50;
const BAD_RECORD_MAC: u8 = 20;
const RECORD_OVERFLOW: u8 = 22;

/// Every suite the door offers.
const SUITES: [SupportedCipherSuite; 6] = [
    cipher_suite::TLS13_AES_128_GCM_SHA256,
    cipher_suite::TLS13_AES_256_GCM_SHA384,
    cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
    cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    cipher_suite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
];

/// Where the door's layer answers otherwise than rustls on purpose. The comparison below
/// lets exactly these through; each names its case and what allows it.
pub const DEVIATIONS: &[(&str, &str)] = &[
    (
        "past a limit rustls keeps against floods (32 KeyUpdates without data, 4 warning alerts, 32 \
         empty records) it closes without an alert; the door sends a fatal unexpected_message",
        "RFC 8446 §6.2: an implementation that meets a fatal error SHOULD send a fatal alert",
    ),
    (
        "when a KeyUpdate asks for ours, ours goes out at once, one per read that holds requests; \
         rustls parks one and sends it before its next data",
        "RFC 8446 §4.6.3: the answer must come before the next application data, no sooner",
    ),
    (
        "a handshake record holding anything but one whole KeyUpdate after the handshake (a \
         renegotiation, a Finished, an empty fragment, part of a message, garbage) gets \
         unexpected_message unparsed; rustls parses it first and answers decode_error when its \
         body is malformed, or waits for the rest of a message begun",
        "RFC 8446 §6.2 and RFC 5246 §7.2.2: unexpected_message, an inappropriate message, which any \
         handshake message but KeyUpdate is there, well-formed or not",
    ),
    (
        "a record of a type the version does not send after the handshake (TLS 1.3: any outer \
         type but application_data; TLS 1.2: change_cipher_spec; either: a type no RFC defines) \
         gets unexpected_message; rustls answers decode_error for types it does not know or \
         cannot parse there, and bad_record_mac for those it tries to decrypt",
        "RFC 8446 §5 and RFC 5246 §6: an unexpected record type MUST get unexpected_message",
    ),
    (
        "a header announcing more than the version allows (2^14 + 256 bytes under TLS 1.3, \
         2^14 + 2048 under 1.2) gets record_overflow at once; rustls answers decode_error from \
         18,432 bytes on (TLS 1.2 allows exactly that many) and, under TLS 1.3, waits for the \
         body of a shorter one",
        "RFC 8446 §5.2 and RFC 5246 §6.2.3: a record over the length MUST get record_overflow",
    ),
    (
        "under TLS 1.3, a warning alert other than close_notify and user_canceled ends the \
         session as the client's error alert, with no answer; rustls answers decode_error",
        "RFC 8446 §6: such alerts MUST be treated as error alerts whatever their level, and \
         §6.2: no alert is sent back for a received error alert",
    ),
    (
        "a KeyUpdate split over two records ends the session with unexpected_message; rustls joins it",
        "RFC 8446 §5.1 lets a handshake message span records; no TLS library sends a 5-byte \
         message in pieces, and refusing it keeps the layer free of a join buffer",
    ),
];

/// One step of a generated stream, sealed as the raw client would.
#[derive(Clone, Debug)]
enum Op {
    Data(Vec<u8>),
    /// Application data of no bytes.
    Empty,
    /// A KeyUpdate with this `request_update` (0 and 1 are valid); the client's keys move on
    /// after a valid one.
    KeyUpdate(u8),
    /// KeyUpdate(update_requested), its 5 bytes over two handshake records.
    SplitKeyUpdate,
    Alert(u8, u8),
    /// A handshake message other than KeyUpdate (a ClientHello's start, a Finished).
    Handshake(Vec<u8>),
    /// Data with this many zeros of TLS 1.3 padding.
    Padded(Vec<u8>, usize),
    /// Data of 16 KiB and this many bytes more.
    Oversize(usize),
    BadTag,
    /// Data under this outer content type (TLS 1.3), or this type for the record (1.2).
    Outer(u8),
    /// Data with this header version.
    Version([u8; 2]),
    /// A TLS 1.3 record whose inner plaintext is all zeros.
    NoType,
    /// A protected record of this (inner) content type: change_cipher_spec, heartbeat,
    /// unknown ones.
    Inner(u8, Vec<u8>),
    /// Bytes outside any protection: a plaintext alert, a change_cipher_spec, garbage.
    Raw(Vec<u8>),
}

fn seal(client: &mut RawClient, op: &Op) -> Vec<u8> {
    let data = |payload: &[u8]| Record::new(APPLICATION_DATA, payload.to_vec());
    match op {
        Op::Data(payload) => client.seal(&data(payload)),
        Op::Empty => client.seal(&data(&[])),
        Op::KeyUpdate(request) => {
            let sealed = client.seal(&Record::new(HANDSHAKE, vec![KEY_UPDATE, 0, 0, 1, *request]));
            if client.tls13 && *request <= 1 {
                client.tx.update();
            }
            sealed
        }
        Op::SplitKeyUpdate => {
            let mut sealed = client.seal(&Record::new(HANDSHAKE, vec![KEY_UPDATE, 0, 0]));
            sealed.extend(client.seal(&Record::new(HANDSHAKE, vec![1, 1])));
            if client.tls13 {
                client.tx.update();
            }
            sealed
        }
        Op::Alert(level, description) => client.seal(&Record::new(ALERT, vec![*level, *description])),
        Op::Handshake(message) => client.seal(&Record::new(HANDSHAKE, message.clone())),
        Op::Padded(payload, padding) => client.seal(&Record { padding: *padding, ..data(payload) }),
        Op::Oversize(extra) => client.seal(&data(&vec![b'o'; 16 * 1024 + extra])),
        Op::BadTag => client.seal(&Record { bad_tag: true, ..data(b"forged") }),
        Op::Outer(outer) => client.seal(&Record { outer: Some(*outer), ..data(b"outer") }),
        Op::Version(version) => client.seal(&Record { version: *version, ..data(b"version") }),
        Op::NoType => client.seal(&Record { no_type: true, padding: 3, ..data(&[]) }),
        Op::Inner(typ, payload) => client.seal(&Record::new(*typ, payload.clone())),
        Op::Raw(bytes) => bytes.clone(),
    }
}

/// How a session stands after the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    Open,
    /// The client's close_notify was taken.
    Closed,
    /// The session failed; the alert the client heard, if any.
    Failed(Option<u8>),
}

/// A server session fed bytes: the door's layer or rustls's own.
trait Server {
    /// Takes `bytes`: (plaintext, what it wrote back, how it stands).
    fn feed(&mut self, bytes: &[u8]) -> (Vec<u8>, Vec<u8>, End);
    /// Sends `data` as application data.
    fn send(&mut self, data: &[u8]) -> Vec<u8>;
}

struct Door {
    layer: ServerLayer,
    raw: BytesMut,
    end: End,
}

impl Server for Door {
    fn feed(&mut self, bytes: &[u8]) -> (Vec<u8>, Vec<u8>, End) {
        let (mut plain, mut wire) = (BytesMut::new(), BytesMut::new());
        if self.end == End::Open {
            self.raw.extend_from_slice(bytes);
            self.end = match self.layer.open(&mut self.raw, &mut plain, &mut wire) {
                Ok(false) => End::Open,
                Ok(true) => End::Closed,
                Err(_) => End::Failed(None),
            };
        }
        (plain.to_vec(), wire.to_vec(), self.end)
    }

    fn send(&mut self, data: &[u8]) -> Vec<u8> {
        let mut wire = BytesMut::new();
        self.layer.seal(data, &mut wire).expect("the session is open");
        wire.to_vec()
    }
}

struct Rustls {
    conn: rustls::ServerConnection,
    end: End,
}

impl Server for Rustls {
    fn feed(&mut self, mut bytes: &[u8]) -> (Vec<u8>, Vec<u8>, End) {
        let mut plain = Vec::new();
        while self.end == End::Open && !bytes.is_empty() {
            match self.conn.read_tls(&mut bytes) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            match self.conn.process_new_packets() {
                Ok(state) => {
                    let mut buf = vec![0; state.plaintext_bytes_to_read()];
                    self.conn.reader().read_exact(&mut buf).unwrap();
                    plain.extend(buf);
                    if state.peer_has_closed() {
                        self.end = End::Closed;
                    }
                }
                Err(_) => {
                    // What the records before the failing one carried (the door's layer
                    // opens them too; which a connection then reads is its own matter).
                    let mut buf = [0; 4096];
                    while let Ok(n @ 1..) = self.conn.reader().read(&mut buf) {
                        plain.extend_from_slice(&buf[..n]);
                    }
                    self.end = End::Failed(None);
                }
            }
        }
        let mut wire = Vec::new();
        while self.conn.wants_write() {
            self.conn.write_tls(&mut wire).unwrap();
        }
        (plain, wire, self.end)
    }

    fn send(&mut self, data: &[u8]) -> Vec<u8> {
        std::io::Write::write_all(&mut self.conn.writer(), data).unwrap();
        let mut wire = Vec::new();
        while self.conn.wants_write() {
            self.conn.write_tls(&mut wire).unwrap();
        }
        wire
    }
}

fn configs(suite: SupportedCipherSuite) -> (Arc<ServerConfig>, ClientConfig) {
    let cert = CertificateDer::from_pem_slice(CERT).unwrap();
    let provider = Arc::new(rustls::crypto::CryptoProvider { cipher_suites: vec![suite], ..default_provider() });
    let versions = [suite.version()];
    let mut server = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], PrivateKeyDer::from_pem_slice(KEY).unwrap())
        .unwrap();
    server.enable_secret_extraction = true;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).unwrap();
    let client = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&versions)
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    (Arc::new(server), client)
}

/// What one session made of the stream.
#[derive(Debug)]
struct Outcome {
    plain: Vec<u8>,
    end: End,
    /// KeyUpdates the client heard before the data sent last (if the session stayed open).
    key_updates: usize,
    /// The data sent at the end, as the client read it.
    last: Option<Heard>,
    /// Everything the client heard but data and tickets, for the failure's message.
    #[allow(dead_code)] // read through Debug
    heard: Vec<Heard>,
}

fn run(server: &mut dyn Server, suite: SupportedCipherSuite, ops: &[Op], cuts: &[usize]) -> Outcome {
    let (_, client_config) = configs(suite);
    let mut client = RawClient::handshake(&client_config, &mut |bytes| server.feed(bytes).1);
    let mut stream = Vec::new();
    for op in ops {
        stream.extend(seal(&mut client, op));
    }
    let mut heard = Vec::new();
    let (mut plain, mut end) = (Vec::new(), End::Open);
    let mut at = 0;
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (stream.len() + 1)).chain([stream.len()]).collect();
    cuts.sort_unstable();
    for cut in cuts {
        let (p, wire, e) = server.feed(&stream[at..cut]);
        at = cut;
        plain.extend(p);
        heard.extend(client.read(&wire));
        end = e;
    }
    if let End::Failed(_) = end {
        let alert = heard.iter().rev().find_map(|h| match h {
            Heard::Alert(2, description) => Some(*description),
            _ => None,
        });
        end = End::Failed(alert);
    }
    let mut last = None;
    if end == End::Open {
        let wire = server.send(b"end");
        heard.extend(client.read(&wire));
        last = heard.last().cloned();
    }
    let key_updates = heard.iter().filter(|h| matches!(h, Heard::KeyUpdate(_))).count();
    heard.retain(|h| !matches!(h, Heard::Handshake(_) | Heard::Data(_)));
    Outcome { plain, end, key_updates, last, heard }
}

/// The door's layer and rustls over the same stream; `Err` says how they differ.
fn compare(suite: SupportedCipherSuite, ops: &[Op], cuts: &[usize]) -> Result<(), String> {
    let (config, _) = configs(suite);
    let door = Door { layer: ServerLayer::new(config.clone()).unwrap(), raw: BytesMut::new(), end: End::Open };
    let door = run(&mut { door }, suite, ops, cuts);
    let rustls = Rustls { conn: rustls::ServerConnection::new(config).unwrap(), end: End::Open };
    let reference = run(&mut { rustls }, suite, ops, cuts);
    let tls13 = suite.tls13().is_some();
    let has = |f: &dyn Fn(&Op) -> bool| ops.iter().any(f);
    let max = if tls13 { 16 * 1024 + 256 } else { 16 * 1024 + 2048 };
    let (d, r) = (door.end, reference.end);
    let unexpected = d == End::Failed(Some(UNEXPECTED_MESSAGE));
    // The entries of DEVIATIONS that may have ended the door's session where rustls's read
    // on or answered otherwise, each by the ops that lead to it and the end it gives.
    let deviations = [
        unexpected && r == End::Failed(None),
        false, // the count of KeyUpdate answers: checked below
        unexpected && has(&|op| matches!(op, Op::Handshake(_))),
        unexpected
            && has(&|op| match op {
                Op::Outer(t) => *t != APPLICATION_DATA,
                Op::Inner(t, _) => ![ALERT, HANDSHAKE, APPLICATION_DATA].contains(t),
                Op::Raw(_) => true,
                _ => false,
            }),
        matches!(d, End::Open | End::Failed(Some(RECORD_OVERFLOW)))
            && matches!(r, End::Open | End::Failed(Some(DECODE_ERROR)))
            && has(&|op| match op {
                Op::Raw(bytes) => {
                    bytes.len() >= 5 && {
                        let len = usize::from(u16::from_be_bytes([bytes[3], bytes[4]]));
                        len > max || len >= 16 * 1024 + 2048
                    }
                }
                _ => false,
            }),
        tls13 && d == End::Failed(None) && has(&|op| matches!(op, Op::Alert(1, d) if *d != 0 && *d != 90)),
        tls13 && unexpected && has(&|op| matches!(op, Op::SplitKeyUpdate)),
    ];
    debug_assert_eq!(deviations.len(), DEVIATIONS.len());
    if deviations.iter().any(|&d| d) {
        // One session read on where the other stopped: what the shorter one opened is
        // where the longer one began.
        if !(door.plain.starts_with(&reference.plain) || reference.plain.starts_with(&door.plain)) {
            return Err(format!("{suite:?}: the plaintext differs\n  door:   {door:?}\n  rustls: {reference:?}"));
        }
        return Ok(());
    }
    if d != r || door.plain != reference.plain {
        return Err(format!("{suite:?}: they differ\n  door:   {door:?}\n  rustls: {reference:?}"));
    }
    if d == End::Open && r == End::Open {
        // The data sent last reads under the keys the client then holds, from both; and
        // DEVIATIONS[1]: where one answered a KeyUpdate request, so did the other, maybe
        // not as many times.
        if door.last != reference.last || (door.key_updates > 0) != (reference.key_updates > 0) {
            return Err(format!("{suite:?}: key updates differ\n  door:   {door:?}\n  rustls: {reference:?}"));
        }
    }
    Ok(())
}

fn op() -> impl Strategy<Value = Op> {
    let bytes = || proptest::collection::vec(any::<u8>(), 0..40);
    prop_oneof![
        6 => bytes().prop_map(Op::Data),
        2 => Just(Op::Empty),
        3 => prop_oneof![Just(0u8), Just(1u8), any::<u8>()].prop_map(Op::KeyUpdate),
        1 => Just(Op::SplitKeyUpdate),
        2 => (prop_oneof![Just(1u8), Just(2u8), any::<u8>()], prop_oneof![Just(0u8), Just(90u8), Just(100u8), any::<u8>()])
            .prop_map(|(level, description)| Op::Alert(level, description)),
        1 => prop_oneof![Just(vec![1u8, 0, 0, 0]), Just(vec![20u8, 0, 0, 1, 0]), bytes()].prop_map(Op::Handshake),
        1 => (bytes(), 0usize..300).prop_map(|(payload, padding)| Op::Padded(payload, padding)),
        1 => (0usize..300).prop_map(Op::Oversize),
        1 => Just(Op::BadTag),
        1 => prop_oneof![Just(CHANGE_CIPHER_SPEC), Just(ALERT), Just(HANDSHAKE), Just(24u8), any::<u8>()].prop_map(Op::Outer),
        1 => prop_oneof![Just([3u8, 1]), Just([3u8, 4]), Just([2u8, 0]), any::<[u8; 2]>()].prop_map(Op::Version),
        1 => Just(Op::NoType),
        1 => (prop_oneof![Just(CHANGE_CIPHER_SPEC), Just(24u8), Just(0u8), any::<u8>()], bytes())
            .prop_map(|(typ, payload)| Op::Inner(typ, payload)),
        1 => prop_oneof![Just(vec![ALERT, 3, 3, 0, 2, 1, 0]), Just(vec![CHANGE_CIPHER_SPEC, 3, 3, 0, 1, 1]), bytes()]
            .prop_map(Op::Raw),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn the_door_answers_every_record_stream_as_rustls_does(
        suite in proptest::sample::select(SUITES.to_vec()),
        ops in proptest::collection::vec(op(), 1..10),
        cuts in proptest::collection::vec(any::<usize>(), 0..4),
    ) {
        if let Err(why) = compare(suite, &ops, &cuts) {
            return Err(TestCaseError::fail(why));
        }
    }
}

/// The cases the defects were found in, each on every suite, whole and cut byte by byte.
#[test]
fn the_named_cases_match_rustls_on_every_suite() {
    let cases: Vec<(&str, Vec<Op>)> = vec![
        ("data", vec![Op::Data(b"hello".to_vec()), Op::Data(vec![7; 16 * 1024])]),
        ("33 key updates", vec![Op::KeyUpdate(1); 33]),
        (
            "32 key updates, data, 32 more",
            [vec![Op::KeyUpdate(0); 32], vec![Op::Data(b"x".to_vec())], vec![Op::KeyUpdate(1); 32]].concat(),
        ),
        ("5 warnings", vec![Op::Alert(1, 90); 5]),
        ("4 warnings, data", [vec![Op::Alert(1, 90); 4], vec![Op::Data(b"y".to_vec())]].concat()),
        ("33 empty records", vec![Op::Empty; 33]),
        ("32 empty records, data", [vec![Op::Empty; 32], vec![Op::Data(b"z".to_vec())]].concat()),
        ("padding past 2^14 + 1", vec![Op::Padded(vec![1; 16 * 1024], 2)]),
        ("oversize", vec![Op::Oversize(1)]),
        ("bad tag", vec![Op::BadTag]),
        ("close_notify then data", vec![Op::Alert(1, 0), Op::Data(b"after".to_vec())]),
        ("fatal alert", vec![Op::Alert(2, 40)]),
        ("renegotiation", vec![Op::Handshake(vec![1, 0, 0, 0])]),
        ("header version 3,1", vec![Op::Version([3, 1])]),
        ("unknown outer type", vec![Op::Outer(99)]),
        ("protected change_cipher_spec", vec![Op::Inner(CHANGE_CIPHER_SPEC, vec![1])]),
        ("no content type", vec![Op::NoType]),
        ("plaintext alert", vec![Op::Raw(vec![ALERT, 3, 3, 0, 2, 2, 40])]),
        ("a header of 17,000 bytes", vec![Op::Raw(vec![APPLICATION_DATA, 3, 3, 0x42, 0x68])]),
        ("a header of 18,432 bytes", vec![Op::Raw(vec![APPLICATION_DATA, 3, 3, 0x48, 0x00])]),
        ("a header of 65,535 bytes", vec![Op::Raw(vec![APPLICATION_DATA, 3, 3, 0xff, 0xff])]),
        ("an empty handshake record", vec![Op::Raw(vec![HANDSHAKE, 3, 3, 0, 0])]),
        ("version 2.0", vec![Op::Version([2, 0])]),
        ("version 3.4", vec![Op::Version([3, 4])]),
        ("heartbeat", vec![Op::Inner(24, vec![1, 0, 0])]),
    ];
    let mut failures = Vec::new();
    for suite in SUITES {
        for (name, ops) in &cases {
            // Whole, then in pieces of 7 bytes (the first 512 of them).
            let pieces: Vec<usize> = (0..512).map(|i| i * 7).collect();
            for (how, cuts) in [("whole", &[][..]), ("in pieces", &pieces[..])] {
                if let Err(why) = compare(suite, ops, cuts) {
                    failures.push(format!("{name} ({how}): {why}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} differences:\n{}", failures.len(), failures.join("\n"));
}

//! The comparison behind `tests/tls_differential.rs` and the fuzz target (`fuzz/`): one
//! stream of records, sealed by the raw client for the door's layer and for rustls's own
//! server, delivered at the same split points; [`compare`] says whether they answered
//! alike, or differ only where [`DEVIATIONS`] allows.

#![allow(dead_code)]

use std::io::Read;
use std::sync::Arc;

use bytes::BytesMut;
use idlegate::conformance::ServerLayer;
use rustls::crypto::ring::cipher_suite;
use rustls::{ClientConfig, ServerConfig, SupportedCipherSuite};

use super::raw_tls::{Heard, RawClient, Record, ALERT, APPLICATION_DATA, HANDSHAKE, KEY_UPDATE};

/// The alert a policy limit ends a session with (RFC 8446 §6).
const UNEXPECTED_MESSAGE: u8 = 10;
const DECODE_ERROR: u8 = 50;
const RECORD_OVERFLOW: u8 = 22;

/// Every suite the door offers.
pub const SUITES: [SupportedCipherSuite; 6] = [
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
    (
        "a header version whose first byte is not 3 gets decode_error, as rustls answers every \
         other such version; rustls lets through the few its enum names (SSL 2's 0x0002, DTLS's \
         0xfeff, 0xfefd and 0xfefc), then answers bad_record_mac (TLS 1.2) or reads the record \
         (TLS 1.3, whose additional data it builds)",
        "RFC 5246 §6.2.1 and RFC 8446 §5.1: a record's version is 3.x; neither RFC names the alert, \
         and decode_error is rustls's own for the others",
    ),
];

/// One step of a generated stream, sealed as the raw client would.
#[derive(Clone, Debug)]
pub enum Op {
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
pub enum End {
    Open,
    /// The client's close_notify was taken.
    Closed,
    /// The session failed; the alert the client heard, if any.
    Failed(Option<u8>),
}

/// A server session fed bytes: the door's layer or rustls's own, in memory or over a socket.
pub trait Server {
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
    let (server, client) = super::tls_configs::configs(suite);
    (Arc::new(server), client)
}

/// What one session made of the stream.
#[derive(Debug)]
pub struct Outcome {
    pub plain: Vec<u8>,
    pub end: End,
    /// KeyUpdates the client heard before the data sent last (if the session stayed open).
    key_updates: usize,
    /// The data sent at the end, as the client read it.
    last: Option<Heard>,
    /// Everything the client heard but data and tickets, for the failure's message.
    #[allow(dead_code)] // read through Debug
    heard: Vec<Heard>,
}

/// Runs `ops` against `server` after a handshake with `client_config` (which must offer
/// only `suite`), cut at `cuts`.
pub fn run_with(server: &mut dyn Server, client_config: &ClientConfig, ops: &[Op], cuts: &[usize]) -> Outcome {
    let mut client = RawClient::handshake(client_config, &mut |bytes| server.feed(bytes).1);
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
        // Over a socket an end is an end of stream: after the server's close_notify and no
        // fatal alert, the close was the client's, answered.
        let answered_close = heard.iter().any(|h| matches!(h, Heard::Alert(_, 0)));
        end = if alert.is_none() && answered_close { End::Closed } else { End::Failed(alert) };
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
fn run(server: &mut dyn Server, suite: SupportedCipherSuite, ops: &[Op], cuts: &[usize]) -> Outcome {
    run_with(server, &configs(suite).1, ops, cuts)
}

/// The door's layer and rustls in memory over the same stream; `Err` says how they differ.
pub fn compare(suite: SupportedCipherSuite, ops: &[Op], cuts: &[usize]) -> Result<(), String> {
    let (config, _) = configs(suite);
    let door = Door { layer: ServerLayer::new(config.clone()).unwrap(), raw: BytesMut::new(), end: End::Open };
    let door = run(&mut { door }, suite, ops, cuts);
    let rustls = Rustls { conn: rustls::ServerConnection::new(config).unwrap(), end: End::Open };
    let reference = run(&mut { rustls }, suite, ops, cuts);
    judge(suite, ops, &door, &reference)
}

/// Whether the door's outcome of `ops` may differ from rustls's as it does: not at all, or
/// as one of [`DEVIATIONS`] allows.
pub fn judge(suite: SupportedCipherSuite, ops: &[Op], door: &Outcome, reference: &Outcome) -> Result<(), String> {
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
        d == End::Failed(Some(DECODE_ERROR))
            && has(&|op| {
                let named = |v: &[u8]| matches!(v, [0x00, 0x02] | [0xfe, 0xff] | [0xfe, 0xfd] | [0xfe, 0xfc]);
                match op {
                    Op::Version(version) => named(version),
                    Op::Raw(bytes) => bytes.len() >= 3 && named(&bytes[1..3]),
                    _ => false,
                }
            })
            && matches!(r, End::Open | End::Closed | End::Failed(_)),
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

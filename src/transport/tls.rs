//! TLS under a door's bytes (`--tls-listen`, `--wss-listen`): rustls's unbuffered API for
//! the handshake, then the keys alone (`records.rs`).
//!
//! rustls's usual connection keeps buffers of its own for as long as the connection lives;
//! the unbuffered one decrypts from the buffer it is handed and encrypts into another. Here
//! those are the worker's buffers, as for a plain socket. Once the handshake is over,
//! rustls's connection is dropped and [`Records`] goes on with the traffic keys: an idle
//! TLS connection keeps its keys, and no buffer (docs/SECURITY.md weighs both).
//!
//! The seam with rustls has three rules. rustls is handed one whole record at a time, so
//! that it stops at the client's Finished and leaves what follows to the records. When
//! rustls fails, the alert it queued goes out before the close. And no more than
//! [`MAX_HANDSHAKE_HELD`] bytes of a client's handshake are held at once. rustls's
//! version is pinned: `records::tests::the_hand_over_keeps_rustls_keys_and_sequence_numbers`
//! is the hand-over's contract.

use std::sync::Arc;

use bytes::{Buf, BytesMut};
use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::{ConnectionState, EncodeError, EncryptError, InsufficientSizeError};
use rustls::ServerConfig;

use crate::proto::CloseReason;
use crate::protocol::Close;
use crate::transport::connection::{disconnect, Layer};
use crate::transport::records::Records;

/// Room first offered for a handshake flight (a certificate chain fits); rustls says how
/// much more it needs when that is not enough.
const HANDSHAKE_ROOM: usize = 4 * 1024;

/// Room per record beyond its plaintext: a record's header, content type, explicit nonce
/// (TLS 1.2) and tag, rounded up.
const RECORD_OVERHEAD: usize = 64;

/// Most plaintext one record carries.
const MAX_RECORD_PLAINTEXT: usize = 16 * 1024;

/// A record's header: content type, legacy version, length.
const RECORD_HEADER: usize = 5;

/// Most bytes of the client's handshake held at once, before anyone is authenticated: a
/// ClientHello with post-quantum key shares (X25519MLKEM768's is 1,216 bytes) and a
/// resumption ticket is 2 to 3 KiB, and nothing else a client sends to this server (no
/// client certificates are asked for) comes near it. Without a cap, rustls joins a
/// handshake message of up to 64 KiB from the records a client trickles in.
const MAX_HANDSHAKE_HELD: usize = 8 * 1024;

/// The alert a handshake past [`MAX_HANDSHAKE_HELD`] ends with, written here since rustls
/// never saw the record: fatal `decode_error` (RFC 8446 §6), unprotected, as every alert
/// before the server's flight is.
const DECODE_ERROR_ALERT: [u8; 7] = [21, 3, 3, 0, 2, 2, 50];

/// The alert a record longer than a plaintext record may be ends with (RFC 8446 §5.1: more
/// than 2^14 bytes), before the server's flight: fatal `record_overflow`, unprotected.
const RECORD_OVERFLOW_ALERT: [u8; 7] = [21, 3, 3, 0, 2, 2, 22];

/// Most bytes a plaintext record carries (RFC 8446 §5.1, RFC 5246 §6.2.1: 2^14).
const MAX_PLAINTEXT_RECORD: usize = 16 * 1024;

/// Record lengths rustls refuses in the header itself (`MAX_PAYLOAD` in its
/// `msgs/message`): 2^14 and the 2,048 bytes TLS 1.2 allowed a ciphertext to grow.
const MAX_RECORD_PAYLOAD: usize = 16 * 1024 + 2048;

/// The record content types rustls takes (change_cipher_spec, alert, handshake,
/// application_data, heartbeat); any other is no TLS record.
const CONTENT_TYPES: std::ops::RangeInclusive<u8> = 20..=24;

/// The content type of application data, the one record that may be empty.
const APPLICATION_DATA: u8 = 23;

/// Records rustls may still queue after it failed: its one fatal alert.
const ALERT_RECORDS: usize = 4;

/// A TLS session over a client socket; see the module documentation. Boxed either way: one
/// pointer in every TLS connection's task.
pub(crate) enum Tls {
    /// rustls drives the handshake; `ready` once application data may flow (TLS 1.3's
    /// server may send before the client's Finished, which ends the handshake); `held`
    /// bytes at the front of the read buffer are records rustls took but keeps, joining a
    /// handshake message split across them.
    Handshake { conn: Box<Handshaking>, ready: bool, held: u16 },
    /// The handshake is over: the records under the traffic keys.
    Records(Box<Records>),
    /// Only while the session passes from one to the other, or after that failed.
    Gone,
}

/// rustls's connection while it shakes hands, and what the records will need from the door.
pub(crate) struct Handshaking {
    rustls: UnbufferedServerConnection,
    /// Records a key protects before it changes, when not the suite's own limit (tests).
    record_limit: Option<u64>,
    /// The server's flight went out: the client's next records may be protected, and
    /// only rustls can write an alert it reads.
    flight_sent: bool,
}

impl std::ops::Deref for Handshaking {
    type Target = UnbufferedServerConnection;

    fn deref(&self) -> &UnbufferedServerConnection {
        &self.rustls
    }
}

impl std::ops::DerefMut for Handshaking {
    fn deref_mut(&mut self) -> &mut UnbufferedServerConnection {
        &mut self.rustls
    }
}

// === impl Tls ===

impl Tls {
    /// A server session with `config` (the identity of `--tls-cert` and `--tls-key`, with
    /// secret extraction enabled so the session can pass to [`Records`]).
    /// `record_limit` replaces the suite's confidentiality limit (`--tls-record-limit`, for
    /// tests that must see keys change).
    pub(crate) fn new(config: Arc<ServerConfig>, record_limit: Option<u64>) -> Result<Tls, rustls::Error> {
        debug_assert!(config.enable_secret_extraction, "the records need the traffic secrets");
        let rustls = UnbufferedServerConnection::new(config)?;
        let conn = Box::new(Handshaking { rustls, record_limit, flight_sent: false });
        Ok(Tls::Handshake { conn, ready: false, held: 0 })
    }

    /// Passes the session to [`Records`] once rustls has finished the handshake.
    fn take_over(&mut self) -> Result<(), Close> {
        let Tls::Handshake { conn, .. } = std::mem::replace(self, Tls::Gone) else {
            return Ok(());
        };
        let record_limit = conn.record_limit;
        let (secrets, kernel) = conn.rustls.dangerous_into_kernel_connection().map_err(tls_error)?;
        *self = Tls::Records(Box::new(Records::new(secrets, kernel, record_limit).map_err(tls_error)?));
        Ok(())
    }
}

fn tls_error(e: impl std::fmt::Display) -> Close {
    (CloseReason::ProtocolError, format!("TLS: {e}"))
}

/// The length of the whole record after the `held` bytes at the front of `raw`, or `None`
/// until it has all arrived. In this order:
/// - a header that is no TLS record's (an SSL 2.0 ClientHello, HTTP, noise), or one rustls
///   refuses for its length, is handed to rustls at once (its length alone), which refuses
///   it with its own alert, instead of waiting for a length that means nothing;
/// - before the server's flight, a record longer than a plaintext record may be ends the
///   handshake with `record_overflow` (RFC 8446 §5.1), appended to `wire`; after it, rustls
///   reads a protected record whole and answers with its alert, protected;
/// - a record that would take the handshake past [`MAX_HANDSHAKE_HELD`] (one record before
///   the flight, or records joined into one message after it) ends it with `decode_error`.
fn next_record(raw: &[u8], held: usize, flight_sent: bool, wire: &mut BytesMut) -> Result<Option<usize>, Close> {
    let rest = &raw[held..];
    let (kind, major, len) = match rest {
        [kind, major, _, high, low, ..] => (*kind, *major, usize::from(u16::from_be_bytes([*high, *low]))),
        _ => return Ok(None),
    };
    let empty = len == 0 && kind != APPLICATION_DATA;
    if !CONTENT_TYPES.contains(&kind) || major != 3 || empty || len >= MAX_RECORD_PAYLOAD {
        return Ok(Some(RECORD_HEADER));
    }
    if !flight_sent && len > MAX_PLAINTEXT_RECORD {
        wire.extend_from_slice(&RECORD_OVERFLOW_ALERT);
        return Err(tls_error(format!("a record of {len} bytes, over the {MAX_PLAINTEXT_RECORD} a record may carry")));
    }
    let announced = RECORD_HEADER + len;
    if held + announced > MAX_HANDSHAKE_HELD && (held > 0 || !flight_sent) {
        wire.extend_from_slice(&DECODE_ERROR_ALERT);
        return Err(tls_error(format!("a handshake of more than {MAX_HANDSHAKE_HELD} bytes")));
    }
    Ok((rest.len() >= announced).then_some(announced))
}

/// rustls failed the handshake with `e`: the alert it queued for the client goes to `wire`
/// (RFC 8446 §6.2 and RFC 5246 §7.2.2 make the server send it), then the session ends.
fn failed(conn: &mut UnbufferedServerConnection, wire: &mut BytesMut, e: rustls::Error) -> Close {
    for _ in 0..ALERT_RECORDS {
        match conn.process_tls_records(&mut []).state {
            Ok(ConnectionState::EncodeTlsData(mut data)) => {
                let encoded = encode_into(wire, RECORD_OVERHEAD, |room| data.encode(room).map_err(EncodeFailure::from));
                if encoded.is_err() {
                    break;
                }
            }
            Ok(ConnectionState::TransmitTlsData(data)) => data.done(),
            _ => break,
        }
    }
    tls_error(e)
}

impl Layer for Tls {
    const CLEAR: bool = false;

    fn open(&mut self, raw: &mut BytesMut, plain: &mut BytesMut, wire: &mut BytesMut) -> Result<bool, Close> {
        let (conn, ready, held) = match self {
            Tls::Handshake { conn, ready, held } => (conn, ready, held),
            Tls::Records(records) => return records.open(raw, plain, wire).map_err(tls_error),
            Tls::Gone => return Err(disconnect()),
        };
        // rustls takes one whole record at a time, so that it stops at the client's
        // Finished, which ends its record (RFC 8446 §5.1): whatever follows it (a KeyUpdate,
        // data) is for the records' layer under the traffic keys. Given more, rustls would
        // answer a KeyUpdate that came with the Finished itself and park the answer where
        // the hand-over drops it.
        while let Some(len) = next_record(raw, usize::from(*held), conn.flight_sent, wire)? {
            let mut end = usize::from(*held) + len;
            let mut peer_closed = false;
            let handshake_over = loop {
                let status = conn.process_tls_records(&mut raw[..end]);
                let mut discard = status.discard;
                let mut taken = false;
                let state = match status.state {
                    Ok(state) => state,
                    Err(e) => {
                        raw.advance(discard);
                        return Err(failed(conn, wire, e));
                    }
                };
                match state {
                    ConnectionState::ReadTraffic(mut traffic) => {
                        while let Some(record) = traffic.next_record() {
                            let record = record.map_err(tls_error)?;
                            discard += record.discard;
                            plain.extend_from_slice(record.payload);
                        }
                    }
                    ConnectionState::EncodeTlsData(mut data) => {
                        encode_into(wire, HANDSHAKE_ROOM, |room| data.encode(room).map_err(EncodeFailure::from))?;
                        conn.flight_sent = true;
                    }
                    ConnectionState::TransmitTlsData(data) => {
                        // Queued in `wire`, which is written (or kept, in order) before
                        // anything else this connection sends.
                        data.done();
                    }
                    ConnectionState::BlockedHandshake => taken = true,
                    ConnectionState::WriteTraffic(_) => {
                        *ready = true;
                        taken = true;
                    }
                    ConnectionState::PeerClosed | ConnectionState::Closed => {
                        peer_closed = true;
                        taken = true;
                    }
                    ConnectionState::ReadEarlyData(_) => return Err(tls_error("early data is not accepted")),
                    _ => return Err(tls_error("a state this gateway does not know")),
                }
                raw.advance(discard);
                end -= discard;
                if taken {
                    break !conn.is_handshaking();
                }
            };
            // What rustls did not discard of the record it took, it holds.
            *held = u16::try_from(end).map_err(|_| tls_error("a handshake record over the bound"))?;
            if peer_closed {
                return Ok(true);
            }
            if handshake_over {
                if *held != 0 {
                    return Err(tls_error("a handshake message across the change to the traffic keys"));
                }
                self.take_over()?;
                return self.open(raw, plain, wire);
            }
        }
        Ok(false)
    }

    fn seal(&mut self, plain: &[u8], wire: &mut BytesMut) -> Result<(), Close> {
        let conn = match self {
            Tls::Handshake { conn, .. } => conn,
            Tls::Records(records) => return records.seal(plain, wire).map_err(tls_error),
            Tls::Gone => return Err(disconnect()),
        };
        loop {
            let status = conn.process_tls_records(&mut []);
            debug_assert_eq!(status.discard, 0, "nothing was handed in to discard");
            match status.state.map_err(tls_error)? {
                ConnectionState::WriteTraffic(mut traffic) => {
                    let room = plain.len() + (plain.len() / MAX_RECORD_PLAINTEXT + 1) * RECORD_OVERHEAD;
                    return encode_into(wire, room, |room| traffic.encrypt(plain, room).map_err(EncodeFailure::from));
                }
                // A ticket rustls wants out first.
                ConnectionState::EncodeTlsData(mut data) => {
                    encode_into(wire, HANDSHAKE_ROOM, |room| data.encode(room).map_err(EncodeFailure::from))?;
                }
                ConnectionState::TransmitTlsData(data) => data.done(),
                // Records read but not taken cannot happen here (`open` takes them all); the
                // handshake unfinished or the session closed: nothing can be sent.
                _ => return Err(disconnect()),
            }
        }
    }

    fn finish(&mut self, wire: &mut BytesMut) {
        match self {
            Tls::Handshake { conn, .. } => {
                if let Ok(ConnectionState::WriteTraffic(mut traffic)) = conn.process_tls_records(&mut []).state {
                    let _ = encode_into(wire, RECORD_OVERHEAD, |room| {
                        traffic.queue_close_notify(room).map_err(EncodeFailure::from)
                    });
                }
            }
            Tls::Records(records) => records.finish(wire),
            Tls::Gone => {}
        }
    }

    fn ready(&self) -> bool {
        match self {
            Tls::Handshake { ready, .. } => *ready,
            Tls::Records(_) => true,
            Tls::Gone => false,
        }
    }
}

/// Why an encoding into `wire` did not happen.
enum EncodeFailure {
    Room(InsufficientSizeError),
    Other(String),
}

impl From<EncodeError> for EncodeFailure {
    fn from(e: EncodeError) -> EncodeFailure {
        match e {
            EncodeError::InsufficientSize(e) => EncodeFailure::Room(e),
            e => EncodeFailure::Other(e.to_string()),
        }
    }
}

impl From<EncryptError> for EncodeFailure {
    fn from(e: EncryptError) -> EncodeFailure {
        match e {
            EncryptError::InsufficientSize(e) => EncodeFailure::Room(e),
            e => EncodeFailure::Other(e.to_string()),
        }
    }
}

/// Runs `encode` on `room` bytes at the end of `wire`, growing the room to what rustls asks
/// for when it was too little, and keeps what it wrote.
fn encode_into(
    wire: &mut BytesMut,
    mut room: usize,
    mut encode: impl FnMut(&mut [u8]) -> Result<usize, EncodeFailure>,
) -> Result<(), Close> {
    let start = wire.len();
    loop {
        wire.resize(start + room, 0);
        match encode(&mut wire[start..]) {
            Ok(n) => {
                wire.truncate(start + n);
                return Ok(());
            }
            Err(EncodeFailure::Room(e)) if e.required_size > room => room = e.required_size,
            Err(EncodeFailure::Room(e)) => {
                wire.truncate(start);
                return Err(tls_error(format!("no room for {} bytes", e.required_size)));
            }
            Err(EncodeFailure::Other(e)) => {
                wire.truncate(start);
                return Err(tls_error(e));
            }
        }
    }
}

/// The door's TLS layer as the differential tests and the fuzz target drive it, in memory:
/// rustls's handshake, the hand-over, then this gateway's records. Not the gateway's API.
#[doc(hidden)]
pub struct ServerLayer(Tls);

// === impl ServerLayer ===

impl ServerLayer {
    /// A server session with `config`, which must enable secret extraction.
    pub fn new(config: Arc<ServerConfig>) -> Result<ServerLayer, rustls::Error> {
        Tls::new(config, None).map(ServerLayer)
    }

    /// Takes the whole records at the front of `raw`: their plaintext to `plain`, what the
    /// session answers to `wire`. `Ok(true)` once the peer closed; an error ends the session
    /// (its alert, if any, at the end of `wire`).
    pub fn open(&mut self, raw: &mut BytesMut, plain: &mut BytesMut, wire: &mut BytesMut) -> Result<bool, String> {
        self.0.open(raw, plain, wire).map_err(|(_, why)| why)
    }

    /// Appends `plain`, protected, to `wire`.
    pub fn seal(&mut self, plain: &[u8], wire: &mut BytesMut) -> Result<(), String> {
        self.0.seal(plain, wire).map_err(|(_, why)| why)
    }

    /// Appends close_notify to `wire`.
    pub fn finish(&mut self, wire: &mut BytesMut) {
        self.0.finish(wire)
    }

    /// Whether the session passed from rustls to this gateway's records.
    pub fn handed_over(&self) -> bool {
        matches!(self.0, Tls::Records(_))
    }
}

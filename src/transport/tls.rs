//! TLS under a door's bytes (`--tls-listen`, `--wss-listen`), with rustls's unbuffered API.
//!
//! rustls's usual connection keeps buffers of its own (a 4 KiB read buffer at the least,
//! for as long as the connection lives); the unbuffered one decrypts from the buffer it is
//! handed and encrypts into another. Here those are the worker's buffers, as for a plain
//! socket: an idle TLS connection keeps its keys and its state machine, and no buffer.
//! The handshake's state is rustls's, dropped by it once the handshake is done.

use std::sync::Arc;

use bytes::{Buf, BytesMut};
use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::{ConnectionState, EncodeError, EncryptError, InsufficientSizeError};
use rustls::ServerConfig;

use crate::proto::CloseReason;
use crate::protocol::Close;
use crate::transport::connection::{disconnect, Layer};

/// Room first offered for a handshake flight (a certificate chain fits); rustls says how
/// much more it needs when that is not enough.
const HANDSHAKE_ROOM: usize = 4 * 1024;

/// Room per record beyond its plaintext: a record's header, content type, explicit nonce
/// (TLS 1.2) and tag, rounded up.
const RECORD_OVERHEAD: usize = 64;

/// Most plaintext one record carries.
const MAX_RECORD_PLAINTEXT: usize = 16 * 1024;

/// A TLS session over a client socket; see the module documentation.
pub(crate) struct Tls {
    /// Boxed: one pointer in every TLS connection's task, and the state where rustls keeps it.
    conn: Box<UnbufferedServerConnection>,
    /// The handshake is done (application data may flow).
    ready: bool,
}

// === impl Tls ===

impl Tls {
    /// A server session with `config` (the identity of `--tls-cert` and `--tls-key`).
    pub(crate) fn new(config: Arc<ServerConfig>) -> Result<Tls, rustls::Error> {
        Ok(Tls { conn: Box::new(UnbufferedServerConnection::new(config)?), ready: false })
    }
}

fn tls_error(e: impl std::fmt::Display) -> Close {
    (CloseReason::ProtocolError, format!("TLS: {e}"))
}

impl Layer for Tls {
    const CLEAR: bool = false;

    fn open(&mut self, raw: &mut BytesMut, plain: &mut BytesMut, wire: &mut BytesMut) -> Result<bool, Close> {
        loop {
            let status = self.conn.process_tls_records(&mut raw[..]);
            let mut discard = status.discard;
            let mut done = false;
            let mut peer_closed = false;
            match status.state.map_err(tls_error)? {
                ConnectionState::ReadTraffic(mut traffic) => {
                    while let Some(record) = traffic.next_record() {
                        let record = record.map_err(tls_error)?;
                        discard += record.discard;
                        plain.extend_from_slice(record.payload);
                    }
                }
                ConnectionState::EncodeTlsData(mut data) => {
                    encode_into(wire, HANDSHAKE_ROOM, |room| data.encode(room).map_err(EncodeFailure::from))?;
                }
                ConnectionState::TransmitTlsData(data) => {
                    // Queued in `wire`, which is written (or kept, in order) before anything
                    // else this connection sends.
                    data.done();
                }
                ConnectionState::BlockedHandshake => done = true,
                ConnectionState::WriteTraffic(_) => {
                    self.ready = true;
                    done = true;
                }
                ConnectionState::PeerClosed | ConnectionState::Closed => {
                    peer_closed = true;
                    done = true;
                }
                ConnectionState::ReadEarlyData(_) => return Err(tls_error("early data is not accepted")),
                _ => return Err(tls_error("a state this gateway does not know")),
            }
            raw.advance(discard);
            if done {
                return Ok(peer_closed);
            }
        }
    }

    fn seal(&mut self, plain: &[u8], wire: &mut BytesMut) -> Result<(), Close> {
        loop {
            let status = self.conn.process_tls_records(&mut []);
            debug_assert_eq!(status.discard, 0, "nothing was handed in to discard");
            match status.state.map_err(tls_error)? {
                ConnectionState::WriteTraffic(mut traffic) => {
                    let room = plain.len() + (plain.len() / MAX_RECORD_PLAINTEXT + 1) * RECORD_OVERHEAD;
                    return encode_into(wire, room, |room| traffic.encrypt(plain, room).map_err(EncodeFailure::from));
                }
                // A key update or a ticket rustls wants out first.
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
        if let Ok(ConnectionState::WriteTraffic(mut traffic)) = self.conn.process_tls_records(&mut []).state {
            let _ = encode_into(wire, RECORD_OVERHEAD, |room| {
                traffic.queue_close_notify(room).map_err(EncodeFailure::from)
            });
        }
    }

    fn ready(&self) -> bool {
        self.ready
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

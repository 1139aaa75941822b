//! TLS under a door's bytes (`--tls-listen`, `--wss-listen`): rustls's unbuffered API for
//! the handshake, then the keys alone (`records.rs`).
//!
//! rustls's usual connection keeps buffers of its own (a 4 KiB read buffer at the least,
//! for as long as the connection lives); the unbuffered one decrypts from the buffer it is
//! handed and encrypts into another. Here those are the worker's buffers, as for a plain
//! socket. Once the handshake is over, rustls's connection (its state machine and record
//! layer, about 3 KiB) is dropped and [`Records`] goes on with the traffic keys: an idle
//! TLS connection keeps its keys, and no buffer.

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

/// A TLS session over a client socket; see the module documentation. Boxed either way: one
/// pointer in every TLS connection's task.
pub(crate) enum Tls {
    /// rustls drives the handshake; `ready` once application data may flow (TLS 1.3's
    /// server may send before the client's Finished, which ends the handshake).
    Handshake { conn: Box<UnbufferedServerConnection>, ready: bool },
    /// The handshake is over: the records under the traffic keys.
    Records(Box<Records>),
    /// Only while the session passes from one to the other, or after that failed.
    Gone,
}

// === impl Tls ===

impl Tls {
    /// A server session with `config` (the identity of `--tls-cert` and `--tls-key`, with
    /// secret extraction enabled so the session can pass to [`Records`]).
    pub(crate) fn new(config: Arc<ServerConfig>) -> Result<Tls, rustls::Error> {
        debug_assert!(config.enable_secret_extraction, "the records need the traffic secrets");
        Ok(Tls::Handshake { conn: Box::new(UnbufferedServerConnection::new(config)?), ready: false })
    }

    /// Passes the session to [`Records`] once rustls has finished the handshake.
    fn take_over(&mut self) -> Result<(), Close> {
        let Tls::Handshake { conn, .. } = std::mem::replace(self, Tls::Gone) else {
            return Ok(());
        };
        let (secrets, kernel) = conn.dangerous_into_kernel_connection().map_err(tls_error)?;
        *self = Tls::Records(Box::new(Records::new(secrets, kernel).map_err(tls_error)?));
        Ok(())
    }
}

fn tls_error(e: impl std::fmt::Display) -> Close {
    (CloseReason::ProtocolError, format!("TLS: {e}"))
}

impl Layer for Tls {
    const CLEAR: bool = false;

    fn open(&mut self, raw: &mut BytesMut, plain: &mut BytesMut, wire: &mut BytesMut) -> Result<bool, Close> {
        let (conn, ready) = match self {
            Tls::Handshake { conn, ready } => (conn, ready),
            Tls::Records(records) => return records.open(raw, plain, wire).map_err(tls_error),
            Tls::Gone => return Err(disconnect()),
        };
        loop {
            let status = conn.process_tls_records(&mut raw[..]);
            let mut discard = status.discard;
            let mut done = false;
            let mut peer_closed = false;
            let mut handshake_over = false;
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
                    *ready = true;
                    done = true;
                    handshake_over = !conn.is_handshaking();
                }
                ConnectionState::PeerClosed | ConnectionState::Closed => {
                    peer_closed = true;
                    done = true;
                }
                ConnectionState::ReadEarlyData(_) => return Err(tls_error("early data is not accepted")),
                _ => return Err(tls_error("a state this gateway does not know")),
            }
            raw.advance(discard);
            if handshake_over {
                // Whatever the client sent after its Finished is records of the new keys.
                self.take_over()?;
                return self.open(raw, plain, wire);
            }
            if done {
                return Ok(peer_closed);
            }
        }
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

//! The PROXY protocol (HAProxy's `proxy-protocol.txt`, versions 1 and 2): a balancer in
//! front of the gateway tells, in a header before the client's first byte, whose
//! connection it forwards. With `--proxy-protocol`, a connection from an address in
//! `--proxy-protocol-from` must open with one; its source address is then the client's
//! address for the per-address bounds, the logs and the events. A connection from anyone
//! else is served as the client it is, and a header from it is refused: it is never
//! trusted. A missing, malformed or late header closes the connection, counted by why.
//!
//! The header is parsed by the `ppp` crate. It is read with `peek` and then consumed to its
//! exact length, so the door's own bytes stay in the socket for its framing: no door needs
//! to take bytes read ahead of it, and an idle connection still holds no buffer.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use ppp::{v1, v2, HeaderResult, PartialResult};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::time::sleep;

/// The first bytes of a version 2 header.
const V2_SIGNATURE: &[u8] = b"\r\n\r\n\0\r\nQUIT\n";

/// The first bytes of a version 1 header.
const V1_PREFIX: &[u8] = b"PROXY ";

/// The longest header taken: version 1's is at most 107 bytes; version 2's is 16 bytes, the
/// addresses (36 for IPv6) and the TLVs a balancer adds (a cloud's endpoint id, an ALPN, a
/// TLS summary), which stay far below this. A longer one is refused as malformed.
pub(crate) const MAX_HEADER: usize = 16 + 1024;

/// Pause before looking again at a header that has not fully arrived. A balancer writes its
/// header in one piece, so this is the rare case; `peek` would return at once with the same
/// bytes, and waiting on readability again would spin.
const PEEK_AGAIN: Duration = Duration::from_millis(5);

/// Why a connection's header was refused: the `why` of
/// `idlegate_proxy_protocol_refused_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refusal {
    #[error("no PROXY header from a trusted balancer")]
    Missing,
    #[error("malformed PROXY header")]
    Malformed,
    #[error("PROXY header from an address not in --proxy-protocol-from")]
    Untrusted,
    #[error("no complete PROXY header within the login timeout")]
    Timeout,
    #[error("closed before its first bytes")]
    Closed,
}

impl Refusal {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Refusal::Missing => "missing",
            Refusal::Malformed => "malformed",
            Refusal::Untrusted => "untrusted",
            Refusal::Timeout => "timeout",
            Refusal::Closed => "closed",
        }
    }
}

/// Whether `seen`, the first bytes of a connection, opens a PROXY header: `None` while too
/// few have arrived to tell. No door's first bytes can open one: a frame's length prefix
/// would be over a gigabyte, and TLS, HTTP and MQTT start otherwise.
fn opens_header(seen: &[u8]) -> Option<bool> {
    let mut undecided = false;
    for signature in [V1_PREFIX, V2_SIGNATURE] {
        let n = seen.len().min(signature.len());
        if seen[..n] == signature[..n] {
            if n == signature.len() {
                return Some(true);
            }
            undecided = true;
        }
    }
    (!undecided).then_some(false)
}

/// Reads the PROXY header opening `stream`, if its peer is `trusted`, to its last byte;
/// `Ok(None)` when there is none to read (a connection from anyone else, which must not
/// send one) or when the header names no client address (a balancer's own health check:
/// version 2's LOCAL, version 1's UNKNOWN), where the peer's address stands.
pub(crate) async fn read(stream: &mut TcpStream, trusted: bool) -> Result<Option<SocketAddr>, Refusal> {
    // Allocated while the header is read, freed after.
    let mut buf = vec![0u8; MAX_HEADER];
    loop {
        let n = match stream.peek(&mut buf).await {
            Ok(0) | Err(_) => return Err(Refusal::Closed),
            Ok(n) => n,
        };
        let seen = &buf[..n];
        match (opens_header(seen), trusted) {
            (Some(false), false) => return Ok(None),
            (Some(true), false) => return Err(Refusal::Untrusted),
            (Some(false), true) => return Err(Refusal::Missing),
            (Some(true), true) => {}
            (None, _) => {
                sleep(PEEK_AGAIN).await;
                continue;
            }
        }
        let header = HeaderResult::parse(seen);
        if header.is_incomplete() {
            if n == MAX_HEADER {
                return Err(Refusal::Malformed);
            }
            sleep(PEEK_AGAIN).await;
            continue;
        }
        let (len, source) = match header {
            HeaderResult::V1(Ok(header)) => (header.header.len(), v1_source(&header.addresses)),
            HeaderResult::V2(Ok(header)) => (header.len(), v2_source(&header)),
            HeaderResult::V1(Err(_)) | HeaderResult::V2(Err(_)) => return Err(Refusal::Malformed),
        };
        debug_assert!(len <= n, "a parsed header lies within what was seen: {len} > {n}");
        consume(stream, &mut buf[..len]).await.map_err(|_| Refusal::Closed)?;
        return Ok(source);
    }
}

/// Takes the header's bytes, already seen, out of the socket.
async fn consume(stream: &mut TcpStream, header: &mut [u8]) -> io::Result<()> {
    stream.read_exact(header).await.map(drop)
}

fn v1_source(addresses: &v1::Addresses) -> Option<SocketAddr> {
    match addresses {
        v1::Addresses::Tcp4(a) => Some(SocketAddr::from((a.source_address, a.source_port))),
        v1::Addresses::Tcp6(a) => Some(SocketAddr::from((a.source_address, a.source_port))),
        v1::Addresses::Unknown => None,
    }
}

fn v2_source(header: &v2::Header<'_>) -> Option<SocketAddr> {
    if header.command == v2::Command::Local {
        return None;
    }
    match header.addresses {
        v2::Addresses::IPv4(a) => Some(SocketAddr::from((a.source_address, a.source_port))),
        v2::Addresses::IPv6(a) => Some(SocketAddr::from((a.source_address, a.source_port))),
        v2::Addresses::Unspecified | v2::Addresses::Unix(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_is_told_from_a_doors_first_bytes() {
        assert_eq!(opens_header(b"PROXY TCP4 1.2.3.4"), Some(true));
        assert_eq!(opens_header(b"\r\n\r\n\0\r\nQUIT\n!"), Some(true));
        assert_eq!(opens_header(b"PRO"), None);
        assert_eq!(opens_header(b"\r\n"), None);
        // TLS's ClientHello, an HTTP upgrade, an MQTT CONNECT, a LOGIN frame.
        for first in [&[0x16u8, 0x03, 0x01][..], b"GET / HTTP/1.1", &[0x10, 0x2a, 0x00, 0x04], &[0, 0, 0, 40, 1]] {
            assert_eq!(opens_header(first), Some(false), "{first:?}");
        }
    }
}

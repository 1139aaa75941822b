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

use std::net::SocketAddr;

use ppp::{v1, v2, HeaderResult, PartialResult};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// The first bytes of a version 2 header.
const V2_SIGNATURE: &[u8] = b"\r\n\r\n\0\r\nQUIT\n";

/// The first bytes of a version 1 header.
const V1_PREFIX: &[u8] = b"PROXY ";

/// The longest header taken: version 1's is at most 107 bytes; version 2's is 16 bytes, the
/// addresses (36 for IPv6) and the TLVs a balancer adds (a cloud's endpoint id, an ALPN, a
/// TLS summary), which stay far below this. A longer one is refused as malformed.
pub(crate) const MAX_HEADER: usize = 16 + 1024;

/// The longest version 1 header (the specification's 107 bytes, its CRLF included): one
/// that has not ended by then never will, and is refused as malformed at once.
const V1_MAX: usize = 107;

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
///
/// Waiting is driven by readiness, never by polling: the bytes seen of a header that has
/// not ended (a prefix of a signature, a header cut short) are all the header's, so they
/// are taken out of the socket, and the next `peek` then waits for new bytes. The last
/// read takes the header to its exact end, leaving the door's bytes in the socket.
pub(crate) async fn read(stream: &mut TcpStream, trusted: bool) -> Result<Option<SocketAddr>, Refusal> {
    // Allocated while the header is read, freed after.
    let mut buf = vec![0u8; MAX_HEADER];
    // Bytes of `buf` already taken out of the socket.
    let mut taken = 0;
    loop {
        let m = match stream.peek(&mut buf[taken..]).await {
            Ok(0) | Err(_) => return Err(Refusal::Closed),
            Ok(m) => m,
        };
        let n = taken + m;
        let seen = &buf[..n];
        match (opens_header(seen), trusted) {
            // Bytes taken already began like a header: what follows is no door's opening.
            (Some(false), _) if taken > 0 => return Err(Refusal::Malformed),
            (Some(false), false) => return Ok(None),
            (Some(true), false) => return Err(Refusal::Untrusted),
            (Some(false), true) => return Err(Refusal::Missing),
            (Some(true), true) => {}
            (None, _) => {
                take(stream, &mut buf[taken..n]).await?;
                taken = n;
                continue;
            }
        }
        // Version 1 is parsed once its line has ended: `ppp` refuses some prefixes of a
        // good line (one that ends in the space before the last port) as malformed.
        let v1 = seen.starts_with(V1_PREFIX);
        let end = if v1 {
            match seen.windows(2).position(|w| w == b"\r\n") {
                Some(at) => at + 2,
                // A line that has run past the longest one without ending never will.
                None if n >= V1_MAX => return Err(Refusal::Malformed),
                None => {
                    take(stream, &mut buf[taken..n]).await?;
                    taken = n;
                    continue;
                }
            }
        } else {
            n
        };
        let header = HeaderResult::parse(&seen[..end]);
        if header.is_incomplete() {
            // A version 1 line that has ended, or a version 2 header as long as any taken,
            // is all there is.
            if v1 || n == MAX_HEADER {
                return Err(Refusal::Malformed);
            }
            take(stream, &mut buf[taken..n]).await?;
            taken = n;
            continue;
        }
        let (len, source) = match header {
            HeaderResult::V1(Ok(header)) => (header.header.len(), v1_source(&header.addresses)),
            HeaderResult::V2(Ok(header)) => (header.len(), v2_source(&header)),
            HeaderResult::V1(Err(_)) | HeaderResult::V2(Err(_)) => return Err(Refusal::Malformed),
        };
        debug_assert!(taken <= len && len <= n, "a parsed header ends within what was seen: {taken} <= {len} <= {n}");
        take(stream, &mut buf[taken..len]).await?;
        return Ok(source);
    }
}

/// Takes bytes already seen with `peek` out of the socket (into the same place of the
/// buffer, which they already hold).
async fn take(stream: &mut TcpStream, seen: &mut [u8]) -> Result<(), Refusal> {
    stream.read_exact(seen).await.map(drop).map_err(|_| Refusal::Closed)
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

//! RFC 6455's frame layout, for both ends: the header (parsed and written, masked or not),
//! masking, the opcodes, and (feature `websocket`) the handshake's `Sec-WebSocket-Accept`.
//! The gateway's WebSocket door and the load generator both frame with this; what a frame
//! means to each (fragments, control frames, closes) stays with them.

/// Frame opcodes (RFC 6455, 5.2).
pub mod opcode {
    pub const CONTINUATION: u8 = 0x0;
    pub const TEXT: u8 = 0x1;
    pub const BINARY: u8 = 0x2;
    pub const CLOSE: u8 = 0x8;
    pub const PING: u8 = 0x9;
    pub const PONG: u8 = 0xA;
}

/// The GUID a server appends to the client's key for `Sec-WebSocket-Accept`.
pub const ACCEPT_GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// Longest header a frame can have: 2 bytes, 8 of length, 4 of mask.
pub const MAX_HEADER: usize = 14;

/// A frame's header; see RFC 6455, 5.2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The last frame of its message.
    pub fin: bool,
    /// The reserved bits RSV1-3 (0 unless an extension was agreed).
    pub rsv: u8,
    pub opcode: u8,
    /// The payload's length; lengths past what a `usize` holds read as `usize::MAX / 2`,
    /// which any limit refuses.
    pub len: usize,
    /// The masking key, on frames from a client.
    pub mask: Option<[u8; 4]>,
    /// Bytes of the header: where the payload starts.
    pub header_len: usize,
}

// === impl Header ===

impl Header {
    /// The header at the front of `b`; `None` until it has all arrived.
    #[inline]
    pub fn parse(b: &[u8]) -> Option<Header> {
        let [b0, b1, ..] = *b else { return None };
        let (len, at) = match b1 & 0x7f {
            126 => (u64::from(u16::from_be_bytes(b.get(2..4)?.try_into().ok()?)), 4),
            127 => (u64::from_be_bytes(b.get(2..10)?.try_into().ok()?), 10),
            n => (u64::from(n), 2),
        };
        let (mask, header_len) =
            if b1 & 0x80 != 0 { (Some(b.get(at..at + 4)?.try_into().ok()?), at + 4) } else { (None, at) };
        Some(Header {
            fin: b0 & 0x80 != 0,
            rsv: (b0 >> 4) & 0x07,
            opcode: b0 & 0x0f,
            len: usize::try_from(len).unwrap_or(usize::MAX / 2),
            mask,
            header_len,
        })
    }

    /// The header of a whole (FIN) frame of `opcode` carrying `len` bytes, masked with
    /// `mask` if given (a client's), as bytes; and how many of them are used.
    #[inline]
    pub fn encode(opcode: u8, len: usize, mask: Option<[u8; 4]>) -> ([u8; MAX_HEADER], usize) {
        let mut header = [0u8; MAX_HEADER];
        header[0] = 0x80 | opcode;
        let masked = if mask.is_some() { 0x80 } else { 0 };
        let mut n = if len < 126 {
            header[1] = masked | len as u8;
            2
        } else if let Ok(len) = u16::try_from(len) {
            header[1] = masked | 126;
            header[2..4].copy_from_slice(&len.to_be_bytes());
            4
        } else {
            header[1] = masked | 127;
            header[2..10].copy_from_slice(&(len as u64).to_be_bytes());
            10
        };
        if let Some(mask) = mask {
            header[n..n + 4].copy_from_slice(&mask);
            n += 4;
        }
        (header, n)
    }
}

/// Masks or unmasks `payload` in place (the same XOR), a word at a time.
#[inline]
pub fn apply_mask(payload: &mut [u8], mask: [u8; 4]) {
    let word = u32::from_ne_bytes(mask);
    let mut chunks = payload.chunks_exact_mut(4);
    for chunk in &mut chunks {
        let v = u32::from_ne_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]) ^ word;
        chunk.copy_from_slice(&v.to_ne_bytes());
    }
    for (i, b) in chunks.into_remainder().iter_mut().enumerate() {
        *b ^= mask[i];
    }
}

/// `Sec-WebSocket-Accept` for a client's `Sec-WebSocket-Key`.
#[cfg(feature = "websocket")]
pub fn accept_key(key: &[u8]) -> String {
    use base64::Engine;
    use sha1::{Digest, Sha1};
    let mut sha = Sha1::new();
    sha.update(key);
    sha.update(ACCEPT_GUID);
    base64::engine::general_purpose::STANDARD.encode(sha.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "websocket")]
    #[test]
    fn accept_key_matches_rfc_6455_example() {
        assert_eq!(accept_key(b"dGhlIHNhbXBsZSBub25jZQ=="), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    }

    #[test]
    fn headers_round_trip_at_every_length_form() {
        for len in [0, 125, 126, 65_535, 65_536] {
            for mask in [None, Some([1, 2, 3, 4])] {
                let (bytes, n) = Header::encode(opcode::BINARY, len, mask);
                let header = Header::parse(&bytes[..n]).expect("whole");
                assert_eq!((header.fin, header.opcode, header.len, header.mask), (true, 2, len, mask));
                assert_eq!(header.header_len, n);
                assert_eq!(Header::parse(&bytes[..n - 1]), None, "a header cut short is not there yet");
            }
        }
    }

    #[test]
    fn rfc_6455_examples_parse() {
        // 5.7: a single-frame unmasked text message, and a masked one, "Hello".
        let unmasked = Header::parse(&[0x81, 0x05]).unwrap();
        assert_eq!((unmasked.opcode, unmasked.len, unmasked.mask), (opcode::TEXT, 5, None));
        let mut masked = [0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58];
        let header = Header::parse(&masked).unwrap();
        assert_eq!(header.mask, Some([0x37, 0xfa, 0x21, 0x3d]));
        apply_mask(&mut masked[header.header_len..], header.mask.unwrap());
        assert_eq!(&masked[header.header_len..], b"Hello");
        assert_eq!(Header::parse(&[0xf1, 0x00]).unwrap().rsv, 0x07);
    }
}

//! The WebSocket door's frames as a server reads and writes them, on RFC 6455's layout
//! from `proto::websocket`: what it requires of a client's frame, the headers of its own
//! (never masked), close frames, and a message whose length is known only once it is
//! encoded.

use bytes::{Buf, BufMut, BytesMut};

use crate::proto::websocket::{opcode, Header};

/// Longest header of a frame the gateway sends (no mask): 2 bytes, and 8 of length.
pub(super) const MAX_SERVER_HEADER: usize = 10;

/// Close code for a malformed frame: 4000 + BYE(protocol_error)'s byte.
pub(super) const MALFORMED: u16 = 4004;

/// Close code for a text message: "unsupported data" (RFC 6455 section 7.4.1).
pub(super) const UNSUPPORTED_DATA: u16 = 1003;

/// Close code for a message over `--max-frame-bytes`: "message too big".
pub(super) const TOO_BIG: u16 = 1009;

/// Close code answering a close frame whose payload breaks the rules: "protocol error".
pub(super) const PROTOCOL_ERROR: u16 = 1002;

/// Close code answering a close reason that is not UTF-8: "invalid frame payload data".
pub(super) const INVALID_PAYLOAD: u16 = 1007;

/// Longest control frame payload (RFC 6455 section 5.5).
pub(super) const MAX_CONTROL_PAYLOAD: usize = 125;

/// Leaves room for a binary message's header before what is appended next; `close_message`
/// then writes it, once the length is known, so a packet is encoded where it is sent from.
pub(super) fn open_message(out: &mut BytesMut) -> usize {
    let at = out.len();
    out.put_bytes(0, MAX_SERVER_HEADER);
    at
}

/// Writes the header of the binary message whose room `open_message` left at `at` (none
/// at all if nothing was appended), closing the gap a shorter header leaves.
pub(super) fn close_message(out: &mut BytesMut, at: usize) {
    let len = out.len() - at - MAX_SERVER_HEADER;
    if len == 0 {
        out.truncate(at);
        return;
    }
    let (header, n) = Header::encode(opcode::BINARY, len, None);
    out.copy_within(at + MAX_SERVER_HEADER.., at + n);
    out.truncate(at + n + len);
    out[at..at + n].copy_from_slice(&header[..n]);
}

/// A client frame's header: RFC 6455's layout (`proto`), and what a server requires of a
/// client's frame: no reserved bit without an extension, and a mask. `None` until the whole
/// header has arrived.
#[inline]
pub(super) fn client_header(b: &[u8]) -> Result<Option<ClientHeader>, String> {
    let Some(header) = Header::parse(b) else { return Ok(None) };
    if header.rsv != 0 {
        return Err("reserved bits set: no extension was agreed".into());
    }
    let Some(mask) = header.mask else {
        return Err("an unmasked frame from a client".into());
    };
    let Header { fin, opcode, len, header_len, .. } = header;
    Ok(Some(ClientHeader { fin, opcode, len, mask, header_len }))
}

/// A client frame's header, its mask known to be there.
pub(super) struct ClientHeader {
    pub(super) fin: bool,
    pub(super) opcode: u8,
    pub(super) len: usize,
    pub(super) mask: [u8; 4],
    pub(super) header_len: usize,
}

/// Takes `len` bytes at `at` out of `src`.
pub(super) fn remove(src: &mut BytesMut, at: usize, len: usize) {
    if at == 0 {
        src.advance(len);
    } else {
        src.copy_within(at + len.., at);
        src.truncate(src.len() - len);
    }
}

/// A server frame's header (never masked).
pub(super) fn put_header(out: &mut BytesMut, opcode: u8, len: usize) {
    out.reserve(MAX_SERVER_HEADER + len);
    let (header, n) = Header::encode(opcode, len, None);
    out.put_slice(&header[..n]);
}

/// A close frame with `code` and `reason` (none without a code).
pub(super) fn put_close(out: &mut BytesMut, code: Option<u16>, reason: &str) {
    let reason = &reason.as_bytes()[..reason.len().min(MAX_CONTROL_PAYLOAD - 2)];
    match code {
        Some(code) => {
            put_header(out, opcode::CLOSE, 2 + reason.len());
            out.put_u16(code);
            out.extend_from_slice(reason);
        }
        None => put_header(out, opcode::CLOSE, 0),
    }
}

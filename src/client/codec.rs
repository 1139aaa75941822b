//! Length-prefixed framing: a 4-byte big-endian length `N`, then `N` bytes of frame body.
//!
//! A tokio-util [`Decoder`]/[`Encoder`] with no IO of its own. The length is checked against
//! the limit before a single byte of the body is buffered, so a header that claims 4 GiB
//! costs nothing but its own four bytes.

use bytes::{Buf, BufMut, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

use crate::client::frame::Frame;
use crate::error::FrameError;

/// Bytes of the length prefix.
pub const HEADER_LEN: usize = 4;

/// Default limit on a frame's length (`--max-frame-bytes`): room for any keepalive or
/// application message a client should send over a control connection.
pub const DEFAULT_MAX_FRAME_BYTES: u32 = 65_536;

/// Frames bytes to [`Frame`]s and back; see the module documentation.
#[derive(Debug, Clone, Copy)]
pub struct FrameCodec {
    max_frame_bytes: u32,
}

// === impl FrameCodec ===

impl FrameCodec {
    /// A codec that refuses frames longer than `max_frame_bytes` (kind byte included).
    pub fn new(max_frame_bytes: u32) -> FrameCodec {
        FrameCodec { max_frame_bytes }
    }
}

impl Default for FrameCodec {
    fn default() -> FrameCodec {
        FrameCodec::new(DEFAULT_MAX_FRAME_BYTES)
    }
}

impl Decoder for FrameCodec {
    type Item = Frame;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        let Some(header) = src.first_chunk::<HEADER_LEN>() else {
            return Ok(None);
        };
        let len = u32::from_be_bytes(*header);
        if len == 0 || len > self.max_frame_bytes {
            return Err(FrameError::BadLength { len, max: self.max_frame_bytes });
        }
        let total = HEADER_LEN + len as usize;
        if src.len() < total {
            // Safe to reserve now: `len` passed the limit above.
            src.reserve(total - src.len());
            return Ok(None);
        }
        src.advance(HEADER_LEN);
        Frame::parse(src.split_to(len as usize).freeze()).map(Some)
    }
}

/// Appends `frame` with its length prefix. For the frames the gateway builds, which carry at
/// most a payload it accepted, far below the 4 GiB a length prefix can say.
pub(crate) fn put_frame(frame: &Frame, dst: &mut BytesMut) {
    let body = frame.body_len();
    debug_assert!(u32::try_from(body).is_ok(), "a {body}-byte frame overflows the length prefix");
    dst.reserve(HEADER_LEN + body);
    dst.put_u32(body as u32);
    frame.encode(dst);
}

impl Encoder<&Frame> for FrameCodec {
    type Error = FrameError;

    fn encode(&mut self, frame: &Frame, dst: &mut BytesMut) -> Result<(), FrameError> {
        let body = frame.body_len();
        if u32::try_from(body).is_err() {
            return Err(FrameError::BadLength { len: u32::MAX, max: self.max_frame_bytes });
        }
        put_frame(frame, dst);
        Ok(())
    }
}

impl Encoder<Frame> for FrameCodec {
    type Error = FrameError;

    fn encode(&mut self, frame: Frame, dst: &mut BytesMut) -> Result<(), FrameError> {
        self.encode(&frame, dst)
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    #[test]
    fn decodes_byte_by_byte_and_in_one_piece() {
        let mut codec = FrameCodec::default();
        let mut wire = BytesMut::new();
        let frames = [Frame::Login { uid: 7, token: Bytes::from_static(b"x") }, Frame::Ping(Bytes::from_static(b"ts"))];
        for f in &frames {
            codec.encode(f, &mut wire).unwrap();
        }
        let mut src = BytesMut::new();
        let mut got = Vec::new();
        for b in wire.iter() {
            src.put_u8(*b);
            while let Some(f) = codec.decode(&mut src).unwrap() {
                got.push(f);
            }
        }
        assert_eq!(got, frames);

        let mut all = wire.clone();
        assert_eq!(codec.decode(&mut all).unwrap(), Some(frames[0].clone()));
        assert_eq!(codec.decode(&mut all).unwrap(), Some(frames[1].clone()));
        assert_eq!(codec.decode(&mut all).unwrap(), None);
    }

    #[test]
    fn bad_lengths_are_caught_from_the_header_without_allocating() {
        let mut codec = FrameCodec::new(16);
        let mut zero = BytesMut::from(&[0u8, 0, 0, 0][..]);
        assert!(matches!(codec.decode(&mut zero), Err(FrameError::BadLength { len: 0, max: 16 })));
        let mut huge = BytesMut::with_capacity(8);
        huge.put_u32(u32::MAX);
        assert!(matches!(codec.decode(&mut huge), Err(FrameError::BadLength { .. })));
        assert!(huge.capacity() < 64, "reserved for a refused frame: {}", huge.capacity());
        let mut at_limit = BytesMut::new();
        at_limit.put_u32(16);
        assert!(matches!(codec.decode(&mut at_limit), Ok(None)));
        let mut over = BytesMut::new();
        over.put_u32(17);
        assert!(matches!(codec.decode(&mut over), Err(FrameError::BadLength { len: 17, max: 16 })));
    }

    #[test]
    fn encoder_writes_the_length_prefix() {
        let mut dst = BytesMut::new();
        FrameCodec::default().encode(Frame::Welcome { timeout_ms: 30_000, tick_ms: 1_000 }, &mut dst).unwrap();
        assert_eq!(&dst[..], &[0, 0, 0, 9, 0x81, 0, 0, 0x75, 0x30, 0, 0, 0x03, 0xe8]);
    }
}

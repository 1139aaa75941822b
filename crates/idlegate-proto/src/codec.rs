//! Length-prefixed framing: a 4-byte big-endian length `N`, then `N` bytes of frame body.
//!
//! Plain functions over buffers, with no IO and no runtime of their own (the tokio-util
//! codec traits are implemented on top, in `transport/framed.rs`). The length is checked against
//! the limit before a single byte of the body is buffered, so a header that claims 4 GiB
//! costs nothing but its own four bytes.

use bytes::{Buf, BufMut, BytesMut};

use crate::Frame;
use crate::FrameError;

/// Bytes of the length prefix.
pub const HEADER_LEN: usize = 4;

/// Default limit on a frame's length (`--max-frame-bytes`): room for any keepalive or
/// application message a client should send over a control connection.
pub const DEFAULT_MAX_FRAME_BYTES: u32 = 65_536;

/// Longest LOGIN token: a JWT of an identity provider (RS256 with a few claims runs to
/// 700-1,200 bytes; a 4096-bit key's signature alone is 683) with room to spare.
pub const MAX_TOKEN_BYTES: u32 = 4096;

/// Longest first frame the gateway reads: a LOGIN (kind byte and uid) with a token of up to
/// [`MAX_TOKEN_BYTES`], then the 0x00 and a device name of up to
/// [`crate::MAX_DEVICE_BYTES`]. Until a connection has logged in it costs at most
/// this much, however large `--max-frame-bytes` is.
pub const MAX_LOGIN_FRAME_BYTES: u32 = 1 + 8 + MAX_TOKEN_BYTES + 1 + crate::MAX_DEVICE_BYTES as u32 + 1 + 4;

/// Least a split frame's buffer grows by; after that it doubles with what has arrived.
const MIN_SPLIT_GROWTH: usize = 64;

/// Frames bytes to [`Frame`]s and back; see the module documentation.
#[derive(Debug, Clone, Copy)]
pub struct FrameCodec {
    max_frame_bytes: u32,
    /// Limit of the next frame: lower than `max_frame_bytes` until the first frame was
    /// decoded, when one was set. Two `u32`s, not an `Option`: every open connection
    /// carries a codec.
    limit: u32,
}

// === impl FrameCodec ===

impl FrameCodec {
    /// A codec that refuses frames longer than `max_frame_bytes` (kind byte included).
    pub fn new(max_frame_bytes: u32) -> FrameCodec {
        FrameCodec { max_frame_bytes, limit: max_frame_bytes }
    }

    /// Also refuses a first frame longer than `max`: a gateway expects a LOGIN first, and a
    /// connection that has not logged in should cost little.
    pub fn first_frame_at_most(self, max: u32) -> FrameCodec {
        FrameCodec { limit: max.min(self.max_frame_bytes), ..self }
    }

    /// The longest frame it accepts (after the first).
    pub fn max_frame_bytes(&self) -> u32 {
        self.max_frame_bytes
    }

    fn limit(&self) -> u32 {
        self.limit
    }
}

impl Default for FrameCodec {
    fn default() -> FrameCodec {
        FrameCodec::new(DEFAULT_MAX_FRAME_BYTES)
    }
}

impl FrameCodec {
    /// The next whole frame at the front of `src`, taken off it; `None` until one has
    /// arrived (the buffer then grows by what is missing, doubling, never by what a header
    /// promises).
    pub fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        let Some(header) = src.first_chunk::<HEADER_LEN>() else {
            return Ok(None);
        };
        let len = u32::from_be_bytes(*header);
        let max = self.limit();
        if len == 0 || len > max {
            return Err(FrameError::BadLength { len, max });
        }
        let total = HEADER_LEN + len as usize;
        if src.len() < total {
            // Grows with what has arrived, not with what the header promises: a header that
            // claims 64 KiB followed by one byte costs a few bytes, not 64 KiB. Doubling keeps
            // a large frame to a handful of reads.
            let missing = total - src.len();
            src.reserve(missing.min(src.len().max(MIN_SPLIT_GROWTH)));
            return Ok(None);
        }
        self.limit = self.max_frame_bytes;
        src.advance(HEADER_LEN);
        Frame::parse(src.split_to(len as usize).freeze()).map(Some)
    }
}

/// Appends `frame` with its length prefix. For the frames the gateway builds, which carry at
/// most a payload it accepted, far below the 4 GiB a length prefix can say.
pub fn put_frame(frame: &Frame, dst: &mut BytesMut) {
    let body = frame.body_len();
    debug_assert!(u32::try_from(body).is_ok(), "a {body}-byte frame overflows the length prefix");
    dst.reserve(HEADER_LEN + body);
    dst.put_u32(body as u32);
    frame.encode(dst);
}

impl FrameCodec {
    /// Appends `frame` with its length prefix; an error for a body a length prefix cannot say.
    pub fn encode(&mut self, frame: &Frame, dst: &mut BytesMut) -> Result<(), FrameError> {
        let body = frame.body_len();
        if u32::try_from(body).is_err() {
            return Err(FrameError::BadLength { len: u32::MAX, max: self.max_frame_bytes });
        }
        put_frame(frame, dst);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::kind;

    #[test]
    fn decodes_byte_by_byte_and_in_one_piece() {
        let mut codec = FrameCodec::default();
        let mut wire = BytesMut::new();
        let frames = [
            Frame::Login { uid: 7, token: Bytes::from_static(b"x"), device: Default::default(), timeout_ms: None },
            Frame::Ping(Bytes::from_static(b"ts")),
        ];
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
    fn a_promised_frame_is_not_reserved_before_it_arrives() {
        let mut codec = FrameCodec::new(65_536);
        let mut src = BytesMut::new();
        src.put_u32(65_536);
        src.put_u8(kind::PING);
        assert!(matches!(codec.decode(&mut src), Ok(None)));
        assert!(src.capacity() < 1024, "reserved {} bytes for 5 that arrived", src.capacity());
        // As the frame arrives the buffer doubles, so it never holds more than twice what came.
        while src.len() < 4 + 65_536 {
            let more = (4 + 65_536 - src.len()).min(src.capacity() - src.len());
            src.put_bytes(0, more);
            assert!(src.capacity() <= 2 * src.len() + 2 * MIN_SPLIT_GROWTH, "{} for {}", src.capacity(), src.len());
            if let Some(frame) = codec.decode(&mut src).unwrap() {
                assert!(matches!(frame, Frame::Ping(p) if p.len() == 65_535));
                return;
            }
        }
        panic!("the frame never decoded");
    }

    #[test]
    fn the_first_frame_has_its_own_limit_and_later_ones_the_full_one() {
        let mut codec = FrameCodec::new(65_536).first_frame_at_most(MAX_LOGIN_FRAME_BYTES);
        let mut big_first = BytesMut::new();
        big_first.put_u32(MAX_LOGIN_FRAME_BYTES + 1);
        assert!(matches!(codec.decode(&mut big_first), Err(FrameError::BadLength { max: MAX_LOGIN_FRAME_BYTES, .. })));
        let mut wire = BytesMut::new();
        codec
            .encode(
                &Frame::Login {
                    uid: 1,
                    token: Bytes::from(vec![b'x'; 512]),
                    device: Default::default(),
                    timeout_ms: None,
                },
                &mut wire,
            )
            .unwrap();
        codec.encode(&Frame::Data(Bytes::from(vec![0u8; 60_000])), &mut wire).unwrap();
        assert!(matches!(codec.decode(&mut wire), Ok(Some(Frame::Login { .. }))));
        assert!(matches!(codec.decode(&mut wire), Ok(Some(Frame::Data(p))) if p.len() == 60_000));
    }

    #[test]
    fn encoder_writes_the_length_prefix() {
        let mut dst = BytesMut::new();
        FrameCodec::default()
            .encode(&Frame::Welcome { timeout_ms: 30_000, tick_ms: 1_000, session: String::new() }, &mut dst)
            .unwrap();
        assert_eq!(&dst[..], &[0, 0, 0, 9, 0x81, 0, 0, 0x75, 0x30, 0, 0, 0x03, 0xe8]);
    }
}

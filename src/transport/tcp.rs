//! The plain TCP door: the length-prefixed protocol straight on the socket. No layer under
//! the bytes ([`Plain`]) and the wire vocabulary's own [`FrameCodec`] over them.

use bytes::BytesMut;

use crate::proto::{put_frame, Frame, FrameCodec, MAX_LOGIN_FRAME_BYTES};
use crate::protocol::Close;
use crate::protocol::Command;
use crate::transport::connection::{Framing, Layer};
use crate::transport::door::Speaks;

/// No layer: the socket's bytes are the protocol's.
pub(crate) struct Plain;

impl Layer for Plain {
    const CLEAR: bool = true;

    fn open(&mut self, _raw: &mut BytesMut, _plain: &mut BytesMut, _wire: &mut BytesMut) -> Result<bool, Close> {
        debug_assert!(false, "a clear layer's bytes are decoded where they are read");
        Ok(false)
    }

    fn seal(&mut self, plain: &[u8], wire: &mut BytesMut) -> Result<(), Close> {
        wire.extend_from_slice(plain);
        Ok(())
    }

    fn finish(&mut self, _wire: &mut BytesMut) {}

    fn ready(&self) -> bool {
        true
    }
}

/// The frame door's codec: frames of at most `max` bytes, the first (the LOGIN) of at most
/// [`MAX_LOGIN_FRAME_BYTES`], so a connection that has not logged in cannot make the
/// gateway hold a large frame for it.
pub(crate) fn frames(max: u32) -> FrameCodec {
    FrameCodec::new(max).first_frame_at_most(MAX_LOGIN_FRAME_BYTES)
}

/// Length-prefixed frames, as `docs/PROTOCOL.md` describes them.
impl Framing for FrameCodec {
    const SPEAKS: Speaks = Speaks::Frames;

    fn decode(&mut self, src: &mut BytesMut, _out: &mut BytesMut) -> Result<Option<Command>, Close> {
        match FrameCodec::decode(self, src) {
            Ok(frame) => Ok(frame.map(Command::from)),
            Err(e) => Err((crate::proto::CloseReason::ProtocolError, e.to_string())),
        }
    }

    fn encode(&mut self, frame: &Frame, out: &mut BytesMut) {
        put_frame(frame, out);
    }

    fn max_frame_bytes(&self) -> u32 {
        FrameCodec::max_frame_bytes(self)
    }

    fn ready(&self) -> bool {
        true
    }
}

//! [`FrameCodec`] as a tokio-util codec (feature `tokio-codec`, off by default), for whoever
//! frames a stream with `tokio_util::codec::Framed`: the wire vocabulary itself stays free of
//! any runtime.

use bytes::BytesMut;
use tokio_util::codec::{Decoder, Encoder};

use crate::{Frame, FrameCodec, FrameError};

impl Decoder for FrameCodec {
    type Item = Frame;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        FrameCodec::decode(self, src)
    }
}

impl Encoder<&Frame> for FrameCodec {
    type Error = FrameError;

    fn encode(&mut self, frame: &Frame, dst: &mut BytesMut) -> Result<(), FrameError> {
        FrameCodec::encode(self, frame, dst)
    }
}

impl Encoder<Frame> for FrameCodec {
    type Error = FrameError;

    fn encode(&mut self, frame: Frame, dst: &mut BytesMut) -> Result<(), FrameError> {
        FrameCodec::encode(self, &frame, dst)
    }
}

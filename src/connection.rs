//! One client connection, from accept to BYE: reads frames, answers them, and ends when the
//! client leaves, misbehaves, or its session is ended by an expiry, a kick or shutdown.
//!
//! One task per connection owns both halves of the socket. Replies go into a bounded
//! outgoing buffer written whenever the socket takes them, so a client that never reads
//! costs at most that bound before it is closed as a slow consumer, and nothing ever waits
//! on a client without a deadline.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::{sleep_until, timeout, Instant};
use tokio_util::codec::{Encoder, FramedRead};

use crate::auth::unix_now;
use crate::codec::FrameCodec;
use crate::error::FrameError;
use crate::frame::{CloseReason, Frame};
use crate::metrics::FrameKind;
use crate::registry::Activity;
use crate::server::Shared;
use crate::session::Session;

/// Initial read buffer: a LOGIN with a token, or a handful of pings, fit. tokio-util's
/// default is 8 KiB, which at 100k idle connections would be 800 MiB of buffers.
const INITIAL_READ_BUFFER: usize = 256;

/// A read or write buffer larger than this, once empty again, is given back, so one large
/// frame does not make a connection expensive for the rest of its life.
const SHRINK_ABOVE: usize = 4 * 1024;

/// Replies queued for a client that does not read them, beyond which it is closed with
/// reason slow_consumer: about a thousand PONGs, far more than a healthy client lags.
const MAX_QUEUED_BYTES: usize = 64 * 1024;

/// Longest a BYE may wait on a client's socket before the connection is dropped anyway.
const BYE_WRITE_DEADLINE: Duration = Duration::from_secs(1);

/// How a connection ends: the reason, and a text for the BYE.
type Close = (CloseReason, String);

/// Serves one accepted connection until it closes; returns why it closed.
pub(crate) async fn serve(mut stream: TcpStream, conn_id: u64, shared: Arc<Shared>) -> CloseReason {
    let (read_half, mut write_half) = stream.split();
    let codec = FrameCodec::new(shared.config.max_frame_bytes);
    let mut frames = FramedRead::with_capacity(read_half, codec, INITIAL_READ_BUFFER);
    let mut conn = Connection { shared: &shared, codec, conn_id, session: None, last_tick: 0, out: BytesMut::new() };
    let login_deadline = Instant::now() + shared.config.login_timeout;

    let (reason, text) = loop {
        tokio::select! {
            biased;
            _ = shared.shutdown.cancelled() => break (CloseReason::Shutdown, String::new()),
            reason = ended(conn.session.as_deref()) => break (reason, String::new()),
            _ = sleep_until(login_deadline), if conn.session.is_none() => {
                break (CloseReason::LoginTimeout, "no LOGIN in time".into());
            }
            written = write_half.write_buf(&mut conn.out), if !conn.out.is_empty() => {
                if !matches!(written, Ok(n) if n > 0) {
                    break (CloseReason::Disconnect, String::new());
                }
            }
            frame = frames.next() => match frame {
                None | Some(Err(FrameError::Io(_))) => break (CloseReason::Disconnect, String::new()),
                Some(Err(e)) => break (CloseReason::ProtocolError, e.to_string()),
                Some(Ok(frame)) => {
                    if let Err(close) = conn.on_frame(frame) {
                        break close;
                    }
                }
            },
        }
        if conn.out.len() > MAX_QUEUED_BYTES {
            break (CloseReason::SlowConsumer, format!("more than {MAX_QUEUED_BYTES} bytes of replies unread"));
        }
        shrink_if_idle(frames.read_buffer_mut());
        shrink_if_idle(&mut conn.out);
    };

    let reason = match &conn.session {
        Some(session) => shared.registry.leave(session, reason),
        None => reason,
    };
    if reason.wire_code().is_some() {
        conn.reply(&Frame::Bye { reason, text });
    }
    // Best effort: a client that does not read loses its BYE and pending replies, not our
    // time.
    let _ = timeout(BYE_WRITE_DEADLINE, async {
        write_half.write_all_buf(&mut conn.out).await?;
        write_half.shutdown().await
    })
    .await;
    shared.metrics.closed(reason);
    match &conn.session {
        Some(s) => tracing::debug!(conn_id, uid = s.uid(), %reason, "connection closed"),
        None => tracing::debug!(conn_id, %reason, "connection closed before login"),
    }
    reason
}

/// Resolves when `session` ends; never without one.
async fn ended(session: Option<&Session>) -> CloseReason {
    match session {
        Some(session) => session.ended().await,
        None => std::future::pending().await,
    }
}

/// Gives back a buffer that grew for a large frame once it is empty again.
fn shrink_if_idle(buf: &mut BytesMut) {
    if buf.is_empty() && buf.capacity() > SHRINK_ABOVE {
        *buf = BytesMut::new();
    }
}

/// The per-connection state the frame handlers need.
struct Connection<'a> {
    shared: &'a Shared,
    codec: FrameCodec,
    conn_id: u64,
    session: Option<Arc<Session>>,
    /// The tick of this session's last ring touch: a frame on the same tick skips the ring.
    last_tick: u64,
    /// Encoded replies not yet written.
    out: BytesMut,
}

// === impl Connection ===

impl Connection<'_> {
    fn on_frame(&mut self, frame: Frame) -> Result<(), Close> {
        let metrics = &self.shared.metrics;
        match (&self.session, frame) {
            (None, Frame::Login { uid, token }) => {
                metrics.frame(FrameKind::Login);
                self.login(uid, &token)
            }
            (Some(_), Frame::Login { .. }) => Err((CloseReason::ProtocolError, "second LOGIN".into())),
            (Some(_), Frame::Ping(payload)) => {
                metrics.frame(FrameKind::Ping);
                self.activity()?;
                self.reply(&Frame::Pong(payload));
                Ok(())
            }
            (Some(_), Frame::Data(_)) => {
                metrics.frame(FrameKind::Data);
                self.activity()
            }
            (Some(_), Frame::Logout) => {
                metrics.frame(FrameKind::Logout);
                Err((CloseReason::Logout, String::new()))
            }
            (None, Frame::Ping(_) | Frame::Data(_) | Frame::Logout) => {
                Err((CloseReason::ProtocolError, "LOGIN must be the first frame".into()))
            }
            (_, Frame::Welcome { .. } | Frame::Pong(_) | Frame::Bye { .. }) => {
                Err((CloseReason::ProtocolError, "gateway-to-client frame kind sent by a client".into()))
            }
        }
    }

    fn login(&mut self, uid: u64, token: &[u8]) -> Result<(), Close> {
        let shared = self.shared;
        if let Some(auth) = &shared.config.auth {
            if let Err(e) = auth.verify(uid, token, unix_now()) {
                tracing::debug!(conn_id = self.conn_id, uid, error = %e, "login refused");
                return Err((CloseReason::AuthFailed, "token refused".into()));
            }
        }
        let now = shared.now_tick();
        self.session = Some(shared.registry.login(uid, self.conn_id, now));
        self.last_tick = now;
        self.reply(&Frame::Welcome { timeout_ms: shared.config.timeout_ms(), tick_ms: shared.config.tick_ms() });
        tracing::debug!(conn_id = self.conn_id, uid, "logged in");
        Ok(())
    }

    /// Counts a frame as activity of the session: ring work only when the tick changed.
    fn activity(&mut self) -> Result<(), Close> {
        let Some(session) = &self.session else {
            return Ok(());
        };
        let now = self.shared.now_tick();
        if now == self.last_tick {
            return Ok(());
        }
        match self.shared.registry.touch(session, now) {
            Activity::Online => {
                self.last_tick = now;
                Ok(())
            }
            Activity::Offline => {
                // Swept (or kicked) before this frame was read: the frame is dropped.
                self.shared.registry.finish_expired(session.uid());
                Err((session.end_reason().unwrap_or(CloseReason::IdleTimeout), String::new()))
            }
        }
    }

    fn reply(&mut self, frame: &Frame) {
        // Cannot fail: our frames echo at most a payload we accepted, far below 4 GiB.
        let _ = self.codec.encode(frame, &mut self.out);
    }
}

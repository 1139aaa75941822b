//! One client connection, from accept to BYE: reads frames, answers them, and ends when the
//! client leaves, misbehaves, or its session is ended by an expiry, a kick or shutdown.
//!
//! One task per connection owns the socket. It waits for readiness, not for data, and reads
//! into a buffer that belongs to the worker thread, not to the connection, as epoll servers
//! holding a million connections do: an idle connection owns no read or write buffer at all.
//! Only a frame split across reads, or replies the client has not taken yet, are copied into
//! buffers of the connection's own, sized to what they hold. Replies the client does not read
//! are bounded; past the bound the connection is closed as a slow consumer, and nothing ever
//! waits on a client without a deadline.

use std::cell::RefCell;
use std::io;
use std::sync::Arc;
use std::thread::LocalKey;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncWriteExt, Interest, Ready};
use tokio::net::TcpStream;
use tokio::time::{sleep, timeout};
use tokio_util::codec::{Decoder, Encoder};

use crate::auth::unix_now;
use crate::codec::FrameCodec;
use crate::frame::{CloseReason, Frame};
use crate::metrics::FrameKind;
use crate::registry::Activity;
use crate::server::Shared;
use crate::session::Session;

/// Bytes one read asks the kernel for: a burst of pings, or a whole LOGIN with its token.
const READ_CHUNK: usize = 4 * 1024;

/// Bytes a read adds to a connection's own buffer while it holds part of a frame.
const SPLIT_FRAME_READ: usize = 64;

/// Replies queued for a client that does not read them, beyond which it is closed with
/// reason slow_consumer: about a thousand PONGs, far more than a healthy client lags.
const MAX_QUEUED_BYTES: usize = 64 * 1024;

/// Longest a BYE may wait on a client's socket before the connection is dropped anyway.
const BYE_WRITE_DEADLINE: Duration = Duration::from_secs(1);

thread_local! {
    /// The worker's read buffer, lent to one connection for the length of one read.
    static READ_SCRATCH: RefCell<BytesMut> = RefCell::new(BytesMut::new());
    /// The worker's write buffer, lent to one connection while it answers one read.
    static WRITE_SCRATCH: RefCell<BytesMut> = RefCell::new(BytesMut::new());
}

/// How a connection ends: the reason, and a text for the BYE.
type Close = (CloseReason, String);

fn disconnect() -> Close {
    (CloseReason::Disconnect, String::new())
}

/// Serves one accepted connection until it closes; returns why it closed.
pub(crate) async fn serve(mut stream: TcpStream, conn_id: u64, shared: Arc<Shared>) -> CloseReason {
    let mut conn = Connection {
        shared: &shared,
        codec: FrameCodec::new(shared.config.max_frame_bytes),
        conn_id,
        session: None,
        last_tick: 0,
        pending: BytesMut::new(),
        unsent: BytesMut::new(),
    };
    // The future every connection keeps for its whole life holds only the logged-in phase.
    // The login phase (with its deadline timer) and the close (with its write deadline) are
    // boxed: allocated while they run, freed after, instead of widening every connection's
    // future by their size for as long as it lives.
    let (reason, text) = match Box::pin(conn.until_login(&stream)).await {
        Ok(session) => conn.until_end(&stream, session).await,
        Err(close) => close,
    };
    Box::pin(conn.close(&mut stream, reason, text)).await
}

/// The per-connection state.
struct Connection<'a> {
    shared: &'a Shared,
    codec: FrameCodec,
    conn_id: u64,
    session: Option<Arc<Session>>,
    /// The tick of this session's last ring touch: a frame on the same tick skips the ring.
    last_tick: u64,
    /// The start of a frame split across reads; empty (and unallocated) otherwise.
    pending: BytesMut,
    /// Replies the socket did not take yet; empty (and unallocated) otherwise.
    unsent: BytesMut,
}

// === impl Connection ===

impl Connection<'_> {
    /// Serves the connection until a LOGIN succeeds; returns its session.
    async fn until_login(&mut self, stream: &TcpStream) -> Result<Arc<Session>, Close> {
        let deadline = sleep(self.shared.config.login_timeout);
        tokio::pin!(deadline);
        loop {
            if let Some(session) = &self.session {
                return Ok(session.clone());
            }
            tokio::select! {
                biased;
                _ = self.shared.shutdown.cancelled() => return Err((CloseReason::Shutdown, String::new())),
                _ = &mut deadline => return Err((CloseReason::LoginTimeout, "no LOGIN in time".into())),
                ready = stream.ready(self.interest()) => self.on_ready(stream, ready)?,
            }
        }
    }

    /// Serves a logged-in connection until it or its session ends.
    async fn until_end(&mut self, stream: &TcpStream, session: Arc<Session>) -> Close {
        // Shutdown ends every session in the registry; one that logged in as it began is
        // ended here, so none is missed either way.
        if self.shared.shutdown.is_cancelled() {
            session.end(CloseReason::Shutdown);
        }
        loop {
            tokio::select! {
                biased;
                reason = session.ended() => return (reason, String::new()),
                ready = stream.ready(self.interest()) => {
                    if let Err(close) = self.on_ready(stream, ready) {
                        return close;
                    }
                }
            }
        }
    }

    /// Readable always; writable too while replies wait.
    fn interest(&self) -> Interest {
        if self.unsent.is_empty() {
            Interest::READABLE
        } else {
            Interest::READABLE | Interest::WRITABLE
        }
    }

    /// Reads what arrived, answers it, and writes what the socket takes.
    fn on_ready(&mut self, stream: &TcpStream, ready: io::Result<Ready>) -> Result<(), Close> {
        let ready = ready.map_err(|_| disconnect())?;
        let mut out = std::mem::take(&mut self.unsent);
        let result = lend(&WRITE_SCRATCH, &mut out, |out| {
            if ready.is_readable() || ready.is_read_closed() {
                self.read(stream, out)?;
            }
            flush(stream, out)
        });
        self.unsent = out;
        if self.unsent.len() > MAX_QUEUED_BYTES {
            return Err((CloseReason::SlowConsumer, format!("more than {MAX_QUEUED_BYTES} bytes of replies unread")));
        }
        result
    }

    /// One read from the socket, and every whole frame in it.
    fn read(&mut self, stream: &TcpStream, out: &mut BytesMut) -> Result<(), Close> {
        let mut pending = std::mem::take(&mut self.pending);
        let result = lend(&READ_SCRATCH, &mut pending, |buf| {
            // The worker's buffer takes a full chunk; a split frame's own buffer only grows by
            // a little, since the codec already reserved the rest of the frame it knows of.
            buf.reserve(if buf.is_empty() { READ_CHUNK } else { SPLIT_FRAME_READ });
            match stream.try_read_buf(buf) {
                Ok(0) => Err(disconnect()),
                Ok(_) => self.decode_all(buf, out),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
                Err(_) => Err(disconnect()),
            }
        });
        self.pending = pending;
        result
    }

    fn decode_all(&mut self, buf: &mut BytesMut, out: &mut BytesMut) -> Result<(), Close> {
        loop {
            match self.codec.decode(buf) {
                Ok(Some(frame)) => self.on_frame(frame, out)?,
                Ok(None) => return Ok(()),
                Err(e) => return Err((CloseReason::ProtocolError, e.to_string())),
            }
        }
    }

    fn on_frame(&mut self, frame: Frame, out: &mut BytesMut) -> Result<(), Close> {
        let metrics = &self.shared.metrics;
        match (&self.session, frame) {
            (None, Frame::Login { uid, token }) => {
                metrics.frame(FrameKind::Login);
                self.login(uid, &token, out)
            }
            (Some(_), Frame::Login { .. }) => Err((CloseReason::ProtocolError, "second LOGIN".into())),
            (Some(_), Frame::Ping(payload)) => {
                metrics.frame(FrameKind::Ping);
                self.activity()?;
                self.reply(&Frame::Pong(payload), out);
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

    fn login(&mut self, uid: u64, token: &[u8], out: &mut BytesMut) -> Result<(), Close> {
        let shared = self.shared;
        if let Some(auth) = &shared.config.auth {
            if let Err(e) = auth.verify(uid, token, unix_now()) {
                tracing::debug!(conn_id = self.conn_id, uid, error = %e, "login refused");
                return Err((CloseReason::AuthFailed, "token refused".into()));
            }
        }
        let now = shared.now_tick();
        self.session = Some(shared.registry.login(uid, now));
        self.last_tick = now;
        let welcome = Frame::Welcome { timeout_ms: shared.config.timeout_ms(), tick_ms: shared.config.tick_ms() };
        self.reply(&welcome, out);
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

    fn reply(&mut self, frame: &Frame, out: &mut BytesMut) {
        // Cannot fail: our frames echo at most a payload we accepted, far below 4 GiB.
        let _ = self.codec.encode(frame, out);
    }

    /// Ends the session (the first reason given wins), sends the BYE within a deadline, and
    /// closes; returns the reason the connection closed with.
    async fn close(mut self, stream: &mut TcpStream, reason: CloseReason, text: String) -> CloseReason {
        let reason = match &self.session {
            Some(session) => self.shared.registry.leave(session, reason),
            None => reason,
        };
        let mut out = std::mem::take(&mut self.unsent);
        if reason.wire_code().is_some() {
            self.reply(&Frame::Bye { reason, text }, &mut out);
        }
        // Best effort: a client that does not read loses its BYE and pending replies, not
        // our time.
        let _ = timeout(BYE_WRITE_DEADLINE, async {
            stream.write_all_buf(&mut out).await?;
            stream.shutdown().await
        })
        .await;
        self.shared.metrics.closed(reason);
        match &self.session {
            Some(s) => tracing::debug!(conn_id = self.conn_id, uid = s.uid(), %reason, "connection closed"),
            None => tracing::debug!(conn_id = self.conn_id, %reason, "connection closed before login"),
        }
        reason
    }
}

/// Writes what the socket takes now, without waiting.
fn flush(stream: &TcpStream, out: &mut BytesMut) -> Result<(), Close> {
    while !out.is_empty() {
        match stream.try_write(out) {
            Ok(0) => return Err(disconnect()),
            Ok(n) => out.advance(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(_) => return Err(disconnect()),
        }
    }
    Ok(())
}

/// Runs `f` on the connection's own buffer `own` if it holds something, else on the worker's
/// scratch buffer in `key`. Whatever `f` leaves in the scratch is copied into `own`, sized to
/// fit, so the scratch goes back to the worker empty and an idle connection keeps no buffer.
fn lend<R>(key: &'static LocalKey<RefCell<BytesMut>>, own: &mut BytesMut, f: impl FnOnce(&mut BytesMut) -> R) -> R {
    if !own.is_empty() {
        let result = f(own);
        if own.is_empty() {
            *own = BytesMut::new();
        }
        return result;
    }
    key.with(|cell| {
        let mut scratch = cell.borrow_mut();
        scratch.clear();
        let result = f(&mut scratch);
        if !scratch.is_empty() {
            *own = BytesMut::from(&scratch[..]);
            scratch.clear();
        }
        result
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        static TEST_SCRATCH: RefCell<BytesMut> = RefCell::new(BytesMut::new());
    }

    #[test]
    fn lend_keeps_only_leftovers_and_sizes_them_to_fit() {
        let mut own = BytesMut::new();
        lend(&TEST_SCRATCH, &mut own, |buf| {
            buf.reserve(READ_CHUNK);
            buf.extend_from_slice(b"whole frame");
            buf.advance(5);
        });
        assert_eq!(&own[..], b" frame");
        assert!(own.capacity() < 64, "leftover copied to a right-sized buffer: {}", own.capacity());
        TEST_SCRATCH.with(|s| assert!(s.borrow().is_empty() && s.borrow().capacity() >= READ_CHUNK - 11));

        // A connection with leftovers uses its own buffer, and gives it up once empty.
        lend(&TEST_SCRATCH, &mut own, |buf| buf.advance(6));
        assert_eq!(own.capacity(), 0);
    }
}

#[cfg(test)]
mod footprint {
    /// Every open connection keeps this future alive; the memory per connection at 19,000
    /// clients (docs/BENCHMARKS.md) is mostly it. A regression guard, not a speed test.
    #[tokio::test]
    async fn the_connection_future_stays_small() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stream = tokio::net::TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let server = crate::server::Server::new(crate::config::Config::default());
        let future = super::serve(stream, 1, server.shared());
        let size = std::mem::size_of_val(&future);
        assert!(size <= 600, "the connection future grew to {size} bytes");
    }
}

//! One client, from accept to BYE: the protocol's state machine over a [`Connection`].
//!
//! Before LOGIN only a LOGIN is accepted, within the login deadline; after it, PING, DATA
//! and LOGOUT count as activity (one ring touch per tick at most), DATA goes to the event
//! log, and pushes from backends go out as PUSH frames. The session ends when the client
//! leaves or misbehaves, or when someone else ends it: an expiry, a kick, shutdown.

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;

use bytes::{Bytes, BytesMut};
use tokio::io::Ready;
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::sleep;

use crate::client::connection::{Close, Connection};
use crate::error::AuthError;
use crate::gateway::Gateway;
use crate::metrics::Metrics;
use crate::presence::Session;
use crate::presence::{unix_now, Liveness};
use crate::proto::put_frame;
use crate::proto::{
    jittered_ms, retry_text, REFUSED_RETRY_BASE, REFUSED_RETRY_SPREAD, SHUTDOWN_RETRY_BASE, SHUTDOWN_RETRY_SPREAD,
};
use crate::proto::{CloseReason, Frame};

/// Serves one accepted connection until it closes, holding `permit` (its place under
/// `--max-connections`) until then; returns why it closed.
///
/// This future is the connection's task: everything it keeps across an await is memory every
/// open connection costs (`footprint` below).
pub(crate) async fn serve(stream: TcpStream, gateway: Arc<Gateway>, permit: OwnedSemaphorePermit) -> CloseReason {
    let mut conn = Connection::new(stream, gateway.config.max_frame_bytes);
    let mut handler = Handler { gateway, session: None, last_tick: 0 };
    // The future every connection keeps for its whole life holds only the logged-in phase.
    // The login phase (with its deadline timer) and the close (with its write deadline) are
    // boxed: allocated while they run, freed after, instead of widening every connection's
    // future by their size for as long as it lives.
    let logged_in = Box::pin(handler.until_login(&mut conn)).await;
    handler.gateway.metrics.pending_logins.dec();
    let (reason, text) = match logged_in {
        Ok(()) => handler.until_end(&mut conn).await,
        Err(close) => close,
    };
    let reason = Box::pin(handler.close(conn, reason, text)).await;
    drop(permit);
    reason
}

/// The protocol state of one connection.
struct Handler {
    gateway: Arc<Gateway>,
    session: Option<Arc<Session>>,
    /// The tick of this session's last ring touch: a frame on the same tick skips the ring.
    last_tick: u64,
}

// === impl Handler ===

impl Handler {
    /// Serves the connection until a LOGIN succeeds (`self.session` is then set); its
    /// ticket among the connections waiting to log in goes back when this returns.
    async fn until_login(&mut self, conn: &mut Connection) -> Result<(), Close> {
        let ticket = self.gateway.pending.claim(conn.fd());
        let shed = async {
            match &ticket {
                Some(ticket) => ticket.shed().await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(shed);
        let deadline = sleep(self.gateway.config.login_timeout);
        tokio::pin!(deadline);
        loop {
            if self.session.is_some() {
                return Ok(());
            }
            tokio::select! {
                biased;
                _ = self.gateway.shutdown.cancelled() => return Err((CloseReason::Shutdown, String::new())),
                _ = &mut shed => {
                    self.gateway.metrics.shed_pending_logins.inc();
                    let hint = jittered_ms(REFUSED_RETRY_BASE, REFUSED_RETRY_SPREAD);
                    let why = "the oldest connection waiting to log in, shed to make room for newer ones";
                    return Err((CloseReason::ServerFull, retry_text(hint, why)));
                }
                _ = &mut deadline => {
                    // Judge what the client sent, not how fast we got to it: a LOGIN that
                    // arrived while the gateway lagged is read now, before giving up.
                    conn.on_ready(Ok(Ready::READABLE), |frame, out| self.on_frame(frame, out))?;
                    return match &self.session {
                        Some(_) => Ok(()),
                        None => Err((CloseReason::LoginTimeout, "no LOGIN in time".into())),
                    };
                }
                ready = conn.ready() => conn.on_ready(ready, |frame, out| self.on_frame(frame, out))?,
            }
        }
    }

    /// Serves a logged-in connection until it or its session ends.
    async fn until_end(&mut self, conn: &mut Connection) -> Close {
        // Shutdown ends every session in the registry; one that logged in as it began is
        // ended here, so none is missed either way.
        if let Some(session) = self.session.as_deref().filter(|_| self.gateway.shutdown.is_cancelled()) {
            session.end(CloseReason::Shutdown);
        }
        loop {
            let step = tokio::select! {
                biased;
                _ = woken(self.session.as_deref()) => match self.session.as_deref().map(|s| (s, s.end_reason())) {
                    Some((_, Some(reason))) => return (reason, String::new()),
                    Some((session, None)) => {
                        conn.send(self.gateway.registry.take_pushes(session).into_iter().map(Frame::Push))
                    }
                    None => Ok(()),
                },
                ready = conn.ready() => conn.on_ready(ready, |frame, out| self.on_frame(frame, out)),
            };
            if let Err(close) = step {
                return close;
            }
        }
    }

    fn on_frame(&mut self, frame: Frame, out: &mut BytesMut) -> Result<(), Close> {
        let metrics: &Metrics = &self.gateway.metrics;
        metrics.frame(&frame);
        match (&self.session, frame) {
            (None, Frame::Login { uid, token }) => self.login(uid, &token, out),
            (Some(_), Frame::Login { .. }) => Err((CloseReason::ProtocolError, "second LOGIN".into())),
            (Some(_), Frame::Ping(payload)) => {
                self.activity()?;
                put_frame(&Frame::Pong(payload), out);
                Ok(())
            }
            (Some(_), Frame::Data(payload)) => {
                self.activity()?;
                self.data_allowed()?;
                if let Some(session) = &self.session {
                    // Copied to a buffer of its own size: the frame's bytes live in the
                    // worker's read buffer, which the log must not keep alive.
                    self.gateway.registry.events().data(session, Bytes::copy_from_slice(&payload));
                }
                Ok(())
            }
            (Some(_), Frame::Logout) => Err((CloseReason::Logout, String::new())),
            (None, Frame::Ping(_) | Frame::Data(_) | Frame::Logout) => {
                Err((CloseReason::ProtocolError, "LOGIN must be the first frame".into()))
            }
            (_, Frame::Welcome { .. } | Frame::Pong(_) | Frame::Push(_) | Frame::Bye { .. }) => {
                Err((CloseReason::ProtocolError, "gateway-to-client frame kind sent by a client".into()))
            }
        }
    }

    fn login(&mut self, uid: u64, token: &[u8], out: &mut BytesMut) -> Result<(), Close> {
        let gateway = &self.gateway;
        if let Some(auth) = &gateway.config.auth {
            if let Err(e) = auth.verify(uid, token, unix_now()) {
                tracing::debug!(uid, error = %e, "login refused");
                // Says what to do about it (refresh, or fix the minting), never what the
                // secret is.
                let why = match e {
                    AuthError::Expired { .. } => "token expired",
                    AuthError::BadSignature => "token did not verify",
                    AuthError::Malformed => "token malformed: expected <expiry>.<64 lowercase hex>",
                    AuthError::TooLong { .. } => "token expiry too far ahead (--max-token-ttl)",
                };
                return Err((CloseReason::AuthFailed, why.into()));
            }
        }
        let now = gateway.clock.now();
        self.session = Some(gateway.registry.login(uid, now));
        self.last_tick = now;
        let config = &gateway.config;
        put_frame(&Frame::Welcome { timeout_ms: config.timeout_ms(), tick_ms: config.tick_ms() }, out);
        tracing::debug!(uid, "logged in");
        Ok(())
    }

    /// Counts a frame as activity of the session: ring work only when the tick changed.
    fn activity(&mut self) -> Result<(), Close> {
        let Some(session) = &self.session else {
            return Ok(());
        };
        let now = self.gateway.clock.now();
        if now == self.last_tick {
            return Ok(());
        }
        match self.gateway.registry.touch(session, now) {
            Liveness::Alive => {
                self.last_tick = now;
                Ok(())
            }
            // Swept (or kicked) before this frame was read: the frame is dropped, and the
            // close ends the session as expired unless something else ended it first.
            Liveness::Gone => Err((session.end_reason().unwrap_or(CloseReason::IdleTimeout), String::new())),
        }
    }

    /// Takes a DATA frame's token from the session's bucket (`--max-data-rate`); a client
    /// over the rate is ended, so one client cannot flood the event log for everyone.
    fn data_allowed(&self) -> Result<(), Close> {
        let (Some(session), Some((per_tick, burst))) = (&self.session, self.gateway.data_bucket) else {
            return Ok(());
        };
        if session.take_data_token(self.gateway.clock.now(), per_tick, burst) {
            return Ok(());
        }
        let config = &self.gateway.config;
        Err((
            CloseReason::ProtocolError,
            format!(
                "DATA over --max-data-rate: more than {} frames a second with a burst of {}",
                config.max_data_rate, config.max_data_burst
            ),
        ))
    }

    /// Ends the session (the first reason given wins), sends the BYE within a deadline, and
    /// closes; returns the reason the connection closed with.
    async fn close(self, conn: Connection, reason: CloseReason, text: String) -> CloseReason {
        let reason = match &self.session {
            Some(session) => self.gateway.registry.leave(session, reason),
            None => reason,
        };
        // Counted before the client can see the close, so whoever watches both never sees
        // an end of stream the counters do not know of yet.
        self.gateway.metrics.closed(reason);
        // Pushes a backend was told were sent go out before the BYE.
        let pushes = self.session.as_ref().map(|s| self.gateway.registry.take_pushes(s)).unwrap_or_default();
        // Told when to come back, each at a different moment, so a fleet does not return at
        // once to a restarted gateway.
        let text = match reason {
            CloseReason::Shutdown => retry_text(jittered_ms(SHUTDOWN_RETRY_BASE, SHUTDOWN_RETRY_SPREAD), &text),
            _ => text,
        };
        let bye = reason.wire_code().map(|_| Frame::Bye { reason, text });
        conn.close(pushes.into_iter().map(Frame::Push).chain(bye)).await;
        if reason == CloseReason::IdleTimeout && self.session.is_some() {
            // Swept on the tick its last touch fell due: window ticks after that touch.
            let gateway = &self.gateway;
            let swept_at = gateway.clock.instant_of(self.last_tick + gateway.config.window());
            gateway.metrics.expiry_bye_delay.observe(swept_at.elapsed().as_secs_f64());
        }
        match &self.session {
            Some(s) => tracing::debug!(uid = s.uid(), %reason, "connection closed"),
            None => tracing::debug!(%reason, "connection closed before login"),
        }
        self.gateway.metrics.connections_open.dec();
        reason
    }
}

/// Resolves when `session` was woken; never without a session, which `until_end` does not
/// serve. A poll, not an `async fn`: this future lives in every open connection's task.
fn woken(session: Option<&Session>) -> impl Future<Output = ()> + '_ {
    std::future::poll_fn(move |cx| match session {
        Some(session) => session.poll_woken(cx),
        None => Poll::Pending,
    })
}

#[cfg(test)]
mod footprint {
    /// The most the connection's future may take for its task to stay at 384 bytes: tokio's
    /// task adds 96 bytes (header, scheduler, id, trailer) and rounds up to 128-byte steps.
    /// At 544 bytes (until this round) each connection's task took 768.
    const MAX_CONNECTION_FUTURE: usize = 288;

    /// Every open connection keeps this future alive as its task; at 19,000 clients it is
    /// the largest share of the memory per connection (docs/BENCHMARKS.md). A regression
    /// guard, not a speed test.
    #[tokio::test]
    async fn the_connection_future_stays_small() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stream = tokio::net::TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let gateway = crate::gateway::Gateway::new(crate::config::Config::default());
        let permit = std::sync::Arc::new(tokio::sync::Semaphore::new(1)).try_acquire_owned().unwrap();
        let future = super::serve(stream, gateway, permit);
        let size = std::mem::size_of_val(&future);
        assert!(size <= MAX_CONNECTION_FUTURE, "the connection future grew to {size} bytes");
    }
}

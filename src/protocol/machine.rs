//! The protocol's state machine for one connection, with no IO: frames and wake-ups in,
//! frames to send and a close out. Every transport drives the same machine, so the rules
//! (LOGIN first and in time, activity, DATA to the event log and its rate, pushes, every
//! BYE and its reason) are written once.
//!
//! Before LOGIN only a LOGIN is accepted; after it, PING, DATA and LOGOUT count as activity
//! (one ring touch per tick at most), DATA goes to the event log, and pushes from backends go
//! out as PUSH frames. The session ends when the client leaves or misbehaves, or when
//! someone else ends it: an expiry, a kick, shutdown.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use crate::error::AuthError;
use crate::gateway::Gateway;
use crate::metrics::Metrics;
use crate::presence::{session_hex, unix_now, Liveness, Push, Session, Will};
use crate::proto::{
    jittered_ms, put_frame, retry_text, CloseReason, Device, Frame, Transport, REFUSED_RETRY_BASE,
    REFUSED_RETRY_SPREAD, SHUTDOWN_RETRY_BASE, SHUTDOWN_RETRY_SPREAD,
};

/// Why a connection closes: the reason its BYE carries, and the BYE's text.
pub(crate) type Close = (CloseReason, String);

/// Where the machine's frames go: a transport's output.
pub(crate) trait Out {
    fn frame(&mut self, frame: &Frame);

    /// An MQTT SUBSCRIBE's outcome, filter by filter (granted or not), for its SUBACK.
    fn subscribed(&mut self, _granted: &[bool]) {}

    /// Whether the door can ping the client so that its network stack answers (WebSocket).
    fn pings(&self) -> bool {
        false
    }

    /// The DATA just taken is durable at `position` (see [`crate::presence::EventLog::data`]):
    /// its acknowledgement (an MQTT PUBACK) waits until then.
    fn logged(&mut self, _position: u64) {}
}

/// A stream transport's output buffer: frames length-prefixed, back to back.
impl Out for BytesMut {
    fn frame(&mut self, frame: &Frame) {
        put_frame(frame, self);
    }
}

/// What a wake-up of the session means for its connection.
#[derive(Debug)]
pub(crate) enum Wake {
    /// Someone ended the session (an expiry, a kick, shutdown): close with this reason.
    End(CloseReason),
    /// Pushes to send, (`ping`) a ping for a client silent for a third of the timeout, and
    /// the position through which its data is durable, for acknowledgements it owes.
    Push { pushes: Vec<Push>, ping: bool, durable: u64 },
}

/// The protocol state of one connection.
pub(crate) struct Machine {
    gateway: Arc<Gateway>,
    session: Option<Arc<Session>>,
    /// The tick of this session's last ring touch: a frame on the same tick skips the ring.
    last_tick: u64,
}

// === impl Machine ===

impl Machine {
    pub(crate) fn new(gateway: Arc<Gateway>) -> Machine {
        Machine { gateway, session: None, last_tick: 0 }
    }

    pub(crate) fn gateway(&self) -> &Arc<Gateway> {
        &self.gateway
    }

    /// The session, once logged in.
    pub(crate) fn session(&self) -> Option<&Session> {
        self.session.as_deref()
    }

    /// The close of a connection shed from the connections waiting to log in.
    pub(crate) fn shed(&self) -> Close {
        self.gateway.metrics.shed_pending_logins.inc();
        let hint = jittered_ms(REFUSED_RETRY_BASE, REFUSED_RETRY_SPREAD);
        let why = "the oldest connection waiting to log in, shed to make room for newer ones";
        (CloseReason::ServerFull, retry_text(hint, why))
    }

    /// At the login deadline, after the transport read what had arrived: logged in, or the
    /// close for a client that did not log in in time.
    pub(crate) fn login_deadline(&self) -> Result<(), Close> {
        match &self.session {
            Some(_) => Ok(()),
            None => Err((CloseReason::LoginTimeout, "no LOGIN in time".into())),
        }
    }

    /// Called as the logged-in phase begins: shutdown ends every session in the registry,
    /// and one that logged in as it began is ended here, so none is missed either way.
    pub(crate) fn begin(&self) {
        if let Some(session) = self.session.as_ref().filter(|_| self.gateway.shutdown.is_cancelled()) {
            // Through the registry, which decides under the uid's entry whether this was
            // its last session.
            self.gateway.registry.leave(session, CloseReason::Shutdown);
        }
    }

    /// What the session's wake-up means.
    pub(crate) fn on_wake(&self) -> Option<Wake> {
        let session = self.session.as_deref()?;
        Some(match session.end_reason() {
            Some(reason) => Wake::End(reason),
            None => Wake::Push {
                pushes: self.gateway.registry.take_pushes(session),
                ping: session.take_ping(),
                durable: self.gateway.registry.events().durable_through(),
            },
        })
    }

    /// Acts on one frame from the client; replies go to `out`. An error closes the
    /// connection with that reason and text.
    pub(crate) fn on_frame(&mut self, frame: Frame, out: &mut (impl Out + ?Sized)) -> Result<(), Close> {
        self.on_frame_of(frame, false, out)
    }

    /// A frame from a client that takes every push, or (`subscriber`, an MQTT client) only
    /// those its subscriptions match.
    fn on_frame_of(&mut self, frame: Frame, subscriber: bool, out: &mut (impl Out + ?Sized)) -> Result<(), Close> {
        let metrics: &Metrics = &self.gateway.metrics;
        metrics.frame(&frame);
        match (&self.session, frame) {
            (None, Frame::Login { uid, token, device }) => self.login(uid, &token, device, subscriber, out),
            (Some(_), Frame::Login { .. }) => Err((CloseReason::ProtocolError, "second LOGIN".into())),
            (Some(_), Frame::Ping(payload)) => {
                self.activity()?;
                out.frame(&Frame::Pong(payload));
                Ok(())
            }
            (Some(_), Frame::Data(payload)) => {
                // Copied to a buffer of its own size: the frame's bytes live in the worker's
                // read buffer, which the log must not keep alive.
                self.data(Bytes::copy_from_slice(&payload), None, out)
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

    /// An MQTT PUBLISH: a DATA on `topic`, its payload already in a buffer of its own.
    pub(crate) fn on_publish(
        &mut self,
        topic: Arc<str>,
        payload: Bytes,
        out: &mut (impl Out + ?Sized),
    ) -> Result<(), Close> {
        if self.session.is_none() {
            return Err((CloseReason::ProtocolError, "PUBLISH before CONNECT".into()));
        }
        self.gateway.metrics.frame(&Frame::Data(Bytes::new()));
        self.data(payload, Some(&topic), out)
    }

    /// An MQTT CONNECT: the LOGIN of a session that takes only the pushes it subscribes to,
    /// and its will, told in its offline event.
    pub(crate) fn on_connect(
        &mut self,
        login: Frame,
        will: Option<Box<Will>>,
        out: &mut (impl Out + ?Sized),
    ) -> Result<(), Close> {
        self.on_frame_of(login, true, out)?;
        if let (Some(session), Some(will)) = (&self.session, will) {
            self.gateway.registry.events().set_will(session, *will);
        }
        Ok(())
    }

    /// An MQTT SUBSCRIBE (with the largest packet its client takes) or UNSUBSCRIBE (`None`):
    /// activity, counted against the session's `--max-data-rate` as a DATA is (each changes
    /// state the gateway keeps), and the session's topic filters change, at most
    /// `--mqtt-max-subscriptions` of them; a SUBSCRIBE's outcome goes to `out`, filter by
    /// filter.
    pub(crate) fn on_subscriptions(
        &mut self,
        filters: &[String],
        subscribe: Option<u32>,
        out: &mut (impl Out + ?Sized),
    ) -> Result<(), Close> {
        let now = self.activity()?;
        self.data_allowed(now)?;
        if let Some(session) = &self.session {
            let subscriptions = self.gateway.registry.subscriptions();
            if let Some(max_packet) = subscribe {
                let max = self.gateway.config.mqtt_max_subscriptions;
                out.subscribed(&subscriptions.subscribe(session.id(), filters, max, max_packet));
            } else {
                subscriptions.unsubscribe(session.id(), filters);
            }
        }
        Ok(())
    }

    /// A DATA of the logged-in session: activity, the rate, the event log. A DATA the log
    /// did not take (its session ended since the tick's touch: a kick, a takeover) closes
    /// the connection with the session's reason, so an MQTT PUBLISH is never acknowledged
    /// for data nobody will see, and the client sends it again on its next connection.
    fn data(&mut self, payload: Bytes, topic: Option<&str>, out: &mut (impl Out + ?Sized)) -> Result<(), Close> {
        let now = self.activity()?;
        self.data_allowed(now)?;
        if let Some(session) = &self.session {
            match self.gateway.registry.events().data(session, payload, topic) {
                Some(position) => out.logged(position),
                None => return Err((session.end_reason().unwrap_or(CloseReason::Kicked), String::new())),
            }
        }
        Ok(())
    }

    /// Something from the client that is not a frame but shows it is there (a WebSocket
    /// ping or pong): activity of a logged-in session, nothing before LOGIN.
    pub(crate) fn on_activity(&mut self) -> Result<(), Close> {
        self.activity().map(|_| ())
    }

    /// Logs in; `subscriber` for an MQTT session, which takes only the pushes its
    /// subscriptions match.
    fn login(
        &mut self,
        uid: u64,
        token: &[u8],
        device: Device,
        subscriber: bool,
        out: &mut (impl Out + ?Sized),
    ) -> Result<(), Close> {
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
        let pingable = out.pings() && gateway.config.ws_keepalive_pings;
        let session = gateway.registry.login_as(uid, device, now, subscriber, pingable);
        let id = session_hex(session.id());
        self.session = Some(session);
        self.last_tick = now;
        let config = &gateway.config;
        out.frame(&Frame::Welcome { timeout_ms: config.timeout_ms(), tick_ms: config.tick_ms(), session: id });
        tracing::debug!(uid, "logged in");
        Ok(())
    }

    /// Counts a frame as activity of the session: ring work only when the tick changed.
    /// Returns the tick now, for the frame's other checks.
    fn activity(&mut self) -> Result<u64, Close> {
        let now = self.gateway.clock.now();
        let Some(session) = &self.session else {
            return Ok(now);
        };
        if now == self.last_tick {
            return Ok(now);
        }
        match self.gateway.registry.touch(session, now) {
            Liveness::Alive => {
                self.last_tick = now;
                Ok(now)
            }
            // Swept (or kicked) before this frame was read: the frame is dropped, and the
            // close ends the session as expired unless something else ended it first.
            Liveness::Gone => Err((session.end_reason().unwrap_or(CloseReason::IdleTimeout), String::new())),
        }
    }

    /// Takes a DATA frame's token at tick `now` from the session's bucket (`--max-data-rate`); a client
    /// over the rate is ended, so one client cannot flood the event log for everyone.
    fn data_allowed(&self, now: u64) -> Result<(), Close> {
        let (Some(session), Some((per_tick, burst))) = (&self.session, self.gateway.data_bucket) else {
            return Ok(());
        };
        if session.take_data_token(now, per_tick, burst) {
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

    /// Ends the session (the first reason given wins) and says what to send last: the pushes
    /// a backend was told were sent, then the BYE (with a retry hint for shutdown). Returns
    /// the reason the connection closes with.
    pub(crate) fn goodbye(&self, reason: CloseReason, text: String) -> (CloseReason, Vec<Push>, Option<Frame>) {
        let reason = match &self.session {
            Some(session) => {
                // Here, the connection's last word, not at the ending: a SUBSCRIBE read after
                // a kick but before its wake-up would otherwise leave its filters behind.
                self.gateway.registry.subscriptions().forget(session.id());
                self.gateway.registry.leave(session, reason)
            }
            None => reason,
        };
        // Counted before the client can see the close, so whoever watches both never sees
        // an end of stream the counters do not know of yet.
        self.gateway.metrics.closed(reason);
        if reason == CloseReason::IdleTimeout && self.session.is_some() {
            // From the tick that swept it (window ticks after its last touch) to its BYE,
            // which goes out next.
            let gateway = &self.gateway;
            let swept_at = gateway.clock.instant_of(self.last_tick + gateway.config.window());
            gateway.metrics.expiry_bye_delay.observe(swept_at.elapsed().as_secs_f64());
        }
        let pushes = self.session.as_ref().map(|s| self.gateway.registry.take_pushes(s)).unwrap_or_default();
        // Told when to come back, each at a different moment, so a fleet does not return at
        // once to a restarted gateway.
        let text = match reason {
            CloseReason::Shutdown => retry_text(jittered_ms(SHUTDOWN_RETRY_BASE, SHUTDOWN_RETRY_SPREAD), &text),
            CloseReason::Kicked if text.is_empty() && self.session.as_ref().is_some_and(|s| s.was_evicted()) => {
                match self.gateway.config.max_devices {
                    1 => "replaced by a login of the same uid on another device (--max-devices 1)".to_string(),
                    n => format!("the least recently active of {n} devices, ended for a login on another"),
                }
            }
            _ => text,
        };
        let bye = reason.wire_code().map(|_| Frame::Bye { reason, text });
        (reason, pushes, bye)
    }

    /// After the connection on `transport` closed with `reason`.
    pub(crate) fn closed(&self, transport: Transport, reason: CloseReason) {
        match &self.session {
            Some(s) => tracing::debug!(uid = s.uid(), %reason, "connection closed"),
            None => tracing::debug!(%reason, "connection closed before login"),
        }
        self.gateway.metrics.closed_on(transport);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn login(machine: &mut Machine, uid: u64) {
        let mut out = BytesMut::new();
        let login = Frame::Login { uid, token: Bytes::new(), device: Device::DEFAULT };
        machine.on_connect(login, None, &mut out).expect("the login is taken");
        assert!(!out.is_empty(), "a WELCOME went out");
    }

    /// A takeover ends the session on the tick of its last touch: the PUBLISH read next
    /// does no ring work, and must still find out that the log did not take its DATA.
    #[tokio::test(start_paused = true)]
    async fn a_publish_the_log_did_not_take_closes_instead_of_being_acknowledged() {
        let gateway = Gateway::new(Config::default());
        let mut machine = Machine::new(gateway.clone());
        login(&mut machine, 7);
        assert_eq!(machine.on_publish("t".into(), Bytes::from_static(b"before"), &mut BytesMut::new()), Ok(()));
        assert_eq!(gateway.registry.kick(7, None), 1);
        let after = machine.on_publish("t".into(), Bytes::from_static(b"after"), &mut BytesMut::new());
        assert_eq!(after.map_err(|(reason, _)| reason), Err(CloseReason::Kicked));
        let mut tcp = Machine::new(gateway.clone());
        login(&mut tcp, 8);
        gateway.registry.kick(8, None);
        let data = tcp.on_frame(Frame::Data(Bytes::from_static(b"late")), &mut BytesMut::new());
        assert_eq!(data.map_err(|(reason, _)| reason), Err(CloseReason::Kicked));
    }
}

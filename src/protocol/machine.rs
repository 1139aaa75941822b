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
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::time::Instant;

use crate::config::{Class, JwtAuth, TimeoutClasses, WatchPolicy};
use crate::presence::{session_hex, unix_ms_now, Claims, Origin, Push, Session, Touched, Traits, WatchRefused, Will};
use crate::proto::{
    jittered_ms, kind, put_frame, retry_text, AuthError, CloseReason, Device, Frame, MAX_TOKEN_BYTES,
    REFUSED_RETRY_BASE, REFUSED_RETRY_SPREAD, SHUTDOWN_RETRY_BASE, SHUTDOWN_RETRY_SPREAD,
};
use crate::protocol::command::{Asked, Command};
use crate::protocol::context::Context;

/// Why a connection closes: the reason its BYE carries, and the BYE's text.
pub(crate) type Close = (CloseReason, String);

/// What a connection shed from those waiting to log in is told, in its login phase or
/// still waiting for its PROXY header.
pub(crate) const SHED: &str = "the oldest connection waiting to log in, shed to make room for newer ones";

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

/// What the machine reads of the world besides commands: the time, randomness and, at
/// login, where the client came from. The driver passes [`System`] (through [`Arriving`]
/// until the login); tests pass fixed values, so every rule runs with no clock.
pub(crate) trait Inputs {
    /// Monotonic time now: the ring's ticks and the login deadline.
    fn now(&self) -> Instant;
    /// Wall-clock milliseconds since the Unix epoch: token expiry only.
    fn unix_ms(&self) -> u64;
    /// The same in whole seconds, as tokens count.
    fn unix_secs(&self) -> u64 {
        self.unix_ms() / 1000
    }
    /// `base` plus a random share of `spread`, in milliseconds: the retry hints, so a fleet
    /// told to come back does not come back at once.
    fn jitter_ms(&self, base: Duration, spread: Duration) -> u64;
    /// The client's door and address, which its session keeps for its online event and its
    /// presence entry: read at login only.
    fn origin(&self) -> Origin {
        Origin::default()
    }
}

/// [`System`], for a connection not logged in yet that came from `.0`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Arriving(pub Origin);

impl Inputs for Arriving {
    fn now(&self) -> Instant {
        System.now()
    }

    fn unix_ms(&self) -> u64 {
        System.unix_ms()
    }

    fn jitter_ms(&self, base: Duration, spread: Duration) -> u64 {
        System.jitter_ms(base, spread)
    }

    fn origin(&self) -> Origin {
        self.0
    }
}

/// The real time and randomness.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct System;

impl Inputs for System {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn unix_ms(&self) -> u64 {
        unix_ms_now()
    }

    fn jitter_ms(&self, base: Duration, spread: Duration) -> u64 {
        jittered_ms(base, spread)
    }
}

/// A LOGIN's parts, as [`Machine::login`] takes them.
struct Login<'a> {
    uid: u64,
    token: &'a [u8],
    device: Device,
    timeout: Asked,
    subscriber: bool,
    will: Option<Box<Will>>,
}

/// A token that checked out: when it expires, and what of it the session's events carry.
#[derive(Debug, Default)]
struct Checked {
    /// Its expiry (unix seconds; `exp` for a JWT), 0 when nothing was checked (no token
    /// rules are configured).
    expires: u64,
    /// When it stops being taken (unix milliseconds): the expiry, plus `--jwt-leeway` for a
    /// JWT. The session ends there when expiry is enforced.
    deadline_ms: Option<u64>,
    claims: Option<Arc<Claims>>,
    /// The timeout cap its claim says (`--jwt-timeout-cap-claim`), in seconds.
    timeout_cap_s: Option<u64>,
    /// The uids its claim lets the session watch (`--jwt-watch-claim`).
    watch: Option<Vec<u64>>,
}

/// What a wake-up of the session means for its connection.
#[derive(Debug)]
pub(crate) enum Wake {
    /// Someone ended the session (an expiry, a kick, shutdown): close with this reason.
    End(CloseReason),
    /// Pushes to send, PRESENCE frames owed to a watcher, (`ping`) a ping for a client
    /// silent for a third of the timeout, and the position through which its data is
    /// durable, for acknowledgements it owes.
    Push { pushes: Vec<Push>, presence: Vec<Frame>, ping: bool, durable: u64 },
}

/// Where a connection is in the protocol. Two words: the logged-in variant's session
/// pointer leaves room for the deadline beside it, so the machine costs every open
/// connection's task no more than the session and its last tick.
enum Phase {
    /// Until a LOGIN succeeds: it must arrive by `deadline_ms` (the clock's milliseconds).
    LoggingIn { deadline_ms: u64 },
    /// Logged in; `last_tick` is the tick of the session's last ring touch: a command on the
    /// same tick skips the ring.
    LoggedIn { session: Arc<Session>, last_tick: u64 },
}

/// The protocol state of one connection.
pub(crate) struct Machine {
    context: Arc<Context>,
    phase: Phase,
}

// === impl Machine ===

impl Machine {
    /// The machine of a connection accepted at `accepted`: it must log in within
    /// `--login-timeout` of then.
    pub(crate) fn new(context: Arc<Context>, accepted: Instant) -> Machine {
        let deadline_ms = context.clock.millis_at(accepted + context.rules.login_timeout);
        Machine { context, phase: Phase::LoggingIn { deadline_ms } }
    }

    pub(crate) fn context(&self) -> &Arc<Context> {
        &self.context
    }

    /// The session, once logged in.
    pub(crate) fn session(&self) -> Option<&Arc<Session>> {
        match &self.phase {
            Phase::LoggedIn { session, .. } => Some(session),
            Phase::LoggingIn { .. } => None,
        }
    }

    /// When [`Machine::handle_timeout`] must be called next, if ever: the login deadline.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        match self.phase {
            Phase::LoggingIn { deadline_ms } => Some(self.context.clock.instant_of_millis(deadline_ms)),
            Phase::LoggedIn { .. } => None,
        }
    }

    /// Time has passed (call it once [`Machine::poll_timeout`] is reached, after the door
    /// read what had arrived): the close for a client that did not log in in time.
    pub(crate) fn handle_timeout(&self, inputs: &impl Inputs) -> Result<(), Close> {
        match self.poll_timeout() {
            Some(deadline) if inputs.now() >= deadline => Err((CloseReason::LoginTimeout, "no LOGIN in time".into())),
            _ => Ok(()),
        }
    }

    /// The close of a connection shed from the connections waiting to log in.
    pub(crate) fn shed(&self, inputs: &impl Inputs) -> Close {
        self.context.metrics.shed_pending_logins.inc();
        let hint = inputs.jitter_ms(REFUSED_RETRY_BASE, REFUSED_RETRY_SPREAD);
        (CloseReason::ServerFull, retry_text(hint, SHED))
    }

    /// Called as the logged-in phase begins: shutdown ends every session in the registry,
    /// and one that logged in as it began is ended here, so none is missed either way.
    pub(crate) fn begin(&self) {
        if let Some(session) = self.session().filter(|_| self.context.shutdown.is_cancelled()) {
            // Through the registry, which decides under the uid's entry whether this was
            // its last session.
            self.context.registry.leave(session, CloseReason::Shutdown);
        }
    }

    /// What the session's wake-up means.
    pub(crate) fn on_wake(&self) -> Option<Wake> {
        let session = self.session()?;
        Some(match session.end_reason() {
            Some(reason) => Wake::End(reason),
            None => Wake::Push {
                pushes: self.context.registry.take_pushes(session),
                presence: self.context.watches.take(session),
                ping: session.take_ping(),
                durable: self.context.registry.events().durable_through(),
            },
        })
    }

    /// Acts on one command from the client; replies go to `out`. An error closes the
    /// connection with that reason and text.
    pub(crate) fn handle(
        &mut self,
        inputs: &impl Inputs,
        command: Command,
        out: &mut (impl Out + ?Sized),
    ) -> Result<(), Close> {
        let counted = match &command {
            Command::Login { .. } => Some(kind::LOGIN),
            Command::Ping(_) => Some(kind::PING),
            Command::Data { .. } => Some(kind::DATA),
            Command::Logout => Some(kind::LOGOUT),
            Command::Refresh(_) => Some(kind::REFRESH),
            _ => None,
        };
        if let Some(kind) = counted {
            self.context.metrics.frame_of_kind(kind);
        }
        let logged_in = matches!(self.phase, Phase::LoggedIn { .. });
        match command {
            Command::Login { uid, token, device, timeout, subscriber, will } if !logged_in => {
                self.login(inputs, Login { uid, token: &token, device, timeout, subscriber, will }, out)
            }
            Command::Login { .. } => Err((CloseReason::ProtocolError, "second LOGIN".into())),
            Command::Refused(why) => Err((CloseReason::ProtocolError, why.into())),
            // Not a frame: activity of a logged-in session, nothing before LOGIN.
            Command::Activity => self.activity(inputs).map(|_| ()),
            _ if !logged_in => Err((CloseReason::ProtocolError, "LOGIN must be the first frame".into())),
            Command::Ping(payload) => {
                self.activity(inputs)?;
                out.frame(&Frame::Pong(payload));
                Ok(())
            }
            Command::Data { payload, topic } => self.data(inputs, payload, topic.as_deref(), out),
            Command::Logout => Err((CloseReason::Logout, String::new())),
            Command::Refresh(token) => self.refresh(inputs, &token, out),
            Command::Subscribe { filters, max_packet, watch } => {
                self.subscriptions(inputs, &filters, Some(max_packet), watch, out)
            }
            Command::Unsubscribe { filters, unwatch } => self.subscriptions(inputs, &filters, None, unwatch, out),
            Command::Watch(uids) => self.watch(inputs, uids, true),
            Command::Unwatch(uids) => self.watch(inputs, uids, false),
            Command::Status(text) => self.status(inputs, text),
        }
    }

    /// A WATCH (`add`) or UNWATCH of `uids`: activity, counted against `--max-data-rate` as
    /// a DATA is (each changes state the gateway keeps, and a WATCH is answered with a
    /// snapshot). Under `--watch-policy listed` a uid the session may not watch is answered
    /// as a uid that never logged in, and never watched. The snapshot comes with a later
    /// wake-up; a WATCH past `--max-watch` or `--max-watch-entries` closes the connection,
    /// with the bound in its BYE.
    fn watch(&mut self, inputs: &impl Inputs, uids: Vec<u64>, add: bool) -> Result<(), Close> {
        let now = self.activity(inputs)?;
        let frame = if add { "WATCH" } else { "UNWATCH" };
        self.watching_allowed(frame)?;
        self.data_allowed(now).map_err(|(reason, text)| (reason, text.replacen("DATA", frame, 1)))?;
        let Some(session) = self.session().cloned() else { return Ok(()) };
        if !add {
            self.context.watches.unwatch(&session, uids);
            return Ok(());
        }
        self.watch_for(&session, uids).map_err(|refused| {
            let reason = match refused {
                WatchRefused::Node { .. } => CloseReason::ServerFull,
                WatchRefused::Session { .. } | WatchRefused::Off => CloseReason::ProtocolError,
            };
            (reason, refused.to_string())
        })
    }

    /// A STATUS: activity, counted against `--max-data-rate`; the user's status becomes
    /// `text` (empty: none), at most `--max-status-bytes`, and its status event is logged.
    fn status(&mut self, inputs: &impl Inputs, text: String) -> Result<(), Close> {
        let now = self.activity(inputs)?;
        self.watching_allowed("STATUS")?;
        self.data_allowed(now).map_err(|(reason, text)| (reason, text.replacen("DATA", "STATUS", 1)))?;
        let max = self.context.rules.max_status_bytes;
        if text.len() > max {
            let why = format!("STATUS of {} bytes; at most {max} (--max-status-bytes)", text.len());
            return Err((CloseReason::ProtocolError, why));
        }
        let Some(session) = self.session() else { return Ok(()) };
        if !self.context.registry.set_status(session, Arc::from(text)) {
            // Ended since the tick's touch (a kick, a takeover): its status never counted.
            return Err((session.end_reason().unwrap_or(CloseReason::Kicked), String::new()));
        }
        Ok(())
    }

    /// Refuses `frame` (WATCH, UNWATCH, STATUS) under `--watch-policy none`.
    fn watching_allowed(&self, frame: &str) -> Result<(), Close> {
        if self.context.rules.watch_policy == WatchPolicy::None {
            return Err((
                CloseReason::ProtocolError,
                format!("{frame} refused: watch lists are off (--watch-policy none)"),
            ));
        }
        Ok(())
    }

    /// An MQTT SUBSCRIBE (with the largest packet its client takes) or UNSUBSCRIBE (`None`):
    /// activity, counted against the session's `--max-data-rate` as a DATA is (each changes
    /// state the gateway keeps), and the session's topic filters change, at most
    /// `--mqtt-max-subscriptions` of them. The uids of the presence topics it named (`uids`)
    /// are watched or unwatched as a WATCH or UNWATCH would, except that a refusal (a policy
    /// of none, a bound) refuses their filters instead of closing. A SUBSCRIBE's outcome
    /// goes to `out`, filter by filter, the presence topics' last.
    fn subscriptions(
        &mut self,
        inputs: &impl Inputs,
        filters: &[String],
        subscribe: Option<u32>,
        uids: Vec<u64>,
        out: &mut (impl Out + ?Sized),
    ) -> Result<(), Close> {
        let now = self.activity(inputs)?;
        self.data_allowed(now)?;
        let Some(session) = self.session().cloned() else { return Ok(()) };
        let context = &self.context;
        let subscriptions = context.registry.subscriptions();
        let Some(max_packet) = subscribe else {
            subscriptions.unsubscribe(session.id(), filters);
            if !uids.is_empty() && context.rules.watch_policy != WatchPolicy::None {
                context.watches.unwatch(&session, uids);
            }
            return Ok(());
        };
        let max = context.rules.mqtt_max_subscriptions;
        let mut granted = subscriptions.subscribe(session.id(), filters, max, max_packet);
        if !uids.is_empty() {
            let (n, watched) = (uids.len(), self.watch_for(&session, uids));
            granted.extend(std::iter::repeat_n(watched.is_ok(), n));
        }
        out.subscribed(&granted);
        Ok(())
    }

    /// Adds `uids` to `session`'s watch list under the policy, which the fan-out applies:
    /// uids it may not watch are answered as uids that never logged in. Counted when
    /// refused.
    fn watch_for(&self, session: &Arc<Session>, uids: Vec<u64>) -> Result<(), WatchRefused> {
        let context = &self.context;
        if context.rules.watch_policy == WatchPolicy::None {
            return Err(WatchRefused::Off);
        }
        let uids = crate::presence::distinct(uids);
        context.watches.watch(session, uids).inspect_err(|refused| match refused {
            WatchRefused::Session { .. } => context.metrics.watch_refused_session.inc(),
            WatchRefused::Node { .. } => context.metrics.watch_refused_node.inc(),
            WatchRefused::Off => {}
        })
    }

    /// A DATA of the logged-in session: activity, the rate, the event log. A DATA the log
    /// did not take (its session ended since the tick's touch: a kick, a takeover) closes
    /// the connection with the session's reason, so an MQTT PUBLISH is never acknowledged
    /// for data nobody will see, and the client sends it again on its next connection.
    fn data(
        &mut self,
        inputs: &impl Inputs,
        payload: Bytes,
        topic: Option<&str>,
        out: &mut (impl Out + ?Sized),
    ) -> Result<(), Close> {
        let now = self.activity(inputs)?;
        self.data_allowed(now)?;
        if let Some(session) = self.session() {
            match self.context.registry.events().data(session, payload, topic) {
                Some(position) => out.logged(position),
                None => return Err((session.end_reason().unwrap_or(CloseReason::Kicked), String::new())),
            }
        }
        Ok(())
    }

    /// Checks a LOGIN's or a REFRESH's token for `uid`. A JWT (three base64url parts) goes to
    /// the JWT keys when there are any; any other token to the HMAC secrets. With neither
    /// configured, any token is taken.
    fn check_token(&self, inputs: &impl Inputs, uid: u64, token: &[u8]) -> Result<Checked, Close> {
        let context = &self.context;
        match (&context.rules.jwt, context.rules.live.auth().as_deref()) {
            (Some(jwt), _) if JwtAuth::looks_like_jwt(token) => match jwt.verify(uid, token, inputs.unix_secs()) {
                Ok(verified) => {
                    if verified.claims_too_large {
                        context.metrics.claims_too_large.inc();
                    }
                    let leeway_ms = u64::try_from(jwt.leeway().as_millis()).unwrap_or(u64::MAX);
                    Ok(Checked {
                        expires: verified.exp,
                        deadline_ms: Some(verified.exp.saturating_mul(1000).saturating_add(leeway_ms)),
                        claims: verified.claims.map(|json| Arc::new(Claims::from_json(json))),
                        timeout_cap_s: verified.timeout_cap_s,
                        watch: verified.watch,
                    })
                }
                Err(e) => {
                    tracing::debug!(uid, error = %e, "token refused");
                    // Names the check that failed, never the token.
                    Err((CloseReason::AuthFailed, e.to_string()))
                }
            },
            (_, Some(auth)) => match auth.verify(uid, token, inputs.unix_secs()) {
                Ok(expires) => {
                    Ok(Checked { expires, deadline_ms: Some(expires.saturating_mul(1000)), ..Checked::default() })
                }
                Err(e) => {
                    tracing::debug!(uid, error = %e, "token refused");
                    // Says what to do about it (refresh, or fix the minting), never what
                    // the secret is.
                    let why = match e {
                        AuthError::Expired { .. } => "token expired",
                        AuthError::BadSignature => "token did not verify",
                        AuthError::Malformed => "token malformed: expected <expiry>.<64 lowercase hex>",
                        AuthError::TooLong { .. } => "token expiry too far ahead (--max-token-ttl)",
                    };
                    Err((CloseReason::AuthFailed, why.into()))
                }
            },
            (Some(_), None) => Err((CloseReason::AuthFailed, "token malformed: expected a JWT".into())),
            (None, None) => Ok(Checked::default()),
        }
    }

    /// Files the session's token deadline on the ticks, when expiry is enforced: the
    /// ticker ends it on the first tick at or after it.
    fn enforce(&self, inputs: &impl Inputs, session: &Arc<Session>, checked: &Checked) {
        let context = &self.context;
        if let (true, Some(deadline_ms)) = (context.rules.enforce_token_expiry, checked.deadline_ms) {
            let tick = context.clock.first_tick_at_or_after_unix(inputs.now(), inputs.unix_ms(), deadline_ms);
            context.registry.expire_at(session, tick);
        }
    }

    /// Logs in; a `subscriber` (an MQTT session) takes only the pushes its subscriptions
    /// match.
    fn login(&mut self, inputs: &impl Inputs, login: Login<'_>, out: &mut (impl Out + ?Sized)) -> Result<(), Close> {
        let Login { uid, token, device, timeout, subscriber, will } = login;
        let checked = self.check_token(inputs, uid, token)?;
        let context = &self.context;
        let rules = &context.rules;
        let now = context.clock.tick_at(inputs.now());
        let pingable = out.pings() && rules.ws_keepalive_pings;
        let (claims, origin) = (checked.claims.clone(), inputs.origin());
        let classes = context.registry.classes();
        let class = grant(classes, timeout, checked.timeout_cap_s.map(|s| s.saturating_mul(1000)));
        let traits = Traits { filters_pushes: subscriber, pingable, will, claims, origin, class: Some(class) };
        let session = context.registry.login_as(uid, device, now, traits);
        self.enforce(inputs, &session, &checked);
        if let Some(watch) = checked.watch {
            context.watch_lists.claim(session.id(), watch);
        }
        let id = session_hex(session.id());
        out.frame(&Frame::Welcome { timeout_ms: session.timeout_ms(), tick_ms: rules.tick_ms, session: id });
        self.phase = Phase::LoggedIn { session, last_tick: now };
        tracing::debug!(uid, "logged in");
        Ok(())
    }

    /// A new token for the logged-in uid: activity, and when it checks out the session goes
    /// on under it (its expiry moves) and the client is told the new expiry; when it does
    /// not, or names another uid, the session ends as `auth_failed`. Its claims are not
    /// taken: the session's events carry its login's.
    ///
    /// A token is at most [`MAX_TOKEN_BYTES`], as at LOGIN, and each REFRESH (or MQTT 5
    /// AUTH) takes a token of `--max-data-rate`'s bucket as a DATA does: checking a token
    /// costs a signature verification, so its rate is bounded like everything a client can
    /// repeat.
    fn refresh(&mut self, inputs: &impl Inputs, token: &[u8], out: &mut (impl Out + ?Sized)) -> Result<(), Close> {
        let now = self.activity(inputs)?;
        let Some(session) = self.session().cloned() else { return Ok(()) };
        let metrics = &self.context.metrics;
        if token.len() > MAX_TOKEN_BYTES as usize {
            metrics.refreshes_refused.inc();
            let why = format!("REFRESH refused: a token of {} bytes; at most {MAX_TOKEN_BYTES}", token.len());
            return Err((CloseReason::ProtocolError, why));
        }
        if let Err((reason, text)) = self.data_allowed(now) {
            metrics.refreshes_refused.inc();
            return Err((reason, text.replacen("DATA", "REFRESH", 1)));
        }
        let checked = match self.check_token(inputs, session.uid(), token) {
            Ok(checked) => checked,
            Err((reason, text)) => {
                metrics.refreshes_refused.inc();
                return Err((reason, format!("REFRESH refused: {text}")));
            }
        };
        metrics.refreshes_ok.inc();
        self.enforce(inputs, &session, &checked);
        out.frame(&Frame::Refreshed { expires: checked.expires });
        Ok(())
    }

    /// Counts a command as activity of the session: ring work only when the tick changed.
    /// Returns the tick now, for the command's other checks.
    fn activity(&mut self, inputs: &impl Inputs) -> Result<u64, Close> {
        let now = self.context.clock.tick_at(inputs.now());
        let Phase::LoggedIn { session, last_tick } = &mut self.phase else {
            return Ok(now);
        };
        if now == *last_tick {
            return Ok(now);
        }
        match self.context.registry.touch(session, now) {
            Touched::Alive => {
                *last_tick = now;
                Ok(now)
            }
            // Swept (or kicked) before this command was read: it is dropped, and the close
            // ends the session as expired unless something else ended it first.
            Touched::Gone => Err((session.end_reason().unwrap_or(CloseReason::IdleTimeout), String::new())),
        }
    }

    /// Takes a DATA's token at tick `now` from the session's bucket (`--max-data-rate`); a
    /// client over the rate is ended, so one client cannot flood the event log for everyone.
    fn data_allowed(&self, now: u64) -> Result<(), Close> {
        let rules = &self.context.rules;
        let (Some(session), Some(((per_tick, burst), (rate, burst_frames)))) = (self.session(), rules.data_bucket())
        else {
            return Ok(());
        };
        if session.take_data_token(now, per_tick, burst) {
            return Ok(());
        }
        Err((
            CloseReason::ProtocolError,
            format!("DATA over --max-data-rate: more than {rate} frames a second with a burst of {burst_frames}"),
        ))
    }

    /// Ends the session (the first reason given wins) and says what to send last: the pushes
    /// a backend was told were sent, then the BYE (with a retry hint for shutdown). Returns
    /// the reason the connection closes with; its door counts it before the client can see
    /// the close.
    pub(crate) fn goodbye(
        &self,
        inputs: &impl Inputs,
        reason: CloseReason,
        text: String,
    ) -> (CloseReason, Vec<Push>, Option<Frame>) {
        let context = &self.context;
        let reason = match self.session() {
            Some(session) => {
                // Here, the connection's last word, not at the ending: a SUBSCRIBE read after
                // a kick but before its wake-up would otherwise leave its filters behind.
                context.registry.subscriptions().forget(session.id());
                context.registry.forget_expiry(session);
                context.watches.closed(session);
                context.watch_lists.closed(session.id());
                context.registry.leave(session, reason)
            }
            None => reason,
        };
        if let (CloseReason::IdleTimeout, Phase::LoggedIn { last_tick, .. }) = (reason, &self.phase) {
            // From the tick that swept it (window ticks after its last touch) to its BYE,
            // which goes out next.
            let window = self.session().map_or(0, |s| context.registry.classes().window(s.class()));
            let swept_at = context.clock.instant_of(last_tick + window);
            let delay = inputs.now().saturating_duration_since(swept_at);
            context.metrics.expiry_bye_delay.observe(delay.as_secs_f64());
        }
        let pushes = self.session().map(|s| context.registry.take_pushes(s)).unwrap_or_default();
        // Told when to come back, each at a different moment, so a fleet does not return at
        // once to a restarted gateway.
        let text = match reason {
            CloseReason::Shutdown => retry_text(inputs.jitter_ms(SHUTDOWN_RETRY_BASE, SHUTDOWN_RETRY_SPREAD), &text),
            CloseReason::Kicked if text.is_empty() && self.session().is_some_and(|s| s.was_evicted()) => {
                match context.rules.max_devices {
                    1 => "replaced by a login of the same uid on another device (--max-devices 1)".to_string(),
                    n => format!("the least recently active of {n} devices, ended for a login on another"),
                }
            }
            _ => text,
        };
        let bye = reason.wire_code().map(|_| Frame::Bye { reason, text });
        (reason, pushes, bye)
    }

    /// After the connection closed with `reason` (its door's count goes down with its
    /// guard, when its task ends).
    pub(crate) fn closed(&self, reason: CloseReason) {
        match self.session() {
            Some(s) => tracing::debug!(uid = s.uid(), %reason, "connection closed"),
            None => tracing::debug!(%reason, "connection closed before login"),
        }
    }
}

/// The timeout class a login gets for what it asked, under its token's cap (`cap_ms`).
///
/// An MQTT keepalive K gets the longest class that disconnects the client within 1.5 K and
/// never while it keeps K; when none fits (K is 0, or outside what the classes reach, or
/// the cap is below it) the class nearest to K, which MQTT 5 tells the client as Server
/// Keep Alive (the door refuses such a 3.1.1 CONNECT before it gets here, unless the cap
/// is to blame). No keepalive at all gets the longest class.
fn grant(classes: &TimeoutClasses, asked: Asked, cap_ms: Option<u64>) -> Class {
    match asked {
        Asked::Default => classes.for_asked(classes.timeout_ms(classes.default_class()), cap_ms),
        Asked::Ms(ms) => classes.for_asked(u64::from(ms), cap_ms),
        Asked::KeepAlive(k) => classes.for_keep_alive(k, cap_ms).unwrap_or_else(|| {
            let wanted = if k == 0 { u64::MAX } else { u64::from(k) * 1000 };
            classes.for_asked(wanted, cap_ms)
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;
    use crate::config::Config;
    use crate::proto::Auth;

    /// Time and randomness the test sets: the machine reads no clock of its own.
    struct Fixed {
        now: Cell<Instant>,
        unix: u64,
    }

    impl Fixed {
        fn at(now: Instant) -> Fixed {
            Fixed { now: Cell::new(now), unix: 1_000_000 }
        }

        fn advance(&self, by: Duration) {
            self.now.set(self.now.get() + by);
        }
    }

    impl Inputs for Fixed {
        fn now(&self) -> Instant {
            self.now.get()
        }

        fn unix_ms(&self) -> u64 {
            self.unix * 1000
        }

        fn jitter_ms(&self, base: Duration, _spread: Duration) -> u64 {
            base.as_millis() as u64
        }
    }

    fn login_command(uid: u64) -> Command {
        Command::Login {
            uid,
            token: Bytes::new(),
            device: Device::DEFAULT,
            timeout: Asked::Default,
            subscriber: true,
            will: None,
        }
    }

    fn machine(config: &Config) -> (Machine, Fixed) {
        let context = Context::for_test(config);
        let inputs = Fixed::at(context.clock.instant_of(0));
        (Machine::new(context, inputs.now()), inputs)
    }

    fn login(machine: &mut Machine, inputs: &Fixed, uid: u64) {
        let mut out = BytesMut::new();
        machine.handle(inputs, login_command(uid), &mut out).expect("the login is taken");
        assert!(!out.is_empty(), "a WELCOME went out");
    }

    fn reason(result: Result<(), Close>) -> Result<(), CloseReason> {
        result.map_err(|(reason, _)| reason)
    }

    /// A takeover ends the session on the tick of its last touch: the PUBLISH read next
    /// does no ring work, and must still find out that the log did not take its DATA.
    #[tokio::test(start_paused = true)]
    async fn a_publish_the_log_did_not_take_closes_instead_of_being_acknowledged() {
        let (mut machine, inputs) = machine(&Config::default());
        let registry = machine.context().registry.clone();
        login(&mut machine, &inputs, 7);
        let publish =
            |payload: &'static [u8]| Command::Data { payload: Bytes::from_static(payload), topic: Some("t".into()) };
        assert_eq!(machine.handle(&inputs, publish(b"before"), &mut BytesMut::new()), Ok(()));
        assert_eq!(registry.kick(7, None), 1);
        let after = machine.handle(&inputs, publish(b"after"), &mut BytesMut::new());
        assert_eq!(reason(after), Err(CloseReason::Kicked));
        let mut tcp = Machine::new(machine.context().clone(), inputs.now());
        login(&mut tcp, &inputs, 8);
        registry.kick(8, None);
        let data = tcp.handle(&inputs, Frame::Data(Bytes::from_static(b"late")).into(), &mut BytesMut::new());
        assert_eq!(reason(data), Err(CloseReason::Kicked));
    }

    #[tokio::test(start_paused = true)]
    async fn the_login_deadline_is_the_machine_s_and_ends_only_a_connection_that_did_not_log_in() {
        let config = Config { login_timeout: Duration::from_secs(5), ..Config::default() };
        let (mut waiting, inputs) = machine(&config);
        let deadline = waiting.poll_timeout().expect("a deadline before LOGIN");
        assert_eq!(deadline, inputs.now() + Duration::from_secs(5));
        inputs.advance(Duration::from_millis(4999));
        assert_eq!(waiting.handle_timeout(&inputs), Ok(()));
        inputs.advance(Duration::from_millis(1));
        assert_eq!(reason(waiting.handle_timeout(&inputs)), Err(CloseReason::LoginTimeout));
        // A LOGIN read before the deadline was acted on: no deadline any more.
        login(&mut waiting, &inputs, 1);
        assert_eq!(waiting.poll_timeout(), None);
        assert_eq!(waiting.handle_timeout(&inputs), Ok(()));
    }

    /// Every open connection's task holds its machine: the login deadline shares the word
    /// the logged-in phase gives the session's last tick, so the machine is three words.
    #[test]
    fn the_machine_is_three_words() {
        assert_eq!(std::mem::size_of::<Machine>(), 3 * std::mem::size_of::<usize>());
    }

    /// Issue 50: what a login asks for, and the class it gets.
    #[test]
    fn a_login_gets_the_class_of_what_it_asked_under_its_token_s_cap() {
        let s = Duration::from_secs(1);
        let classes = TimeoutClasses::new(30 * s, s, 5 * s, 1800 * s, &[], 100_000).expect("classes");
        let ms = |asked: Asked, cap: Option<u64>| classes.timeout_ms(grant(&classes, asked, cap));
        assert_eq!(ms(Asked::Default, None), 30_000);
        assert!(ms(Asked::Default, Some(20_000)) <= 20_000);
        assert_eq!(ms(Asked::Ms(1), None), 5_000);
        assert_eq!(ms(Asked::Ms(30_000), None), 30_000);
        assert_eq!(ms(Asked::Ms(u32::MAX), None), 1_800_000);
        let k60 = ms(Asked::KeepAlive(60), None);
        assert!(k60 > 60_000 && k60 <= 90_000, "{k60}");
        // No keepalive: the longest class, or the longest under the cap.
        assert_eq!(ms(Asked::KeepAlive(0), None), 1_800_000);
        assert!(ms(Asked::KeepAlive(0), Some(300_000)) <= 300_000);
        // Outside what the classes hold: the nearest class (MQTT 5 is told it).
        assert_eq!(ms(Asked::KeepAlive(2), None), 5_000);
        assert_eq!(ms(Asked::KeepAlive(3_000), None), 1_800_000);
    }

    #[tokio::test(start_paused = true)]
    async fn login_comes_first_and_once() {
        let (mut machine, inputs) = machine(&Config::default());
        let ping = machine.handle(&inputs, Command::Ping(Bytes::new()), &mut BytesMut::new());
        assert_eq!(ping, Err((CloseReason::ProtocolError, "LOGIN must be the first frame".into())));
        // Activity before LOGIN is nothing, not an error: a WebSocket ping during the login.
        assert_eq!(machine.handle(&inputs, Command::Activity, &mut BytesMut::new()), Ok(()));
        login(&mut machine, &inputs, 3);
        let again = machine.handle(&inputs, login_command(3), &mut BytesMut::new());
        assert_eq!(again, Err((CloseReason::ProtocolError, "second LOGIN".into())));
        let refused = machine.handle(&inputs, Frame::Pong(Bytes::new()).into(), &mut BytesMut::new());
        assert_eq!(reason(refused), Err(CloseReason::ProtocolError));
    }

    #[tokio::test(start_paused = true)]
    async fn a_ping_is_answered_and_touches_the_ring_once_a_tick() {
        let (mut machine, inputs) = machine(&Config::default());
        let registry = machine.context().registry.clone();
        login(&mut machine, &inputs, 4);
        let mut out = BytesMut::new();
        machine.handle(&inputs, Command::Ping(Bytes::from_static(b"x")), &mut out).unwrap();
        let pong = crate::proto::FrameCodec::default().decode(&mut out).unwrap();
        assert_eq!(pong, Some(Frame::Pong(Bytes::from_static(b"x"))));
        // Silent up to the timeout's last tick, one ping keeps it: the ring moved it.
        inputs.advance(Duration::from_secs(29));
        machine.handle(&inputs, Command::Ping(Bytes::new()), &mut BytesMut::new()).unwrap();
        let Phase::LoggedIn { last_tick, .. } = machine.phase else { panic!("logged in") };
        assert_eq!(last_tick, 29);
        assert_eq!(registry.online(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn token_expiry_is_judged_by_the_wall_clock_given() {
        let auth = Auth::new(b"secret-secret-secret-secret-32b!".to_vec());
        let config = Config { auth: Some(auth.clone()), ..Config::default() };
        let (mut machine, mut inputs) = machine(&config);
        let token = auth.mint(9, 1_000_100);
        inputs.unix = 1_000_101;
        let login = Command::Login {
            uid: 9,
            token: token.into(),
            device: Device::DEFAULT,
            timeout: Asked::Default,
            subscriber: false,
            will: None,
        };
        let refused = machine.handle(&inputs, login, &mut BytesMut::new());
        assert_eq!(refused, Err((CloseReason::AuthFailed, "token expired".into())));
    }

    #[tokio::test(start_paused = true)]
    async fn data_over_the_rate_ends_the_session() {
        let config = Config { max_data_rate: 1, max_data_burst: 2, ..Config::default() };
        let (mut machine, inputs) = machine(&config);
        login(&mut machine, &inputs, 5);
        let data = || Command::Data { payload: Bytes::from_static(b"d"), topic: None };
        assert_eq!(machine.handle(&inputs, data(), &mut BytesMut::new()), Ok(()));
        assert_eq!(machine.handle(&inputs, data(), &mut BytesMut::new()), Ok(()));
        let over = machine.handle(&inputs, data(), &mut BytesMut::new());
        assert_eq!(reason(over), Err(CloseReason::ProtocolError));
    }

    #[tokio::test(start_paused = true)]
    async fn a_shutdown_goodbye_carries_the_retry_hint_it_was_given() {
        let (mut machine, inputs) = machine(&Config::default());
        login(&mut machine, &inputs, 6);
        let (reason, _, bye) = machine.goodbye(&inputs, CloseReason::Shutdown, String::new());
        assert_eq!(reason, CloseReason::Shutdown);
        let Some(Frame::Bye { text, .. }) = bye else { panic!("a BYE") };
        let base = SHUTDOWN_RETRY_BASE.as_millis() as u64;
        assert_eq!(crate::proto::retry_hint(&text), Some(base));
        assert_eq!(machine.context().registry.online(), 0);
    }
}

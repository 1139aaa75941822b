//! The client: a handle the application sends with, an event stream it reads, and one
//! background task that holds the connection, keeps it alive and brings it back.

use std::collections::{BTreeSet, VecDeque};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use idlegate_proto::{retry_hint, CloseReason, Frame};
use tokio::sync::{mpsc, watch};
use tokio::time::{sleep_until, timeout, Instant};

use crate::conn::{default_tls, Conn, OpenError};
use crate::token::refresh_delay;
use crate::{ClientError, Endpoint, Event, Options, SendError, State, TokenFuture};

/// Wait before asking a token provider again after it failed to give a refresh's token:
/// the session's token is still good meanwhile (the refresh runs well ahead of expiry).
const REFRESH_RETRY: Duration = Duration::from_secs(1);

/// Share of the gateway's timeout after which a client that sent nothing pings: a third
/// leaves room for two late or lost pings before the gateway's window closes.
const KEEPALIVE_DIVISOR: u32 = 3;

/// Shortest keepalive, whatever a (misconfigured) gateway says: no busy loop of pings.
const MIN_KEEPALIVE: Duration = Duration::from_millis(10);

/// Events the application's channel holds before the client keeps them itself.
const EVENT_QUEUE: usize = 256;

/// Events the client keeps itself for an application that reads late, on top of
/// [`EVENT_QUEUE`]. The client never waits for the application: it reads its socket and
/// pings on time whatever the application does, so it never reports `Online` for a session
/// the gateway ended. An application further behind than both ends the session here, as a
/// slow consumer (the gateway would end it too, once its own queue for the client filled),
/// instead of pushes vanishing unseen; the client then reconnects as after any loss.
const EVENT_BACKLOG: usize = 1024;

/// How long a logout or close waits for the gateway's goodbye before dropping the socket.
const GOODBYE_PATIENCE: Duration = Duration::from_secs(2);

/// uids in one WATCH or UNWATCH frame: 8 KiB, far under any gateway's frame limit.
const UIDS_PER_FRAME: usize = 1024;

/// A connected (or connecting) client; cheap to clone. The connection lives in a task of
/// its own; dropping every clone ends it.
#[derive(Debug, Clone)]
pub struct Client {
    data: mpsc::Sender<Bytes>,
    control: mpsc::UnboundedSender<Control>,
    state: watch::Receiver<State>,
}

/// What the client has to say, in order: state changes and pushes. Also a
/// [`futures_core::Stream`].
#[derive(Debug)]
pub struct Events {
    rx: mpsc::Receiver<Event>,
}

#[derive(Debug)]
enum Control {
    Logout,
    Reconnect,
    Close,
    Watch(Vec<u64>),
    Unwatch(Vec<u64>),
    Status(String),
}

/// How a connection ended.
enum Ended {
    /// The gateway's BYE (or a WebSocket close carrying one).
    Bye { reason: CloseReason, text: String },
    /// No connection, or it failed or closed without a BYE.
    Lost(String),
    /// The application logged out.
    Logout,
    /// The application closed the client, or dropped it.
    Closed,
    /// The application fell further behind its events than [`EVENT_BACKLOG`].
    Lagged(usize),
}

// === impl Client ===

impl Client {
    /// Starts a client of the gateway at `url` (`tcp://host:port`, `tls://host:port`,
    /// `ws://host:port[/path]`, `wss://host[:port][/path]`; the WebSocket path defaults to
    /// `/v1/ws`). It connects in the background: the first event is
    /// [`State::Connecting`], then [`State::Online`] once the gateway welcomed it. Must be
    /// called inside a tokio runtime.
    pub fn connect(url: &str, options: Options) -> Result<(Client, Events), ClientError> {
        let endpoint: Endpoint = url.parse()?;
        let (data_tx, data_rx) = mpsc::channel(options.max_queued);
        let (control_tx, control_rx) = mpsc::unbounded_channel();
        let (events_tx, events_rx) = mpsc::channel(EVENT_QUEUE);
        let (state_tx, state_rx) = watch::channel(State::Connecting { attempt: 0 });
        let tls = options.tls.clone().unwrap_or_else(default_tls);
        let task = Task {
            endpoint,
            options,
            tls,
            data: data_rx,
            control: control_rx,
            events: events_tx,
            backlog: VecDeque::new(),
            state: state_tx,
            watching: BTreeSet::new(),
            status: None,
        };
        tokio::spawn(task.run());
        Ok((Client { data: data_tx, control: control_tx, state: state_rx }, Events { rx: events_rx }))
    }

    /// Queues `payload` as a DATA frame: sent at once when online, held (up to
    /// [`Options::max_queued`]) while not. Past the bound, the payload comes back in
    /// [`SendError::Full`]; nothing is dropped silently. A DATA written to a connection
    /// that then fails is not sent again (at most once).
    pub fn try_send(&self, payload: impl Into<Bytes>) -> Result<(), SendError> {
        self.data.try_send(payload.into()).map_err(|e| match e {
            mpsc::error::TrySendError::Full(p) => SendError::Full(p),
            mpsc::error::TrySendError::Closed(p) => SendError::Closed(p),
        })
    }

    /// Queues `payload` like [`Client::try_send`], waiting for room when the queue is full.
    pub async fn send(&self, payload: impl Into<Bytes>) -> Result<(), SendError> {
        self.data.send(payload.into()).await.map_err(|e| SendError::Closed(e.0))
    }

    /// Ends the session (LOGOUT): the gateway reports `offline` with reason `logout` and the
    /// client stays offline until [`Client::reconnect`].
    pub fn logout(&self) {
        let _ = self.control.send(Control::Logout);
    }

    /// Connects now: after a logout or a kick, or instead of waiting out a backoff.
    pub fn reconnect(&self) {
        let _ = self.control.send(Control::Reconnect);
    }

    /// Drops the connection without a LOGOUT (the gateway reports `disconnect`) and ends the
    /// client's task.
    pub fn close(&self) {
        let _ = self.control.send(Control::Close);
    }

    /// Watches `uids` too: the gateway answers with a snapshot of them, then each change, as
    /// [`Event::Presence`]. The client keeps the list and watches it again on every
    /// connection (a fresh snapshot each time). Which uids a user may watch is the
    /// gateway's policy: one it may not reads as a uid that never logged in.
    pub fn watch(&self, uids: impl IntoIterator<Item = u64>) {
        let _ = self.control.send(Control::Watch(uids.into_iter().collect()));
    }

    /// Stops watching `uids`.
    pub fn unwatch(&self, uids: impl IntoIterator<Item = u64>) {
        let _ = self.control.send(Control::Unwatch(uids.into_iter().collect()));
    }

    /// Sets the user's status, which its watchers see (empty: none); set again on every
    /// connection. A status lasts while the user is online.
    pub fn set_status(&self, status: impl Into<String>) {
        let _ = self.control.send(Control::Status(status.into()));
    }

    /// The current state.
    pub fn state(&self) -> State {
        self.state.borrow().clone()
    }

    /// Waits until the state is one `accept` accepts, and returns it; `None` once the
    /// client's task has ended.
    pub async fn wait_for(&mut self, mut accept: impl FnMut(&State) -> bool) -> Option<State> {
        self.state.wait_for(|s| accept(s)).await.ok().map(|s| s.clone())
    }
}

// === impl Events ===

impl Events {
    /// The next event; `None` once the client's task has ended.
    pub async fn recv(&mut self) -> Option<Event> {
        self.rx.recv().await
    }
}

impl futures_core::Stream for Events {
    type Item = Event;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        self.rx.poll_recv(cx)
    }
}

/// Sends `uids` as WATCH or UNWATCH frames (`frame`) of at most [`UIDS_PER_FRAME`] each.
async fn send_uids(conn: &mut Conn, uids: &[u64], frame: fn(Vec<u64>) -> Frame) -> std::io::Result<()> {
    for chunk in uids.chunks(UIDS_PER_FRAME) {
        conn.send(frame(chunk.to_vec())).await?;
    }
    Ok(())
}

/// When to refresh a token that expires at `expires` (unix seconds), if known.
fn refresh_instant(expires: Option<u64>) -> Option<Instant> {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    expires.map(|expires| Instant::now() + refresh_delay(expires, now_ms))
}

/// The background task holding the connection.
struct Task {
    endpoint: Endpoint,
    options: Options,
    tls: Arc<rustls::ClientConfig>,
    data: mpsc::Receiver<Bytes>,
    control: mpsc::UnboundedReceiver<Control>,
    events: mpsc::Sender<Event>,
    /// Events the application's channel had no room for, oldest first.
    backlog: VecDeque<Event>,
    state: watch::Sender<State>,
    /// The uids the application watches, and the status it set: sent on every connection.
    watching: BTreeSet<u64>,
    status: Option<String>,
}

// === impl Task ===

impl Task {
    async fn run(mut self) {
        // Failed attempts since the last session that reached WELCOME.
        let mut attempt = 0u32;
        let mut refresh = false;
        loop {
            self.set(State::Connecting { attempt });
            let (ended, welcomed) = self.session(refresh).await;
            if welcomed {
                attempt = 0;
            }
            refresh = false;
            let (reason, text, hint) = match ended {
                Ended::Closed => return self.closed().await,
                Ended::Logout => {
                    self.set(State::Offline { reason: CloseReason::Logout, text: String::new(), retry_in: None });
                    if !self.wait_for_reconnect().await {
                        return self.closed().await;
                    }
                    attempt = 0;
                    continue;
                }
                Ended::Bye { reason: CloseReason::Kicked, text } if !self.options.reconnect_after_kick => {
                    self.set(State::Offline { reason: CloseReason::Kicked, text, retry_in: None });
                    if !self.wait_for_reconnect().await {
                        return self.closed().await;
                    }
                    attempt = 0;
                    continue;
                }
                Ended::Bye { reason, text } => {
                    // The token was refused or ran out: the provider is asked for a new one.
                    refresh = matches!(reason, CloseReason::AuthFailed | CloseReason::TokenExpired);
                    let hint = retry_hint(&text).map(Duration::from_millis);
                    (reason, text, hint)
                }
                Ended::Lost(text) => (CloseReason::Disconnect, text, None),
                Ended::Lagged(behind) => {
                    let text = format!("the application fell {behind} events behind; the session was ended here");
                    (CloseReason::SlowConsumer, text, None)
                }
            };
            let delay = self.options.backoff.delay(attempt, hint);
            attempt = attempt.saturating_add(1);
            tracing::debug!(%reason, %text, ?delay, "offline; reconnecting");
            self.set(State::Offline { reason, text, retry_in: Some(delay) });
            if !self.back_off(delay).await {
                return self.closed().await;
            }
        }
    }

    /// One connection, from connect to its end; and whether it reached WELCOME.
    async fn session(&mut self, refresh: bool) -> (Ended, bool) {
        let uid = self.options.uid;
        let token = match self.options.token.token(uid, refresh).await {
            Ok(token) => token,
            Err(e) => return (Ended::Lost(format!("no token: {e}")), false),
        };
        let expires = self.options.token.expiry(&token);
        // At least 1 ms: the wire has no zero timeout (the gateway grants its least class).
        let timeout_ms = self
            .options
            .timeout
            .and_then(|t| std::num::NonZeroU32::new(u32::try_from(t.as_millis()).unwrap_or(u32::MAX).max(1)));
        let login = Frame::Login { uid, token: Bytes::from(token), device: self.options.device.clone(), timeout_ms };
        let patience = self.options.connect_timeout;
        // The first frame, and the connection it came on (none for an upgrade refused with
        // 503, read as the BYE it stands for).
        let opened = timeout(patience, async {
            let mut conn = match Conn::open(&self.endpoint, &self.tls).await {
                Ok(conn) => conn,
                Err(OpenError::Refused(bye)) => return Ok((None, bye)),
                Err(e) => return Err(e.to_string()),
            };
            conn.send(login).await.map_err(|e| e.to_string())?;
            let first = conn.recv().await?;
            Ok::<_, String>((Some(conn), first))
        })
        .await;
        let (mut conn, timeout_ms, tick_ms, session) = match opened {
            Err(_) => return (Ended::Lost(format!("no WELCOME within {patience:?}")), false),
            Ok(Err(text)) => return (Ended::Lost(format!("{}: {text}", self.endpoint)), false),
            Ok(Ok((_, Frame::Bye { reason, text }))) => return (Ended::Bye { reason, text }, false),
            Ok(Ok((Some(conn), Frame::Welcome { timeout_ms, tick_ms, session }))) => {
                (conn, timeout_ms, tick_ms, session)
            }
            Ok(Ok((_, other))) => return (Ended::Lost(format!("expected WELCOME, got {other:?}")), false),
        };
        let timeout = Duration::from_millis(timeout_ms.into());
        let keepalive = (timeout / KEEPALIVE_DIVISOR).max(MIN_KEEPALIVE);
        let tick = Duration::from_millis(tick_ms.into());
        self.set(State::Online { session, timeout, tick, keepalive });
        (self.online(&mut conn, keepalive, expires).await, true)
    }

    /// Serves an open session until it ends: sends queued DATA, pings after `keepalive`
    /// without sending, hands pushes to the application, and refreshes its token (which
    /// expires at `expires`, unix seconds, when known) ahead of its expiry.
    async fn online(&mut self, conn: &mut Conn, keepalive: Duration, expires: Option<u64>) -> Ended {
        let mut ping_at = Instant::now() + keepalive;
        // What the application watches and its status, again on this connection.
        let watching: Vec<u64> = self.watching.iter().copied().collect();
        if let Err(e) = send_uids(conn, &watching, Frame::Watch).await {
            return Ended::Lost(format!("send failed: {e}"));
        }
        if let Some(status) = self.status.clone() {
            if let Err(e) = conn.send(Frame::Status(status)).await {
                return Ended::Lost(format!("send failed: {e}"));
            }
        }
        // When to ask the provider for the next token, and the answer being awaited.
        let mut refresh_at = refresh_instant(expires);
        let mut fetching: Option<TokenFuture> = None;
        let uid = self.options.uid;
        // A handle of its own, so the select's hand-over does not hold all of `self`.
        let events = self.events.clone();
        loop {
            if self.backlog.len() > EVENT_BACKLOG {
                conn.close(GOODBYE_PATIENCE).await;
                return Ended::Lagged(self.backlog.len() + EVENT_QUEUE);
            }
            tokio::select! {
                biased;
                Ok(permit) = events.reserve(), if !self.backlog.is_empty() => {
                    if let Some(event) = self.backlog.pop_front() {
                        permit.send(event);
                    }
                }
                control = self.control.recv() => match control {
                    Some(Control::Reconnect) => {}
                    Some(Control::Watch(uids)) => {
                        let new: Vec<u64> = uids.into_iter().filter(|&uid| self.watching.insert(uid)).collect();
                        if let Err(e) = send_uids(conn, &new, Frame::Watch).await {
                            return Ended::Lost(format!("send failed: {e}"));
                        }
                    }
                    Some(Control::Unwatch(uids)) => {
                        let gone: Vec<u64> = uids.into_iter().filter(|uid| self.watching.remove(uid)).collect();
                        if let Err(e) = send_uids(conn, &gone, Frame::Unwatch).await {
                            return Ended::Lost(format!("send failed: {e}"));
                        }
                    }
                    Some(Control::Status(status)) => {
                        self.status = Some(status.clone());
                        if let Err(e) = conn.send(Frame::Status(status)).await {
                            return Ended::Lost(format!("send failed: {e}"));
                        }
                    }
                    Some(Control::Logout) => {
                        let _ = conn.send(Frame::Logout).await;
                        // The gateway answers BYE(logout) and closes; wait for it, briefly.
                        let _ = timeout(GOODBYE_PATIENCE, async {
                            while let Ok(frame) = conn.recv().await {
                                if matches!(frame, Frame::Bye { .. }) {
                                    break;
                                }
                            }
                        })
                        .await;
                        conn.close(GOODBYE_PATIENCE).await;
                        return Ended::Logout;
                    }
                    Some(Control::Close) | None => {
                        conn.close(GOODBYE_PATIENCE).await;
                        return Ended::Closed;
                    }
                },
                token = async { fetching.as_mut().expect("guarded").await }, if fetching.is_some() => {
                    fetching = None;
                    match token {
                        Ok(token) => {
                            if let Err(e) = conn.send(Frame::Refresh(Bytes::from(token))).await {
                                return Ended::Lost(format!("send failed: {e}"));
                            }
                            // A REFRESH is activity: it saves a ping.
                            ping_at = Instant::now() + keepalive;
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "no token for a refresh; asking again");
                            refresh_at = Some(Instant::now() + REFRESH_RETRY);
                        }
                    }
                }
                _ = sleep_until(refresh_at.unwrap_or(ping_at)), if refresh_at.is_some() && fetching.is_none() => {
                    refresh_at = None;
                    fetching = Some(self.options.token.token(uid, true));
                }
                received = conn.recv() => match received {
                    Ok(Frame::Push(payload)) => self.emit(Event::Push(payload)),
                    Ok(Frame::Pong(_)) => {}
                    Ok(Frame::Refreshed { expires }) => {
                        // The gateway's word on the new token's expiry: the next refresh
                        // runs from it.
                        refresh_at = refresh_instant(Some(expires).filter(|&e| e > 0));
                        self.emit(Event::Refreshed { expires });
                    }
                    Ok(Frame::Presence { kind, entries }) => self.emit(Event::Presence { kind, entries }),
                    Ok(Frame::Bye { reason, text }) => return Ended::Bye { reason, text },
                    Ok(other) => return Ended::Lost(format!("the gateway sent {other:?}")),
                    Err(text) => return Ended::Lost(text),
                },
                Some(payload) = self.data.recv() => {
                    if let Err(e) = conn.send(Frame::Data(payload)).await {
                        return Ended::Lost(format!("send failed: {e}"));
                    }
                    // DATA is activity: it saves a ping.
                    ping_at = Instant::now() + keepalive;
                }
                _ = sleep_until(ping_at) => {
                    if let Err(e) = conn.send(Frame::Ping(Bytes::new())).await {
                        return Ended::Lost(format!("send failed: {e}"));
                    }
                    ping_at = Instant::now() + keepalive;
                }
            }
        }
    }

    /// Waits `delay` before the next attempt; a reconnect request cuts it short. False
    /// when the client was closed meanwhile.
    async fn back_off(&mut self, delay: Duration) -> bool {
        let until = Instant::now() + delay;
        let events = self.events.clone();
        loop {
            tokio::select! {
                _ = sleep_until(until) => return true,
                Ok(permit) = events.reserve(), if !self.backlog.is_empty() => {
                    if let Some(event) = self.backlog.pop_front() {
                        permit.send(event);
                    }
                }
                control = self.control.recv() => match control {
                    Some(Control::Reconnect) => return true,
                    Some(Control::Logout) => {
                        let text = String::new();
                        self.set(State::Offline { reason: CloseReason::Logout, text, retry_in: None });
                        return self.wait_for_reconnect().await;
                    }
                    Some(Control::Close) | None => return false,
                    Some(other) => self.keep(other),
                },
            }
        }
    }

    /// Stays offline until the application asks to reconnect; false when it closed.
    async fn wait_for_reconnect(&mut self) -> bool {
        let events = self.events.clone();
        loop {
            tokio::select! {
                Ok(permit) = events.reserve(), if !self.backlog.is_empty() => {
                    if let Some(event) = self.backlog.pop_front() {
                        permit.send(event);
                    }
                }
                control = self.control.recv() => match control {
                    Some(Control::Reconnect) => return true,
                    Some(Control::Logout) => {}
                    Some(Control::Close) | None => return false,
                    Some(other) => self.keep(other),
                },
            }
        }
    }

    /// A watch, unwatch or status asked for while offline: kept for the next connection.
    fn keep(&mut self, control: Control) {
        match control {
            Control::Watch(uids) => self.watching.extend(uids),
            Control::Unwatch(uids) => uids.iter().for_each(|uid| {
                self.watching.remove(uid);
            }),
            Control::Status(status) => self.status = Some(status),
            Control::Logout | Control::Reconnect | Control::Close => {}
        }
    }

    /// The last state of a client the application closed (or dropped).
    async fn closed(&mut self) {
        let text = "closed by the application".to_string();
        self.set(State::Offline { reason: CloseReason::Disconnect, text, retry_in: None });
    }

    fn set(&mut self, state: State) {
        self.state.send_replace(state.clone());
        self.emit(Event::State(state));
    }

    /// Hands `event` to the application without waiting for it: into its channel, or,
    /// while that is full, into the backlog the task's loops drain as the application reads.
    /// An application that dropped its [`Events`] only reads the state.
    fn emit(&mut self, event: Event) {
        if self.backlog.is_empty() {
            match self.events.try_send(event) {
                Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => return,
                Err(mpsc::error::TrySendError::Full(event)) => self.backlog.push_back(event),
            }
        } else {
            self.backlog.push_back(event);
        }
        // Out of a session only state changes come, and the watch holds the newest: the
        // oldest of an application that never reads go first.
        while self.backlog.len() > 4 * EVENT_BACKLOG {
            self.backlog.pop_front();
        }
    }
}

//! The client: a handle the application sends with, an event stream it reads, and one
//! background task that holds the connection, keeps it alive and brings it back.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use idlegate_proto::{retry_hint, CloseReason, Frame};
use tokio::sync::{mpsc, watch};
use tokio::time::{sleep, sleep_until, timeout, Instant};

use crate::conn::{default_tls, Conn};
use crate::{ClientError, Endpoint, Event, Options, SendError, State};

/// Share of the gateway's timeout after which a client that sent nothing pings: a third
/// leaves room for two late or lost pings before the gateway's window closes.
const KEEPALIVE_DIVISOR: u32 = 3;

/// Shortest keepalive, whatever a (misconfigured) gateway says: no busy loop of pings.
const MIN_KEEPALIVE: Duration = Duration::from_millis(10);

/// Events held for an application that reads them late; past this the client stops
/// reading its socket until the application catches up.
const EVENT_QUEUE: usize = 256;

/// How long a logout or close waits for the gateway's goodbye before dropping the socket.
const GOODBYE_PATIENCE: Duration = Duration::from_secs(2);

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
        let task =
            Task { endpoint, options, tls, data: data_rx, control: control_rx, events: events_tx, state: state_tx };
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

/// The background task holding the connection.
struct Task {
    endpoint: Endpoint,
    options: Options,
    tls: Arc<rustls::ClientConfig>,
    data: mpsc::Receiver<Bytes>,
    control: mpsc::UnboundedReceiver<Control>,
    events: mpsc::Sender<Event>,
    state: watch::Sender<State>,
}

// === impl Task ===

impl Task {
    async fn run(mut self) {
        // Failed attempts since the last session that reached WELCOME.
        let mut attempt = 0u32;
        let mut refresh = false;
        loop {
            self.set(State::Connecting { attempt }).await;
            let (ended, welcomed) = self.session(refresh).await;
            if welcomed {
                attempt = 0;
            }
            refresh = false;
            let (reason, text, hint) = match ended {
                Ended::Closed => return self.closed().await,
                Ended::Logout => {
                    self.set(State::Offline { reason: CloseReason::Logout, text: String::new(), retry_in: None }).await;
                    if !self.wait_for_reconnect().await {
                        return self.closed().await;
                    }
                    attempt = 0;
                    continue;
                }
                Ended::Bye { reason: CloseReason::Kicked, text } if !self.options.reconnect_after_kick => {
                    self.set(State::Offline { reason: CloseReason::Kicked, text, retry_in: None }).await;
                    if !self.wait_for_reconnect().await {
                        return self.closed().await;
                    }
                    attempt = 0;
                    continue;
                }
                Ended::Bye { reason, text } => {
                    refresh = reason == CloseReason::AuthFailed;
                    let hint = retry_hint(&text).map(Duration::from_millis);
                    (reason, text, hint)
                }
                Ended::Lost(text) => (CloseReason::Disconnect, text, None),
            };
            let delay = self.options.backoff.delay(attempt, hint);
            attempt = attempt.saturating_add(1);
            tracing::debug!(%reason, %text, ?delay, "offline; reconnecting");
            self.set(State::Offline { reason, text, retry_in: Some(delay) }).await;
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
        let login = Frame::Login { uid, token: Bytes::from(token), device: self.options.device.clone() };
        let patience = self.options.connect_timeout;
        let opened = timeout(patience, async {
            let mut conn = Conn::open(&self.endpoint, &self.tls).await.map_err(|e| e.to_string())?;
            conn.send(login).await.map_err(|e| e.to_string())?;
            let first = conn.recv().await?;
            Ok::<_, String>((conn, first))
        })
        .await;
        let (mut conn, timeout_ms, tick_ms, session) = match opened {
            Err(_) => return (Ended::Lost(format!("no WELCOME within {patience:?}")), false),
            Ok(Err(text)) => return (Ended::Lost(format!("{}: {text}", self.endpoint)), false),
            Ok(Ok((_, Frame::Bye { reason, text }))) => return (Ended::Bye { reason, text }, false),
            Ok(Ok((conn, Frame::Welcome { timeout_ms, tick_ms, session }))) => (conn, timeout_ms, tick_ms, session),
            Ok(Ok((_, other))) => return (Ended::Lost(format!("expected WELCOME, got {other:?}")), false),
        };
        let timeout = Duration::from_millis(timeout_ms.into());
        let keepalive = (timeout / KEEPALIVE_DIVISOR).max(MIN_KEEPALIVE);
        let tick = Duration::from_millis(tick_ms.into());
        self.set(State::Online { session, timeout, tick, keepalive }).await;
        (self.online(&mut conn, keepalive).await, true)
    }

    /// Serves an open session until it ends: sends queued DATA, pings after `keepalive`
    /// without sending, hands pushes to the application.
    async fn online(&mut self, conn: &mut Conn, keepalive: Duration) -> Ended {
        let mut ping_at = Instant::now() + keepalive;
        loop {
            tokio::select! {
                biased;
                control = self.control.recv() => match control {
                    Some(Control::Reconnect) => {}
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
                received = conn.recv() => match received {
                    Ok(Frame::Push(payload)) => self.emit(Event::Push(payload)).await,
                    Ok(Frame::Pong(_)) => {}
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
        tokio::select! {
            _ = sleep(delay) => true,
            control = self.control.recv() => match control {
                Some(Control::Reconnect) => true,
                Some(Control::Logout) => {
                    let text = String::new();
                    self.set(State::Offline { reason: CloseReason::Logout, text, retry_in: None }).await;
                    self.wait_for_reconnect().await
                }
                Some(Control::Close) | None => false,
            },
        }
    }

    /// Stays offline until the application asks to reconnect; false when it closed.
    async fn wait_for_reconnect(&mut self) -> bool {
        loop {
            match self.control.recv().await {
                Some(Control::Reconnect) => return true,
                Some(Control::Logout) => {}
                Some(Control::Close) | None => return false,
            }
        }
    }

    /// The last state of a client the application closed (or dropped).
    async fn closed(&mut self) {
        let text = "closed by the application".to_string();
        self.set(State::Offline { reason: CloseReason::Disconnect, text, retry_in: None }).await;
    }

    async fn set(&mut self, state: State) {
        self.state.send_replace(state.clone());
        self.emit(Event::State(state)).await;
    }

    /// Hands `event` to the application; an application that dropped its [`Events`] only
    /// reads the state.
    async fn emit(&mut self, event: Event) {
        let _ = self.events.send(event).await;
    }
}

//! One accepted socket, on any door, driven through the protocol machine from accept to BYE.
//!
//! The socket's bytes become frames in [`Connection`] (no buffer of its own while idle); the
//! [`Machine`] decides; this file only waits: for the socket, for the session's wake-ups,
//! for the login deadline (which covers the door's handshakes) and for shedding.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::Ready;
use tokio::net::TcpStream;
use tokio::time::{sleep_until, Instant};

use crate::presence::Origin;
use crate::proto::{CloseReason, Transport};
use crate::protocol::{self, Arriving, Close, Command, Machine, System, Wake};
use crate::transport::admission::Ticket;
use crate::transport::connection::{Connection, Framing, Layer};
use crate::transport::guard::Guard;
use crate::transport::refusal_log::{self, RefusalLog};

/// Serves one accepted connection until it closes, holding `guard` (its slot and its
/// counts) until then, and `ticket` (its place among the connections waiting to log in)
/// through the login phase; resolves to why it closed.
///
/// This future is the connection's task: everything it keeps is memory every open
/// connection costs (`footprint` below). So it is written by hand, not as an `async fn`: an
/// `async fn` keeps its arguments in slots of their own beside the state built from them,
/// and each nested future's state beside that. The login phase (with its deadline timer and
/// its ticket) and the close (with its write deadline) are boxed futures that own the
/// connection while they run: allocated while they run, freed after, instead of widening
/// every connection's task by their size for as long as it lives.
pub(crate) fn serve<L: Layer + Send + Sync + Unpin + 'static, F: Framing + Send + Sync + Unpin + 'static>(
    stream: TcpStream,
    layer: L,
    framing: F,
    context: Arc<protocol::Context>,
    guard: Guard,
    arrival: Arrival,
) -> Serve<L, F> {
    let conn = Connection::new(stream, layer, framing);
    let machine = Machine::new(context, arrival.accepted);
    let login = log_in(machine, conn, arrival);
    Serve { phase: Phase::LoggingIn(Box::pin(login)), guard }
}

/// What the login phase holds besides the connection: held by it only.
pub(crate) struct Arrival {
    /// When it was accepted: its login deadline runs from then, a PROXY header's wait
    /// included.
    pub accepted: Instant,
    /// Its place among the connections waiting to log in.
    pub ticket: Option<Ticket>,
    /// The client's address (the peer's, or a trusted PROXY header's), for its session and
    /// the log of a refusal.
    pub peer: Option<SocketAddr>,
    /// Where a refusal is told.
    pub log: Arc<RefusalLog>,
}

/// A connection's task; see [`serve`].
pub(crate) struct Serve<L, F> {
    phase: Phase<L, F>,
    /// Its slot and counts, given back when the task ends.
    guard: Guard,
}

/// The future of a connection's login phase: the connection and machine back, and how it
/// ended.
type LoggingIn<L, F> = Pin<Box<dyn Future<Output = (Machine, Connection<L, F>, Result<(), Close>)> + Send>>;

enum Phase<L, F> {
    /// Until a LOGIN succeeds (or the connection ends first).
    LoggingIn(LoggingIn<L, F>),
    /// Logged in: the connection's longest phase, and the one its task is sized for.
    LoggedIn {
        conn: Connection<L, F>,
        machine: Machine,
    },
    /// Sending what is left and the BYE, then closing.
    Closing(Pin<Box<dyn Future<Output = CloseReason> + Send>>),
    Done,
}

impl<L: Layer + Send + Sync + Unpin + 'static, F: Framing + Send + Sync + Unpin + 'static> Future for Serve<L, F> {
    type Output = CloseReason;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<CloseReason> {
        let this = self.get_mut();
        loop {
            let (machine, conn, (reason, text)) = match &mut this.phase {
                Phase::LoggingIn(login) => {
                    let (machine, conn, result) = std::task::ready!(login.as_mut().poll(cx));
                    this.guard.done_waiting();
                    match result {
                        Ok(()) => {
                            machine.begin();
                            this.phase = Phase::LoggedIn { conn, machine };
                            continue;
                        }
                        Err(close) => (machine, conn, close),
                    }
                }
                Phase::LoggedIn { conn, machine } => {
                    let close = std::task::ready!(logged_in(machine, conn, cx));
                    let Phase::LoggedIn { conn, machine } = std::mem::replace(&mut this.phase, Phase::Done) else {
                        unreachable!("matched just above")
                    };
                    (machine, conn, close)
                }
                Phase::Closing(closing) => {
                    let reason = std::task::ready!(closing.as_mut().poll(cx));
                    this.phase = Phase::Done;
                    return Poll::Ready(reason);
                }
                Phase::Done => {
                    debug_assert!(false, "a connection's task polled after it closed");
                    return Poll::Pending;
                }
            };
            this.phase = Phase::Closing(Box::pin(close(machine, conn, reason, text)));
        }
    }
}

/// The login phase, owning the connection, the machine and the ticket while it runs; the
/// ticket goes back when it ends, whatever the outcome.
async fn log_in<L: Layer, F: Framing>(
    mut machine: Machine,
    mut conn: Connection<L, F>,
    arrival: Arrival,
) -> (Machine, Connection<L, F>, Result<(), Close>) {
    let Arrival { ticket, peer, log, .. } = arrival;
    let door = Connection::<L, F>::TRANSPORT;
    let mut handshake = Handshake::start(door, &conn);
    let arriving = Arriving(Origin { door: Some(door), remote: peer });
    let result = login(&mut machine, &mut conn, ticket.as_ref(), &mut handshake, &arriving).await;
    handshake.ended(&machine, &conn, &result);
    drop(ticket);
    // A client that closed says nothing worth a line; everything else refused before its
    // login is counted by why and told (rate-limited) with its peer.
    if let Err((reason, text)) = &result {
        if *reason != CloseReason::Disconnect {
            machine.context().metrics.refused_login(door, refusal_log::why(*reason, text));
            if *reason != CloseReason::Shutdown {
                log.refused(peer, door, *reason, text);
            }
        }
    }
    (machine, conn, result)
}

/// Serves the connection until a LOGIN succeeds, the machine's login deadline passes, the
/// connection is shed to make room for a newer one, or shutdown begins.
async fn login<L: Layer, F: Framing>(
    machine: &mut Machine,
    conn: &mut Connection<L, F>,
    ticket: Option<&Ticket>,
    handshake: &mut Handshake,
    inputs: &Arriving,
) -> Result<(), Close> {
    let context = machine.context().clone();
    let shed = async {
        match ticket {
            Some(ticket) => ticket.shed().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(shed);
    let Some(first) = machine.poll_timeout() else { return Ok(()) };
    let deadline = sleep_until(first);
    tokio::pin!(deadline);
    loop {
        if machine.session().is_some() {
            return Ok(());
        }
        tokio::select! {
            biased;
            _ = context.shutdown.cancelled() => return Err((CloseReason::Shutdown, String::new())),
            _ = &mut shed => return Err(machine.shed(inputs)),
            _ = &mut deadline => {
                // Judge what the client sent, not how fast we got to it: a LOGIN that
                // arrived while the gateway lagged is read now, before giving up.
                conn.on_ready(Ok(Ready::READABLE), |command, out| machine.handle(inputs, command, out))?;
                machine.handle_timeout(inputs)?;
                match machine.poll_timeout() {
                    Some(next) => deadline.as_mut().reset(next),
                    None => return Ok(()),
                }
            }
            ready = conn.ready() => conn.on_ready(ready, |command, out| machine.handle(inputs, command, out))?,
        }
        handshake.check(machine, conn);
    }
}

/// Serves a logged-in connection until it or its session ends: the session's wake-ups
/// first (an ending, pushes), then the socket.
fn logged_in<L: Layer, F: Framing>(
    machine: &mut Machine,
    conn: &mut Connection<L, F>,
    cx: &mut Context<'_>,
) -> Poll<Close> {
    loop {
        if machine.session().is_some_and(|session| session.poll_woken(cx).is_ready()) {
            let step = match machine.on_wake() {
                Some(Wake::End(reason)) => Err((reason, String::new())),
                Some(Wake::Push { pushes, presence, ping, durable }) => conn
                    .send(&pushes, &presence)
                    .and_then(|()| if ping { conn.ping() } else { Ok(()) })
                    .and_then(|()| conn.release(durable)),
                None => Ok(()),
            };
            if let Err(close) = step {
                return Poll::Ready(close);
            }
            continue;
        }
        let ready = std::task::ready!(conn.poll_ready(cx));
        let handle = |command: Command, out: &mut dyn protocol::Out| machine.handle(&System, command, out);
        if let Err(close) = conn.on_ready(ready, handle) {
            return Poll::Ready(close);
        }
    }
}

/// Ends the session, sends what is left and the BYE within a deadline, and closes.
async fn close<L: Layer, F: Framing>(
    machine: Machine,
    conn: Connection<L, F>,
    reason: CloseReason,
    text: String,
) -> CloseReason {
    let (reason, pushes, bye) = machine.goodbye(&System, reason, text);
    // Counted before the client can see the close, so whoever watches both never sees an
    // end of stream the counters do not know of yet.
    machine.context().metrics.closed(reason, Connection::<L, F>::TRANSPORT);
    conn.close(&pushes, bye).await;
    machine.closed(reason);
    reason
}

/// A door's handshake (TLS, the WebSocket upgrade) from accept until it is done or the
/// login phase ends without it: counted and timed once.
struct Handshake {
    transport: Transport,
    started: Instant,
    /// Still to be counted.
    open: bool,
}

impl Handshake {
    fn start<L: Layer, F: Framing>(transport: Transport, conn: &Connection<L, F>) -> Handshake {
        let open = transport.has_handshake() && !conn.handshaken();
        Handshake { transport, started: Instant::now(), open }
    }

    /// Counts the handshake once it is done.
    fn check<L: Layer, F: Framing>(&mut self, machine: &Machine, conn: &Connection<L, F>) {
        if self.open && conn.handshaken() {
            self.open = false;
            machine.context().metrics.handshake(self.transport, "ok", self.started.elapsed().as_secs_f64());
        }
    }

    /// The login phase ended with `result`: a handshake still open failed, and how.
    fn ended<L: Layer, F: Framing>(&mut self, machine: &Machine, conn: &Connection<L, F>, result: &Result<(), Close>) {
        self.check(machine, conn);
        if !self.open {
            return;
        }
        self.open = false;
        let outcome = match result {
            Err((CloseReason::LoginTimeout, _)) => "timeout",
            Err((CloseReason::ProtocolError, _)) => "error",
            _ => "closed",
        };
        machine.context().metrics.handshake(self.transport, outcome, 0.0);
    }
}

#[cfg(test)]
mod footprint {
    use std::sync::Arc;

    use crate::config::Config;
    use crate::metrics::Metrics;
    use crate::protocol::Context;
    use crate::transport::guard::Slots;
    use crate::transport::{mqtt, tcp, ws};

    /// The most a connection's future may take for its task to stay at 256 bytes: tokio's
    /// task adds 96 bytes (header, scheduler, id, trailer) and rounds up to 128-byte steps
    /// (what an `async fn` took instead is in docs/BENCHMARKS.md).
    const MAX_CONNECTION_FUTURE: usize = 160;

    /// Every open connection keeps this future alive as its task; at 19,000 clients it is
    /// the largest share of the memory per connection (docs/BENCHMARKS.md). A regression
    /// guard on every clear door, not a speed test.
    #[tokio::test]
    async fn the_connection_future_stays_small() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let config = Config::default();
        let context = Context::for_test(&config);
        let max = config.max_frame_bytes;
        let slots = Arc::new(Slots::new(3, Arc::new(Metrics::new(&config))));
        let stream = || async { tokio::net::TcpStream::connect(listener.local_addr().unwrap()).await.unwrap() };
        let guard = || slots.take(crate::proto::Transport::Tcp).unwrap();
        let mqtt = || mqtt::Mqtt::new(max, Arc::new(mqtt::MqttPolicy::new(&config)));
        let log = Arc::<super::RefusalLog>::default();
        let arrival =
            || super::Arrival { accepted: tokio::time::Instant::now(), ticket: None, peer: None, log: log.clone() };
        let sizes = [
            (
                "tcp",
                size(super::serve(stream().await, tcp::Plain, tcp::frames(max), context.clone(), guard(), arrival())),
            ),
            ("mqtt", size(super::serve(stream().await, tcp::Plain, mqtt(), context.clone(), guard(), arrival()))),
            (
                "ws",
                size(super::serve(
                    stream().await,
                    tcp::Plain,
                    ws::WebSocket::new(max, Arc::default()),
                    context.clone(),
                    guard(),
                    arrival(),
                )),
            ),
        ];
        for (door, size) in sizes {
            assert!(size <= MAX_CONNECTION_FUTURE, "the {door} door's connection future grew to {size} bytes");
        }
    }

    fn size<T>(future: T) -> usize {
        std::mem::size_of_val(&future)
    }

    /// What an idle logged-in connection holds in user space, pinned exactly (issue 48: an
    /// idle connection grew by about 95 bytes over a round, and nothing noticed). A change
    /// that grows any of these fails here, and its author updates the figure together with
    /// the measurement in docs/BENCHMARKS.md ("What an idle connection holds") that says
    /// why the bytes are worth it.
    #[test]
    fn what_an_idle_connection_holds_is_pinned() {
        use std::mem::size_of;

        use idlegate_proto::FrameCodec;

        use crate::presence::{Origin, Session};
        use crate::transport::tls::Tls;

        // Its task's future, by door: the task adds tokio's 96 bytes and rounds up to
        // 128-byte steps.
        let futures = [
            ("tcp", size_of::<super::Serve<tcp::Plain, FrameCodec>>(), 96),
            ("tls", size_of::<super::Serve<Tls, FrameCodec>>(), 112),
            ("ws", size_of::<super::Serve<tcp::Plain, ws::WebSocket>>(), 128),
            ("mqtt", size_of::<super::Serve<tcp::Plain, mqtt::Mqtt>>(), 128),
            ("wss", size_of::<super::Serve<Tls, ws::WebSocket>>(), 144),
            ("mqtts", size_of::<super::Serve<Tls, mqtt::Mqtt>>(), 144),
        ];
        for (door, got, pinned) in futures {
            assert_eq!(got, pinned, "the {door} door's connection future");
        }
        // Its session (behind an `Arc`: 16 bytes more), whose client address (`Origin`,
        // boxed again in the event log's online event) is the latest growth.
        assert_eq!(size_of::<Session>(), 104, "the session");
        assert_eq!(size_of::<Origin>(), 36, "a session's door and client address");
        // The event log keeps every online event it holds: 56 bytes inline, and a boxed
        // packed origin (a 32-byte allocation).
        assert_eq!(crate::presence::kept_online_event_bytes(), (56, 19), "the event log's online event");
    }
}

//! One accepted socket, on any door, driven through the protocol machine from accept to BYE.
//!
//! The socket's bytes become frames in [`Connection`] (no buffer of its own while idle); the
//! [`Machine`] decides; this file only waits: for the socket, for the session's wake-ups,
//! for the login deadline (which covers the door's handshakes) and for shedding.

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;

use tokio::io::Ready;
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{sleep, Instant};

use crate::gateway::Gateway;
use crate::presence::Session;
use crate::proto::{CloseReason, Transport};
use crate::protocol::{Close, Machine, Wake};
use crate::transport::connection::{Connection, Framing, Input, Layer};

/// Serves one accepted connection until it closes, holding `permit` (its place under
/// `--max-connections`) until then; returns why it closed.
///
/// This future is the connection's task: everything it keeps across an await is memory every
/// open connection costs (`footprint` below).
pub(crate) async fn serve<L: Layer, F: Framing>(
    stream: TcpStream,
    layer: L,
    framing: F,
    gateway: Arc<Gateway>,
    permit: OwnedSemaphorePermit,
) -> CloseReason {
    let mut conn = Connection::new(stream, layer, framing);
    let mut machine = Machine::new(gateway);
    // The future every connection keeps for its whole life holds only the logged-in phase.
    // The login phase (with its deadline timer) and the close (with its write deadline) are
    // boxed: allocated while they run, freed after, instead of widening every connection's
    // future by their size for as long as it lives.
    let logged_in = Box::pin(until_login(&mut machine, &mut conn)).await;
    machine.gateway().metrics.pending_logins.dec();
    let (reason, text) = match logged_in {
        Ok(()) => until_end(&mut machine, &mut conn).await,
        Err(close) => close,
    };
    let reason = Box::pin(close(&machine, conn, reason, text)).await;
    drop(permit);
    reason
}

/// Serves the connection until a LOGIN succeeds; its ticket among the connections waiting to
/// log in goes back when this returns.
async fn until_login<L: Layer, F: Framing>(machine: &mut Machine, conn: &mut Connection<L, F>) -> Result<(), Close> {
    let gateway = machine.gateway().clone();
    let mut handshake = Handshake::start(Connection::<L, F>::TRANSPORT, conn);
    let result = login(machine, conn, &gateway, &mut handshake).await;
    handshake.ended(&gateway, conn, &result);
    result
}

async fn login<L: Layer, F: Framing>(
    machine: &mut Machine,
    conn: &mut Connection<L, F>,
    gateway: &Arc<Gateway>,
    handshake: &mut Handshake,
) -> Result<(), Close> {
    let ticket = gateway.pending.claim(conn.fd());
    let shed = async {
        match &ticket {
            Some(ticket) => ticket.shed().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(shed);
    let deadline = sleep(gateway.config.login_timeout);
    tokio::pin!(deadline);
    loop {
        if machine.session().is_some() {
            return Ok(());
        }
        tokio::select! {
            biased;
            _ = gateway.shutdown.cancelled() => return Err((CloseReason::Shutdown, String::new())),
            _ = &mut shed => return Err(machine.shed()),
            _ = &mut deadline => {
                // Judge what the client sent, not how fast we got to it: a LOGIN that
                // arrived while the gateway lagged is read now, before giving up.
                conn.on_ready(Ok(Ready::READABLE), |input, out| on_input(machine, input, out))?;
                return machine.login_deadline();
            }
            ready = conn.ready() => conn.on_ready(ready, |input, out| on_input(machine, input, out))?,
        }
        handshake.check(gateway, conn);
    }
}

/// Serves a logged-in connection until it or its session ends.
async fn until_end<L: Layer, F: Framing>(machine: &mut Machine, conn: &mut Connection<L, F>) -> Close {
    machine.begin();

    loop {
        let step = tokio::select! {
            biased;
            _ = woken(machine.session()) => match machine.on_wake() {
                Some(Wake::End(reason)) => return (reason, String::new()),
                Some(Wake::Push(pushes)) => conn.send(&pushes),
                None => Ok(()),
            },
            ready = conn.ready() => conn.on_ready(ready, |input, out| on_input(machine, input, out)),
        };
        if let Err(close) = step {
            return close;
        }
    }
}

/// Ends the session, sends what is left and the BYE within a deadline, and closes.
async fn close<L: Layer, F: Framing>(
    machine: &Machine,
    conn: Connection<L, F>,
    reason: CloseReason,
    text: String,
) -> CloseReason {
    let (reason, pushes, bye) = machine.goodbye(reason, text);
    conn.close(&pushes, bye).await;
    machine.closed(Connection::<L, F>::TRANSPORT, reason);
    reason
}

/// One unit from the client, to the machine.
fn on_input(machine: &mut Machine, input: Input, out: &mut dyn crate::protocol::Out) -> Result<(), Close> {
    match input {
        Input::Frame(frame) => machine.on_frame(frame, out),
        Input::Activity => machine.on_activity(),
        Input::Publish { topic, payload } => machine.on_publish(topic, payload),
        Input::Connect { login, will } => machine.on_connect(login, will, out),
        Input::Subscribe(filters) => machine.on_subscriptions(&filters, true),
        Input::Unsubscribe(filters) => machine.on_subscriptions(&filters, false),
    }
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
    fn check<L: Layer, F: Framing>(&mut self, gateway: &Gateway, conn: &Connection<L, F>) {
        if self.open && conn.handshaken() {
            self.open = false;
            gateway.metrics.handshake(self.transport, "ok", self.started.elapsed().as_secs_f64());
        }
    }

    /// The login phase ended with `result`: a handshake still open failed, and how.
    fn ended<L: Layer, F: Framing>(&mut self, gateway: &Gateway, conn: &Connection<L, F>, result: &Result<(), Close>) {
        self.check(gateway, conn);
        if !self.open {
            return;
        }
        self.open = false;
        let outcome = match result {
            Err((CloseReason::LoginTimeout, _)) => "timeout",
            Err((CloseReason::ProtocolError, _)) => "error",
            _ => "closed",
        };
        gateway.metrics.handshake(self.transport, outcome, 0.0);
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
        let codec = crate::proto::FrameCodec::new(gateway.config.max_frame_bytes);
        let future = super::serve(stream, crate::transport::tcp::Plain, codec, gateway, permit);
        let size = std::mem::size_of_val(&future);
        assert!(size <= MAX_CONNECTION_FUTURE, "the connection future grew to {size} bytes");
    }
}

//! The HTTP listeners' accept loop: a bounded number of connections each, and a reserve
//! descriptor (see `descriptors.rs`), so the admin endpoint and the API keep answering when
//! clients have taken every other descriptor and never take the ones clients need.
//!
//! Neither idle nor slow connections can hold a listener shut (a liveness probe that
//! cannot get in gets a working gateway killed):
//! - a connection must finish its first request within [`FIRST_REQUEST`] of being
//!   accepted, however it trickles bytes (slowloris): until the server first answers, only
//!   that deadline counts, not activity;
//! - when every place is taken, the next connection takes the place of one quiet for at
//!   least [`EVICTABLE_AFTER`]: of those that never got an answer (idle or slow sockets),
//!   the quietest; only if there is none, the quietest of the rest (an event stream
//!   between keep-alives); only when every connection is busy does a new one wait;
//! - a connection with no byte read or written for [`HTTP_IDLE`] is closed.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::config::TlsIdentity;
use crate::descriptors::{is_out_of_descriptors, Reserve};

/// Connections the admin endpoint serves at once: probes, scrapes, and status pages, each of
/// which holds two (its event stream and its polls), so a hundred pages fit.
pub(crate) const ADMIN_CONNECTIONS: usize = 256;

/// Connections the backend API serves at once: a backend's pools and its event consumers.
/// With the admin's, inside [`crate::FD_HEADROOM`].
pub(crate) const API_CONNECTIONS: usize = 256;

/// An HTTP connection with no byte read or written for this long is closed, giving its place
/// back: far longer than any request takes, and four times the event stream's keep-alive.
pub(crate) const HTTP_IDLE: Duration = Duration::from_secs(60);

/// Time a connection has, from its accept, to send a whole first request: a probe or a
/// backend sends one in a millisecond; a slow mobile link in well under this.
pub(crate) const FIRST_REQUEST: Duration = Duration::from_secs(5);

/// A connection quiet for at least this long may lose its place to a new one when the
/// listener is full; one that moved a byte more recently is busy and keeps it.
const EVICTABLE_AFTER: Duration = Duration::from_secs(1);

/// How long a full listener waits for an evicted connection to give its place back
/// before it looks again.
const EVICTION_WAIT: Duration = Duration::from_millis(50);

/// Pause after a failed accept that is not the descriptors running out.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);

/// A TCP listener serving at most a fixed number of connections; see the module
/// documentation.
pub(crate) struct Bounded {
    listener: TcpListener,
    /// With `--api-tls` or `--admin-tls`: each connection's TLS handshake, run inside the
    /// connection's own task (so a slow handshake delays nobody else) and within its
    /// first-request deadline.
    tls: Option<TlsAcceptor>,
    permits: Arc<Semaphore>,
    reserve: Reserve,
    idle: Duration,
    first_request: Duration,
    places: Arc<Places>,
}

/// The connections holding a place, for eviction.
#[derive(Debug)]
struct Places {
    epoch: Instant,
    next: AtomicU64,
    held: Mutex<HashMap<u64, Arc<Place>>>,
}

/// One connection's place: when it last moved a byte, and how to close it.
#[derive(Debug)]
struct Place {
    last_ms: AtomicU64,
    /// Whether the server has answered a request on it: a connection that never sent a
    /// whole request (an idle or slow socket of a flood) goes before one that did (an event
    /// stream between keep-alives, a pooled backend connection).
    answered: AtomicBool,
    evict: CancellationToken,
}

// === impl Places ===

impl Places {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Closes the connection quiet longest, if one has been quiet long enough; whether one
    /// was (or an earlier eviction is still giving its place back: one at a time, so a
    /// slow goodbye never costs a second connection its place).
    fn evict_quietest(&self) -> bool {
        let now = self.now_ms();
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if held.values().any(|p| p.evict.is_cancelled()) {
            return true;
        }
        let quietest = held
            .values()
            .min_by_key(|p| (p.answered.load(Ordering::Relaxed), p.last_ms.load(Ordering::Relaxed)))
            .filter(|p| now.saturating_sub(p.last_ms.load(Ordering::Relaxed)) >= EVICTABLE_AFTER.as_millis() as u64);
        match quietest {
            Some(place) => {
                place.evict.cancel();
                true
            }
            None => false,
        }
    }
}

// === impl Bounded ===

impl Bounded {
    /// Serves at most `max` connections at once, each closed after `idle` without traffic.
    pub(crate) fn new(listener: TcpListener, max: usize, idle: Duration) -> Bounded {
        Bounded::with_first_request(listener, max, idle, FIRST_REQUEST)
    }

    fn with_first_request(listener: TcpListener, max: usize, idle: Duration, first_request: Duration) -> Bounded {
        let places = Places { epoch: Instant::now(), next: AtomicU64::new(0), held: Mutex::default() };
        Bounded {
            listener,
            tls: None,
            permits: Arc::new(Semaphore::new(max)),
            reserve: Reserve::open(),
            idle,
            first_request,
            places: Arc::new(places),
        }
    }

    /// Serves HTTPS with the identity of `--tls-cert` and `--tls-key` when `on` (and the
    /// identity is there, which the configuration's validation ensured).
    pub(crate) fn with_tls(mut self, identity: Option<&Arc<TlsIdentity>>, on: bool) -> Bounded {
        self.tls = identity.filter(|_| on).map(|id| TlsAcceptor::from(id.server_config(&[b"http/1.1"])));
        self
    }

    /// A free place, taking one from the quietest connection when none is free.
    async fn place(&self) -> OwnedSemaphorePermit {
        loop {
            if let Ok(permit) = self.permits.clone().try_acquire_owned() {
                return permit;
            }
            let evicted = self.places.evict_quietest();
            // An evicted connection gives its place back as soon as its task sees the
            // eviction; with every connection busy, wait for one to end.
            let wait = if evicted { EVICTION_WAIT } else { EVICTABLE_AFTER };
            if let Ok(Ok(permit)) = tokio::time::timeout(wait, self.permits.clone().acquire_owned()).await {
                return permit;
            }
        }
    }
}

impl axum::serve::Listener for Bounded {
    type Io = BoundedIo;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (BoundedIo, SocketAddr) {
        // Accepted before it has a place, so only a connection that is really waiting ever
        // takes a quiet one's place; while it waits for one, it is the only connection this
        // listener holds beyond its bound.
        let (stream, addr) = loop {
            match self.listener.accept().await {
                Ok(accepted) => {
                    self.reserve.reopen();
                    break accepted;
                }
                Err(e) if is_out_of_descriptors(&e) && self.reserve.release() => continue,
                Err(e) => {
                    tracing::debug!(error = %e, "HTTP accept failed; retrying");
                    tokio::time::sleep(ACCEPT_RETRY).await;
                    self.reserve.reopen();
                }
            }
        };
        let permit = self.place().await;
        let id = self.places.next.fetch_add(1, Ordering::Relaxed);
        let place = Arc::new(Place {
            last_ms: AtomicU64::new(self.places.now_ms()),
            answered: AtomicBool::new(false),
            evict: CancellationToken::new(),
        });
        self.places.held.lock().unwrap_or_else(PoisonError::into_inner).insert(id, place.clone());
        let stream = match &self.tls {
            Some(acceptor) => Stream::Handshake(Box::new(acceptor.accept(stream))),
            None => Stream::Plain(stream),
        };
        let io = BoundedIo {
            stream,
            _permit: permit,
            idle: Box::pin(tokio::time::sleep(self.idle)),
            idle_for: self.idle,
            first_request: Some(Box::pin(tokio::time::sleep(self.first_request))),
            evicted: Box::pin(place.evict.clone().cancelled_owned()),
            place,
            places: self.places.clone(),
            id,
        };
        (io, addr)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// A connection's bytes: plain, or TLS (its handshake first).
enum Stream {
    Plain(TcpStream),
    Handshake(Box<tokio_rustls::Accept<TcpStream>>),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

// === impl Stream ===

/// What a finished stream is, plain or TLS, to read and write through.
trait Io: AsyncRead + AsyncWrite + Unpin {}

impl<T: AsyncRead + AsyncWrite + Unpin> Io for T {}

impl Stream {
    /// The stream to read and write, once a TLS handshake has come to its end.
    fn ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<&mut dyn Io>> {
        if let Stream::Handshake(accept) = self {
            match Pin::new(accept.as_mut()).poll(cx) {
                Poll::Ready(Ok(tls)) => *self = Stream::Tls(Box::new(tls)),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => s.as_mut(),
            Stream::Handshake(_) => unreachable!("the handshake finished above"),
        }))
    }
}

impl AsyncRead for Stream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let io = std::task::ready!(self.ready(cx))?;
        Pin::new(io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Stream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let io = std::task::ready!(self.ready(cx))?;
        Pin::new(io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let io = std::task::ready!(self.ready(cx))?;
        Pin::new(io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
            Stream::Handshake(_) => false,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let io = std::task::ready!(self.ready(cx))?;
        Pin::new(io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let io = std::task::ready!(self.ready(cx))?;
        Pin::new(io).poll_shutdown(cx)
    }
}

/// An accepted HTTP connection; its place goes back when it closes.
pub(crate) struct BoundedIo {
    stream: Stream,
    _permit: OwnedSemaphorePermit,
    /// Fires after `idle_for` without traffic; pushed back by every read and write.
    idle: Pin<Box<tokio::time::Sleep>>,
    idle_for: Duration,
    /// Fires if the server has not answered a first request in time; gone after it has.
    first_request: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Resolves once a newer connection took this one's place.
    evicted: Pin<Box<WaitForCancellationFutureOwned>>,
    place: Arc<Place>,
    places: Arc<Places>,
    id: u64,
}

// === impl BoundedIo ===

impl BoundedIo {
    /// Pushes the idle deadline back after traffic.
    fn active(&mut self) {
        let deadline = Instant::now() + self.idle_for;
        self.idle.as_mut().reset(deadline);
        self.place.last_ms.store(self.places.now_ms(), Ordering::Relaxed);
    }

    /// A read waiting for bytes ends in an error once the connection has been idle too
    /// long, has not sent a whole first request in time, or lost its place.
    fn check_idle(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let why = if self.idle.as_mut().poll(cx).is_ready() {
            "idle HTTP connection"
        } else if self.first_request.as_mut().is_some_and(|f| f.as_mut().poll(cx).is_ready()) {
            "no whole first request in time"
        } else if self.evicted.as_mut().poll(cx).is_ready() {
            "quietest connection of a full listener"
        } else {
            return Poll::Pending;
        };
        Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, why)))
    }

    /// A write (an event stream to a consumer that stopped reading) ends too once a newer
    /// connection took this one's place.
    fn check_evicted(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        match self.evicted.as_mut().poll(cx) {
            Poll::Ready(()) => {
                Poll::Ready(io::Error::new(io::ErrorKind::TimedOut, "quietest connection of a full listener"))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    /// The server answers: the first request is in.
    fn answered(&mut self) {
        if self.first_request.take().is_some() {
            self.place.answered.store(true, Ordering::Relaxed);
        }
        self.active();
    }
}

impl Drop for BoundedIo {
    fn drop(&mut self) {
        self.places.held.lock().unwrap_or_else(PoisonError::into_inner).remove(&self.id);
    }
}

impl AsyncRead for BoundedIo {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if let Poll::Ready(Err(e)) = self.check_idle(cx) {
            return Poll::Ready(Err(e));
        }
        match Pin::new(&mut self.stream).poll_read(cx, buf) {
            Poll::Ready(result) => {
                self.active();
                Poll::Ready(result)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncWrite for BoundedIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if let Poll::Ready(e) = self.check_evicted(cx) {
            return Poll::Ready(Err(e));
        }
        let written = Pin::new(&mut self.stream).poll_write(cx, buf);
        if written.is_ready() {
            self.answered();
        }
        written
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if let Poll::Ready(e) = self.check_evicted(cx) {
            return Poll::Ready(Err(e));
        }
        let written = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        if written.is_ready() {
            self.answered();
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// Accepts on `listener` through [`Bounded`] and holds each connection open, reading,
    /// until it errs or ends.
    fn serve_holding(listener: TcpListener, max: usize, idle: Duration) {
        serve_holding_with(listener, max, idle, FIRST_REQUEST)
    }

    fn serve_holding_with(listener: TcpListener, max: usize, idle: Duration, first_request: Duration) {
        tokio::spawn(async move {
            let mut bounded = Bounded::with_first_request(listener, max, idle, first_request);
            loop {
                let (mut io, _) = axum::serve::Listener::accept(&mut bounded).await;
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while matches!(io.read(&mut buf).await, Ok(n) if n > 0) {}
                });
            }
        });
    }

    #[tokio::test]
    async fn idle_connections_are_closed_and_give_their_place_back() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        serve_holding(listener, 1, Duration::from_millis(300));
        // The one place is taken by a connection that then says nothing...
        let mut idle = TcpStream::connect(addr).await.unwrap();
        idle.write_all(b"x").await.unwrap();
        // ...so a second waits, until the first is closed for idling.
        let mut second = TcpStream::connect(addr).await.unwrap();
        let mut buf = [0u8; 8];
        let closed = tokio::time::timeout(Duration::from_secs(10), idle.read(&mut buf)).await.expect("closed in time");
        assert!(matches!(closed, Ok(0) | Err(_)), "{closed:?}");
        second.write_all(b"y").await.unwrap();
        // Served now: it too is closed once idle, which it could not be without a place.
        let closed = tokio::time::timeout(Duration::from_secs(10), second.read(&mut buf)).await.expect("served");
        assert!(matches!(closed, Ok(0) | Err(_)), "{closed:?}");
    }

    async fn closed(stream: &mut TcpStream) -> bool {
        let mut buf = [0u8; 8];
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf)).await.expect("closed in time");
        matches!(read, Ok(0) | Err(_))
    }

    #[tokio::test]
    async fn a_full_listener_gives_the_quietest_place_to_a_newcomer() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        serve_holding(listener, 2, Duration::from_secs(60));
        let mut oldest = TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut quiet = TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(EVICTABLE_AFTER).await;
        // Full: the newcomer takes the place of the one quiet longest, not the other.
        let mut newcomer = TcpStream::connect(addr).await.unwrap();
        assert!(closed(&mut oldest).await);
        quiet.write_all(b"still here").await.unwrap();
        newcomer.write_all(b"served").await.unwrap();
        let mut buf = [0u8; 8];
        let open = tokio::time::timeout(Duration::from_millis(300), quiet.read(&mut buf)).await;
        assert!(open.is_err(), "the busier connection kept its place: {open:?}");
    }

    #[tokio::test]
    async fn a_first_request_trickled_a_byte_at_a_time_is_cut_at_its_deadline() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        serve_holding_with(listener, 4, Duration::from_secs(60), Duration::from_millis(500));
        let mut slow = TcpStream::connect(addr).await.unwrap();
        let started = Instant::now();
        let cut = loop {
            if slow.write_all(b"G").await.is_err() {
                break true;
            }
            let mut buf = [0u8; 1];
            if let Ok(read) = tokio::time::timeout(Duration::from_millis(100), slow.read(&mut buf)).await {
                break matches!(read, Ok(0) | Err(_));
            }
            assert!(started.elapsed() < Duration::from_secs(10), "never cut");
        };
        assert!(cut);
    }

    #[tokio::test]
    async fn a_connection_that_never_sent_a_request_goes_before_one_that_did() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // Answers each read with "ok", as a server answers a request.
        tokio::spawn(async move {
            let mut bounded = Bounded::new(listener, 2, Duration::from_secs(60));
            loop {
                let (mut io, _) = axum::serve::Listener::accept(&mut bounded).await;
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while matches!(io.read(&mut buf).await, Ok(n) if n > 0) {
                        if io.write_all(b"ok").await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let mut served = TcpStream::connect(addr).await.unwrap();
        served.write_all(b"GET").await.unwrap();
        let mut buf = [0u8; 2];
        served.read_exact(&mut buf).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        // Newer than the served one, but it never sent a request.
        let mut idle = TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(EVICTABLE_AFTER).await;
        let _newcomer = TcpStream::connect(addr).await.unwrap();
        assert!(closed(&mut idle).await, "the socket that never asked anything makes room");
        served.write_all(b"GET").await.unwrap();
        assert!(served.read_exact(&mut buf).await.is_ok(), "the connection that was served keeps its place");
    }
}

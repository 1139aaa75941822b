//! The HTTP listeners' accept loop: a bounded number of connections each, closed after a
//! while with no traffic either way, and a reserve descriptor (see `descriptors.rs`), so the
//! admin endpoint and the API keep answering when clients have taken every other descriptor,
//! never take the ones clients need, and cannot be held shut by connections left idle.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

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

/// Pause after a failed accept that is not the descriptors running out.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);

/// A TCP listener serving at most a fixed number of connections; see the module
/// documentation.
pub(crate) struct Bounded {
    listener: TcpListener,
    permits: Arc<Semaphore>,
    reserve: Reserve,
    idle: Duration,
}

// === impl Bounded ===

impl Bounded {
    /// Serves at most `max` connections at once, each closed after `idle` without traffic.
    pub(crate) fn new(listener: TcpListener, max: usize, idle: Duration) -> Bounded {
        Bounded { listener, permits: Arc::new(Semaphore::new(max)), reserve: Reserve::open(), idle }
    }
}

impl axum::serve::Listener for Bounded {
    type Io = BoundedIo;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (BoundedIo, SocketAddr) {
        // Waiting for a permit leaves the connection in the kernel's backlog, costing us
        // no descriptor.
        let permit = self.permits.clone().acquire_owned().await.expect("the semaphore is never closed");
        loop {
            match self.listener.accept().await {
                Ok((stream, addr)) => {
                    self.reserve.reopen();
                    let idle = Box::pin(tokio::time::sleep(self.idle));
                    return (BoundedIo { stream, _permit: permit, idle, idle_for: self.idle }, addr);
                }
                Err(e) if is_out_of_descriptors(&e) && self.reserve.release() => continue,
                Err(e) => {
                    tracing::debug!(error = %e, "HTTP accept failed; retrying");
                    tokio::time::sleep(ACCEPT_RETRY).await;
                    self.reserve.reopen();
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// An accepted HTTP connection; its permit goes back when it closes.
pub(crate) struct BoundedIo {
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
    /// Fires after `idle_for` without traffic; pushed back by every read and write.
    idle: Pin<Box<tokio::time::Sleep>>,
    idle_for: Duration,
}

// === impl BoundedIo ===

impl BoundedIo {
    /// Pushes the idle deadline back after traffic.
    fn active(&mut self) {
        let deadline = tokio::time::Instant::now() + self.idle_for;
        self.idle.as_mut().reset(deadline);
    }

    /// A read waiting for bytes ends in an error once the connection has been idle too long.
    fn check_idle(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.idle.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "idle HTTP connection"))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for BoundedIo {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.stream).poll_read(cx, buf) {
            Poll::Ready(result) => {
                self.active();
                Poll::Ready(result)
            }
            Poll::Pending => self.check_idle(cx),
        }
    }
}

impl AsyncWrite for BoundedIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.stream).poll_write(cx, buf);
        if written.is_ready() {
            self.active();
        }
        written
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        if written.is_ready() {
            self.active();
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
        tokio::spawn(async move {
            let mut bounded = Bounded::new(listener, max, idle);
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
}

//! The HTTP listeners' accept loop: a bounded number of connections each, and a reserve
//! descriptor (see `descriptors.rs`), so the admin endpoint and the API keep answering when
//! clients have taken every other descriptor, and never take the ones clients need.

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

/// Connections the admin endpoint serves at once: probes and scrapes, a few at a time.
pub(crate) const ADMIN_CONNECTIONS: usize = 16;

/// Connections the backend API serves at once: a backend's pool and its event consumers.
/// With the admin's, well inside [`crate::FD_HEADROOM`].
pub(crate) const API_CONNECTIONS: usize = 64;

/// Pause after a failed accept that is not the descriptors running out.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);

/// A TCP listener serving at most a fixed number of connections; see the module
/// documentation.
pub(crate) struct Bounded {
    listener: TcpListener,
    permits: Arc<Semaphore>,
    reserve: Reserve,
}

// === impl Bounded ===

impl Bounded {
    pub(crate) fn new(listener: TcpListener, max: usize) -> Bounded {
        Bounded { listener, permits: Arc::new(Semaphore::new(max)), reserve: Reserve::open() }
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
                    return (BoundedIo { stream, _permit: permit }, addr);
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
}

impl AsyncRead for BoundedIo {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for BoundedIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
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

//! Telling a connection refused at accept (no room, too many from its address) why, in its
//! door's own words, without holding the accept loop.
//!
//! - the idlegate protocol on plain TCP: a BYE(server_full) frame with the retry hint;
//! - WebSocket: an HTTP `503` with `Retry-After`, written before the request is read (an
//!   HTTP/1.1 client reads a response whenever it comes);
//! - MQTT: the CONNACK its version reads (3.1.1: 0x03 Server unavailable; 5: 0x89 Server
//!   busy, or 0x97 Quota exceeded for the per-address bound, with the retry hint as Reason
//!   String). The version is in the CONNECT, so the refusal reads the CONNECT's first bytes:
//!   at once when they are there, else in a small task under [`MQTT_LEVEL_WAIT`], at most
//!   [`MQTT_WAITERS`] at a time; past that, the socket closes without a word;
//! - the TLS doors: a close (nothing can be said before a handshake the gateway has no room
//!   for); their clients retry with their own backoff.
//!
//! What the client already sent is read and dropped, at most [`DRAIN_BYTES`]: closing a
//! socket with unread data resets the connection, and a reset can destroy the answer before
//! the client reads it; but a client that keeps writing must not keep the accept loop
//! reading (one did, for seconds, while others waited to be accepted).

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

use crate::proto::mqtt::{connect_level, ConnectLevel as Level};
use crate::proto::{put_frame, CloseReason, Frame, Transport};
use crate::transport::door::{Door, Speaks};

/// Most bytes a refusal reads and drops: a LOGIN, a WebSocket upgrade request or a CONNECT
/// fits several times over.
pub(crate) const DRAIN_BYTES: usize = 4 * 1024;

/// How long a refused MQTT client has to send its CONNECT's protocol level: a client sends
/// CONNECT as soon as it is connected, within a round trip.
pub(crate) const MQTT_LEVEL_WAIT: Duration = Duration::from_millis(500);

/// Refused MQTT connections waiting for their CONNECT at once: each holds a descriptor for
/// at most [`MQTT_LEVEL_WAIT`], so a connect storm past the limit holds at most this many.
pub(crate) const MQTT_WAITERS: usize = 64;

/// Why a connection is refused: the bound it met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bound {
    /// `--max-connections`, or no descriptor left.
    Server,
    /// `--max-pending-logins-per-ip`.
    Address,
}

/// Refusals under way: the MQTT waiters' bound.
#[derive(Debug)]
pub(crate) struct Refusals {
    mqtt_waiters: Arc<Semaphore>,
}

impl Default for Refusals {
    fn default() -> Refusals {
        Refusals { mqtt_waiters: Arc::new(Semaphore::new(MQTT_WAITERS)) }
    }
}

// === impl Refusals ===

impl Refusals {
    /// Answers `stream`, accepted on `transport`, with a refusal for `bound` carrying the
    /// retry hint `hint_ms` and `why`, then closes it; never waits.
    pub(crate) fn refuse(&self, stream: TcpStream, transport: Transport, bound: Bound, hint_ms: u64, why: &str) {
        let text = crate::proto::retry_text(hint_ms, why);
        let mut answer = BytesMut::new();
        let door = Door::of(transport);
        match (door.is_tls(), door.speaks) {
            // Nothing can be said before a handshake the gateway has no room for.
            (true, _) => {}
            (false, Speaks::Frames) => put_frame(&Frame::Bye { reason: CloseReason::ServerFull, text }, &mut answer),
            (false, Speaks::WebSocket) => super::ws::put_http_refusal(&mut answer, 503, CloseReason::ServerFull, &text),
            (false, Speaks::Mqtt) => {
                let mut first = [0u8; 64];
                // Nothing there yet (would block) reads as nothing.
                let read = stream.try_read(&mut first).unwrap_or_default();
                match connect_level(&first[..read]) {
                    Level::Known(level) => super::mqtt::put_refusal(&mut answer, level, bound, &text),
                    Level::Missing => {
                        if let Ok(permit) = self.mqtt_waiters.clone().try_acquire_owned() {
                            let start = first[..read].to_vec();
                            tokio::spawn(async move {
                                answer_mqtt_later(stream, start, bound, text).await;
                                drop(permit);
                            });
                            return;
                        }
                    }
                    Level::NotMqtt => {}
                }
            }
        }
        if !answer.is_empty() {
            let _ = stream.try_write(&answer);
        }
        close(stream);
    }
}

/// Waits up to [`MQTT_LEVEL_WAIT`] for the CONNECT's protocol level after `start`, answers
/// in its version, and closes.
async fn answer_mqtt_later(stream: TcpStream, mut start: Vec<u8>, bound: Bound, text: String) {
    let deadline = tokio::time::Instant::now() + MQTT_LEVEL_WAIT;
    let level = loop {
        match connect_level(&start) {
            Level::Missing if start.len() < 64 => {}
            Level::Known(level) => break Some(level),
            _ => break None,
        }
        match tokio::time::timeout_at(deadline, stream.readable()).await {
            Ok(Ok(())) => {}
            _ => break None,
        }
        let mut more = [0u8; 64];
        match stream.try_read(&mut more) {
            Ok(0) => break None,
            Ok(n) => start.extend_from_slice(&more[..n.min(64 - start.len())]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => break None,
        }
    };
    if let Some(level) = level {
        let mut answer = BytesMut::new();
        super::mqtt::put_refusal(&mut answer, level, bound, &text);
        let _ = stream.try_write(&answer);
    }
    close(stream);
}

/// Reads and drops at most [`DRAIN_BYTES`] of what the client sent, then closes our side.
fn close(stream: TcpStream) {
    drain(&stream);
    if let Ok(stream) = stream.into_std() {
        let _ = stream.shutdown(std::net::Shutdown::Write);
    }
}

/// Reads and drops what has arrived, at most [`DRAIN_BYTES`]; returns how much.
fn drain(stream: &TcpStream) -> usize {
    let mut sink = [0u8; 1024];
    let mut drained = 0;
    while drained < DRAIN_BYTES {
        match stream.try_read(&mut sink[..(DRAIN_BYTES - drained).min(1024)]) {
            Ok(n) if n > 0 => drained += n,
            _ => break,
        }
    }
    drained
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer writing without pause (a thread with a blocking socket) is read from at most
    /// [`DRAIN_BYTES`]: before the bound, the read went on for as long as the writer kept
    /// ahead of it (21 MB in one run here, seconds of an accept loop elsewhere).
    #[tokio::test]
    async fn a_drain_reads_at_most_its_bound_from_a_writer_that_never_stops() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writing = stop.clone();
        let writer = std::thread::spawn(move || {
            use std::io::Write;
            let mut socket = std::net::TcpStream::connect(addr).unwrap();
            let chunk = vec![0u8; 64 * 1024];
            while !writing.load(std::sync::atomic::Ordering::Relaxed) && socket.write(&chunk).is_ok() {}
        });
        let (stream, _) = listener.accept().await.unwrap();
        stream.readable().await.unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let drained = drain(&stream);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        close(stream);
        writer.join().unwrap();
        assert!((1..=DRAIN_BYTES).contains(&drained), "drained {drained} bytes");
        const { assert!(DRAIN_BYTES <= 64 * 1024, "a small fixed amount") };
    }
}

//! One client socket, framed: frames in, frames out, with no buffer of its own while idle.
//!
//! The connection waits for readiness, not for data, and reads into a buffer that belongs
//! to the worker thread, not to the connection, as epoll servers holding a million
//! connections do. Only a frame split across reads, or replies the client has not taken
//! yet, are copied into buffers of the connection's own, sized to what they hold. Replies
//! the client does not read are bounded; past the bound the connection is closed as a slow
//! consumer, and nothing ever waits on a client without a deadline.
//!
//! Every door shares this: what differs is a [`Layer`] under the bytes (nothing for plain
//! sockets, TLS records for `tls` and `wss`) and a [`Framing`] over them (length-prefixed
//! frames, or WebSocket messages). Both are generic parameters, so a plain connection pays
//! nothing for the doors it does not use. What the frames mean is the protocol machine's
//! business; this file only moves them.

use std::cell::RefCell;
use std::future::Future;
use std::io;
use std::task::Poll;
use std::thread::LocalKey;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncWriteExt, Interest, Ready};
use tokio::net::TcpStream;
use tokio::time::timeout;

use crate::config::max_queued_bytes;
use crate::presence::Push;
use crate::proto::{CloseReason, Frame, Transport};
use crate::protocol::{Close, Command, Out};
use crate::transport::door::{Door, Speaks};

/// Bytes one read asks the kernel for: a burst of pings, or a whole LOGIN with its token.
const READ_CHUNK: usize = 4 * 1024;

/// Bytes a read adds to a connection's own buffer while it holds part of a frame.
const SPLIT_FRAME_READ: usize = 64;

/// Longest a BYE may wait on a client's socket before the connection is dropped anyway.
const BYE_WRITE_DEADLINE: Duration = Duration::from_secs(1);

thread_local! {
    /// The worker's read buffer, lent to one connection for the length of one read.
    static READ_SCRATCH: RefCell<BytesMut> = RefCell::new(BytesMut::new());
    /// The worker's write buffer, lent to one connection while it answers one read.
    static WRITE_SCRATCH: RefCell<BytesMut> = RefCell::new(BytesMut::new());
    /// Under TLS: the plaintext of the records one read brought.
    static OPEN_SCRATCH: RefCell<BytesMut> = RefCell::new(BytesMut::new());
    /// Under TLS: the plaintext of the replies to one read, before it is sealed.
    static SEAL_SCRATCH: RefCell<BytesMut> = RefCell::new(BytesMut::new());
}

pub(crate) fn disconnect() -> Close {
    (CloseReason::Disconnect, String::new())
}

/// What lies under a door's bytes: nothing for a plain socket, TLS records for `tls` and `wss`.
pub(crate) trait Layer {
    /// The socket's bytes are the framing's bytes: decoded where they were read, no copy.
    const CLEAR: bool;

    /// Takes the whole records at the front of `raw`, appending their plaintext to `plain`
    /// and whatever the layer must answer (its handshake) to `wire`. `Ok(true)` once the
    /// peer closed the layer; a layer error closes the connection.
    fn open(&mut self, raw: &mut BytesMut, plain: &mut BytesMut, wire: &mut BytesMut) -> Result<bool, Close>;

    /// Appends `plain`, protected, to `wire`.
    fn seal(&mut self, plain: &[u8], wire: &mut BytesMut) -> Result<(), Close>;

    /// Appends the layer's own goodbye (TLS close_notify) to `wire`.
    fn finish(&mut self, wire: &mut BytesMut);

    /// Whether the layer's handshake is done.
    fn ready(&self) -> bool;
}

/// How a door's plaintext becomes frames and frames become plaintext.
pub(crate) trait Framing {
    /// What it decodes: with the layer, names the door (`door.rs`).
    const SPEAKS: Speaks;

    /// The next unit at the front of `src`, taken off it; `None` until one has arrived.
    /// Whatever the framing must answer by itself (a WebSocket pong, the upgrade's 101) is
    /// appended to `out`. An error closes the connection.
    fn decode(&mut self, src: &mut BytesMut, out: &mut BytesMut) -> Result<Option<Command>, Close>;

    /// Appends `frame` to `out` as this door sends it.
    fn encode(&mut self, frame: &Frame, out: &mut BytesMut);

    /// Appends a backend's push to `out`: a PUSH frame of its payload, or (MQTT) a PUBLISH
    /// on its topic.
    fn encode_push(&mut self, push: &Push, out: &mut BytesMut) {
        self.encode(&Frame::Push(push.payload.clone()), out);
    }

    /// Appends a PRESENCE frame a watcher is owed: as it is, or (MQTT) as a PUBLISH per
    /// entry on its uid's presence topic.
    fn encode_presence(&mut self, frame: &Frame, out: &mut BytesMut) {
        self.encode(frame, out);
    }

    /// The unit decoded last was taken by the protocol machine: appends what the door says
    /// to that (an MQTT PUBACK, once the DATA is in the event log).
    fn accepted(&mut self, _out: &mut BytesMut) {}

    /// The machine's outcome of an MQTT SUBSCRIBE, filter by filter, answered (with the
    /// rest the unit is owed) in [`Framing::accepted`].
    fn subscribed(&mut self, _granted: &[bool]) {}

    /// Appends a ping the client's network stack answers by itself, if the door has one
    /// (a WebSocket ping); nothing else.
    fn encode_ping(&mut self, _out: &mut BytesMut) {}

    /// The DATA of the unit decoded last is durable at `position`: an acknowledgement it is
    /// owed waits until [`Framing::release`] reaches it (0: durable already).
    fn logged(&mut self, _position: u64) {}

    /// Whether acknowledgements wait for their data to become durable.
    fn owes(&self) -> bool {
        false
    }

    /// Appends the acknowledgements whose data is durable through `through`.
    fn release(&mut self, _through: u64, _out: &mut BytesMut) {}

    /// The longest frame it accepts: the bound on unread replies derives from it.
    fn max_frame_bytes(&self) -> u32;

    /// Whether the framing's own handshake (the WebSocket upgrade) is done.
    fn ready(&self) -> bool;
}

/// The machine's replies, written as the door's framing writes them.
struct Encoded<'a, F> {
    framing: &'a mut F,
    out: &'a mut BytesMut,
}

impl<F: Framing> Out for Encoded<'_, F> {
    fn frame(&mut self, frame: &Frame) {
        self.framing.encode(frame, self.out);
    }

    fn pings(&self) -> bool {
        matches!(F::SPEAKS, Speaks::WebSocket)
    }

    fn logged(&mut self, position: u64) {
        self.framing.logged(position);
    }

    fn subscribed(&mut self, granted: &[bool]) {
        self.framing.subscribed(granted);
    }
}

/// A framed client socket; see the module documentation.
pub(crate) struct Connection<L, F> {
    stream: TcpStream,
    layer: L,
    framing: F,
    /// Bytes kept between reads, only while there are any.
    leftover: Option<Box<Leftover>>,
}

/// What a connection keeps between reads: a split frame's start, replies not yet taken.
/// Boxed and dropped once all are empty, so an idle connection keeps one pointer instead of
/// empty buffers (64 bytes in every open connection's task, which tokio rounds up to
/// 128-byte steps).
#[derive(Default)]
struct Leftover {
    /// The start of a frame (or, under TLS, of a record) split across reads.
    split: BytesMut,
    /// Under TLS: the start of a frame split across records.
    opened: BytesMut,
    /// Bytes the socket did not take yet.
    unsent: BytesMut,
}

/// The close of a client that left more than `max_queued` bytes unread.
fn slow(max_queued: usize) -> Close {
    (CloseReason::SlowConsumer, format!("more than {max_queued} bytes of replies unread"))
}

fn split(leftover: &mut Leftover) -> &mut BytesMut {
    &mut leftover.split
}

fn opened(leftover: &mut Leftover) -> &mut BytesMut {
    &mut leftover.opened
}

fn unsent(leftover: &mut Leftover) -> &mut BytesMut {
    &mut leftover.unsent
}

// === impl Connection ===

impl<L: Layer, F: Framing> Connection<L, F> {
    /// The door this connection came in by: known from its types, so no connection stores it.
    pub(crate) const TRANSPORT: Transport = Door::by(L::CLEAR, F::SPEAKS);

    pub(crate) fn new(stream: TcpStream, layer: L, framing: F) -> Self {
        Connection { stream, layer, framing, leftover: None }
    }

    /// Whether the door's handshakes (TLS, WebSocket upgrade) are done.
    pub(crate) fn handshaken(&self) -> bool {
        self.layer.ready() && self.framing.ready()
    }

    /// Resolves when the socket is readable, or writable while replies wait.
    ///
    /// Polled, not awaited through `TcpStream::ready`: that future keeps a waiter node of its
    /// own, while polling keeps the waker in the socket's registration, which has a slot for
    /// it already. Every open connection's task holds this future, and tokio rounds a task up
    /// in 128-byte steps (the `footprint` test in `drive.rs` guards the size; what polling
    /// saved is in docs/BENCHMARKS.md, "Figures behind the code").
    pub(crate) fn ready(&self) -> impl Future<Output = io::Result<Ready>> + '_ {
        std::future::poll_fn(move |cx| self.poll_ready(cx))
    }

    /// Polls for what [`Connection::ready`] resolves to.
    pub(crate) fn poll_ready(&self, cx: &mut std::task::Context<'_>) -> Poll<io::Result<Ready>> {
        if self.leftover.as_ref().is_some_and(|leftover| !leftover.unsent.is_empty()) {
            if let Poll::Ready(result) = self.stream.poll_write_ready(cx) {
                return Poll::Ready(result.map(|()| Ready::WRITABLE));
            }
        }
        self.stream.poll_read_ready(cx).map(|result| result.map(|()| Ready::READABLE))
    }

    /// Reads what arrived, hands every whole unit to `on_input` (which writes its replies
    /// to the [`Out`] it is given), and writes what the socket takes.
    pub(crate) fn on_ready(
        &mut self,
        ready: io::Result<Ready>,
        mut on_input: impl FnMut(Command, &mut dyn Out) -> Result<(), Close>,
    ) -> Result<(), Close> {
        let ready = ready.map_err(|_| disconnect())?;
        self.write_with(|conn, plain, wire| {
            if ready.is_readable() || ready.is_read_closed() {
                conn.read(plain, wire, &mut on_input)?;
            }
            Ok(())
        })
    }

    /// Queues `pushes`, then the PRESENCE frames a watcher is owed (`presence`), after the
    /// replies already waiting, and writes what the socket takes.
    pub(crate) fn send(&mut self, pushes: &[Push], presence: &[Frame]) -> Result<(), Close> {
        let max_queued = max_queued_bytes(self.framing.max_frame_bytes());
        self.write_with(|conn, plain, wire| {
            // Unsent replies stay under the bound, the outbox holds at most the bound of
            // encoded pushes, and a watcher is owed at most the bound of changes (past it, a
            // resync of its list): output past twice the bound is a client that does not
            // read, closed as a slow consumer; encoding the rest would only grow the buffer
            // about to be dropped.
            let lagging = |plain: &BytesMut, wire: &BytesMut| plain.len() + wire.len() > 2 * max_queued;
            for push in pushes {
                if lagging(plain, wire) {
                    return Err(slow(max_queued));
                }
                conn.framing.encode_push(push, plain);
            }
            for frame in presence {
                if lagging(plain, wire) {
                    return Err(slow(max_queued));
                }
                conn.framing.encode_presence(frame, plain);
            }
            Ok(())
        })
    }

    /// Writes the acknowledgements now due (see [`Framing::release`]).
    pub(crate) fn release(&mut self, through: u64) -> Result<(), Close> {
        if !self.framing.owes() {
            return Ok(());
        }
        self.write_with(|conn, plain, _| {
            conn.framing.release(through, plain);
            Ok(())
        })
    }

    /// Pings the client, if its door can (see [`Framing::encode_ping`]).
    pub(crate) fn ping(&mut self) -> Result<(), Close> {
        self.write_with(|conn, plain, _| {
            conn.framing.encode_ping(plain);
            Ok(())
        })
    }

    /// Sends `pushes` still queued, then `bye`, after the replies still waiting, within a
    /// deadline, and closes. Best effort: a client that does not read loses them, not our
    /// time.
    pub(crate) async fn close(mut self, pushes: &[Push], bye: Option<Frame>) {
        let mut out = self.take(unsent);
        // On a clear layer the frames are written where they are sent from, as replies are.
        let mut plain = BytesMut::new();
        let to = if L::CLEAR { &mut out } else { &mut plain };
        for push in pushes {
            self.framing.encode_push(push, to);
        }
        if let Some(bye) = bye {
            self.framing.encode(&bye, to);
        }
        if !L::CLEAR && self.layer.ready() {
            // A BYE the handshake never reached has nobody to read it: dropped.
            let _ = self.layer.seal(&plain, &mut out);
            self.layer.finish(&mut out);
        }
        write_corked(&self.stream, &mut out);
        let stream = &mut self.stream;
        let _ = timeout(BYE_WRITE_DEADLINE, async {
            stream.write_all_buf(&mut out).await?;
            stream.shutdown().await
        })
        .await;
    }

    /// Runs `f` with a plaintext buffer for frames and the wire buffer (the worker's, or the
    /// connection's own while bytes wait), seals the plaintext into the wire, flushes it,
    /// and keeps what the socket did not take, up to the bound. On a clear layer both are
    /// the one wire buffer's bytes: frames are written where they are sent from.
    fn write_with(
        &mut self,
        f: impl FnOnce(&mut Self, &mut BytesMut, &mut BytesMut) -> Result<(), Close>,
    ) -> Result<(), Close> {
        let mut out = self.take(unsent);
        let result = with_buffer(&WRITE_SCRATCH, &mut out, |wire| {
            if L::CLEAR {
                f(self, wire, &mut BytesMut::new())?;
            } else {
                SEAL_SCRATCH.with(|cell| {
                    let mut plain = cell.borrow_mut();
                    plain.clear();
                    // Replies made before an error still go out, sealed, ahead of the BYE.
                    let result = f(self, &mut plain, wire);
                    let sealed = if plain.is_empty() { Ok(()) } else { self.layer.seal(&plain, wire) };
                    plain.clear();
                    result.and(sealed)
                })?;
            }
            flush(&self.stream, wire)
        });
        let queued = out.len();
        self.keep(unsent, out);
        // Derived from the frame limit, not stored: every open connection would carry it.
        let max_queued = max_queued_bytes(self.framing.max_frame_bytes());
        if queued > max_queued {
            return Err(slow(max_queued));
        }
        result
    }

    /// One read from the socket, and every whole unit in it.
    fn read(
        &mut self,
        plain_out: &mut BytesMut,
        wire: &mut BytesMut,
        on_input: &mut impl FnMut(Command, &mut dyn Out) -> Result<(), Close>,
    ) -> Result<(), Close> {
        let mut start = self.take(split);
        let result = with_buffer(&READ_SCRATCH, &mut start, |buf| {
            // The worker's buffer takes a full chunk; a split frame's own buffer only grows by
            // a little, since the codec already reserved the rest of the frame it knows of.
            buf.reserve(if buf.is_empty() { READ_CHUNK } else { SPLIT_FRAME_READ });
            match read_draining(&self.stream, buf) {
                Ok(0) => Err(disconnect()),
                Ok(_) if L::CLEAR => self.decode_all(buf, plain_out, on_input),
                Ok(_) => {
                    let mut text = self.take(opened);
                    let result = with_buffer(&OPEN_SCRATCH, &mut text, |text| {
                        let peer_closed = self.layer.open(buf, text, wire)?;
                        self.decode_all(text, plain_out, on_input)?;
                        if peer_closed {
                            return Err(disconnect());
                        }
                        Ok(())
                    });
                    self.keep(opened, text);
                    result
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
                Err(_) => Err(disconnect()),
            }
        });
        self.keep(split, start);
        result
    }

    /// Hands every whole unit in `src` to `on_input`.
    fn decode_all(
        &mut self,
        src: &mut BytesMut,
        out: &mut BytesMut,
        on_input: &mut impl FnMut(Command, &mut dyn Out) -> Result<(), Close>,
    ) -> Result<(), Close> {
        while let Some(input) = self.framing.decode(src, out)? {
            on_input(input, &mut Encoded { framing: &mut self.framing, out })?;
            self.framing.accepted(out);
        }
        Ok(())
    }

    /// Takes one of the held buffers (empty if nothing is held).
    fn take(&mut self, which: fn(&mut Leftover) -> &mut BytesMut) -> BytesMut {
        self.leftover.as_deref_mut().map(|leftover| std::mem::take(which(leftover))).unwrap_or_default()
    }

    /// Puts one of the held buffers back; drops the box once all are empty.
    fn keep(&mut self, which: fn(&mut Leftover) -> &mut BytesMut, bytes: BytesMut) {
        if bytes.is_empty() && self.leftover.is_none() {
            return;
        }
        let leftover = self.leftover.get_or_insert_with(Box::default);
        *which(leftover) = bytes;
        if leftover.split.is_empty() && leftover.opened.is_empty() && leftover.unsent.is_empty() {
            self.leftover = None;
        }
    }
}

/// Reads what the socket holds into `buf`'s spare room. A read that did not fill the room
/// emptied the socket, so the socket's readiness is cleared with it: otherwise the next
/// wait would return at once and cost a read that finds nothing (a PING would take three
/// system calls instead of two).
///
/// Clearing is as safe as after a real `WouldBlock`: tokio clears only the readiness of the
/// event this read answered, so bytes that arrive after it raise a new one.
fn read_draining(stream: &TcpStream, buf: &mut BytesMut) -> io::Result<usize> {
    let room = buf.capacity() - buf.len();
    let mut got = None;
    let result = stream.try_io(Interest::READABLE, || {
        let n = stream.try_read_buf(buf)?;
        got = Some(n);
        if n > 0 && n < room {
            // Drained: reported to tokio as would-block, which clears the readiness.
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    });
    match (result, got) {
        (_, Some(n)) => Ok(n),
        (result, None) => result,
    }
}

/// Writes what the socket takes of `out` now, marked as more to come, so the FIN of the
/// shutdown that follows rides in the same segment as the last bytes: the client's kernel
/// takes a BYE and the close as one packet instead of two (`loadtest/close-cost.sh` counts
/// the segments; docs/BENCHMARKS.md has the figures). What the socket does not take is
/// left in `out` for the ordinary write, which sends it unmarked.
fn write_corked(stream: &TcpStream, out: &mut BytesMut) {
    #[cfg(target_os = "linux")]
    while !out.is_empty() {
        let sent =
            stream.try_io(Interest::WRITABLE, || socket2::SockRef::from(stream).send_with_flags(out, libc::MSG_MORE));
        match sent {
            Ok(n) if n > 0 => out.advance(n),
            _ => break,
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (stream, out);
}

/// Writes what the socket takes now, without waiting.
fn flush(stream: &TcpStream, out: &mut BytesMut) -> Result<(), Close> {
    while !out.is_empty() {
        match stream.try_write(out) {
            Ok(0) => return Err(disconnect()),
            Ok(n) => out.advance(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(_) => return Err(disconnect()),
        }
    }
    Ok(())
}

/// Runs `f` on the connection's own buffer `own` if it holds something, else on the worker's
/// scratch buffer in `key`. Whatever `f` leaves in the scratch is copied into `own`, sized to
/// fit, so the scratch goes back to the worker empty and an idle connection keeps no buffer.
fn with_buffer<R>(
    key: &'static LocalKey<RefCell<BytesMut>>,
    own: &mut BytesMut,
    f: impl FnOnce(&mut BytesMut) -> R,
) -> R {
    if !own.is_empty() {
        let result = f(own);
        if own.is_empty() {
            *own = BytesMut::new();
        }
        return result;
    }
    key.with(|cell| {
        let mut scratch = cell.borrow_mut();
        scratch.clear();
        let result = f(&mut scratch);
        if !scratch.is_empty() {
            *own = BytesMut::from(&scratch[..]);
            scratch.clear();
        }
        result
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        static TEST_SCRATCH: RefCell<BytesMut> = RefCell::new(BytesMut::new());
    }

    #[tokio::test]
    async fn an_idle_connection_holds_no_buffers() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let mut conn = Connection::new(stream, crate::transport::tcp::Plain, crate::proto::FrameCodec::new(1024));
        conn.keep(unsent, BytesMut::new());
        assert!(conn.leftover.is_none(), "nothing to hold, nothing allocated");
        conn.keep(split, BytesMut::from(&b"half a frame"[..]));
        conn.keep(unsent, BytesMut::from(&b"a reply"[..]));
        assert_eq!(&conn.take(split)[..], b"half a frame");
        conn.keep(split, BytesMut::new());
        assert!(conn.leftover.is_some(), "the reply is still held");
        assert_eq!(&conn.take(unsent)[..], b"a reply");
        conn.keep(unsent, BytesMut::new());
        assert!(conn.leftover.is_none(), "both empty: the box is freed");
    }

    #[test]
    fn with_buffer_keeps_only_leftovers_and_sizes_them_to_fit() {
        let mut own = BytesMut::new();
        with_buffer(&TEST_SCRATCH, &mut own, |buf| {
            buf.reserve(READ_CHUNK);
            buf.extend_from_slice(b"whole frame");
            buf.advance(5);
        });
        assert_eq!(&own[..], b" frame");
        assert!(own.capacity() < 64, "leftover copied to a right-sized buffer: {}", own.capacity());
        TEST_SCRATCH.with(|s| assert!(s.borrow().is_empty() && s.borrow().capacity() >= READ_CHUNK - 11));

        // A connection with leftovers uses its own buffer, and gives it up once empty.
        with_buffer(&TEST_SCRATCH, &mut own, |buf| buf.advance(6));
        assert_eq!(own.capacity(), 0);
    }
}

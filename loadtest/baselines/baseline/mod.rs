//! The comparison servers' shared body: idlegate's protocol and codec with the same small
//! buffers, and idle detection either absent (the floor) or done the idiomatic tokio way, one
//! `Sleep` per connection reset on every frame. Only what differs from idlegate is the idle
//! detection, so the benchmark compares exactly that.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::BytesMut;
use futures_util::StreamExt;
use idlegate_proto::{CloseReason, Frame, FrameCodec};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{sleep, Instant};
use tokio_util::codec::FramedRead;

/// Same initial read buffer as idlegate's connections.
const READ_BUFFER: usize = 256;

/// Serves clients on `listen` forever; with `idle`, a client silent that long gets
/// BYE(idle_timeout).
pub async fn serve(listen: SocketAddr, idle: Option<Duration>) -> std::io::Result<()> {
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    let socket = if listen.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(listen)?;
    let listener: TcpListener = socket.listen(4096)?;
    eprintln!("serving on {listen}, idle timeout {idle:?}");
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let _ = stream.set_nodelay(true);
                tokio::spawn(connection(stream, idle));
            }
            Err(e) => {
                eprintln!("accept: {e}");
                sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

async fn connection(mut stream: TcpStream, idle: Option<Duration>) {
    let (read_half, mut write_half) = stream.split();
    let mut codec = FrameCodec::default();
    let mut frames = FramedRead::with_capacity(read_half, codec, READ_BUFFER);
    let mut out = BytesMut::new();
    // One timer per connection, reset on every frame: the idiomatic tokio idle timeout. The
    // floor has none at all, not even an unpolled one.
    let mut timer = idle.map(|d| Box::pin(sleep(d)));
    let timeout_ms = idle.map_or(0, |d| d.as_millis() as u32);
    loop {
        tokio::select! {
            _ = async { timer.as_mut().expect("guarded by the branch condition").await }, if timer.is_some() => {
                let _ = codec.encode(&Frame::Bye { reason: CloseReason::IdleTimeout, text: String::new() }, &mut out);
                let _ = tokio::time::timeout(Duration::from_secs(1), write_half.write_all_buf(&mut out)).await;
                return;
            }
            written = write_half.write_buf(&mut out), if !out.is_empty() => {
                if !matches!(written, Ok(n) if n > 0) {
                    return;
                }
            }
            frame = frames.next() => {
                let reply = match frame {
                    Some(Ok(Frame::Login { .. })) => Some(Frame::Welcome { timeout_ms, tick_ms: 0, session: String::new() }),
                    Some(Ok(Frame::Ping(payload))) => Some(Frame::Pong(payload)),
                    Some(Ok(Frame::Data(_))) => None,
                    _ => return,
                };
                if let (Some(timer), Some(d)) = (timer.as_mut(), idle) {
                    timer.as_mut().reset(Instant::now() + d);
                }
                if let Some(reply) = reply {
                    let _ = codec.encode(&reply, &mut out);
                }
            }
        }
    }
}

/// Parses `--listen ADDR` and `--timeout DURATION` from the command line.
pub fn args(default_timeout: Option<Duration>) -> (SocketAddr, Option<Duration>) {
    let mut listen: SocketAddr = "127.0.0.1:7070".parse().expect("valid default");
    let mut timeout = default_timeout;
    let mut argv = std::env::args().skip(1);
    while let Some(flag) = argv.next() {
        let value = argv.next().unwrap_or_else(|| usage(&format!("{flag} needs a value")));
        match flag.as_str() {
            "--listen" => listen = value.parse().unwrap_or_else(|e| usage(&format!("--listen: {e}"))),
            "--timeout" if default_timeout.is_some() => {
                timeout = Some(humantime::parse_duration(&value).unwrap_or_else(|e| usage(&format!("--timeout: {e}"))))
            }
            other => usage(&format!("unknown flag {other}")),
        }
    }
    (listen, timeout)
}

fn usage(message: &str) -> ! {
    eprintln!("error: {message}\nusage: [--listen ADDR] [--timeout DURATION]");
    std::process::exit(2);
}

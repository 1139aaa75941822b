//! The WebSocket door's own framing code (`src/transport/ws/`) serving an echo: every text
//! and binary message comes back as it came. Pings are answered, closes too, and bad frames
//! get the door's close codes, within the same size limit. This is the server the Autobahn
//! suite's fuzzing client tests (`tests/autobahn.rs`).
//!
//! ```sh
//! cargo run --release --example ws_echo -- --listen 127.0.0.1:9001 [--max-message-bytes 16777216]
//! ```
//!
//! The upgrade is the door's: path `/v1/ws`.

use std::net::SocketAddr;

use bytes::BytesMut;
use clap::Parser;
use idlegate::conformance::EchoFraming;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The door's default `--max-frame-bytes`.
const DEFAULT_MAX_MESSAGE_BYTES: u32 = 64 * 1024;

/// Most the flag may raise the limit to: the Autobahn suite's largest messages.
const MAX_MESSAGE_BYTES: u32 = 16 * 1024 * 1024;

/// Bytes one read asks for.
const READ_CHUNK: usize = 64 * 1024;

#[derive(Parser)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:9001")]
    listen: SocketAddr,
    /// Longest message accepted (the door's --max-frame-bytes), at most 16 MiB.
    #[arg(long, default_value_t = DEFAULT_MAX_MESSAGE_BYTES)]
    max_message_bytes: u32,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.max_message_bytes <= MAX_MESSAGE_BYTES, "--max-message-bytes: at most {MAX_MESSAGE_BYTES}");
    let listener = TcpListener::bind(args.listen).await?;
    println!("ws_echo listening on ws://{}/v1/ws", listener.local_addr()?);
    loop {
        let (stream, _) = listener.accept().await?;
        tokio::spawn(serve(stream, args.max_message_bytes));
    }
}

/// One connection: read, answer, until either side ends it.
async fn serve(mut stream: TcpStream, max: u32) {
    let _ = stream.set_nodelay(true);
    let mut framing = EchoFraming::new(max);
    let (mut src, mut out) = (BytesMut::new(), BytesMut::new());
    loop {
        src.reserve(READ_CHUNK);
        match stream.read_buf(&mut src).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let result = framing.read(&mut src, &mut out);
        if stream.write_all(&out).await.is_err() {
            return;
        }
        out.clear();
        if result.is_err() {
            // The close went out: the server closes the TCP connection first (RFC 6455 §7.1.1).
            let _ = stream.shutdown().await;
            return;
        }
    }
}

//! The idiomatic tokio alternative: idlegate's protocol with one reusable `Sleep` per
//! connection, reset on every frame. What most Rust servers do; the benchmark sets it beside
//! the ring.
//!
//! `cargo run --release --example per_connection_timer -- --listen 127.0.0.1:7070 --timeout 30s`

mod baseline;

use std::time::Duration;

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let (listen, timeout) = baseline::args(Some(Duration::from_secs(30)));
    baseline::serve(listen, timeout).await
}

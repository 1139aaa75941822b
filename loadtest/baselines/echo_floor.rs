//! The floor: idlegate's protocol and codec with no idle detection at all. What any gateway
//! pays for sockets and framing; idlegate's cost above it is the cost of the ring.
//!
//! `cargo run --release --example echo_floor -- --listen 127.0.0.1:7070`

mod baseline;

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let (listen, _) = baseline::args(None);
    baseline::serve(listen, None).await
}

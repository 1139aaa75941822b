//! How fast the webhook relay delivers, and what it costs: a gateway process (the binary
//! given) relays to a receiver in this process that acknowledges every request at once.
//! The receiver first holds deliveries back (503) while CLIENTS clients log in and out,
//! so the log holds 4 events per client. Then it acknowledges, and the run times how long
//! the relay takes to deliver them all. It also reads the gateway's CPU time over that
//! span from /proc. Each round prints `round events seconds events_per_second
//! cpu_us_per_event`.
//!
//! ```sh
//! cargo build --release && cargo run --release --example webhook_throughput -- target/release/idlegate [clients] [rounds] [batch]
//! ```

#[path = "support/mod.rs"]
mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use futures_util::{SinkExt, StreamExt};
use idlegate_proto::{Frame, FrameCodec};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::codec::Framed;

use support::{free_port, secret_dir, serve_receiver, webhook_gateway, Gateway};

/// What the receiver counts.
#[derive(Default)]
struct Receiver {
    open: AtomicBool,
    events: AtomicU64,
}

async fn receive(State(receiver): State<Arc<Receiver>>, body: Bytes) -> StatusCode {
    if !receiver.open.load(Ordering::Acquire) {
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    let parsed: serde_json::Value = serde_json::from_slice(&body).expect("a JSON body");
    let n = parsed["events"].as_array().map_or(0, Vec::len) as u64;
    receiver.events.fetch_add(n, Ordering::AcqRel);
    StatusCode::NO_CONTENT
}

/// The gateway's user and system CPU time so far, in microseconds (/proc/<pid>/stat).
fn cpu_us(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit(") ").next().unwrap_or("").split_whitespace().collect();
    let ticks: u64 = fields.get(11).and_then(|f| f.parse().ok()).unwrap_or(0)
        + fields.get(12).and_then(|f| f.parse().ok()).unwrap_or(0);
    // USER_HZ is 100 on Linux.
    ticks * 10_000
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let binary = args.first().cloned().unwrap_or_else(|| "target/release/idlegate".into());
    let clients: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(5_000);
    let rounds: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(3);
    let batch: usize = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(100);

    let receiver = Arc::new(Receiver::default());
    let hook = serve_receiver(Router::new().route("/hook", post(receive)).with_state(receiver.clone())).await?;
    let dir = secret_dir()?;
    println!("# examples/webhook_throughput.rs {binary} {clients} {rounds} {batch}");
    println!("# round events seconds events_per_second gateway_cpu_us_per_event");
    for round in 1..=rounds {
        // A fresh port each round: the last round's connections may still hold its own.
        let door: SocketAddr = format!("127.0.0.1:{}", free_port()).parse()?;
        let child = webhook_gateway(binary.as_ref(), door, clients, hook, &dir)
            .args(["--timeout", "60s"])
            .args(["--webhook-batch", &batch.to_string(), "--webhook-max-backoff", "100ms"])
            .spawn()?;
        let gateway = Gateway(child);
        for _ in 0..100 {
            if TcpStream::connect(door).await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        receiver.open.store(false, Ordering::Release);
        receiver.events.store(0, Ordering::Release);
        // Each client logs in, then out: online, user_online, offline, user_offline.
        let mut sessions = Vec::with_capacity(clients);
        for uid in 1..=clients as u64 {
            let mut framed = Framed::new(TcpStream::connect(door).await?, FrameCodec::default());
            framed
                .send(Frame::Login { uid, token: Default::default(), device: Default::default(), timeout_ms: None })
                .await?;
            sessions.push(framed);
        }
        for framed in &mut sessions {
            framed.next().await; // WELCOME
            framed.send(Frame::Logout).await?;
        }
        for framed in &mut sessions {
            while framed.next().await.is_some() {}
        }
        drop(sessions);
        // What the relay delivers: the `start` and every event of every client.
        let expected = 1 + 4 * clients as u64;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (cpu_before, started) = (cpu_us(gateway.0.id()), Instant::now());
        receiver.open.store(true, Ordering::Release);
        while receiver.events.load(Ordering::Acquire) < expected {
            anyhow::ensure!(started.elapsed() < Duration::from_secs(120), "not delivered in 2 minutes");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let seconds = started.elapsed().as_secs_f64();
        let cpu = cpu_us(gateway.0.id()).saturating_sub(cpu_before);
        let rate = expected as f64 / seconds;
        println!("{round} {expected} {seconds:.3} {rate:.0} {:.2}", cpu as f64 / expected as f64);
        drop(gateway);
    }
    Ok(())
}

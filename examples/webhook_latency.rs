//! From a client's silence to the webhook receiver holding its `offline`: a gateway process
//! (the binary given) with `--timeout` 10s relays to a receiver in this process; CLIENTS
//! clients log in, spread evenly over one timeout so every tick expires its share, and then
//! say nothing. For each client the run takes the time from sending its LOGIN (the last
//! frame the gateway heard: its silence begins no earlier) to the receiver getting its
//! `offline`, and prints how far past the timeout that was: the ring's part is at most 0
//! (a uid goes offline after more than timeout - tick of silence and at most timeout), so
//! anything above 0 is the sweep, the event log and the relay.
//!
//! Prints a summary (`# ...` lines with percentiles) and, with `--raw`, one line per client:
//! `uid silence_to_offline_ms beyond_timeout_ms`.
//!
//! ```sh
//! cargo build --release && cargo run --release --example webhook_latency -- target/release/idlegate [clients] [--raw]
//! ```

#[path = "support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use futures_util::SinkExt;
use idlegate_proto::{Frame, FrameCodec};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::codec::Framed;

use support::{free_port, secret_dir, serve_receiver, webhook_gateway, Gateway};

/// The gateway's timeout and tick: short, so a run takes seconds, and a tick as by default.
const TIMEOUT: Duration = Duration::from_secs(10);
const TICK: &str = "1s";

/// When each uid's `offline` reached the receiver.
#[derive(Default)]
struct Receiver {
    offline_at: Mutex<HashMap<u64, Instant>>,
}

async fn receive(State(receiver): State<Arc<Receiver>>, body: Bytes) -> StatusCode {
    let now = Instant::now();
    let parsed: serde_json::Value = serde_json::from_slice(&body).expect("a JSON body");
    let mut offline_at = receiver.offline_at.lock().unwrap();
    for event in parsed["events"].as_array().into_iter().flatten() {
        if event["type"] == "offline" {
            if let Some(uid) = event["uid"].as_u64() {
                offline_at.entry(uid).or_insert(now);
            }
        }
    }
    StatusCode::NO_CONTENT
}

fn percentile(sorted: &[i64], p: f64) -> i64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let binary = args.first().cloned().unwrap_or_else(|| "target/release/idlegate".into());
    let clients: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(19_000);
    let raw = args.iter().any(|a| a == "--raw");

    let receiver = Arc::new(Receiver::default());
    let hook = serve_receiver(Router::new().route("/hook", post(receive)).with_state(receiver.clone())).await?;
    let dir = secret_dir()?;
    let door: SocketAddr = format!("127.0.0.1:{}", free_port()).parse()?;
    let timeout = format!("{}s", TIMEOUT.as_secs());
    let gateway = Gateway(
        webhook_gateway(binary.as_ref(), door, clients, hook, &dir)
            .args(["--timeout", &timeout, "--tick", TICK])
            .spawn()?,
    );
    for _ in 0..100 {
        if TcpStream::connect(door).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("# examples/webhook_latency.rs {binary} {clients}: --timeout {timeout} --tick {TICK}, webhook defaults");

    // Logins spread over one timeout; each client's silence starts when its LOGIN is sent.
    let started = Instant::now();
    let mut silent_from = HashMap::with_capacity(clients as usize);
    let mut held = Vec::with_capacity(clients as usize);
    for uid in 1..=clients {
        tokio::time::sleep_until(started + TIMEOUT.mul_f64((uid - 1) as f64 / clients as f64)).await;
        let mut framed = Framed::new(TcpStream::connect(door).await?, FrameCodec::default());
        silent_from.insert(uid, Instant::now());
        framed
            .send(Frame::Login { uid, token: Default::default(), device: Default::default(), timeout_ms: None })
            .await?;
        held.push(framed);
    }
    // Every client goes offline within a timeout of its LOGIN; then the stragglers.
    let deadline = Instant::now() + TIMEOUT + Duration::from_secs(20);
    while receiver.offline_at.lock().unwrap().len() < clients as usize {
        anyhow::ensure!(Instant::now() < deadline, "not every offline arrived");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(held);
    drop(gateway);

    let offline_at = receiver.offline_at.lock().unwrap();
    let mut beyond: Vec<i64> = Vec::with_capacity(clients as usize);
    let mut lines = Vec::new();
    for uid in 1..=clients {
        let silence = offline_at[&uid].duration_since(silent_from[&uid]);
        let over = silence.as_millis() as i64 - TIMEOUT.as_millis() as i64;
        beyond.push(over);
        if raw {
            lines.push(format!("{uid} {} {over}", silence.as_millis()));
        }
    }
    beyond.sort_unstable();
    println!(
        "# beyond the timeout, ms: min {} p50 {} p90 {} p99 {} max {}",
        beyond[0],
        percentile(&beyond, 0.5),
        percentile(&beyond, 0.9),
        percentile(&beyond, 0.99),
        beyond[beyond.len() - 1]
    );
    let within_100 = beyond.iter().filter(|&&ms| ms < 100).count();
    println!("# offline at the receiver within the timeout plus 100 ms: {within_100} of {clients}");
    for line in lines {
        println!("{line}");
    }
    Ok(())
}

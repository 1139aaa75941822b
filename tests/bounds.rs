//! What the gateway holds, bounded whatever a client or a consumer does: measured on the
//! gateway as a process of its own (its resident memory), with real sockets on loopback.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::process::GatewayProcess;
use common::*;
use idlegate_proto::Frame;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const MIB: u64 = 1024 * 1024;

/// Consumers that open `/v1/events` from the start of a log full of large DATA events and
/// never read hold about one chunk each (1 MiB), not a thousand events each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_that_never_reads_holds_about_a_mib() {
    // The flood of DATA below is the point: no rate limit.
    let gw = GatewayProcess::start(&["--max-data-rate", "0"]).await;
    let mut client = Client::connect(gw.listen).await;
    assert!(matches!(client.login(1).await, Frame::Welcome { .. }));
    let payload = Bytes::from(vec![b'p'; 60_000]);
    for _ in 0..1_100 {
        client.send(Frame::Data(payload.clone())).await;
    }
    client.ping(b"all in").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = gw.rss();
    let mut consumers = Vec::new();
    for _ in 0..3 {
        let mut s = TcpStream::connect(gw.api).await.unwrap();
        s.write_all(b"GET /v1/events?after=0-0 HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        consumers.push(s);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let grown = gw.rss().saturating_sub(before);
    println!("three stalled consumers: rss {} MiB before, grown by {:.1} MiB", before / MIB, grown as f64 / MIB as f64);
    // Three chunks of about 1 MiB, the socket buffers the kernel does not count as ours,
    // and allocator slack; before the bound each consumer held about 85 MB.
    assert!(grown < 16 * MIB, "three stalled consumers grew the gateway by {} MiB", grown / MIB);
    // The gateway serves on: a fourth consumer that reads gets the first events.
    let (status, mut sse) = Sse::open(gw.api, "/v1/events?after=0-0", &[]).await;
    assert_eq!(status, 200);
    let mut first = sse.next().await.unwrap();
    if first.event == "gap" {
        // `after=0-0` predates this process: told as a gap, then the log from its start.
        first = sse.next().await.unwrap();
    }
    assert_eq!(first.event, "online");
}

/// `GET path` answered within a second, the promise under a flood.
async fn answers_within_a_second(addr: std::net::SocketAddr, path: &str) {
    let started = tokio::time::Instant::now();
    let answer = tokio::time::timeout(Duration::from_secs(1), http_get(addr, path)).await;
    assert!(matches!(answer, Ok((200, _))), "{path} on {addr}: {answer:?} after {:?}", started.elapsed());
    println!("under the flood: {path} answered 200 in {:?}", started.elapsed());
}

/// A thousand idle sockets on each HTTP port, and sockets trickling a request head a byte
/// a second, cannot keep liveness probes, scrapes or the API out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_slow_sockets_cannot_lock_the_http_listeners_out() {
    let gw = GatewayProcess::start(&[]).await;
    let mut idle = Vec::new();
    for addr in [gw.admin, gw.api] {
        for _ in 0..1_000 {
            idle.push(TcpStream::connect(addr).await.unwrap());
        }
    }
    // Slowloris: a request head that never ends, a byte a second, on both ports.
    let stop = tokio_util::sync::CancellationToken::new();
    for addr in [gw.admin, gw.api] {
        for _ in 0..100 {
            let stop = stop.clone();
            tokio::spawn(async move {
                let Ok(mut s) = TcpStream::connect(addr).await else { return };
                for byte in b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ".iter().cycle() {
                    if stop.is_cancelled() || s.write_all(&[*byte]).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            });
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    for _ in 0..5 {
        answers_within_a_second(gw.admin, "/healthz").await;
        answers_within_a_second(gw.admin, "/readyz").await;
        answers_within_a_second(gw.admin, "/metrics").await;
        answers_within_a_second(gw.api, "/v1/online").await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    stop.cancel();
}

/// `count` connections to `addr` from the source address `source`, which never send a byte.
async fn idle_from(source: &str, addr: std::net::SocketAddr, count: usize) -> Vec<TcpStream> {
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
        out.push(socket.connect(addr).await.unwrap());
    }
    out
}

/// One address holding 5,000 sockets that never log in cannot keep clients from another
/// address out: past `--max-pending-logins-per-ip` its own are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_of_idle_sockets_cannot_lock_other_clients_out() {
    let gw = GatewayProcess::start(&["--login-timeout", "60s"]).await;
    let _idle = idle_from("127.0.0.2", gw.listen, 5_000).await;
    let started = tokio::time::Instant::now();
    for uid in 0..200 {
        let mut c = Client::connect(gw.listen).await;
        assert!(matches!(c.login(uid).await, Frame::Welcome { .. }), "uid {uid}");
    }
    println!(
        "5,000 idle sockets from 127.0.0.2: 200 of 200 clients from 127.0.0.1 logged in, in {:?}",
        started.elapsed()
    );
    answers_within_a_second(gw.admin, "/healthz").await;
}

/// With the per-address bound lifted, a full table of waiting logins sheds its oldest, not
/// the newcomer: a flood renewed faster than the login timeout still cannot shut the door.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_pending_table_sheds_its_oldest_connection() {
    let gw = GatewayProcess::start(&["--login-timeout", "60s", "--max-pending-logins-per-ip", "100000"]).await;
    let mut idle = idle_from("127.0.0.2", gw.listen, 5_000).await;
    for uid in 0..200 {
        let mut c = Client::connect(gw.listen).await;
        assert!(matches!(c.login(uid).await, Frame::Welcome { .. }), "uid {uid}");
    }
    // The very first idle socket was shed with a retry hint.
    let mut oldest = Client::from_stream(idle.swap_remove(0));
    let text = oldest.expect_bye(idlegate_proto::CloseReason::ServerFull).await;
    assert!(text.contains("retry_after_ms="), "{text}");
}

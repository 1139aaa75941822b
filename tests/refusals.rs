//! Connections refused at accept (no room, too many from one address): each door's client
//! is told in its own words, and a refused client that keeps writing cannot hold the accept
//! loop. Real clients where one shows it: Debian's `mosquitto_sub`.

mod common;

use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use idlegate::Config;
use idlegate_proto::{retry_hint, CloseReason, Frame};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::process::Command;

fn config(max_connections: usize) -> Config {
    Config {
        timeout: Duration::from_secs(9),
        tick: Duration::from_millis(100),
        login_timeout: Duration::from_secs(30),
        max_connections,
        ..Config::default()
    }
}

async fn connect_from(source: &str, addr: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    socket.connect(addr).await.unwrap()
}

/// A gateway with room for one connection, and the logged-in client that takes it.
async fn full() -> (TestServer, Client) {
    let server = TestServer::start(config(1)).await;
    let mut held = server.client().await;
    assert!(matches!(held.login(1).await, Frame::Welcome { .. }));
    (server, held)
}

/// Everything the gateway sends until it closes.
async fn read_to_close(stream: &mut TcpStream) -> Vec<u8> {
    let mut all = Vec::new();
    let _ = tokio::time::timeout(PATIENCE, stream.read_to_end(&mut all)).await.expect("the gateway closes");
    all
}

/// A client refused for its address that writes without pause (a thread with a blocking
/// socket, far faster than any reader) must not keep the door from accepting others: the
/// refusal reads a bounded amount and closes, which the writer sees as an error. Before
/// the bound the refusal read until the writer stopped by itself.
///
/// On a current-thread runtime, so the writers connect and write while the gateway's accept
/// loop cannot run (the test thread sleeps): their bytes are there when they are accepted.
#[tokio::test]
async fn a_refused_client_that_keeps_writing_does_not_hold_the_accept_loop() {
    /// How long a writer writes if nobody closes its connection.
    const WRITING: Duration = Duration::from_secs(20);
    let mut server = TestServer::start(Config { max_pending_logins_per_ip: 1, ..config(1_000) }).await;
    let _waiting = connect_from("127.0.0.1", server.addr).await;
    tokio::task::yield_now().await;
    let writers: Vec<_> = (0..2)
        .map(|_| {
            let addr = server.addr;
            std::thread::spawn(move || {
                let mut socket = std::net::TcpStream::connect(addr).unwrap();
                let chunk = vec![0u8; 64 * 1024];
                let until = tokio::time::Instant::now() + WRITING;
                while tokio::time::Instant::now() < until {
                    if socket.write(&chunk).is_err() {
                        return "closed by the gateway";
                    }
                }
                "never closed while it wrote"
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    // Another address logs in meanwhile.
    let mut other = Client::from_stream(connect_from("127.0.0.3", server.addr).await);
    assert!(matches!(other.login(5).await, Frame::Welcome { .. }));
    for writer in writers {
        assert_eq!(writer.join().unwrap(), "closed by the gateway");
    }
    server.shutdown().await;
}

/// A WebSocket client refused at accept reads HTTP 503 with `Retry-After`, the retry hint
/// in whole seconds rounded up.
#[tokio::test]
async fn the_websocket_door_refuses_with_503_and_retry_after() {
    let (mut server, _held) = full().await;
    let mut ws = TcpStream::connect(server.ws).await.unwrap();
    let request = "GET /v1/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                   Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";
    ws.write_all(request.as_bytes()).await.unwrap();
    let answer = String::from_utf8(read_to_close(&mut ws).await).unwrap();
    assert!(answer.starts_with("HTTP/1.1 503 "), "{answer}");
    let after: u64 = answer
        .lines()
        .find_map(|l| l.strip_prefix("Retry-After: "))
        .unwrap_or_else(|| panic!("no Retry-After in {answer}"))
        .trim()
        .parse()
        .unwrap();
    let (_, body) = answer.split_once("\r\n\r\n").unwrap();
    let hint = retry_hint(body).expect("the body carries the hint");
    assert_eq!(after, hint.div_ceil(1000), "{answer}");
    assert!((1..=3).contains(&after), "{answer}");
    server.shutdown().await;
}

/// An MQTT client refused at accept reads the CONNACK of its version: 3.1.1's 0x03, MQTT
/// 5's 0x89 with the retry hint as Reason String; never the idlegate protocol's BYE. Raw
/// CONNECTs, then Debian's mosquitto_sub, which reported "Unrecognised command 0" before.
#[tokio::test]
async fn the_mqtt_door_refuses_with_each_version_s_connack() {
    let (mut server, mut held) = full().await;
    // MQTT 3.1.1: CONNECT with client id "a", keepalive 5.
    let v311 = [0x10, 13, 0, 4, b'M', b'Q', b'T', b'T', 4, 0x02, 0, 5, 0, 1, b'a'];
    let mut c = TcpStream::connect(server.mqtt).await.unwrap();
    c.write_all(&v311).await.unwrap();
    assert_eq!(read_to_close(&mut c).await, [0x20, 2, 0, 0x03]);
    // MQTT 5, its CONNECT sent in two parts, the level in the second.
    let v5 = [0x10, 14, 0, 4, b'M', b'Q', b'T', b'T', 5, 0x02, 0, 5, 0, 0, 1, b'a'];
    let mut c = TcpStream::connect(server.mqtt).await.unwrap();
    c.write_all(&v5[..6]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    c.write_all(&v5[6..]).await.unwrap();
    let connack = read_to_close(&mut c).await;
    assert_eq!(&connack[..2], &[0x20, connack.len() as u8 - 2], "{connack:02x?}");
    assert_eq!(&connack[2..4], &[0, 0x89], "Server busy: {connack:02x?}");
    let text = String::from_utf8_lossy(&connack[4..]);
    assert!(text.contains("retry_after_ms="), "the hint as Reason String: {text}");
    if find_on_path(&["mosquitto_sub"]).is_none() {
        skip_without("mosquitto_sub", "apt-get install mosquitto-clients");
        return;
    }
    for (version, says) in [("mqttv311", "broker unavailable"), ("mqttv5", "server busy")] {
        let port = server.mqtt.port().to_string();
        let out = Command::new("mosquitto_sub")
            .args(["-h", "127.0.0.1", "-p", &port, "-u", "2", "-k", "5", "-t", "t", "-V", version, "-C", "1"])
            .output();
        let out = tokio::time::timeout(PATIENCE, out).await.expect("mosquitto_sub ends").unwrap();
        let said = String::from_utf8_lossy(&out.stderr).to_lowercase();
        assert!(!out.status.success(), "{version}: refused");
        assert!(said.contains(says), "{version}: {said}");
    }
    held.send(Frame::Logout).await;
    held.expect_bye(CloseReason::Logout).await;
    server.shutdown().await;
}

//! The PROXY protocol behind a real HAProxy (Debian's `haproxy`): clients connect to HAProxy
//! from their own loopback addresses, and HAProxy connects to the gateway from 127.0.0.3,
//! the one balancer the gateway trusts, with a version 2 header on the TCP door and a
//! version 1 header on the WebSocket door. The gateway must see each client's own address
//! in its events and presence entries and bound waiting logins per client, not per
//! balancer; a header from an untrusted HAProxy, a trusted address with no header, and a
//! malformed header are refused and counted, while everyone else stays served.

mod common;

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::ws::DoorClient;
use common::{sample, skip_without, wait_listening, Client, Sse, TestServer, PATIENCE};
use idlegate::{Config, ProxyProtocol};
use idlegate_proto::{CloseReason, Frame, Transport};
use tokio::net::{TcpSocket, TcpStream};

/// The balancer's address, the one `--proxy-protocol-from` names.
const BALANCER: &str = "127.0.0.3";

/// An HAProxy that is not trusted: its headers must be refused.
const STRANGER: &str = "127.0.0.5";

/// HAProxy in the foreground, killed with the test.
struct Haproxy {
    child: Child,
    _dir: tempfile::TempDir,
    /// Its frontends: to the TCP door (v2), to the WebSocket door (v1), and to the TCP door
    /// from the untrusted source (v2).
    tcp: SocketAddr,
    ws: SocketAddr,
    untrusted: SocketAddr,
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts HAProxy in front of `server`'s TCP and WebSocket doors; `None` (skipped, outside
/// CI) when it is not installed.
async fn haproxy(server: &TestServer) -> Option<Haproxy> {
    let installed = std::path::Path::new("/usr/sbin/haproxy");
    let Some(binary) =
        common::find_on_path(&["haproxy"]).or_else(|| installed.is_file().then(|| installed.to_path_buf()))
    else {
        skip_without("haproxy", "apt-get install haproxy");
        return None;
    };
    let dir = tempfile::tempdir().unwrap();
    let (tcp, ws, untrusted) = (common::free_addr(), common::free_addr(), common::free_addr());
    // The configuration docs/DEPLOY.md shows (leastconn, long client and server timeouts,
    // the /readyz health check on the admin port), with test addresses.
    let config = format!(
        "global\n  maxconn 1000\n\
         defaults\n  mode tcp\n  timeout connect 5s\n  timeout client 1h\n  timeout server 1h\n\
         frontend idlegate_tcp\n  bind {tcp}\n  default_backend gateways_tcp\n\
         backend gateways_tcp\n  balance leastconn\n  option httpchk GET /readyz\n\
         \x20 server gw1 {gw_tcp} send-proxy-v2 source {BALANCER} check port {admin_port}\n\
         frontend idlegate_ws\n  bind {ws}\n  default_backend gateways_ws\n\
         backend gateways_ws\n  server gw1 {gw_ws} send-proxy source {BALANCER}\n\
         frontend stranger\n  bind {untrusted}\n  default_backend from_stranger\n\
         backend from_stranger\n  retries 0\n  server gw1 {gw_tcp} send-proxy-v2 source {STRANGER}\n",
        gw_tcp = server.addr,
        gw_ws = server.ws,
        admin_port = server.admin.port(),
    );
    let path = dir.path().join("haproxy.cfg");
    std::fs::write(&path, config).unwrap();
    let check = Command::new(&binary).arg("-c").arg("-f").arg(&path).output().unwrap();
    assert!(check.status.success(), "haproxy -c: {}", String::from_utf8_lossy(&check.stderr));
    let child = Command::new(&binary)
        .arg("-db")
        .arg("-f")
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let haproxy = Haproxy { child, _dir: dir, tcp, ws, untrusted };
    for addr in [tcp, ws, untrusted] {
        wait_listening(addr).await;
    }
    Some(haproxy)
}

fn config(per_ip: usize) -> Config {
    Config {
        proxy_protocol: Some(ProxyProtocol::parse(BALANCER).unwrap()),
        max_pending_logins_per_ip: per_ip,
        // Connections that wait in silence are never timed out within a test.
        login_timeout: Duration::from_secs(120),
        ..Config::default()
    }
}

/// A connection to `to` from the loopback address `from`.
async fn connect_from(from: &str, to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    socket.connect(to).await.unwrap()
}

/// The `session` entries of `uid`'s presence answer.
async fn presence_sessions(server: &TestServer, uid: u64) -> Vec<serde_json::Value> {
    let (status, body) = common::http_get(server.api, &format!("/v1/presence/{uid}")).await;
    assert_eq!(status, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    answer["sessions"].as_array().unwrap().clone()
}

/// The next `online` event of `uid`, past the user events.
async fn online_of(events: &mut Sse, uid: u64) -> serde_json::Value {
    loop {
        let event = tokio::time::timeout(PATIENCE, events.next()).await.expect("an event in time").expect("open");
        if event.event == "online" && event.data["uid"] == uid {
            return event.data;
        }
    }
}

async fn metric(server: &TestServer, series: &str) -> f64 {
    let (_, body) = server.admin_get("/metrics").await;
    sample(&body, series).unwrap_or(0.0)
}

#[tokio::test]
async fn clients_behind_haproxy_are_seen_at_their_own_addresses() {
    let mut server = TestServer::start(config(64)).await;
    let Some(haproxy) = haproxy(&server).await else { return };
    let (_, mut events) = Sse::open(server.api, "/v1/events", &[]).await;

    // The TCP door, through a version 2 header.
    let stream = connect_from("127.0.0.2", haproxy.tcp).await;
    let client_addr = stream.local_addr().unwrap().to_string();
    let mut client = Client::from_stream(stream);
    assert!(matches!(client.login(1).await, Frame::Welcome { .. }));
    let online = online_of(&mut events, 1).await;
    assert_eq!(online["door"], "tcp", "{online}");
    assert_eq!(online["remote"], client_addr.as_str(), "{online}");
    let sessions = presence_sessions(&server, 1).await;
    assert_eq!(sessions[0]["door"], "tcp");
    assert_eq!(sessions[0]["remote"], client_addr.as_str());

    // The WebSocket door, through a version 1 header.
    let stream = connect_from("127.0.0.4", haproxy.ws).await;
    let ws_addr = stream.local_addr().unwrap().to_string();
    let mut ws = DoorClient::over(Transport::Ws, Box::new(stream), haproxy.ws).await;
    ws.login(2).await;
    let online = online_of(&mut events, 2).await;
    assert_eq!(online["door"], "ws", "{online}");
    assert_eq!(online["remote"], ws_addr.as_str(), "{online}");
    assert_eq!(presence_sessions(&server, 2).await[0]["remote"], ws_addr.as_str());

    // A client that connects directly, with no header, is itself.
    let mut direct = Client::connect(server.addr).await;
    let direct_addr = direct.stream.local_addr().unwrap().to_string();
    assert!(matches!(direct.login(3).await, Frame::Welcome { .. }));
    assert_eq!(online_of(&mut events, 3).await["remote"], direct_addr.as_str());
    client.ping(b"still here").await;
    drop(haproxy);
    server.shutdown().await;
}

#[tokio::test]
async fn the_per_address_bound_counts_clients_not_the_balancer() {
    let mut server = TestServer::start(config(2)).await;
    let Some(haproxy) = haproxy(&server).await else { return };
    // Three connections from 127.0.0.2 through the balancer, sending nothing: whichever
    // header is read last finds two of its address waiting, and is refused at once. The
    // other two wait in silence (the login timeout is long).
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(Client::from_stream(connect_from("127.0.0.2", haproxy.tcp).await));
    }
    let first = futures_util::future::select_all(clients.iter_mut().map(|c| Box::pin(c.recv())));
    let (answer, refused, _) = tokio::time::timeout(PATIENCE, first).await.expect("one is refused");
    match answer {
        Some(Frame::Bye { reason: CloseReason::ServerFull, text }) => {
            assert!(text.contains("2 connections from this address waiting to log in"), "{text}");
        }
        other => panic!("expected BYE(server_full), got {other:?}"),
    }
    clients.remove(refused);
    // ...while a client at another address, through the same balancer, logs in.
    let mut other = Client::from_stream(connect_from("127.0.0.4", haproxy.tcp).await);
    assert!(matches!(other.login(7).await, Frame::Welcome { .. }));
    // And the waiting ones still can.
    for (uid, client) in (8..).zip(&mut clients) {
        assert!(matches!(client.login(uid).await, Frame::Welcome { .. }));
    }
    drop(haproxy);
    server.shutdown().await;
}

#[tokio::test]
async fn untrusted_missing_and_malformed_headers_close_the_connection() {
    let mut server = TestServer::start(config(64)).await;
    let Some(haproxy) = haproxy(&server).await else { return };
    let mut bystander = Client::from_stream(connect_from("127.0.0.2", haproxy.tcp).await);
    assert!(matches!(bystander.login(1).await, Frame::Welcome { .. }));
    // (waiting for HAProxy to listen made it connect once from each frontend already)
    let series = |why: &str| format!(r#"idlegate_proxy_protocol_refused_total{{door="tcp",why="{why}"}}"#);
    let mut before = Vec::new();
    for why in ["untrusted", "missing", "malformed"] {
        before.push(metric(&server, &series(why)).await);
    }

    // A real HAProxy's header, from an address the gateway does not trust.
    let mut from_stranger = Client::from_stream(connect_from("127.0.0.6", haproxy.untrusted).await);
    from_stranger.send(Frame::Login { uid: 2, token: bytes::Bytes::new(), device: Default::default() }).await;
    assert_eq!(from_stranger.recv().await, None, "a header from an untrusted address is never believed");

    // The trusted balancer's address with no header.
    let mut missing = Client::from_stream(connect_from(BALANCER, server.addr).await);
    missing.send(Frame::Login { uid: 3, token: bytes::Bytes::new(), device: Default::default() }).await;
    assert_eq!(missing.recv().await, None);

    // A header that does not parse.
    let mut malformed = Client::from_stream(connect_from(BALANCER, server.addr).await);
    malformed.send_raw(b"PROXY TCP4 300.1.2.3 127.0.0.1 1 2\r\n").await;
    assert_eq!(malformed.recv().await, None);

    for (why, before) in ["untrusted", "missing", "malformed"].into_iter().zip(before) {
        assert_eq!(metric(&server, &series(why)).await, before + 1.0, "{}", series(why));
    }
    bystander.ping(b"still served").await;
    drop(haproxy);
    server.shutdown().await;
}

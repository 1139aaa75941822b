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
    from_stranger
        .send(Frame::Login { uid: 2, token: bytes::Bytes::new(), device: Default::default(), timeout_ms: None })
        .await;
    assert_eq!(from_stranger.recv().await, None, "a header from an untrusted address is never believed");

    // The trusted balancer's address with no header.
    let mut missing = Client::from_stream(connect_from(BALANCER, server.addr).await);
    missing
        .send(Frame::Login { uid: 3, token: bytes::Bytes::new(), device: Default::default(), timeout_ms: None })
        .await;
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

/// Issue 48, defect 4: waiting for the header escaped both pending-login bounds. 300 idle
/// sockets from one untrusted address filled `--max-connections 300`, and a client from
/// another address got `server_full`. Now the wait counts: anyone but the balancer against
/// `--max-pending-logins-per-ip` under its own address, a balancer's connection against
/// `--max-pending-logins`, where the oldest waiting is shed for a newer one.
#[tokio::test]
async fn waiting_for_the_header_counts_against_the_pending_login_bounds() {
    let mut server = TestServer::start(Config { max_connections: 40, max_pending_logins: 30, ..config(5) }).await;
    // A flood of silent sockets from an untrusted address: past its five, each is refused.
    let mut flood = Vec::new();
    for _ in 0..40 {
        flood.push(Client::from_stream(connect_from("127.0.0.1", server.addr).await));
    }
    let mut refused = 0;
    for client in flood.iter_mut().skip(5) {
        match client.recv().await {
            Some(Frame::Bye { reason: CloseReason::ServerFull, text }) => {
                assert!(text.contains("5 connections from this address waiting to log in"), "{text}");
                refused += 1;
            }
            other => panic!("expected BYE(server_full), got {other:?}"),
        }
    }
    assert_eq!(refused, 35);
    // Another address still gets in.
    let mut other = Client::from_stream(connect_from("127.0.0.2", server.addr).await);
    assert!(matches!(other.login(1).await, Frame::Welcome { .. }));

    // The balancer's silent connections: 30 wait in all (the flood's five among them), so
    // the oldest waiting is shed to make room for each newer one.
    let mut silent = Vec::new();
    for _ in 0..26 {
        silent.push(Client::from_stream(connect_from(BALANCER, server.addr).await));
    }
    match flood[0].recv().await {
        Some(Frame::Bye { reason: CloseReason::ServerFull, text }) => assert!(text.contains("shed"), "{text}"),
        other => panic!("the oldest waiting is shed: {other:?}"),
    }
    assert!(metric(&server, r#"idlegate_connections_shed_total{why="pending_logins"}"#).await >= 36.0);
    other.ping(b"still served").await;
    server.shutdown().await;
}

/// Issue 48, defect 5: a partial signature was polled every 5 ms until the login timeout
/// (1,000 sockets that each sent `P` cost 73 % of a core), and a malformed version 1
/// header waited for the whole login timeout, counted as a timeout. Now waiting is driven
/// by readiness: a header that arrives in pieces is read as it comes, and one that cannot
/// be a header any more is refused at once, counted as malformed.
#[tokio::test]
async fn a_header_in_pieces_is_read_as_it_comes_and_a_malformed_one_is_refused_at_once() {
    let mut server = TestServer::start(config(64)).await;
    let malformed = r#"idlegate_proxy_protocol_refused_total{door="tcp",why="malformed"}"#;
    let timeouts = r#"idlegate_proxy_protocol_refused_total{door="tcp",why="timeout"}"#;
    // A header byte by byte, then the LOGIN: seen at the header's address.
    let mut pieces = Client::from_stream(connect_from(BALANCER, server.addr).await);
    for byte in b"PROXY TCP4 10.9.8.7 127.0.0.1 4242 7070\r\n" {
        pieces.send_raw(&[*byte]).await;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(matches!(pieces.login(5).await, Frame::Welcome { .. }));
    assert_eq!(presence_sessions(&server, 5).await[0]["remote"], "10.9.8.7:4242");

    // Headers that stop being headers: each refused long before the 120 s login timeout,
    // as malformed, or as missing when its first bytes already were none.
    let missing = r#"idlegate_proxy_protocol_refused_total{door="tcp",why="missing"}"#;
    let missing_before = metric(&server, missing).await;
    // Malformed: the first four (the last two in pieces that began like a signature);
    // missing: the last, whose first bytes were none.
    let cases: [&[&[u8]]; 5] =
        [&[b"PROXY garbage\r\n"], &[b"PROXY TCP4 1.2.3.4\r\n"], &[b"PR", b"X"], &[b"\r\n\r\n", b"X"], &[b"PRX"]];
    for pieces in cases {
        let mut client = Client::from_stream(connect_from(BALANCER, server.addr).await);
        for piece in pieces {
            client.send_raw(piece).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(client.recv().await, None, "{pieces:?}");
    }
    // A version 1 header past its 107 bytes without its end.
    let mut long = Client::from_stream(connect_from(BALANCER, server.addr).await);
    long.send_raw(format!("PROXY TCP4 {}", "1".repeat(120)).as_bytes()).await;
    assert_eq!(long.recv().await, None);
    assert_eq!(metric(&server, malformed).await, 5.0);
    assert_eq!(metric(&server, missing).await, missing_before + 1.0);
    assert_eq!(metric(&server, timeouts).await, 0.0);

    // Silent partial signatures cost nothing while they wait: the process's CPU time over a
    // second with 200 of them stays far below the polling's (a wakeup per socket every
    // 5 ms). Measured with the kernel's own count, not a clock.
    let mut partial = Vec::new();
    for _ in 0..200 {
        let mut client = Client::from_stream(connect_from(BALANCER, server.addr).await);
        client.send_raw(b"P").await;
        partial.push(client);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = cpu_seconds();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let used = cpu_seconds() - before;
    eprintln!("CPU with 200 partial headers waiting: {used:.3} s in 1 s");
    assert!(used < 0.2, "{used:.3} s of CPU in 1 s: the wait is polled");
    pieces.ping(b"still served").await;
    server.shutdown().await;
}

/// This process's user and system CPU time, in seconds (`/proc/self/stat`).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let fields: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split(' ').collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

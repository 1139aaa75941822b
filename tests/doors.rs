//! Every door over real sockets on 127.0.0.1:0: plain TCP, TLS, WebSocket and WebSocket in
//! TLS serve the same protocol (login, PING, DATA, push, kick, expiry, shutdown, each BYE),
//! with the WebSocket rules on top (close codes, pings as activity, upgrade refusals) and
//! the login deadline covering every handshake. TLS certificates come from a test CA that
//! `openssl` makes; without openssl the TLS doors are skipped (never under CI).

mod common;

use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use common::tls::{doors, server_with};
use common::ws::{DoorClient, Got};
use common::{http, short_config, Sse, TestServer, PATIENCE};
use idlegate::Config;
use idlegate_proto::{CloseReason, Frame, Transport, BYE_CLOSE_BASE};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;

fn is_ws(transport: Transport) -> bool {
    matches!(transport, Transport::Ws | Transport::Wss)
}

/// Reads the BYE with `reason` and, on a WebSocket door, the close frame that follows it.
async fn expect_bye(client: &mut DoorClient, transport: Transport, reason: CloseReason) {
    match client.recv().await {
        Got::Frame(Frame::Bye { reason: got, .. }) => assert_eq!(got, reason, "{transport}"),
        other => panic!("{transport}: expected BYE({reason}), got {other:?}"),
    }
    if is_ws(transport) {
        let code = BYE_CLOSE_BASE + u16::from(reason.wire_code().unwrap());
        assert_eq!(client.recv().await, Got::Close(code, reason.label().into()), "{transport}");
    }
}

fn long_login() -> Config {
    // Handshakes on a loaded CI machine take more than the short config's half second.
    Config { login_timeout: Duration::from_secs(5), ..short_config() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_door_logs_in_pings_sends_data_receives_a_push_and_is_kicked() {
    let (mut server, ca, _dir) = server_with(Config { timeout: Duration::from_secs(30), ..long_login() }).await;
    let (status, mut events) = Sse::open(server.api, "/v1/events", &[]).await;
    assert_eq!(status, 200);
    for (i, (transport, addr)) in doors(&server).into_iter().enumerate() {
        let uid = 100 + i as u64;
        let mut client = DoorClient::connect(transport, addr, ca.as_ref()).await;
        client.login(uid).await;
        events.expect("online", uid).await;
        events.expect("user_online", uid).await;

        client.send(Frame::Ping(Bytes::from_static(b"hb"))).await;
        assert_eq!(client.recv().await, Got::Frame(Frame::Pong(Bytes::from_static(b"hb"))), "{transport}");

        client.send(Frame::Data(Bytes::from_static(b"reading=7"))).await;
        let data = events.expect("data", uid).await;
        let payload = base64::engine::general_purpose::STANDARD.encode(b"reading=7");
        assert_eq!(data.data["payload"], payload.as_str(), "{transport}");

        let body =
            serde_json::json!({"uids": [uid], "payload": base64::engine::general_purpose::STANDARD.encode(b"hi")});
        let (status, answer) = http(server.api, "POST", "/v1/push", &[], &body.to_string()).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(client.recv().await, Got::Frame(Frame::Push(Bytes::from_static(b"hi"))), "{transport}");

        let (status, _) = http(server.api, "DELETE", &format!("/v1/sessions/{uid}"), &[], "").await;
        assert_eq!(status, 204);
        expect_bye(&mut client, transport, CloseReason::Kicked).await;
        events.expect("offline", uid).await;
        events.expect("user_offline", uid).await;
        if transport.has_handshake() {
            assert_eq!(server.metrics.handshakes(transport, "ok"), 1, "{transport}");
        }
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silence_expires_on_every_door_and_a_browser_sees_close_4001() {
    let (mut server, ca, _dir) = server_with(long_login()).await;
    let mut clients = Vec::new();
    for (i, (transport, addr)) in doors(&server).into_iter().enumerate() {
        let mut client = DoorClient::connect(transport, addr, ca.as_ref()).await;
        client.login(200 + i as u64).await;
        clients.push((transport, client));
    }
    for (transport, client) in &mut clients {
        expect_bye(client, *transport, CloseReason::IdleTimeout).await;
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_says_bye_shutdown_on_every_door() {
    let (mut server, ca, _dir) = server_with(Config { timeout: Duration::from_secs(30), ..long_login() }).await;
    let mut clients = Vec::new();
    for (i, (transport, addr)) in doors(&server).into_iter().enumerate() {
        let mut client = DoorClient::connect(transport, addr, ca.as_ref()).await;
        client.login(300 + i as u64).await;
        clients.push((transport, client));
    }
    let stop = tokio::spawn(async move {
        server.shutdown().await;
        server
    });
    for (transport, client) in &mut clients {
        expect_bye(client, *transport, CloseReason::Shutdown).await;
    }
    let server = stop.await.unwrap();
    for transport in Transport::ALL {
        assert_eq!(server.metrics.open_on(transport), 0, "{transport}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_pings_are_answered_and_count_as_activity() {
    let (mut server, ca, _dir) = server_with(long_login()).await;
    let timeout = short_config().timeout;
    for (transport, addr) in doors(&server).into_iter().filter(|(t, _)| is_ws(*t)) {
        let mut client = DoorClient::connect(transport, addr, ca.as_ref()).await;
        client.login(400).await;
        // Only WebSocket pings, for three timeouts: never expired.
        let until = tokio::time::Instant::now() + timeout * 3;
        while tokio::time::Instant::now() < until {
            client.send_ws(Message::Ping(b"still here".to_vec())).await;
            tokio::time::sleep(timeout / 4).await;
        }
        let (status, body) = http(server.api, "GET", "/v1/presence/400", &[], "").await;
        assert_eq!(status, 200);
        assert!(body.contains("\"online\":true"), "{transport}: {body}");
        // Then silence, the gateway's own pings unanswered (the client does not read):
        // expired as any client.
        tokio::time::sleep(timeout * 2).await;
        expect_bye(&mut client, transport, CloseReason::IdleTimeout).await;
    }
    server.shutdown().await;
}

/// A WebSocket client written by hand, for what a well-behaved client never sends.
struct RawWs {
    stream: TcpStream,
}

impl RawWs {
    /// Sends an upgrade request for `path` with `headers`; returns the status and, on 101,
    /// the socket.
    async fn upgrade(addr: std::net::SocketAddr, path: &str, headers: &[&str]) -> (u16, String, RawWs) {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let mut request = format!("GET {path} HTTP/1.1\r\nHost: gw\r\n");
        for h in headers {
            request.push_str(h);
            request.push_str("\r\n");
        }
        request.push_str("\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut byte = [0u8; 1];
            let n = tokio::time::timeout(PATIENCE, stream.read(&mut byte)).await.unwrap().unwrap();
            if n == 0 {
                break;
            }
            head.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&head).into_owned();
        let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        (status, head, RawWs { stream })
    }

    async fn websocket(addr: std::net::SocketAddr) -> RawWs {
        let (status, head, ws) = RawWs::upgrade(addr, "/v1/ws", &UPGRADE).await;
        assert_eq!(status, 101, "{head}");
        assert!(head.contains("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo="), "{head}");
        ws
    }

    /// Everything the gateway sends until it closes: (opcode, payload) per frame.
    async fn frames_until_closed(&mut self) -> Vec<(u8, Vec<u8>)> {
        let mut raw = Vec::new();
        tokio::time::timeout(PATIENCE, self.stream.read_to_end(&mut raw)).await.unwrap().unwrap();
        let mut frames = Vec::new();
        let mut at = 0;
        while at + 2 <= raw.len() {
            let (opcode, len7) = (raw[at] & 0x0f, raw[at + 1] & 0x7f);
            assert_eq!(raw[at + 1] & 0x80, 0, "server frames are never masked");
            let (len, header) = match len7 {
                126 => (u16::from_be_bytes([raw[at + 2], raw[at + 3]]) as usize, 4),
                n => (n as usize, 2),
            };
            frames.push((opcode, raw[at + header..at + header + len].to_vec()));
            at += header + len;
        }
        frames
    }
}

/// The upgrade headers of RFC 6455's example.
const UPGRADE: [&str; 4] = [
    "Upgrade: websocket",
    "Connection: Upgrade",
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
    "Sec-WebSocket-Version: 13",
];

/// A masked client frame.
fn masked(first_byte: u8, payload: &[u8]) -> Vec<u8> {
    let mask = [1u8, 2, 3, 4];
    let mut out = vec![first_byte];
    if payload.len() < 126 {
        out.push(0x80 | payload.len() as u8);
    } else {
        out.push(0x80 | 126);
        out.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    }
    out.extend_from_slice(&mask);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    out
}

/// The close code of a close frame's payload.
fn close_code(frame: &(u8, Vec<u8>)) -> u16 {
    assert_eq!(frame.0, 0x8, "a close frame: {frame:?}");
    u16::from_be_bytes([frame.1[0], frame.1[1]])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_upgrades_are_refused_with_the_right_status() {
    let config = Config { ws_allowed_origins: Some(vec!["https://app.example".into()]), ..long_login() };
    let mut server = TestServer::start(config).await;
    let (status, head, _) = RawWs::upgrade(server.ws, "/elsewhere", &UPGRADE).await;
    assert_eq!(status, 404, "{head}");
    let (status, head, _) = RawWs::upgrade(server.ws, "/v1/ws", &[]).await;
    assert_eq!(status, 426, "a plain GET: {head}");
    assert!(head.contains("Upgrade: websocket"), "{head}");
    let with_origin = |origin: &'static str| {
        let mut headers = UPGRADE.to_vec();
        headers.push(origin);
        headers
    };
    let (status, head, _) = RawWs::upgrade(server.ws, "/v1/ws", &with_origin("Origin: https://evil.example")).await;
    assert_eq!(status, 403, "{head}");
    let (status, head, _) = RawWs::upgrade(server.ws, "/v1/ws", &with_origin("Origin: https://APP.example")).await;
    assert_eq!(status, 101, "an allowed origin: {head}");
    let (status, head, _) = RawWs::upgrade(server.ws, "/v1/ws", &UPGRADE).await;
    assert_eq!(status, 101, "no Origin (not a browser) is allowed: {head}");
    assert_eq!(server.metrics.handshakes(Transport::Ws, "error"), 3);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_websocket_messages_get_their_bye_and_close_code_while_others_are_served() {
    let mut server = TestServer::start(Config { max_frame_bytes: 1024, ..long_login() }).await;
    let mut bystander = DoorClient::connect(Transport::Ws, server.ws, None).await;
    bystander.login(1).await;
    let bye = |frames: &[(u8, Vec<u8>)]| {
        let (opcode, body) = &frames[0];
        assert_eq!(*opcode, 0x2, "the BYE is a binary message: {frames:?}");
        Frame::parse(Bytes::from(body.clone())).unwrap()
    };
    let cases: [(&str, Vec<u8>, u16); 5] = [
        ("a text message", masked(0x81, b"hello"), 1003),
        ("a message over --max-frame-bytes", masked(0x82, &[0x03; 2000])[..8].to_vec(), 1009),
        ("an unmasked frame", vec![0x82, 0x02, 0x03, 0x00], 4004),
        ("a binary message that is no frame", masked(0x82, &[0x7f, 1, 2]), 4004),
        ("reserved bits", masked(0xc2, &[0x03]), 4004),
    ];
    for (what, bytes, code) in cases {
        let mut ws = RawWs::websocket(server.ws).await;
        ws.stream.write_all(&masked(0x82, &[0x01, 0, 0, 0, 0, 0, 0, 0, 9, b't'])).await.unwrap();
        ws.stream.write_all(&bytes).await.unwrap();
        let frames = ws.frames_until_closed().await;
        assert!(frames.len() >= 3, "{what}: WELCOME, BYE, close: {frames:?}");
        assert!(matches!(Frame::parse(Bytes::from(frames[0].1.clone())), Ok(Frame::Welcome { .. })), "{what}");
        match bye(&frames[1..]) {
            Frame::Bye { reason, .. } => assert_eq!(reason, CloseReason::ProtocolError, "{what}"),
            other => panic!("{what}: {other:?}"),
        }
        assert_eq!(close_code(&frames[2]), code, "{what}");
    }
    // The bystander was served all along.
    bystander.send(Frame::Ping(Bytes::from_static(b"ok"))).await;
    assert_eq!(bystander.recv().await, Got::Frame(Frame::Pong(Bytes::from_static(b"ok"))));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fragmented_login_and_a_client_close_are_handled() {
    let mut server = TestServer::start(long_login()).await;
    let mut ws = RawWs::websocket(server.ws).await;
    let login = [0x01, 0, 0, 0, 0, 0, 0, 0, 5, b't'];
    // LOGIN in three fragments with a ping between them.
    let mut bytes = masked(0x02, &login[..3]);
    bytes.extend(masked(0x89, b"p"));
    bytes.extend(masked(0x00, &login[3..7]));
    bytes.extend(masked(0x80, &login[7..]));
    // Then the client closes with 1000.
    bytes.extend(masked(0x88, &1000u16.to_be_bytes()));
    ws.stream.write_all(&bytes).await.unwrap();
    let frames = ws.frames_until_closed().await;
    assert_eq!(frames[0], (0xA, b"p".to_vec()), "the ping's pong");
    assert!(matches!(Frame::parse(Bytes::from(frames[1].1.clone())), Ok(Frame::Welcome { .. })));
    assert_eq!(close_code(&frames[2]), 1000, "the client's close echoed");
    assert_eq!(frames.len(), 3, "nothing after the close: {frames:?}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_login_deadline_covers_every_handshake() {
    let config = Config { login_timeout: Duration::from_millis(300), ..short_config() };
    let (mut server, _ca, _dir) = server_with(config).await;
    for (transport, addr) in doors(&server).into_iter().filter(|(t, _)| t.has_handshake()) {
        // Connected, and then nothing: no ClientHello, no upgrade request.
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let mut rest = Vec::new();
        tokio::time::timeout(PATIENCE, stream.read_to_end(&mut rest)).await.unwrap().unwrap();
        if transport == Transport::Ws {
            let text = String::from_utf8_lossy(&rest);
            assert!(text.starts_with("HTTP/1.1 408"), "{text}");
        }
        assert_eq!(server.metrics.handshakes(transport, "timeout"), 1, "{transport}");
        assert_eq!(server.metrics.closed_count(CloseReason::LoginTimeout) as usize, 1 + doors_done(transport));
    }
    server.shutdown().await;
}

/// The handshake doors tested before `transport` in `the_login_deadline_covers_every_handshake`.
fn doors_done(transport: Transport) -> usize {
    [Transport::Ws, Transport::Tls, Transport::Wss].iter().position(|t| *t == transport).unwrap()
}

/// The bytes of the example row `row` of docs/PROTOCOL.md.
fn documented(row: &str) -> Vec<u8> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/PROTOCOL.md")).unwrap();
    let line = doc.lines().find(|l| l.starts_with(row)).unwrap_or_else(|| panic!("no example row {row}"));
    let hex: String = line[row.len()..].chars().filter(|c| c.is_ascii_hexdigit()).collect();
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect()
}

impl RawWs {
    /// Exactly `n` bytes from the gateway.
    async fn read(&mut self, n: usize) -> Vec<u8> {
        let mut bytes = vec![0; n];
        tokio::time::timeout(PATIENCE, self.stream.read_exact(&mut bytes)).await.unwrap().unwrap();
        bytes
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_websocket_examples_in_protocol_md_are_what_the_gateway_sends() {
    let config = Config { timeout: Duration::from_secs(30), tick: Duration::from_secs(1), ..long_login() };
    let mut server = TestServer::start(config).await;
    let mut ws = RawWs::websocket(server.ws).await;
    ws.stream.write_all(&documented("| client: LOGIN uid 42, no token |")).await.unwrap();
    // The documented bytes, then the session id: 16 hex digits of its own.
    let welcome = documented("| gateway: WELCOME 30000 ms / 1000 ms, then the 16 digits of the session id |");
    let got = ws.read(welcome.len() + 16).await;
    assert_eq!(got[..welcome.len()], welcome);
    assert!(got[welcome.len()..].iter().all(|b| b.is_ascii_hexdigit()), "{got:?}");
    ws.stream.write_all(&documented("| client: PING with payload `hi` |")).await.unwrap();
    let pong = documented("| gateway: PONG with payload `hi` |");
    assert_eq!(ws.read(pong.len()).await, pong);
    let (status, _) = http(server.api, "DELETE", "/v1/sessions/42", &[], "").await;
    assert_eq!(status, 204);
    let kicked = documented("| gateway: BYE kicked, then close 4003 `kicked` |");
    assert_eq!(ws.frames_until_closed().await.concat_bytes(), kicked);
    server.shutdown().await;

    // The idle one on a gateway with a short timeout: everything after its WELCOME.
    let mut server = TestServer::start(long_login()).await;
    let mut ws = RawWs::websocket(server.ws).await;
    ws.stream.write_all(&documented("| client: LOGIN uid 42, no token |")).await.unwrap();
    let frames = ws.frames_until_closed().await;
    let idle = documented("| gateway: BYE idle_timeout, then close 4001 `idle_timeout` |");
    // Before it, the gateway's pings this client never answered (PROTOCOL.md says so).
    let (pings, rest): (Vec<_>, Vec<_>) = frames[1..].iter().cloned().partition(|(opcode, _)| *opcode == 0x9);
    assert!(!pings.is_empty(), "a silent WebSocket session is pinged");
    assert_eq!(rest.concat_bytes(), idle);
    server.shutdown().await;
}

/// Frames back to their bytes (all shorter than 126).
trait ConcatBytes {
    fn concat_bytes(&self) -> Vec<u8>;
}

impl ConcatBytes for Vec<(u8, Vec<u8>)> {
    fn concat_bytes(&self) -> Vec<u8> {
        self.iter().flat_map(|(op, p)| [vec![0x80 | op, p.len() as u8], p.clone()].concat()).collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_is_closed_as_slow_consumer_on_every_door() {
    let (mut server, ca, _dir) = server_with(Config { timeout: Duration::from_secs(30), ..long_login() }).await;
    let mut bystander = server.client().await;
    bystander.login(1).await;
    for (i, (transport, addr)) in doors(&server).into_iter().enumerate() {
        let mut slow = DoorClient::connect(transport, addr, ca.as_ref()).await;
        slow.login(600 + i as u64).await;
        // Large PINGs, never reading a PONG: the socket buffers fill, then the gateway's
        // bounded queue of replies (ciphertext under TLS), and it gives up on the client.
        let writer = tokio::spawn(async move {
            let big = Bytes::from(vec![7u8; 60_000]);
            for _ in 0..2_000 {
                if !slow.try_send(Frame::Ping(big.clone())).await {
                    break;
                }
            }
        });
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while server.metrics.closed_count(CloseReason::SlowConsumer) as usize <= i || !writer.is_finished() {
            assert!(tokio::time::Instant::now() < deadline, "{transport}: the slow consumer was never closed");
            bystander.ping(b"alive").await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        writer.await.unwrap();
    }
    bystander.ping(b"still alive").await;
    assert_eq!(server.metrics.online_users.get(), 1);
    server.shutdown().await;
}

/// Relays `from` to `to` one byte per write, so every record and frame arrives in pieces.
async fn trickle(mut from: tokio::net::tcp::OwnedReadHalf, mut to: tokio::net::tcp::OwnedWriteHalf) {
    let mut byte = [0u8; 1];
    while let Ok(1) = from.read(&mut byte).await {
        if to.write_all(&byte).await.is_err() {
            return;
        }
        tokio::task::yield_now().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_records_split_across_reads_and_frames_split_across_records_are_put_back_together() {
    let (mut server, ca, _dir) = server_with(long_login()).await;
    let (Some(ca), Some(door)) = (ca, server.tls) else { return };
    // A relay that hands the gateway the client's bytes one at a time.
    let relay = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let relay_addr = relay.local_addr().unwrap();
    tokio::spawn(async move {
        let (client, _) = relay.accept().await.unwrap();
        let gateway = TcpStream::connect(door).await.unwrap();
        gateway.set_nodelay(true).unwrap();
        let (client_read, client_write) = client.into_split();
        let (gateway_read, gateway_write) = gateway.into_split();
        tokio::spawn(trickle(client_read, gateway_write));
        let mut gateway_read = gateway_read;
        let mut client_write = client_write;
        let _ = tokio::io::copy(&mut gateway_read, &mut client_write).await;
    });
    let mut tls = ca.connect(relay_addr, &[idlegate_proto::TLS_ALPN]).await.expect("handshake through the relay");
    // LOGIN in two TLS records: the frame's first 5 bytes, then the rest.
    let mut login = bytes::BytesMut::new();
    tokio_util::codec::Encoder::encode(
        &mut idlegate_proto::FrameCodec::default(),
        Frame::Login { uid: 77, token: Bytes::from_static(b"t"), device: Default::default(), timeout_ms: None },
        &mut login,
    )
    .unwrap();
    tls.write_all(&login[..5]).await.unwrap();
    tls.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    tls.write_all(&login[5..]).await.unwrap();
    tls.flush().await.unwrap();
    let mut framed = tokio_util::codec::Framed::new(tls, idlegate_proto::FrameCodec::default());
    let welcome = tokio::time::timeout(PATIENCE, futures_util::StreamExt::next(&mut framed)).await.unwrap();
    assert!(matches!(welcome, Some(Ok(Frame::Welcome { .. }))), "{welcome:?}");
    futures_util::SinkExt::send(&mut framed, Frame::Ping(Bytes::from_static(b"slow"))).await.unwrap();
    let pong = tokio::time::timeout(PATIENCE, futures_util::StreamExt::next(&mut framed)).await.unwrap();
    assert!(matches!(pong, Some(Ok(Frame::Pong(ref p))) if p.as_ref() == b"slow"), "{pong:?}");
    server.shutdown().await;
}

/// A WebSocket client whose page code sends nothing (a browser tab in the background, whose
/// timers run once a minute) stays online: the gateway pings a WebSocket session silent for
/// more than a third of the timeout, the client's WebSocket stack answers with a pong, and
/// the pong is activity. Before, it expired in the window.
#[tokio::test]
async fn a_silent_websocket_client_whose_stack_answers_pings_stays_online() {
    use futures_util::{SinkExt, StreamExt};
    // short_config: timeout 600 ms, tick 100 ms: pinged after 300 ms of silence.
    let mut server = TestServer::start(short_config()).await;
    let url = format!("ws://{}{}", server.ws, idlegate_proto::WS_PATH);
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    let mut login = bytes::BytesMut::new();
    Frame::Login { uid: 77, token: bytes::Bytes::new(), device: Default::default(), timeout_ms: None }
        .encode(&mut login);
    ws.send(Message::Binary(login.to_vec())).await.unwrap();
    assert!(matches!(ws.next().await, Some(Ok(Message::Binary(_)))), "a WELCOME");
    // Five timeouts in which the client only reads (tungstenite answers each ping).
    let mut pings = 0;
    let until = tokio::time::Instant::now() + Duration::from_secs(3);
    while let Ok(message) = tokio::time::timeout_at(until, ws.next()).await {
        match message {
            Some(Ok(Message::Ping(_))) => pings += 1,
            other => panic!("expected pings only, got {other:?}"),
        }
    }
    assert!(pings >= 4, "{pings} pings in five timeouts");
    let (_, presence) = http(server.api, "GET", "/v1/presence/77", &[], "").await;
    assert!(presence.contains(r#""online":true"#), "{presence}");
    ws.close(None).await.unwrap();
    server.shutdown().await;
}

/// Issue 50: the timeout classes at their edges, on every door. A LOGIN asking for less
/// than `--min-timeout` gets it, one asking for a class exactly gets it, one just above gets
/// the next, one above `--max-timeout` gets that; a session of the shortest class then
/// expires on each door without WebSocket pings while one of the longest, as silent, stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_door_grants_the_timeout_classes_at_their_edges() {
    // short_config's timeout 600 ms and tick 100 ms: classes of 300, 600, 1,000 and 3,000 ms.
    let config = Config {
        min_timeout: Some(Duration::from_millis(300)),
        max_timeout: Some(Duration::from_secs(3)),
        timeout_classes: vec![Duration::from_secs(1)],
        ..long_login()
    };
    let (mut server, ca, _dir) = server_with(config).await;
    let login = |uid: u64, asked: u32| Frame::Login {
        uid,
        token: Bytes::from_static(b"t"),
        device: Default::default(),
        timeout_ms: std::num::NonZeroU32::new(asked),
    };
    let mut uid = 400;
    for (transport, addr) in doors(&server) {
        for (asked, got) in [(1, 300), (300, 300), (301, 600), (1_000, 1_000), (3_001, 3_000)] {
            uid += 1;
            let mut client = DoorClient::connect(transport, addr, ca.as_ref()).await;
            client.send(login(uid, asked)).await;
            match client.recv().await {
                Got::Frame(Frame::Welcome { timeout_ms, .. }) => {
                    assert_eq!(timeout_ms, got, "{transport}: asked {asked} ms")
                }
                other => panic!("{transport}: asked {asked} ms, expected WELCOME, got {other:?}"),
            }
        }
        if is_ws(transport) {
            // A WebSocket client's stack answers the gateway's pings, which keeps a silent
            // session online by design (the test below): the grants above are the check.
            continue;
        }
        let (mut short, mut long) = (
            DoorClient::connect(transport, addr, ca.as_ref()).await,
            DoorClient::connect(transport, addr, ca.as_ref()).await,
        );
        short.send(login(uid + 1000, 300)).await;
        long.send(login(uid + 2000, 3_000)).await;
        assert!(matches!(short.recv().await, Got::Frame(Frame::Welcome { timeout_ms: 300, .. })), "{transport}");
        assert!(matches!(long.recv().await, Got::Frame(Frame::Welcome { timeout_ms: 3_000, .. })), "{transport}");
        expect_bye(&mut short, transport, CloseReason::IdleTimeout).await;
        long.send(Frame::Ping(Bytes::from_static(b"still"))).await;
        assert_eq!(long.recv().await, Got::Frame(Frame::Pong(Bytes::from_static(b"still"))), "{transport}");
    }
    server.shutdown().await;
}

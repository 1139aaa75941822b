//! Shared test helpers: a gateway on `127.0.0.1:0` and a raw protocol client.
#![allow(dead_code)] // each test file uses its own subset

pub mod browser;
pub mod checker;
pub mod client_process;
pub mod cluster;
pub mod differential;
pub mod jwt;
pub mod mqtt;
pub mod mqttjs;
pub mod process;
#[path = "../../loadtest/src/proxy.rs"]
#[allow(dead_code)]
pub mod proxy;
pub mod raw_tls;
pub mod redis;
pub mod tls;
pub mod tls_configs;
pub mod watch_checker;
pub mod webhook;
pub mod ws;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use idlegate::{Config, Listeners, Metrics, Server};
use idlegate_proto::{CloseReason, Frame, FrameCodec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How long a test waits for a frame before calling the gateway hung. A deadline against a
/// hang, never a speed assertion: generous on a loaded machine.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// A gateway running in the test's runtime.
pub struct TestServer {
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub api: SocketAddr,
    /// The WebSocket door (`--ws-listen`).
    pub ws: SocketAddr,
    /// The MQTT door (`--mqtt-listen`).
    pub mqtt: SocketAddr,
    /// The TLS doors, when the config has an identity.
    pub tls: Option<SocketAddr>,
    pub wss: Option<SocketAddr>,
    pub mqtts: Option<SocketAddr>,
    pub metrics: Arc<Metrics>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl TestServer {
    pub async fn start(config: Config) -> TestServer {
        TestServer::start_at(config, None).await
    }

    /// A new gateway on the addresses this one (now shut down) had, as after a restart.
    pub async fn restart(&self, config: Config) -> TestServer {
        assert!(self.task.is_none(), "shut the gateway down before restarting it");
        TestServer::start_at(config, Some(self)).await
    }

    async fn start_at(config: Config, old: Option<&TestServer>) -> TestServer {
        config.validate().expect("test config is valid");
        let bind = |at: Option<SocketAddr>| async move {
            TcpListener::bind(at.unwrap_or_else(|| "127.0.0.1:0".parse().unwrap())).await.unwrap()
        };
        let listener = bind(old.map(|o| o.addr)).await;
        let admin = bind(old.map(|o| o.admin)).await;
        let api = bind(old.map(|o| o.api)).await;
        let (addr, admin_addr, api_addr) =
            (listener.local_addr().unwrap(), admin.local_addr().unwrap(), api.local_addr().unwrap());
        // Every door is open: the WebSocket one always, the TLS ones with an identity.
        let ws = bind(old.map(|o| o.ws)).await;
        let ws_addr = ws.local_addr().unwrap();
        let mqtt = bind(old.map(|o| o.mqtt)).await;
        let mqtt_addr = mqtt.local_addr().unwrap();
        let secure = config.tls.is_some();
        let tls = if secure { Some(bind(old.and_then(|o| o.tls)).await) } else { None };
        let wss = if secure { Some(bind(old.and_then(|o| o.wss)).await) } else { None };
        let mqtts = if secure { Some(bind(old.and_then(|o| o.mqtts)).await) } else { None };
        let mqtts_addr = mqtts.as_ref().map(|l| l.local_addr().unwrap());
        let tls_addr = tls.as_ref().map(|l| l.local_addr().unwrap());
        let wss_addr = wss.as_ref().map(|l| l.local_addr().unwrap());
        let server = Server::new(config);
        let metrics = server.metrics();
        let (stop, stopped) = oneshot::channel::<()>();
        let listeners = Listeners {
            admin: Some(admin),
            api: Some(api),
            tls,
            ws: Some(ws),
            wss,
            mqtt: Some(mqtt),
            mqtts,
            ..Listeners::clients(listener)
        };
        let task = tokio::spawn(server.run(listeners, async move {
            let _ = stopped.await;
        }));
        TestServer {
            addr,
            admin: admin_addr,
            api: api_addr,
            ws: ws_addr,
            mqtt: mqtt_addr,
            tls: tls_addr,
            wss: wss_addr,
            mqtts: mqtts_addr,
            metrics,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Triggers shutdown and waits for `run` to return.
    pub async fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(PATIENCE, task).await.expect("server drains in time").unwrap().unwrap();
        }
    }

    pub async fn client(&self) -> Client {
        Client::connect(self.addr).await
    }

    /// GET on the admin endpoint: (status, body).
    pub async fn admin_get(&self, path: &str) -> (u16, String) {
        http_get(self.admin, path).await
    }
}

/// The first of `names` found on `PATH`.
pub fn find_on_path(names: &[&str]) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    names.iter().find_map(|name| std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file()))
}

/// Skips a test that needs `what` when it is missing, saying how to install it; under CI
/// (`CI` set, as `.ci/run` does) fails instead, so CI never passes without running it.
pub fn skip_without(what: &str, install: &str) {
    assert!(std::env::var_os("CI").is_none(), "CI must run this test: .ci/run installs {what}");
    eprintln!("SKIPPED: no {what}; install it with `{install}`");
}

/// A loopback address nobody listens on right now, for a process to bind.
/// Milliseconds since the Unix epoch now, as the gateway's timestamps count.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

pub fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// Waits until something accepts connections on `addr`.
pub async fn wait_listening(addr: SocketAddr) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while TcpStream::connect(addr).await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "nothing listens on {addr}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The status of a plain HTTP GET, or 0 when no HTTP answer came within a second (a TLS
/// listener, say).
pub async fn http_get_status(addr: SocketAddr, path: &str) -> (u16, String) {
    match tokio::time::timeout(Duration::from_secs(1), async {
        let mut s = TcpStream::connect(addr).await.ok()?;
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).await.ok()?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.ok()?;
        Some(String::from_utf8_lossy(&raw).into_owned())
    })
    .await
    {
        Ok(Some(text)) => (text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0), text),
        _ => (0, String::new()),
    }
}

/// A minimal HTTP/1.1 GET, enough for the admin endpoint and Prometheus's API.
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    http(addr, "GET", path, &[], "").await
}

/// A minimal HTTP/1.1 request with extra header lines and a body: (status, body).
pub async fn http(addr: SocketAddr, method: &str, path: &str, headers: &[&str], body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n");
    for h in headers {
        head.push_str(h);
        head.push_str("\r\n");
    }
    if !body.is_empty() || method == "POST" {
        head.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body.as_bytes()).await.unwrap();
    let mut raw = String::new();
    tokio::time::timeout(PATIENCE, s.read_to_string(&mut raw)).await.unwrap().unwrap();
    let status = raw.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let chunked = head.lines().any(|l| l.eq_ignore_ascii_case("transfer-encoding: chunked"));
    (status, if chunked { dechunk(body) } else { body.to_string() })
}

/// Decodes a `Transfer-Encoding: chunked` body.
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16).unwrap_or(0);
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

/// Every `(panel title, expr)` of the Grafana dashboard.
pub fn dashboard_queries() -> Vec<(String, String)> {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/grafana/dashboards/idlegate.json")).unwrap();
    let dash: serde_json::Value = serde_json::from_str(&text).expect("dashboard is valid JSON");
    let mut out = Vec::new();
    for panel in dash["panels"].as_array().expect("panels") {
        let title = panel["title"].as_str().unwrap_or("?").to_string();
        for target in panel["targets"].as_array().expect("targets") {
            out.push((title.clone(), target["expr"].as_str().expect("expr").to_string()));
        }
    }
    out
}

/// The value of one sample line `name{labels} value` in a Prometheus text body.
pub fn sample(body: &str, series: &str) -> Option<f64> {
    body.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// A raw protocol client.
pub struct Client {
    pub stream: TcpStream,
    buf: BytesMut,
    codec: FrameCodec,
}

impl Client {
    pub async fn connect(addr: SocketAddr) -> Client {
        Client::from_stream(TcpStream::connect(addr).await.unwrap())
    }

    /// A client on a connection made elsewhere (from another source address, say).
    pub fn from_stream(stream: TcpStream) -> Client {
        stream.set_nodelay(true).unwrap();
        Client { stream, buf: BytesMut::new(), codec: FrameCodec::new(u32::MAX) }
    }

    pub async fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.unwrap();
    }

    pub async fn send(&mut self, frame: Frame) {
        let mut out = BytesMut::new();
        self.codec.encode(&frame, &mut out).unwrap();
        self.send_raw(&out).await;
    }

    /// The next frame, or `None` once the gateway closed the connection.
    pub async fn recv(&mut self) -> Option<Frame> {
        tokio::time::timeout(PATIENCE, self.recv_inner()).await.expect("gateway answered in time")
    }

    async fn recv_inner(&mut self) -> Option<Frame> {
        loop {
            if let Some(frame) = self.codec.decode(&mut self.buf).expect("gateway sends valid frames") {
                return Some(frame);
            }
            match self.stream.read_buf(&mut self.buf).await {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }

    pub async fn login(&mut self, uid: u64) -> Frame {
        self.login_with(uid, b"").await
    }

    pub async fn login_with(&mut self, uid: u64, token: &[u8]) -> Frame {
        self.send(Frame::Login {
            uid,
            token: bytes::Bytes::copy_from_slice(token),
            device: Default::default(),
            timeout_ms: None,
        })
        .await;
        self.recv().await.expect("an answer to LOGIN")
    }

    /// Logs in as `uid` on `device`; returns the session id WELCOME gave.
    pub async fn login_device(&mut self, uid: u64, device: &str) -> String {
        let device = device.parse().expect("a valid device name");
        self.send(Frame::Login { uid, token: bytes::Bytes::new(), device, timeout_ms: None }).await;
        match self.recv().await {
            Some(Frame::Welcome { session, .. }) => session,
            other => panic!("expected WELCOME, got {other:?}"),
        }
    }

    /// Sends a PING and expects its PONG.
    pub async fn ping(&mut self, payload: &'static [u8]) {
        self.send(Frame::Ping(bytes::Bytes::from_static(payload))).await;
        assert_eq!(self.recv().await, Some(Frame::Pong(bytes::Bytes::from_static(payload))));
    }

    /// Expects BYE(reason), then the connection closing.
    pub async fn expect_bye(&mut self, reason: CloseReason) -> String {
        match self.recv().await {
            Some(Frame::Bye { reason: got, text }) => {
                assert_eq!(got, reason, "BYE text: {text}");
                assert_eq!(self.recv().await, None, "connection closes after BYE");
                text
            }
            other => panic!("expected BYE({reason}), got {other:?}"),
        }
    }
}

/// A frame's wire bytes: length prefix, kind, payload.
pub fn raw_frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.put_u32(1 + payload.len() as u32);
    v.put_u8(kind);
    v.put_slice(payload);
    v
}

/// A config with a short timeout for tests over real sockets.
pub fn short_config() -> Config {
    Config {
        timeout: Duration::from_millis(600),
        tick: Duration::from_millis(100),
        login_timeout: Duration::from_millis(500),
        max_connections: 1_000,
        drain_timeout: Duration::from_secs(2),
        ..Config::default()
    }
}

/// One Server-Sent Event.
#[derive(Debug, Clone, PartialEq)]
pub struct SseEvent {
    pub id: String,
    pub event: String,
    pub data: serde_json::Value,
}

/// A raw SSE consumer of `/v1/events`: HTTP/1.1 with chunked transfer decoding.
pub struct Sse {
    stream: TcpStream,
    raw: Vec<u8>,
    text: String,
}

impl Sse {
    /// Opens `path` with extra header lines; returns the status and the stream.
    pub async fn open(addr: SocketAddr, path: &str, headers: &[&str]) -> (u16, Sse) {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let mut head = format!("GET {path} HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n");
        for h in headers {
            head.push_str(h);
            head.push_str("\r\n");
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes()).await.unwrap();
        let mut sse = Sse { stream, raw: Vec::new(), text: String::new() };
        let end = loop {
            if let Some(end) = sse.raw.windows(4).position(|w| w == b"\r\n\r\n") {
                break end;
            }
            assert!(sse.fill().await, "closed before the response head");
        };
        let head = String::from_utf8_lossy(&sse.raw[..end]).to_string();
        sse.raw.drain(..end + 4);
        let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        if status == 200 {
            assert!(head.to_ascii_lowercase().contains("content-type: text/event-stream"), "{head}");
        }
        (status, sse)
    }

    async fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 8192];
        match tokio::time::timeout(PATIENCE, self.stream.read(&mut chunk)).await.expect("event stream stalled") {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                self.raw.extend_from_slice(&chunk[..n]);
                true
            }
        }
    }

    /// Moves whole chunks from `raw` to `text`.
    fn dechunk(&mut self) {
        loop {
            let Some(line_end) = self.raw.windows(2).position(|w| w == b"\r\n") else { return };
            let size_text = String::from_utf8_lossy(&self.raw[..line_end]).to_string();
            let size = usize::from_str_radix(size_text.trim(), 16).expect("chunk size");
            if self.raw.len() < line_end + 2 + size + 2 {
                return;
            }
            let data = self.raw[line_end + 2..line_end + 2 + size].to_vec();
            self.raw.drain(..line_end + 2 + size + 2);
            self.text.push_str(std::str::from_utf8(&data).expect("SSE is UTF-8"));
        }
    }

    /// The next event (comments skipped), or `None` once the stream ends.
    pub async fn next(&mut self) -> Option<SseEvent> {
        loop {
            self.dechunk();
            while let Some(end) = self.text.find("\n\n") {
                let block: String = self.text.drain(..end + 2).collect();
                let mut event = SseEvent { id: String::new(), event: String::new(), data: serde_json::Value::Null };
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id: ") {
                        event.id = v.to_string();
                    } else if let Some(v) = line.strip_prefix("event: ") {
                        event.event = v.to_string();
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        event.data = serde_json::from_str(v).expect("event data is JSON");
                    }
                }
                if !event.event.is_empty() {
                    return Some(event);
                }
            }
            if !self.fill().await {
                return None;
            }
        }
    }

    /// The next event, which must be of type `event` and for `uid`.
    pub async fn expect(&mut self, event: &str, uid: u64) -> SseEvent {
        let got = self.next().await.expect("an event");
        assert_eq!((got.event.as_str(), got.data["uid"].as_u64()), (event, Some(uid)), "{got:?}");
        got
    }
}

//! The JavaScript client (`clients/js`) in a real browser against a real gateway: Debian's
//! headless `chromium` loads the package's ES module from a page served here, logs in over
//! `wss://` with a uid above 2^53, receives a push, sends DATA a backend sees as a `data`
//! event, keeps itself alive from WELCOME; a second client that does not ping goes offline
//! with code 4001; after BYE(shutdown) and a restart the first comes back, no sooner than
//! the gateway's hint.
//!
//! On a machine without chromium or openssl the test skips with a message; under CI it
//! fails instead.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use common::browser::{chromium, launch, trust, Page, WAIT};
use common::tls::server_with;
use common::{find_on_path, http, skip_without, Sse};
use idlegate::Config;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// The largest uid, which a JavaScript number cannot hold.
const BIG_UID: &str = "18446744073709551615";

/// Serves the package's `src/` and a blank page over HTTP on loopback, so the page's origin
/// can import the module; returns the address.
async fn serve_package() -> std::net::SocketAddr {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/js");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let root = root.clone();
            tokio::spawn(async move {
                let mut request = vec![0u8; 4096];
                let n = stream.read(&mut request).await.unwrap_or(0);
                let line = String::from_utf8_lossy(&request[..n]).lines().next().unwrap_or("").to_string();
                let path = line.split(' ').nth(1).unwrap_or("/");
                let (status, kind, body) = match file(&root, path) {
                    Some(file) => ("200 OK", "text/javascript", std::fs::read(file).unwrap()),
                    None if path == "/" => ("200 OK", "text/html", b"<!doctype html><title>idlegate</title>".to_vec()),
                    None => ("404 Not Found", "text/plain", b"not found".to_vec()),
                };
                let head = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(head.as_bytes()).await;
                let _ = stream.write_all(&body).await;
            });
        }
    });
    addr
}

/// The package file a request path names (`/src/<name>.js` only).
fn file(root: &Path, path: &str) -> Option<PathBuf> {
    let name = path.strip_prefix("/src/")?;
    let plain = name.ends_with(".js") && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '_');
    plain.then(|| root.join("src").join(name)).filter(|p| p.is_file())
}

/// Evaluates `expression` until it is true; fails with the page's log after [`WAIT`].
async fn until(page: &mut Page, expression: &str) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while page.eval(expression).await != json!(true) {
        let log = page.eval("JSON.stringify(window.log)").await;
        assert!(tokio::time::Instant::now() < deadline, "never true: {expression}; log {log}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Chromium (with `extra` flags) on the package's blank page at `site`, loaded.
async fn open_site(
    browser: &Path,
    profile: &Path,
    site: std::net::SocketAddr,
    extra: &[String],
) -> (tokio::process::Child, Page) {
    let (chromium, browser_http) = launch(browser, profile, extra).await;
    let mut page = Page::open(&browser_http, &format!("http://{site}/")).await;
    // A new target starts on about:blank, itself "complete": wait for the page itself.
    let loaded = format!("location.href === 'http://{site}/' && document.readyState === 'complete'");
    until(&mut page, &loaded).await;
    (chromium, page)
}

/// The page's state changes for client `name`.
async fn states(page: &mut Page, name: &str) -> Vec<Value> {
    let log = page.eval(&format!("JSON.stringify(window.log.filter((e) => e.name === '{name}'))")).await;
    serde_json::from_str(log.as_str().unwrap()).unwrap()
}

/// A page script: imports the package's `Client`, runs `body`, and answers `'started'` (or
/// why it could not).
fn page_script(body: &str) -> String {
    format!(
        "(async () => {{ try {{\n  const {{ Client }} = await import('/src/index.js');\n{body}\n  return 'started';\n}} \
         catch (e) {{ return `failed: ${{e}} ${{e.stack}}`; }} }})()"
    )
}

const START: &str = r#"
  window.log = [];
  window.pushes = [];
  const watch = (name, c) => c.on('state', (s) => window.log.push({ name, at: performance.now(), ...s }));
  window.a = new Client({ url: WSS, uid: BIG_UID, device: 'tab' });
  watch('a', window.a);
  window.a.on('push', (p) => window.pushes.push(new TextDecoder().decode(p)));
  window.c = new Client({ url: WS, uid: 5, keepalive: false });
  watch('c', window.c);
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_js_client_in_chromium_logs_in_pushes_sends_expires_and_comes_back_after_a_restart() {
    let Some(browser) = chromium() else { return };
    // The gateway's WebSocket pings off: the browser would answer them, and this test
    // watches a client that does not ping expire.
    let config = Config { ws_keepalive_pings: false, ..common::browser::config() };
    let (mut server, ca, _dir) = server_with(config.clone()).await;
    let Some(ca) = ca else { return };
    let config = Config { tls: server_identity(&ca), ..config };
    let site = serve_package().await;
    let (_, mut backend) = Sse::open(server.api, "/v1/events?types=online,offline,data", &[]).await;

    let profile = tempfile::tempdir().unwrap();
    let trust = trust(&ca.dir.join("gateway.pem"));
    let (mut chromium, mut page) = open_site(&browser, profile.path(), site, &[trust]).await;
    let script = START
        .replace("WSS", &format!("'wss://127.0.0.1:{}'", server.wss.unwrap().port()))
        .replace("WS,", &format!("'ws://127.0.0.1:{}',", server.ws.port()))
        .replace("BIG_UID", &format!("'{BIG_UID}'"));
    assert_eq!(page.eval_async(&page_script(&script)).await, json!("started"));
    until(&mut page, "window.a.state.state === 'online' && window.c.state.state === 'online'").await;

    // Every digit of the uid reached the gateway: the backend sees it exactly.
    let big: u64 = BIG_UID.parse().unwrap();
    let mut online = [backend.next().await.unwrap(), backend.next().await.unwrap()];
    online.sort_by_key(|e| e.data["uid"].as_u64());
    assert_eq!((online[1].event.as_str(), online[1].data["uid"].as_u64()), ("online", Some(big)));
    assert_eq!(online[1].data["device"], json!("tab"));

    let body = json!({"uids": [big], "payload": BASE64.encode("to the browser")}).to_string();
    let (status, answer) = http(server.api, "POST", "/v1/push", &[], &body).await;
    assert_eq!(status, 200, "{answer}");
    until(&mut page, "window.pushes.includes('to the browser')").await;
    assert_eq!(page.eval("window.a.send('from the browser')").await, json!(true));
    let data = backend.expect("data", big).await;
    assert_eq!(data.data["payload"], json!(BASE64.encode("from the browser")));

    // The client that does not ping goes offline in the window, with code 4001; the other
    // keeps itself alive meanwhile.
    until(&mut page, "window.c.state.state === 'offline'").await;
    let c = states(&mut page, "c").await;
    let expired = c.iter().find(|s| s["state"] == "offline").unwrap();
    assert_eq!((expired["reason"].clone(), expired["code"].clone()), (json!("idle_timeout"), json!(4001)), "{c:?}");
    assert_eq!(backend.expect("offline", 5).await.data["reason"], json!("idle_timeout"));
    page.eval("window.c.close()").await;
    assert_eq!(page.eval("window.a.state.state").await, json!("online"), "{:?}", states(&mut page, "a").await);

    // BYE(shutdown), a restart, and the client back no sooner than the hint.
    server.shutdown().await;
    until(&mut page, "window.a.state.state === 'offline'").await;
    let mut server = server.restart(config).await;
    until(&mut page, "window.a.state.state === 'online'").await;
    let a = states(&mut page, "a").await;
    let at = a.iter().position(|s| s["state"] == "offline").unwrap();
    let (offline, back) = (&a[at], a[at..].iter().find(|s| s["state"] == "online").unwrap());
    assert_eq!((offline["reason"].clone(), offline["code"].clone()), (json!("shutdown"), json!(4008)), "{a:?}");
    let hint =
        idlegate_proto::retry_hint(offline["text"].as_str().unwrap()).expect("a shutdown BYE carries a hint") as f64;
    assert!(offline["retryInMs"].as_f64().unwrap() >= hint, "{offline}");
    let waited = back["at"].as_f64().unwrap() - offline["at"].as_f64().unwrap();
    assert!(waited >= hint, "back after {waited} ms, before the hint of {hint} ms");

    page.eval("window.a.logout()").await;
    until(&mut page, "window.a.state.state === 'offline' && window.a.state.reason === 'logout'").await;
    let _ = chromium.kill().await;
    server.shutdown().await;
}

/// The gateway's identity, loaded again for the restarted gateway.
fn server_identity(ca: &common::tls::TestCa) -> Option<std::sync::Arc<idlegate::TlsIdentity>> {
    let (cert, key) = (ca.dir.join("gateway.pem"), ca.dir.join("gateway.key"));
    Some(idlegate::TlsIdentity::load(cert.as_ref(), key.as_ref()).unwrap())
}

/// What the JavaScript client knows of the wire, read from its module by Node, must be
/// what the gateway's own vocabulary says: a change of the protocol that the client does
/// not follow fails here.
#[test]
fn the_js_client_speaks_the_gateway_s_wire_vocabulary() {
    use bytes::{Bytes, BytesMut};
    use idlegate_proto::{kind, CloseReason, Device, Frame, PresenceEntry, PresenceKind};

    let Some(node) = find_on_path(&["node", "nodejs"]) else {
        return skip_without("node", "apt-get install nodejs");
    };
    let module = Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/js/src/index.js");
    let welcome = body(&Frame::Welcome { timeout_ms: 30_000, tick_ms: 1_000, session: "00000000000000ff".into() });
    let bye = body(&Frame::Bye { reason: CloseReason::Shutdown, text: "retry_after_ms=4200; restarting".into() });
    let refreshed = body(&Frame::Refreshed { expires: 1_700_000_020 });
    let entries = vec![
        PresenceEntry { uid: u64::MAX, online: true, at_ms: 5, status: "busy".into(), last_seen_ms: None },
        PresenceEntry { uid: 7, online: false, at_ms: 9, status: String::new(), last_seen_ms: Some(8) },
    ];
    let presence = body(&Frame::Presence { kind: PresenceKind::Resync, entries });
    let script = format!(
        "const w = await import({module:?});
         const hex = (b) => Buffer.from(b).toString('hex');
         console.log(JSON.stringify({{
           kind: w.KIND, reasons: w.REASONS.slice(1), base: w.BYE_CLOSE_BASE, device: w.MAX_DEVICE_BYTES,
           login: hex(w.encodeLogin('18446744073709551615', 'tok', 'tab')),
           ping: hex(w.encodePing(new Uint8Array([1, 2]))), data: hex(w.encodeData('app')), logout: hex(w.encodeLogout()),
           refresh: hex(w.encodeRefresh('a.b.c')),
           watch: hex(w.encodeUids(w.KIND.WATCH, ['18446744073709551615', 7])),
           unwatch: hex(w.encodeUids(w.KIND.UNWATCH, [7])),
           status: hex(w.encodeStatus('away ☕')),
           presence: w.decodeFrame(Buffer.from('{presence}', 'hex')),
           refreshed: w.decodeFrame(Buffer.from('{refreshed}', 'hex')),
           welcome: w.decodeFrame(Buffer.from('{welcome}', 'hex')),
           bye: w.decodeFrame(Buffer.from('{bye}', 'hex')),
           hint: w.retryHint('retry_after_ms=4200; restarting'),
         }}));",
        module = module.display().to_string(),
    );
    let out = Command::new(node).args(["--input-type=module", "-e", &script]).output().expect("node runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let js: Value = serde_json::from_slice(&out.stdout).unwrap();

    let kinds = [
        ("LOGIN", kind::LOGIN),
        ("PING", kind::PING),
        ("DATA", kind::DATA),
        ("LOGOUT", kind::LOGOUT),
        ("REFRESH", kind::REFRESH),
        ("WATCH", kind::WATCH),
        ("UNWATCH", kind::UNWATCH),
        ("STATUS", kind::STATUS),
        ("WELCOME", kind::WELCOME),
        ("PONG", kind::PONG),
        ("PUSH", kind::PUSH),
        ("REFRESHED", kind::REFRESHED),
        ("PRESENCE", kind::PRESENCE),
        ("BYE", kind::BYE),
    ];
    for (name, byte) in kinds {
        assert_eq!(js["kind"][name], json!(byte), "{name}");
    }
    let reasons: Vec<&str> = (1..=255).map_while(CloseReason::from_wire).map(CloseReason::label).collect();
    assert_eq!(reasons.last(), Some(&"token_expired"));
    assert_eq!(js["reasons"], json!(reasons));
    assert_eq!(js["base"], json!(idlegate_proto::BYE_CLOSE_BASE));
    assert_eq!(js["device"], json!(idlegate_proto::MAX_DEVICE_BYTES));

    let login = Frame::Login {
        uid: u64::MAX,
        token: Bytes::from_static(b"tok"),
        device: Device::parse(b"tab").unwrap(),
        timeout_ms: None,
    };
    assert_eq!(js["login"], json!(body(&login)));
    assert_eq!(js["ping"], json!(body(&Frame::Ping(Bytes::from_static(&[1, 2])))));
    assert_eq!(js["data"], json!(body(&Frame::Data(Bytes::from_static(b"app")))));
    assert_eq!(js["logout"], json!(body(&Frame::Logout)));
    assert_eq!(js["refresh"], json!(body(&Frame::Refresh(Bytes::from_static(b"a.b.c")))));
    assert_eq!(js["refreshed"], json!({"type": "refreshed", "expires": 1_700_000_020u64}));
    assert_eq!(js["watch"], json!(body(&Frame::Watch(vec![u64::MAX, 7]))));
    assert_eq!(js["unwatch"], json!(body(&Frame::Unwatch(vec![7]))));
    assert_eq!(js["status"], json!(body(&Frame::Status("away ☕".into()))));
    assert_eq!(
        js["presence"],
        json!({"type": "presence", "kind": "resync", "entries": [
            {"uid": "18446744073709551615", "online": true, "atMs": 5, "status": "busy", "lastSeenMs": null},
            {"uid": "7", "online": false, "atMs": 9, "status": "", "lastSeenMs": 8},
        ]})
    );
    assert_eq!(
        js["welcome"],
        json!({"type": "welcome", "timeoutMs": 30000, "tickMs": 1000, "session": "00000000000000ff"})
    );
    assert_eq!(js["bye"], json!({"type": "bye", "reason": "shutdown", "text": "retry_after_ms=4200; restarting"}));
    assert_eq!(js["hint"], json!(4200));

    /// A frame's body (what one WebSocket message carries), in hex.
    fn body(frame: &Frame) -> String {
        let mut out = BytesMut::new();
        frame.encode(&mut out);
        hex::encode(&out)
    }
}

const REFRESHING: &str = r#"
  window.log = [];
  window.refreshed = [];
  const tokens = TOKENS;
  window.r = new Client({ url: WS, uid: 8, token: async () => tokens.shift() });
  window.r.on('state', (s) => window.log.push({ name: 'r', ...s }));
  window.r.on('refreshed', (e) => window.refreshed.push(e.expires));
"#;

/// The client's `token` function is asked again before each token expires, and the
/// session goes on under REFRESH: a 20-second token (minted by PyJWT) refreshed three times
/// against a gateway with `--enforce-token-expiry`, one session throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_js_client_in_chromium_refreshes_a_20_second_token_three_times_in_one_session() {
    let Some(browser) = chromium() else { return };
    let dir = tempfile::tempdir().unwrap();
    let Some(mut tokens) = common::jwt::mint(dir.path(), 4, &[8]) else { return };
    let tokens = tokens.remove(&8).unwrap();
    let server = common::TestServer::start(common::jwt::config(dir.path())).await;
    let (_, mut backend) = Sse::open(server.api, "/v1/events?types=online,offline", &[]).await;
    let site = serve_package().await;
    let profile = tempfile::tempdir().unwrap();
    let (mut chromium, mut page) = open_site(&browser, profile.path(), site, &[]).await;
    let script = REFRESHING
        .replace("TOKENS", &json!(tokens).to_string())
        .replace("WS,", &format!("'ws://127.0.0.1:{}',", server.ws.port()));
    assert_eq!(page.eval_async(&page_script(&script)).await, json!("started"));
    // Three refreshes take three quarters of a minute: 5 s before each token's expiry.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while page.eval("window.refreshed.length >= 3").await != json!(true) {
        let log = page.eval("JSON.stringify(window.log)").await;
        assert!(tokio::time::Instant::now() < deadline, "fewer than 3 refreshes; log {log}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let refreshed = page.eval("JSON.stringify(window.refreshed)").await;
    let expiries: Vec<u64> = tokens[1..].iter().map(|t| common::jwt::exp(t)).collect();
    assert_eq!(serde_json::from_str::<Value>(refreshed.as_str().unwrap()).unwrap(), json!(expiries));
    let log = states(&mut page, "r").await;
    let kinds: Vec<&str> = log.iter().map(|s| s["state"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["connecting", "online"], "one session throughout: {log:?}");
    let online = backend.expect("online", 8).await;
    assert_eq!(online.data["session"], log[1]["session"]);
    assert_eq!(online.data["claims"], common::jwt::claims(8));
    page.eval("window.r.logout(), true").await;
    let offline = backend.expect("offline", 8).await;
    assert_eq!(offline.data["reason"], json!("logout"));
    let _ = chromium.kill().await;
}

const WATCHING: &str = r#"
  window.presence = [];
  window.w = new Client({ url: WS, uid: 1 });
  window.w.on('presence', (p) => window.presence.push(p));
  window.w.watch(['18446744073709551615', 2]);
  window.w.setStatus('in the browser');
"#;

/// The JS client in Chromium watches two uids (one above 2^53) and sets its status: a
/// snapshot, each change of a uid a raw client moves, its own status in the stream, and,
/// after a restart of the gateway, the list watched again with a fresh snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_js_client_in_chromium_watches_uids_and_sets_its_status() {
    let Some(browser) = chromium() else { return };
    let watch = idlegate::WatchConfig { policy: Some(idlegate::WatchPolicy::Open), ..idlegate::WatchConfig::default() };
    let config = Config { watch, ..common::browser::config() };
    let mut server = common::TestServer::start(config.clone()).await;
    let (_, mut backend) = Sse::open(server.api, "/v1/events?types=status", &[]).await;
    let site = serve_package().await;
    let profile = tempfile::tempdir().unwrap();
    let (mut chromium, mut page) = open_site(&browser, profile.path(), site, &[]).await;
    let script = WATCHING.replace("WS,", &format!("'ws://127.0.0.1:{}',", server.ws.port()));
    assert_eq!(page.eval_async(&page_script(&script)).await, json!("started"));
    assert_eq!(backend.expect("status", 1).await.data["status"], json!("in the browser"));
    until(&mut page, "window.presence.length === 1").await;
    let snapshot = page.eval("JSON.stringify(window.presence[0])").await;
    let snapshot: Value = serde_json::from_str(snapshot.as_str().unwrap()).unwrap();
    assert_eq!(snapshot["kind"], json!("snapshot"));
    let mut uids: Vec<&str> =
        snapshot["entries"].as_array().unwrap().iter().map(|e| e["uid"].as_str().unwrap()).collect();
    uids.sort_unstable();
    assert_eq!(uids, [BIG_UID, "2"], "every digit of the big uid");

    let mut big = common::Client::connect(server.addr).await;
    big.login(BIG_UID.parse().unwrap()).await;
    big.send(idlegate_proto::Frame::Status("big".into())).await;
    // Changes owed together go out in one PRESENCE frame: count entries, not frames.
    let changes = "window.presence.slice(1).flatMap((p) => p.entries.map((e) => [p.kind, e.uid, e.online, e.status]))";
    until(&mut page, &format!("{changes}.length >= 2")).await;
    let changes = page.eval(&format!("JSON.stringify({changes})")).await;
    let changes: Value = serde_json::from_str(changes.as_str().unwrap()).unwrap();
    assert_eq!(changes, json!([["change", BIG_UID, true, ""], ["change", BIG_UID, true, "big"]]));

    // A restart: the client watches its list again and sets its status again.
    server.shutdown().await;
    let server = server.restart(config).await;
    let (_, mut backend) = Sse::open(server.api, "/v1/events?types=status", &[]).await;
    until(&mut page, "window.w.state.state === 'online' && window.presence.at(-1).kind === 'snapshot'").await;
    assert_eq!(backend.expect("status", 1).await.data["status"], json!("in the browser"));
    page.eval("window.w.logout(), true").await;
    let _ = chromium.kill().await;
}

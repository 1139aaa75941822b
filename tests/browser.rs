//! The WebSocket doors in a real browser: Debian's headless `chromium` opens `ws://` and
//! `wss://` (the gateway's certificate, made by a test CA, trusted for that browser run by
//! its key), logs in, receives a push from the backend API, falls silent and sees `onclose`
//! with code 4001 and reason `idle_timeout`, as a web app would (with the gateway's
//! WebSocket pings off); with them on, the silent page stays online on the browser's own
//! pongs, as a background tab does.
//!
//! On a machine without chromium or openssl the test skips with a message; under CI it
//! fails instead.

mod common;

use std::time::Duration;

use base64::Engine;
use common::browser::{chromium, launch, trust, Page};
use common::http;
use common::tls::server_with;
use idlegate_proto::{kind, WS_PATH};
use serde_json::Value;

/// Opens a WebSocket to each URL as uid 1, 2, ..., logging in on open and keeping every
/// message; `window.done` resolves with each socket's close code, reason and messages.
const START: &str = r#"
window.online = 0;
window.done = Promise.all(URLS.map((url, i) => new Promise((resolve) => {
  const ws = new WebSocket(url);
  ws.binaryType = "arraybuffer";
  const got = [];
  ws.onopen = () => ws.send(new Uint8Array([LOGIN, 0, 0, 0, 0, 0, 0, 0, i + 1, 116]));
  ws.onmessage = (e) => {
    const bytes = Array.from(new Uint8Array(e.data));
    if (bytes[0] === WELCOME) window.online += 1;
    got.push(bytes);
  };
  ws.onerror = () => got.push("error");
  ws.onclose = (e) => resolve({ code: e.code, reason: e.reason, got });
})));
"started"
"#;

/// Chromium with one page whose sockets on `ws` and `wss` (uids 1 and 2) have logged in.
async fn logged_in_on_both_doors(
    browser: &std::path::Path,
    server: &common::TestServer,
    ca: &common::tls::TestCa,
    profile: &std::path::Path,
) -> (tokio::process::Child, Page) {
    let trust = trust(&ca.dir.join("gateway.pem"));
    let (chromium, browser_http) = launch(browser, profile, &[trust]).await;
    let mut page = Page::open(&browser_http, "about:blank").await;
    let wss = server.wss.unwrap();
    let urls = format!(r#"["ws://{}{WS_PATH}", "wss://localhost:{}{WS_PATH}"]"#, server.ws, wss.port());
    let script = START
        .replace("URLS", &urls)
        .replace("LOGIN", &kind::LOGIN.to_string())
        .replace("WELCOME", &kind::WELCOME.to_string());
    assert_eq!(page.eval(&script).await, "started");
    let deadline = tokio::time::Instant::now() + common::browser::WAIT;
    while page.eval("window.online").await != 2 {
        assert!(tokio::time::Instant::now() < deadline, "the browser never logged in on both doors");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (chromium, page)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_logs_in_over_ws_and_wss_receives_a_push_and_sees_close_4001() {
    let Some(browser) = chromium() else { return };
    // The gateway's pings off: the browser would answer them and never fall silent.
    let config = idlegate::Config { ws_keepalive_pings: false, ..common::browser::config() };
    let (mut server, ca, _dir) = server_with(config).await;
    let Some(ca) = ca else { return };
    let profile = tempfile::tempdir().unwrap();
    let (mut chromium, mut page) = logged_in_on_both_doors(&browser, &server, &ca, profile.path()).await;
    let payload = base64::engine::general_purpose::STANDARD.encode(b"hi");
    let body = serde_json::json!({"uids": [1, 2], "payload": payload});
    let (status, answer) = http(server.api, "POST", "/v1/push", &[], &body.to_string()).await;
    assert_eq!(status, 200, "{answer}");

    let closed = tokio::time::timeout(common::browser::WAIT, page.eval_async("window.done")).await.unwrap();
    let closed = closed.as_array().expect("one result per socket").clone();
    assert_eq!(closed.len(), 2);
    for (door, result) in ["ws", "wss"].iter().zip(&closed) {
        assert_eq!(result["code"], 4001, "{door}: {result}");
        assert_eq!(result["reason"], "idle_timeout", "{door}: {result}");
        let got: Vec<Vec<u64>> = result["got"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m.as_array().unwrap_or_else(|| panic!("{door}: {m}")).iter().filter_map(Value::as_u64).collect())
            .collect();
        let kinds: Vec<u64> = got.iter().map(|m| m[0]).collect();
        assert_eq!(kinds, [kind::WELCOME, kind::PUSH, kind::BYE].map(u64::from), "{door}: {got:?}");
        assert_eq!(got[1][1..], [u64::from(b'h'), u64::from(b'i')], "{door}: the push's payload");
    }
    server.shutdown().await;
    let _ = chromium.kill().await;
}

/// A page that sends nothing after its LOGIN (a background tab whose timers the browser
/// throttles) stays online for several timeouts: the gateway pings its silent WebSocket,
/// Chromium's network stack answers with no page code running, and the pong is activity.
/// Then a kick through the API closes it with 4003.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_page_stays_online_on_the_browser_s_own_pongs() {
    let Some(browser) = chromium() else { return };
    let (mut server, ca, _dir) = server_with(common::browser::config()).await;
    let Some(ca) = ca else { return };
    let profile = tempfile::tempdir().unwrap();
    let (mut chromium, mut page) = logged_in_on_both_doors(&browser, &server, &ca, profile.path()).await;
    // Three timeouts of silence from the page.
    tokio::time::sleep(common::browser::config().timeout * 3).await;
    for uid in [1, 2] {
        let (_, presence) = http(server.api, "GET", &format!("/v1/presence/{uid}"), &[], "").await;
        assert!(presence.contains(r#""online":true"#), "uid {uid}: {presence}");
    }
    for uid in [1, 2] {
        let (status, _) = http(server.api, "DELETE", &format!("/v1/sessions/{uid}"), &[], "").await;
        assert_eq!(status, 204);
    }
    let closed = tokio::time::timeout(common::browser::WAIT, page.eval_async("window.done")).await.unwrap();
    for result in closed.as_array().expect("one result per socket") {
        assert_eq!(result["code"], 4003, "{result}");
    }
    server.shutdown().await;
    let _ = chromium.kill().await;
}

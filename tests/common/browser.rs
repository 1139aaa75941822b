//! Debian's headless `chromium`, driven over the DevTools protocol: a page opened, script
//! evaluated in it, its answer read back.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_tungstenite::tungstenite::Message;

/// Longest the page may take to show what the gateway knows: the silent clients' expiry
/// (5 s) plus start-up, generous for a loaded machine.
pub const WAIT: Duration = Duration::from_secs(40);

/// The machine's Chromium, or `None` after saying how to install it (a failure under CI).
pub fn chromium() -> Option<std::path::PathBuf> {
    let found = super::find_on_path(&["chromium", "chromium-browser", "google-chrome"]);
    if found.is_none() {
        super::skip_without("chromium", "apt-get install chromium");
    }
    found
}

/// A gateway's settings for browser tests: a 3 s timeout, short enough to watch a silent
/// page expire, and a login deadline that allows for a browser starting up.
pub fn config() -> idlegate::Config {
    idlegate::Config {
        timeout: Duration::from_secs(3),
        tick: Duration::from_millis(100),
        login_timeout: Duration::from_secs(10),
        ..idlegate::Config::default()
    }
}

/// The Chromium flag that trusts the certificate at `cert` by its public key's SHA-256
/// (`--ignore-certificate-errors-spki-list`), computed with openssl.
pub fn trust(cert: &Path) -> String {
    let script = format!(
        "openssl x509 -in '{}' -pubkey -noout | openssl pkey -pubin -outform der | openssl dgst -sha256 -binary | base64",
        cert.display()
    );
    let out = std::process::Command::new("sh").args(["-c", &script]).output().expect("sh runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    format!("--ignore-certificate-errors-spki-list={}", String::from_utf8(out.stdout).unwrap().trim())
}

/// Starts headless chromium with the DevTools protocol on a free port; returns it and the
/// browser's HTTP address for the protocol.
pub async fn launch(browser: &Path, profile: &Path, extra: &[String]) -> (tokio::process::Child, String) {
    let mut child = tokio::process::Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            "--window-size=1280,900",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg("about:blank")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("chromium starts");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let ws = tokio::time::timeout(WAIT, async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(url) = line.split("DevTools listening on ").nth(1) {
                return url.trim().to_string();
            }
        }
        panic!("chromium exited without opening the DevTools protocol");
    })
    .await
    .expect("chromium opens the DevTools protocol in time");
    // Keep draining its log so it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let http = ws.trim_start_matches("ws://").split('/').next().unwrap().to_string();
    (child, http)
}

/// A PUT to the browser's DevTools HTTP endpoint, which keeps connections open: the body is
/// read by its Content-Length.
async fn devtools_put(browser_http: &str, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(browser_http).await.unwrap();
    s.write_all(format!("PUT {path} HTTP/1.1\r\nHost: {browser_http}\r\nContent-Length: 0\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut raw = Vec::new();
    let mut chunk = [0u8; 4096];
    tokio::time::timeout(WAIT, async {
        loop {
            let n = s.read(&mut chunk).await.unwrap();
            assert!(n > 0, "DevTools closed: {}", String::from_utf8_lossy(&raw));
            raw.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&raw).to_string();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let len = head
                    .lines()
                    .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string()))
                    .and_then(|v| v.parse::<usize>().ok())
                    .unwrap_or(0);
                if body.len() >= len {
                    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
                    return body[..len].to_string();
                }
            }
        }
    })
    .await
    .expect("DevTools answers in time")
}

/// One page's DevTools session.
pub struct Page {
    ws: tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
    next_id: u64,
}

impl Page {
    pub async fn open(browser_http: &str, url: &str) -> Page {
        let body = devtools_put(browser_http, &format!("/json/new?{url}")).await;
        let target: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
        let ws_url = target["webSocketDebuggerUrl"].as_str().expect("a page target").to_string();
        let (ws, _) = tokio_tungstenite::connect_async(ws_url).await.expect("DevTools websocket");
        Page { ws, next_id: 1 }
    }

    /// Evaluates `expression` in the page; returns its value.
    pub async fn eval(&mut self, expression: &str) -> Value {
        self.evaluate(expression, false).await
    }

    /// Evaluates `expression`, a promise, in the page; returns what it resolves to.
    pub async fn eval_async(&mut self, expression: &str) -> Value {
        self.evaluate(expression, true).await
    }

    async fn evaluate(&mut self, expression: &str, await_promise: bool) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let params = json!({"expression": expression, "returnByValue": true, "awaitPromise": await_promise});
        let request = json!({"id": id, "method": "Runtime.evaluate", "params": params});
        self.ws.send(Message::Text(request.to_string())).await.unwrap();
        while let Some(message) = self.ws.next().await {
            let Ok(Message::Text(text)) = message else { continue };
            let reply: Value = serde_json::from_str(&text).unwrap();
            if reply["id"] == json!(id) {
                return reply["result"]["result"]["value"].clone();
            }
        }
        panic!("the DevTools connection closed");
    }
}

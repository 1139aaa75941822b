//! The status page in a real browser: Debian's `chromium`, headless, driven over the DevTools
//! protocol against a gateway with clients connected and falling silent. The test reads the
//! page's DOM after its script has run and checks that the online count shown is the
//! gateway's, that the silence picture has one bar per second of the timeout with its count
//! on it, that expiries appear in the event tail and as a close rate, and that a page opened
//! afterwards still shows them.
//!
//! On a machine without chromium the test skips with a message; under CI (`CI` set) it fails
//! instead, so CI can never pass without running it.

mod common;

use std::time::Duration;

use common::browser::{launch, Page, WAIT};
use common::{find_on_path, skip_without, Client, TestServer};
use idlegate::Config;
use idlegate_proto::{CloseReason, Frame};
use serde_json::{json, Value};
use tokio::time::{sleep, Instant};

const ACTIVE: u64 = 6;
const SILENT: u64 = 4;

/// What the page shows, read off its DOM.
const READ_PAGE: &str = r#"JSON.stringify({
  online: document.getElementById('online').textContent,
  sessions: document.getElementById('sessions').textContent,
  connections: document.getElementById('connections').textContent,
  bars: document.querySelectorAll('#silence rect.bar').length,
  timeoutMark: !!document.getElementById('timeout-mark'),
  events: [...document.querySelectorAll('#events li')].map(li => [li.dataset.type, li.dataset.uid, li.dataset.reason || '']),
  node: document.getElementById('node').textContent,
  barCounts: [...document.querySelectorAll('#silence text.count')].map(t => Number(t.textContent)),
  closeRates: Object.fromEntries([...document.querySelectorAll('#closes tr')].map(tr => [tr.dataset.reason, Number(tr.children[1].textContent)])),
})"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_the_gateway_live_in_a_real_browser() {
    let Some(browser) = find_on_path(&["chromium", "chromium-browser", "google-chrome"]) else {
        return skip_without("chromium", "apt-get install chromium");
    };
    let config = Config {
        timeout: Duration::from_secs(5),
        tick: Duration::from_millis(100),
        login_timeout: Duration::from_secs(10),
        node_id: "page-node".into(),
        ..Config::default()
    };
    let mut server = TestServer::start(config).await;
    let profile = tempfile::tempdir().unwrap();
    let (mut chromium, browser_http) = launch(&browser, profile.path(), &[]).await;
    let mut page = Page::open(&browser_http, &format!("http://{}/", server.admin)).await;

    // Clients log in after the page is open, so their expiry reaches its event stream.
    sleep(Duration::from_millis(500)).await;
    let mut silent = Vec::new();
    for uid in 0..SILENT {
        let mut c = Client::connect(server.addr).await;
        assert!(matches!(c.login(uid).await, Frame::Welcome { .. }));
        silent.push(c);
    }
    let stop = tokio_util::sync::CancellationToken::new();
    let mut active = Vec::new();
    for uid in 100..100 + ACTIVE {
        let mut c = Client::connect(server.addr).await;
        assert!(matches!(c.login(uid).await, Frame::Welcome { .. }));
        let stop = stop.clone();
        active.push(tokio::spawn(async move {
            while !stop.is_cancelled() {
                c.ping(b"p").await;
                sleep(Duration::from_millis(500)).await;
            }
            c
        }));
    }
    for c in &mut silent {
        c.expect_bye(CloseReason::IdleTimeout).await;
    }

    // The page catches up within a poll and the event stream's delivery.
    let deadline = Instant::now() + WAIT;
    let shown = loop {
        let shown: Value = serde_json::from_str(page.eval(READ_PAGE).await.as_str().unwrap_or("{}")).unwrap();
        let gateway_online = server.metrics.online_users.get().to_string();
        let expiries = shown["events"]
            .as_array()
            .map_or(0, |e| e.iter().filter(|e| e[0] == "offline" && e[2] == "idle_timeout").count());
        if shown["online"] == json!(gateway_online) && expiries == SILENT as usize && shown["bars"] == json!(5) {
            break shown;
        }
        assert!(Instant::now() < deadline, "the page never caught up: {shown} (gateway online {gateway_online})");
        sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(shown["online"], json!(ACTIVE.to_string()));
    // One device each: as many sessions as users.
    assert_eq!(shown["sessions"], json!(ACTIVE.to_string()));
    assert_eq!(shown["node"], json!("page-node"));
    assert_eq!(shown["timeoutMark"], json!(true));
    let onlines = shown["events"].as_array().unwrap().iter().filter(|e| e[0] == "online").count();
    assert_eq!(onlines, (SILENT + ACTIVE) as usize, "{shown}");

    // The bars carry their counts: together every uid online.
    let deadline = Instant::now() + WAIT;
    loop {
        let shown: Value = serde_json::from_str(page.eval(READ_PAGE).await.as_str().unwrap_or("{}")).unwrap();
        let counted: u64 = shown["barCounts"].as_array().map_or(0, |c| c.iter().filter_map(Value::as_u64).sum());
        // The expiries of the last 10 s show as a rate, as rate() over /metrics would.
        let rate = shown["closeRates"]["idle_timeout"].as_f64().unwrap_or(0.0);
        if counted == ACTIVE && rate > 0.0 {
            assert!(rate <= SILENT as f64 / 0.5, "{shown}");
            break;
        }
        assert!(Instant::now() < deadline, "no counts on the bars or no close rate: {shown}");
        sleep(Duration::from_millis(200)).await;
    }

    // A page opened after the fact still shows what happened: the log's last events.
    let mut later = Page::open(&browser_http, &format!("http://{}/", server.admin)).await;
    let deadline = Instant::now() + WAIT;
    loop {
        let shown: Value = serde_json::from_str(later.eval(READ_PAGE).await.as_str().unwrap_or("{}")).unwrap();
        let expiries = shown["events"]
            .as_array()
            .map_or(0, |e| e.iter().filter(|e| e[0] == "offline" && e[2] == "idle_timeout").count());
        if expiries == SILENT as usize {
            break;
        }
        assert!(Instant::now() < deadline, "a page opened later shows none of the past: {shown}");
        sleep(Duration::from_millis(200)).await;
    }

    // The picture follows the gateway: one more client, one more online on the page.
    let mut late = Client::connect(server.addr).await;
    late.login(999).await;
    let deadline = Instant::now() + WAIT;
    loop {
        let shown: Value = serde_json::from_str(page.eval(READ_PAGE).await.as_str().unwrap_or("{}")).unwrap();
        if shown["online"] == json!((ACTIVE + 1).to_string()) {
            break;
        }
        assert!(Instant::now() < deadline, "the page did not update: {shown}");
        sleep(Duration::from_millis(200)).await;
    }
    stop.cancel();
    for task in active {
        task.await.unwrap();
    }
    let _ = chromium.kill().await;
    server.shutdown().await;
}

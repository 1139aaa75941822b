//! Wall-clock jumps do not touch expiry: the real gateway binary runs under libfaketime
//! (Debian's `faketime` package) with its wall clock jumping an hour forward, then an hour
//! back, while the monotonic clock runs true, as when NTP steps a server's clock. Clients that
//! keep pinging stay online throughout; silent ones still expire after more than
//! `timeout - tick`. The gateway's own timestamps show that the jumps really happened.
//!
//! On a machine without faketime the test skips with a message; under CI (`CI` set) it fails
//! instead.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::{free_addr, http_get, skip_without, wait_listening, Client};
use idlegate_proto::{CloseReason, Frame};
use tokio::time::{sleep, Instant};

const TIMEOUT: Duration = Duration::from_secs(2);
const TICK: Duration = Duration::from_millis(100);
const ACTIVE: u64 = 10;
const SILENT: u64 = 5;
const HOUR_MS: i64 = 3_600_000;

fn libfaketime() -> Option<PathBuf> {
    ["/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1", "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// Sets the offset libfaketime applies to the wall clock, read on every call.
fn set_offset(file: &Path, offset: &str) {
    std::fs::write(file, format!("{offset}\n")).unwrap();
}

/// The gateway's wall clock, read off `since_ms` of a fresh login, minus ours.
async fn gateway_clock_offset_ms(addr: SocketAddr, api: SocketAddr, uid: u64) -> i64 {
    let mut probe = Client::connect(addr).await;
    probe.login(uid).await;
    let ours = idlegate_proto::unix_now() as i64 * 1000;
    let (_, body) = http_get(api, &format!("/v1/presence/{uid}")).await;
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    probe.send(Frame::Logout).await;
    probe.expect_bye(CloseReason::Logout).await;
    json["since_ms"].as_i64().unwrap() - ours
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wall_clock_jumps_neither_expire_active_clients_nor_spare_silent_ones() {
    let Some(lib) = libfaketime() else {
        return skip_without("libfaketime", "apt-get install faketime");
    };
    let dir = tempfile::tempdir().unwrap();
    let offset_file = dir.path().join("offset");
    set_offset(&offset_file, "+0");
    let (addr, api) = (free_addr(), free_addr());
    let mut gateway = tokio::process::Command::new(env!("CARGO_BIN_EXE_idlegate"))
        .args(["serve", "--listen", &addr.to_string(), "--admin-listen", "127.0.0.1:0"])
        .args(["--api-listen", &api.to_string(), "--timeout", "2s", "--tick", "100ms"])
        .env_remove("IDLEGATE_AUTH_SECRET")
        .env_remove("IDLEGATE_API_TOKEN")
        .env("LD_PRELOAD", &lib)
        .env("FAKETIME_TIMESTAMP_FILE", &offset_file)
        .env("FAKETIME_NO_CACHE", "1")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    wait_listening(addr).await;

    let started = Instant::now();
    let mut pingers = Vec::new();
    for uid in 0..ACTIVE {
        let mut c = Client::connect(addr).await;
        assert!(matches!(c.login(uid).await, Frame::Welcome { .. }));
        pingers.push(tokio::spawn(async move {
            while started.elapsed() < 4 * TIMEOUT {
                c.ping(b"p").await;
                sleep(TIMEOUT / 4).await;
            }
            c.send(Frame::Logout).await;
            c.expect_bye(CloseReason::Logout).await;
        }));
    }
    let mut silent = Vec::new();
    for uid in 100..100 + SILENT {
        let mut c = Client::connect(addr).await;
        c.login(uid).await;
        silent.push((c, Instant::now()));
    }

    // An hour forward, then an hour back, each while everyone is connected.
    sleep(TIMEOUT / 4).await;
    set_offset(&offset_file, "+1h");
    let ahead = gateway_clock_offset_ms(addr, api, 1_000).await;
    assert!((ahead - HOUR_MS).abs() < 5_000, "the gateway's wall clock is {ahead} ms off, not an hour ahead");
    sleep(TIMEOUT / 2).await;
    set_offset(&offset_file, "-1h");
    let behind = gateway_clock_offset_ms(addr, api, 1_001).await;
    assert!((behind + HOUR_MS).abs() < 5_000, "the gateway's wall clock is {behind} ms off, not an hour behind");

    for (mut c, since) in silent {
        c.expect_bye(CloseReason::IdleTimeout).await;
        assert!(since.elapsed() > TIMEOUT - TICK, "expired after {:?}", since.elapsed());
    }
    for p in pingers {
        p.await.expect("an active client was expired or dropped across the jumps");
    }
    let _ = gateway.kill().await;
}

//! The Autobahn WebSocket suite (autobahntestsuite 0.8.2's fuzzing client) against the
//! WebSocket door's own framing, served as an echo by `examples/ws_echo.rs` with messages up
//! to 16 MiB. Every case's verdict must be the one committed in
//! `docs/results/autobahn/summary.json`: sections 1 to 7 and 9 OK, except the
//! non-strict and informational cases docs/SECURITY.md explains, and the compression
//! sections 12 and 13 UNIMPLEMENTED (permessage-deflate is not offered). A case that
//! changes verdict fails the test until the summary, and the explanation, follow.
//!
//! Needs `wstest` (Python 2.7: `PYENV_VERSION=2.7.18 python2.7 -m pip install
//! autobahntestsuite==0.8.2`, which `.ci/run` does); skips without it, except under CI.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{free_addr, skip_without};

const INSTALL: &str = "PYENV_VERSION=2.7.18 python2.7 -m pip install autobahntestsuite==0.8.2";

/// Where `wstest` is: on the PATH, or in pyenv's Python 2.7.18.
fn wstest() -> Option<PathBuf> {
    let pyenv = std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".pyenv/versions/2.7.18/bin/wstest"));
    common::find_on_path(&["wstest"]).or(pyenv.filter(|p| p.is_file()))
}

/// The example binary cargo built beside this test's (`target/<profile>/examples/`).
fn ws_echo() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(|deps| deps.parent()).unwrap().join("examples").join("ws_echo")
}

#[test]
fn the_websocket_framing_passes_the_autobahn_suite() {
    let Some(wstest) = wstest() else { return skip_without("wstest (autobahntestsuite)", INSTALL) };
    let echo_bin = ws_echo();
    assert!(echo_bin.is_file(), "{} is not built (cargo test builds examples)", echo_bin.display());
    let addr = free_addr();
    let mut echo = Command::new(&echo_bin)
        .args(["--listen", &addr.to_string(), "--max-message-bytes", "16777216"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    for _ in 0..100 {
        if std::net::TcpStream::connect(addr).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let dir = tempfile::tempdir().unwrap();
    let spec = serde_json::json!({
        "outdir": "./reports",
        "servers": [{"agent": "idlegate", "url": format!("ws://{addr}/v1/ws")}],
        "cases": ["1.*", "2.*", "3.*", "4.*", "5.*", "6.*", "7.*", "9.*", "12.*", "13.*"],
        "exclude-cases": [],
        "exclude-agent-cases": {},
    });
    std::fs::write(dir.path().join("spec.json"), spec.to_string()).unwrap();
    let run = Command::new(&wstest)
        .args(["-m", "fuzzingclient", "-s", "spec.json"])
        .env("PYENV_VERSION", "2.7.18")
        .current_dir(dir.path())
        .output()
        .expect("wstest runs");
    let _ = echo.kill();
    let _ = echo.wait();
    let index = dir.path().join("reports/index.json");
    let Ok(index) = std::fs::read_to_string(&index) else {
        panic!(
            "no report from wstest: {}{}",
            String::from_utf8_lossy(&run.stdout),
            String::from_utf8_lossy(&run.stderr)
        );
    };
    let index: serde_json::Value = serde_json::from_str(&index).unwrap();
    let got = index["idlegate"].as_object().expect("the agent's cases");
    let summary =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/results/autobahn/summary.json")).unwrap();
    let summary: serde_json::Value = serde_json::from_str(&summary).unwrap();
    let want = summary["cases"].as_object().unwrap();
    let mut differences = Vec::new();
    for (case, expected) in want {
        let verdict = |v: &serde_json::Value| (v["behavior"].clone(), v["behaviorClose"].clone());
        match got.get(case) {
            Some(actual) if verdict(actual) == verdict(expected) => {}
            actual => differences.push(format!("{case}: {:?}, committed {:?}", actual.map(verdict), verdict(expected))),
        }
    }
    assert_eq!(got.len(), want.len(), "cases run");
    assert!(differences.is_empty(), "verdicts changed:\n{}", differences.join("\n"));
    // What the committed summary must say, whatever it is regenerated from.
    for (case, verdict) in want {
        let section: u32 = case.split('.').next().unwrap().parse().unwrap();
        let behavior = verdict["behavior"].as_str().unwrap();
        let allowed: &[&str] = match section {
            12 | 13 => &["UNIMPLEMENTED"],
            _ => &["OK", "NON-STRICT", "INFORMATIONAL"],
        };
        assert!(allowed.contains(&behavior), "{case}: {behavior}");
    }
}

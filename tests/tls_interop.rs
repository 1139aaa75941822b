//! The TLS door against the TLS stacks clients run, each over every suite of TLS 1.3 and 1.2
//! it can be made to offer: OpenSSL through Python's `ssl` and Node's `tls`, GnuTLS through
//! `gnutls-cli` (with a client key update asking for the gateway's), and rustls and OpenSSL's
//! `s_client` in `tests/tls_records.rs`. Each logs in, exchanges frames, and closes one way
//! or the other: the gateway's close_notify after a LOGOUT, or the client's first, answered
//! by the gateway's. A second gateway with a record limit of a few records (the hidden
//! `--tls-record-limit`) makes its own KeyUpdates (TLS 1.3) and its close at the limit (TLS
//! 1.2) reach every client, which no real session does in a test's time.
//!
//! A client missing from the machine skips with how to install it; under CI it fails.

mod common;

use std::process::Command;
use std::time::Duration;

use common::client_process::run_client;
use common::tls::{server_with, TestCa};
use common::{find_on_path, short_config, skip_without};
use idlegate::Config;

/// (version, OpenSSL's name of the suite, GnuTLS's priority string for it).
const SUITES: [(&str, &str, &str); 6] = [
    ("1.3", "TLS_AES_128_GCM_SHA256", "NORMAL:-VERS-ALL:+VERS-TLS1.3:-CIPHER-ALL:+AES-128-GCM"),
    ("1.3", "TLS_AES_256_GCM_SHA384", "NORMAL:-VERS-ALL:+VERS-TLS1.3:-CIPHER-ALL:+AES-256-GCM"),
    ("1.3", "TLS_CHACHA20_POLY1305_SHA256", "NORMAL:-VERS-ALL:+VERS-TLS1.3:-CIPHER-ALL:+CHACHA20-POLY1305"),
    ("1.2", "ECDHE-ECDSA-AES128-GCM-SHA256", "NORMAL:-VERS-ALL:+VERS-TLS1.2:-CIPHER-ALL:+AES-128-GCM"),
    ("1.2", "ECDHE-ECDSA-AES256-GCM-SHA384", "NORMAL:-VERS-ALL:+VERS-TLS1.2:-CIPHER-ALL:+AES-256-GCM"),
    ("1.2", "ECDHE-ECDSA-CHACHA20-POLY1305", "NORMAL:-VERS-ALL:+VERS-TLS1.2:-CIPHER-ALL:+CHACHA20-POLY1305"),
];

/// The frames a client sends, written out by hand as docs/PROTOCOL.md lays them out: LOGIN
/// of uid 42, PING "before\n", PING "after\n", LOGOUT.
fn frames() -> [Vec<u8>; 4] {
    let frame = |kind: u8, body: &[u8]| {
        let mut frame = ((body.len() + 1) as u32).to_be_bytes().to_vec();
        frame.push(kind);
        frame.extend_from_slice(body);
        frame
    };
    [frame(1, &42u64.to_be_bytes()), frame(2, b"before\n"), frame(2, b"after\n"), frame(4, b"")]
}

fn hex(frames: &[Vec<u8>]) -> String {
    frames.iter().map(|f| f.iter().map(|b| format!("{b:02x}")).collect::<String>()).collect::<Vec<_>>().join(",")
}

/// Python's or Node's client: `program script` with the arguments both take.
fn scripted(
    program: &str,
    script: &str,
    door: std::net::SocketAddr,
    ca: &TestCa,
    version: &str,
    suite: &str,
    close: &str,
) -> (Option<i32>, String) {
    let script = format!("{}/tests/data/interop/{script}", env!("CARGO_MANIFEST_DIR"));
    let mut command = Command::new(program);
    command.args([&script, "127.0.0.1", &door.port().to_string(), &ca.cert, version, suite, &hex(&frames()), close]);
    run_client(command, &[])
}

/// `gnutls-cli` with `priority`, sending the frames, asking for a key update under TLS 1.3
/// (`^rekey1^`: its own keys change and the gateway's must too), then closing (end of its
/// input: close_notify).
fn gnutls(door: std::net::SocketAddr, ca: &TestCa, priority: &str, tls13: bool) -> (Option<i32>, String) {
    let mut command = Command::new("gnutls-cli");
    command.args(["--x509cafile", &ca.cert, "--alpn", "idlegate", "--priority", priority, "--inline-commands"]);
    command.args(["-p", &door.port().to_string(), "127.0.0.1"]);
    let [login, before, after, _] = frames();
    let mut input: Vec<&[u8]> = vec![&login, &before];
    if tls13 {
        input.push(b"^rekey1^\n");
    }
    input.push(&after);
    run_client(command, &input)
}

fn config() -> Config {
    Config { timeout: Duration::from_secs(60), login_timeout: Duration::from_secs(10), ..short_config() }
}

fn tools() -> bool {
    for (tool, install) in [
        ("python3", "apt-get install python3"),
        ("node", "apt-get install nodejs"),
        ("gnutls-cli", "apt-get install gnutls-bin"),
    ] {
        if find_on_path(&[tool]).is_none() {
            skip_without(tool, install);
            return false;
        }
    }
    true
}

#[test]
fn python_node_and_gnutls_exchange_frames_and_close_notify_under_every_suite() {
    if !tools() {
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (mut server, ca, _dir) = rt.block_on(server_with(config()));
    let (Some(ca), Some(door)) = (ca, server.tls) else { return };
    let mut failures = Vec::new();
    for (version, suite, priority) in SUITES {
        for close in ["server", "client"] {
            for (program, script) in [("python3", "tls_client.py"), ("node", "tls_client.js")] {
                // Python's ssl cannot pick among TLS 1.3's suites: one run takes OpenSSL's choice.
                if program == "python3" && version == "1.3" && suite != SUITES[0].1 {
                    continue;
                }
                let (status, out) = scripted(program, script, door, &ca, version, suite, close);
                let closed = if close == "server" { "CLOSE_NOTIFY FROM SERVER" } else { "CLOSE_NOTIFY BOTH WAYS" };
                let suite_seen = program == "python3" && version == "1.3" || out.contains(suite);
                if status != Some(0) || !out.contains("DATA OK") || !out.contains(closed) || !suite_seen {
                    failures.push(format!("{program} {version} {suite} close by {close}: {status:?}\n{out}"));
                }
            }
        }
        let (status, out) = gnutls(door, &ca, priority, version == "1.3");
        let ok = status == Some(0)
            && out.contains("before")
            && out.contains("after")
            && out.contains(&format!("TLS{version}"))
            && !out.contains("abnormally");
        if !ok {
            failures.push(format!("gnutls-cli {version} {priority}: {status:?}\n{out}"));
        }
    }
    rt.block_on(server.shutdown());
    assert!(failures.is_empty(), "{}", failures.join("\n----\n"));
}

/// Keys that change every 3 records: under TLS 1.3 the gateway's own KeyUpdates reach each
/// client between its frames, and the frames still read; under TLS 1.2 the session ends at
/// the limit with the gateway's close_notify, which each client takes as a clean close.
#[test]
fn the_gateways_key_updates_and_its_tls12_close_at_the_limit_reach_every_client() {
    if !tools() {
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (mut server, ca, _dir) = rt.block_on(server_with(Config { tls_record_limit: Some(3), ..config() }));
    let (Some(ca), Some(door)) = (ca, server.tls) else { return };
    let mut failures = Vec::new();
    for (version, suite, priority) in SUITES {
        for (program, script) in [("python3", "tls_client.py"), ("node", "tls_client.js")] {
            if program == "python3" && version == "1.3" && suite != SUITES[0].1 {
                continue;
            }
            let (status, out) = scripted(program, script, door, &ca, version, suite, "server");
            // WELCOME and two PONGs are three records, a BYE a fourth: TLS 1.3 changes keys
            // between them; TLS 1.2 closes once three went out.
            let ok = if version == "1.3" {
                status == Some(0) && out.contains("DATA OK") && out.contains("CLOSE_NOTIFY FROM SERVER")
            } else {
                out.contains("SERVER CLOSED CLEANLY") || out.contains("CLOSE_NOTIFY FROM SERVER")
            };
            if !ok {
                failures.push(format!("{program} {version} {suite}: {status:?}\n{out}"));
            }
        }
        let (status, out) = gnutls(door, &ca, priority, false);
        let ok = if version == "1.3" {
            status == Some(0) && out.contains("after") && !out.contains("abnormally")
        } else {
            out.contains("Peer has closed the GnuTLS connection")
        };
        if !ok {
            failures.push(format!("gnutls-cli {version} {priority}: {status:?}\n{out}"));
        }
    }
    rt.block_on(server.shutdown());
    assert!(failures.is_empty(), "{}", failures.join("\n----\n"));
}

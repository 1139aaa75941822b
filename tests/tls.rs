//! TLS as a process serves it: the client door (`--tls-listen`) and HTTPS on the backend API
//! and the admin listener (`--api-tls`, `--admin-tls`), with `--tls-cert` and `--tls-key`: real certificates made by `openssl`, real clients (`curl`
//! and `openssl s_client`), the gateway as a process of its own so SIGHUP can reach it.
//!
//! On a machine without openssl or curl the test skips with a message; under CI it fails
//! instead.

mod common;

use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use common::process::GatewayProcess;
use common::tls::{handshake, TestCa, INSTALL};
use common::ws::{DoorClient, Got};
use common::{find_on_path, skip_without};
use idlegate_proto::{Frame, Transport};

/// `curl` of `url` trusting `ca`: (exit status, body).
fn curl(ca: &str, url: &str) -> (i32, String) {
    let out = Command::new("curl").args(["-sS", "--max-time", "5", "--cacert", ca, url]).output().expect("curl runs");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_and_admin_listener_speak_https_and_take_a_new_certificate_on_sighup() {
    if find_on_path(&["openssl"]).is_none() || find_on_path(&["curl"]).is_none() {
        return skip_without("openssl and curl", INSTALL);
    }
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path());
    let (cert, key) = ca.leaf("first");
    let gw = GatewayProcess::start_https(&["--api-tls", "--admin-tls", "--tls-cert", &cert, "--tls-key", &key]).await;

    let (code, body) = curl(&ca.cert, &format!("https://{}/healthz", gw.admin));
    assert_eq!((code, body.as_str()), (0, "ok\n"));
    let (code, body) = curl(&ca.cert, &format!("https://{}/v1/online", gw.api));
    assert_eq!(code, 0, "{body}");
    assert!(body.contains("\"online\":0"), "{body}");
    // Plain HTTP gets no answer from a TLS listener.
    let (code, _) = common::http_get_status(gw.api, "/v1/online").await;
    assert_ne!(code, 200);

    // TLS 1.3 and 1.2, nothing older.
    let (subject, protocol) = handshake(gw.api, "-tls1_3").expect("a TLS 1.3 handshake");
    assert!(subject.contains("first") && protocol == "TLSv1.3", "{subject} {protocol}");
    assert_eq!(handshake(gw.api, "-tls1_2").map(|(_, p)| p).as_deref(), Some("TLSv1.2"));
    assert_eq!(handshake(gw.api, "-tls1_1"), None, "TLS 1.1 is refused");

    // A renewed pair in the same files, and SIGHUP: new handshakes present it.
    let (second_cert, second_key) = ca.leaf("second");
    std::fs::copy(&second_cert, &cert).unwrap();
    std::fs::copy(&second_key, &key).unwrap();
    gw.signal("HUP");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if handshake(gw.api, "-tls1_3").is_some_and(|(subject, _)| subject.contains("second")) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the new certificate is never presented");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (code, body) = curl(&ca.cert, &format!("https://{}/healthz", gw.admin));
    assert_eq!((code, body.as_str()), (0, "ok\n"));
}

#[test]
fn a_missing_or_mismatched_pair_exits_2_naming_the_flag() {
    if find_on_path(&["openssl"]).is_none() {
        return skip_without("openssl", INSTALL);
    }
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path());
    let (cert, _) = ca.leaf("one");
    let (_, other_key) = ca.leaf("two");
    let cases: &[(&[&str], &str)] = &[
        (&["--api-tls"], "--tls-cert"),
        (&["--admin-tls"], "--tls-cert"),
        (&["--tls-listen", "127.0.0.1:0"], "--tls-cert"),
        (&["--wss-listen", "127.0.0.1:0"], "--tls-cert"),
        (&["--tls-cert", "/nonexistent/cert.pem", "--tls-key", "/nonexistent/key.pem"], "--tls-cert"),
        (&["--tls-cert", &cert, "--tls-key", &other_key], "--tls-key"),
    ];
    for (args, flag) in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_idlegate"))
            .arg("serve")
            .args(*args)
            .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(flag), "{args:?} should name {flag}: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tls_door_offers_1_3_and_1_2_only_and_keeps_every_client_across_a_certificate_reload() {
    if find_on_path(&["openssl"]).is_none() || find_on_path(&["curl"]).is_none() {
        return skip_without("openssl and curl", INSTALL);
    }
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path());
    let (cert, key) = ca.leaf("first");
    let door = common::free_addr();
    let gw = GatewayProcess::start(&[
        "--tls-listen",
        &door.to_string(),
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--timeout",
        "60s",
    ])
    .await;
    common::wait_listening(door).await;

    let (subject, protocol) = handshake(door, "-tls1_3").expect("a TLS 1.3 handshake");
    assert!(subject.contains("first") && protocol == "TLSv1.3", "{subject} {protocol}");
    assert_eq!(handshake(door, "-tls1_2").map(|(_, p)| p).as_deref(), Some("TLSv1.2"));
    assert_eq!(handshake(door, "-tls1_1"), None, "TLS 1.1 is refused");

    // A hundred clients logged in over TLS.
    let mut clients = Vec::new();
    for uid in 0..100 {
        let mut client = DoorClient::connect(Transport::Tls, door, Some(&ca)).await;
        client.login(uid).await;
        clients.push(client);
    }

    // A renewed pair in the same files, and SIGHUP: new handshakes present it.
    let (second_cert, second_key) = ca.leaf("second");
    std::fs::copy(&second_cert, &cert).unwrap();
    std::fs::copy(&second_key, &key).unwrap();
    gw.signal("HUP");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !handshake(door, "-tls1_3").is_some_and(|(subject, _)| subject.contains("second")) {
        assert!(tokio::time::Instant::now() < deadline, "the new certificate is never presented");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A broken pair: refused, counted, and the renewed one still served.
    std::fs::write(&key, "not a key").unwrap();
    gw.signal("HUP");
    let metrics = loop {
        let (_, body) = common::http_get(gw.admin, "/metrics").await;
        if common::sample(&body, "idlegate_tls_reloads_total{result=\"error\"}") == Some(1.0) {
            break body;
        }
        assert!(tokio::time::Instant::now() < deadline, "the bad reload is never counted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(common::sample(&metrics, "idlegate_tls_reloads_total{result=\"ok\"}"), Some(1.0));
    assert!(handshake(door, "-tls1_3").is_some_and(|(subject, _)| subject.contains("second")));
    let expiry = common::sample(&metrics, "idlegate_tls_cert_expiry_timestamp_seconds").unwrap();
    let in_a_day = idlegate_proto::unix_now() as f64 + 86_400.0;
    assert!((expiry - in_a_day).abs() < 600.0, "the renewed certificate expires in a day: {expiry}");

    // None of the hundred was dropped: each still answers.
    for client in &mut clients {
        client.send(Frame::Ping(Bytes::from_static(b"after"))).await;
        assert_eq!(client.recv().await, Got::Frame(Frame::Pong(Bytes::from_static(b"after"))));
    }
    let (_, body) = common::http_get(gw.admin, "/metrics").await;
    assert_eq!(common::sample(&body, "idlegate_connections_open{transport=\"tls\"}"), Some(100.0));
}

//! The `idlegate` binary as a user runs it: bad flags exit 2 naming the flag, `token` mints
//! tokens the gateway accepts, and SIGTERM drains with BYE(shutdown) and exits 0.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::Client;
use idlegate::Auth;
use idlegate_proto::{CloseReason, Frame};

fn idlegate(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_idlegate"))
        .args(args)
        .env_remove("IDLEGATE_AUTH_SECRET")
        .env("IDLEGATE_ADMIN_LISTEN", "127.0.0.1:0")
        .env("IDLEGATE_API_LISTEN", "127.0.0.1:0")
        .env("IDLEGATE_LISTEN", "127.0.0.1:0")
        .env_remove("IDLEGATE_API_TOKEN")
        .env_remove("IDLEGATE_API_TOKEN_FILE")
        .output()
        .unwrap()
}

/// A good secret file (Standard Webhooks' form), for the cases whose fault is elsewhere.
const WEBHOOK_SECRETS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/webhook/test-secrets");

#[test]
fn configuration_errors_exit_2_and_name_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        (&["serve", "--timeout", "2500ms"], "--timeout"),
        (&["serve", "--timeout", "soon"], "--timeout"),
        (&["serve", "--tick", "0s"], "--tick"),
        (&["serve", "--tick", "7s"], "--timeout"),
        (&["serve", "--login-timeout", "0s"], "--login-timeout"),
        (&["serve", "--max-frame-bytes", "4"], "--max-frame-bytes"),
        (&["serve", "--max-connections", "0"], "--max-connections"),
        (&["serve", "--max-pending-logins", "0"], "--max-pending-logins"),
        (&["serve", "--listen", "not-an-address"], "--listen"),
        (&["serve", "--log-format", "xml"], "--log-format"),
        (&["serve", "--listen", "0.0.0.0:0"], "--auth-secret"),
        (&["serve", "--api-listen", "0.0.0.0:0"], "--api-token"),
        (&["serve", "--admin-listen", "0.0.0.0:0"], "--admin-listen"),
        (&["serve", "--api-listen", "nowhere"], "--api-listen"),
        (&["serve", "--event-log-capacity", "0"], "--event-log-capacity"),
        (&["serve", "--event-log-capacity", "many"], "--event-log-capacity"),
        (&["serve", "--node-id", ""], "--node-id"),
        (&["token", "--uid", "1"], "--secret"),
        (&["token", "--uid", "1", "--secret", "s", "--ttl", "0s"], "--ttl"),
        (&["serve", "--max-token-ttl", "0s"], "--max-token-ttl"),
        (&["serve", "--node-lease", "5s"], "--redis"),
        (&["serve", "--enforce-token-expiry"], "--enforce-token-expiry"),
        (&["serve", "--jwt-claims-to-events", "name,org"], "--jwt-claims-to-events"),
        (&["serve", "--listen", "no-such-host.invalid:7070"], "--listen"),
        (&["serve", "--auth-secret-file", "/nonexistent/secrets"], "--auth-secret-file"),
        (&["serve", "--api-token-file", "/nonexistent/token"], "--api-token-file"),
        (&["serve", "--api-token", "t", "--api-token-file", "/dev/null"], "--api-token"),
        (&["serve", "--api-token-file", "/dev/null"], "--api-token-file"),
        (&["serve", "--webhook-url", "http://127.0.0.1:9/hook"], "--webhook-secret-file"),
        (&["serve", "--webhook-secret-file", "/dev/null"], "--webhook-url"),
        (
            &["serve", "--webhook-url", "http://127.0.0.1:9/", "--webhook-secret-file", "/nonexistent"],
            "--webhook-secret-file",
        ),
        (
            &["serve", "--webhook-url", "http://127.0.0.1:9/", "--webhook-secret-file", "/dev/null"],
            "--webhook-secret-file",
        ),
        (&["serve", "--webhook-url", "ftp://x", "--webhook-secret-file", WEBHOOK_SECRETS], "--webhook-url"),
        (
            &["serve", "--webhook-url", "http://x/", "--webhook-secret-file", WEBHOOK_SECRETS, "--webhook-batch", "0"],
            "--webhook-batch",
        ),
        (
            &[
                "serve",
                "--webhook-url",
                "http://x/",
                "--webhook-secret-file",
                WEBHOOK_SECRETS,
                "--webhook-events",
                "online,nope",
            ],
            "--webhook-events",
        ),
        (&["serve", "--offline-grace", "1500ms"], "--offline-grace"),
        (&["serve", "--jwt-key-file", "/nonexistent"], "--jwt-key-file"),
        (&["serve", "--jwt-key-file", "/dev/null"], "--jwt-key-file"),
        (&["serve", "--jwt-secret-file", "/dev/null"], "--jwt-secret-file"),
        (&["serve", "--offline-grace", "6m"], "--offline-grace"),
    ];
    for (args, flag) in cases {
        let out = idlegate(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(flag), "{args:?} should name {flag}: {stderr}");
        // A usage shown is the subcommand's, not the bare `idlegate <COMMAND>`.
        assert!(!stderr.contains("Usage:") || stderr.contains(&format!("idlegate {}", args[0])), "{args:?}: {stderr}");
    }
}

#[test]
fn token_prints_a_token_the_secret_verifies() {
    let out = idlegate(&["token", "--secret", "s3cret", "--uid", "77", "--ttl", "1h"]);
    assert!(out.status.success());
    let token = String::from_utf8(out.stdout).unwrap();
    let auth = Auth::new("s3cret");
    assert_eq!(auth.verify(77, token.trim().as_bytes(), idlegate_proto::unix_now()).map(|_| ()), Ok(()));
    assert!(auth.verify(78, token.trim().as_bytes(), idlegate_proto::unix_now()).is_err());
}

#[tokio::test]
async fn sigterm_sends_bye_shutdown_and_exits_0() {
    // Reserve a port, then hand it to the gateway.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_idlegate"))
        .args(["serve", "--listen", &listen, "--admin-listen", "127.0.0.1:0", "--drain-timeout", "3s"])
        .args(["--api-listen", "127.0.0.1:0"])
        .env_remove("IDLEGATE_AUTH_SECRET")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut client = None;
    for _ in 0..200 {
        if let Ok(stream) = tokio::net::TcpStream::connect(&listen).await {
            drop(stream);
            client = Some(Client::connect(listen.parse().unwrap()).await);
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let mut client = client.expect("gateway started listening");
    assert!(matches!(client.login(1).await, Frame::Welcome { .. }));
    let killed = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(killed.success());
    client.expect_bye(CloseReason::Shutdown).await;
    let status = tokio::task::spawn_blocking(move || child.wait()).await.unwrap().unwrap();
    assert_eq!(status.code(), Some(0));
}

/// `--api-token-file`: the file's token (its trailing newline not part of it) is the one the
/// API requires.
#[tokio::test]
async fn the_api_takes_the_token_from_its_file() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, "s3cret-token\n").unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let api = format!("127.0.0.1:{port}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_idlegate"))
        .args(["serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--api-listen", &api])
        .arg("--api-token-file")
        .arg(&file)
        .env_remove("IDLEGATE_AUTH_SECRET")
        .env_remove("IDLEGATE_API_TOKEN")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let status = |token: Option<&'static str>| {
        let api = api.clone();
        async move {
            let mut stream = tokio::net::TcpStream::connect(&api).await.ok()?;
            let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
            let request = format!("GET /v1/online HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n");
            stream.write_all(request.as_bytes()).await.ok()?;
            let mut answer = String::new();
            stream.read_to_string(&mut answer).await.ok()?;
            answer.split(' ').nth(1).map(str::to_string)
        }
    };
    let mut up = false;
    for _ in 0..200 {
        if status(None).await.is_some() {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(up, "the API started listening");
    assert_eq!(status(None).await.as_deref(), Some("401"));
    assert_eq!(status(Some("s3cret-token")).await.as_deref(), Some("200"));
    child.kill().unwrap();
    let _ = child.wait();
}

/// The start-up line names the open doors and their addresses, and nothing of Rust's
/// `Option`s (`Some(..)`, `None`) reaches an operator's log.
#[test]
fn the_start_up_line_names_the_open_doors_in_plain_words() {
    let free = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    let (listen, mqtt) = (free(), free());
    let mut child = Command::new(env!("CARGO_BIN_EXE_idlegate"))
        .args(["serve", "--listen", &listen, "--mqtt-listen", &mqtt, "--admin-listen", "127.0.0.1:0"])
        .args(["--api-listen", "127.0.0.1:0"])
        .env_remove("RUST_LOG")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(child.stderr.take().unwrap()));
    let line =
        lines.by_ref().map_while(Result::ok).find(|l| l.contains("idlegate serving")).expect("the start-up line");
    let _ = child.kill();
    let _ = child.wait();
    assert!(line.contains(&format!("doors=tcp {listen}, mqtt {mqtt}")), "{line}");
    assert!(!line.contains("Some(") && !line.contains("None"), "{line}");
    assert!(line.contains("timeout=30s") && line.contains("tick=1s"), "{line}");
}

/// A client refused before its login is told of in the log at the default level, with its
/// peer, its door and why: here an MQTT 3.1.1 keepalive of an hour, which no timeout class
/// holds a client to (mosquitto_pub, which `.ci/run` installs).
#[test]
fn a_refusal_before_login_is_logged_with_peer_door_and_why() {
    if common::find_on_path(&["mosquitto_pub"]).is_none() {
        return common::skip_without("mosquitto_pub", "apt-get install mosquitto-clients");
    }
    let free = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let (listen, mqtt) = (free(), free());
    let mut child = Command::new(env!("CARGO_BIN_EXE_idlegate"))
        .args(["serve", "--listen", &listen.to_string(), "--mqtt-listen", &mqtt.to_string()])
        .args(["--admin-listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0"])
        .env_remove("RUST_LOG")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(child.stderr.take().unwrap()));
    lines.by_ref().map_while(Result::ok).find(|l| l.contains("idlegate serving")).expect("started");
    let out = Command::new("mosquitto_pub")
        .args(["-h", "127.0.0.1", "-p", &mqtt.port().to_string(), "-V", "mqttv311", "-u", "7", "-k", "3600"])
        .args(["-t", "a", "-m", "x"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "a keepalive of an hour is refused");
    let line = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|l| l.contains("connection refused before login"))
        .expect("the refusal's line");
    let _ = child.kill();
    let _ = child.wait();
    assert!(line.contains("INFO"), "{line}");
    assert!(line.contains("peer=127.0.0.1:") && line.contains("door=mqtt"), "{line}");
    assert!(line.contains("MQTT 3.1.1 keepalive 3600 s: no timeout class"), "{line}");
}

//! `idlegate serve --config <file>` (TOML): every flag is a key; a flag on the command line
//! or its environment variable wins over the file; an unknown key or a bad value exits 2
//! naming the key and the file's line; `deploy/idlegate.toml` is what
//! `idlegate config-template` prints, and the gateway starts with it.

mod common;

use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Stdio};

use common::{http_get, sample, wait_listening};

fn free() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// Runs `idlegate serve` with `args` (and `env`), waits for its admin listener, and hands
/// back its `/metrics`.
async fn metrics_of(args: &[&str], env: &[(&str, &str)]) -> String {
    let admin = free();
    let mut command = Command::new(env!("CARGO_BIN_EXE_idlegate"));
    command.arg("serve").args(args).args(["--admin-listen", &admin.to_string()]);
    command.args(["--listen", &free().to_string(), "--api-listen", &free().to_string()]);
    for key in ["IDLEGATE_TIMEOUT", "IDLEGATE_TICK", "IDLEGATE_MAX_CONNECTIONS", "IDLEGATE_CONFIG"] {
        command.env_remove(key);
    }
    command.envs(env.iter().copied()).stderr(Stdio::null());
    let mut child = command.spawn().unwrap();
    wait_listening(admin).await;
    let body = http_get(admin, "/metrics").await.1;
    let _ = child.kill();
    let _ = child.wait();
    body
}

#[tokio::test]
async fn the_file_sets_what_no_flag_and_no_environment_variable_does() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("idlegate.toml");
    std::fs::write(&file, "timeout = \"20s\"\ntick = \"500ms\"\nmax-connections = 700\n").unwrap();
    let path = file.display().to_string();
    let body = metrics_of(&["--config", &path], &[]).await;
    assert_eq!(sample(&body, "idlegate_config_timeout_seconds"), Some(20.0));
    assert_eq!(sample(&body, "idlegate_config_tick_seconds"), Some(0.5));
    assert_eq!(sample(&body, "idlegate_config_max_connections"), Some(700.0));
    // A flag wins over the file, and so does an environment variable.
    let body = metrics_of(&["--config", &path, "--max-connections", "600"], &[("IDLEGATE_TIMEOUT", "10s")]).await;
    assert_eq!(sample(&body, "idlegate_config_max_connections"), Some(600.0));
    assert_eq!(sample(&body, "idlegate_config_timeout_seconds"), Some(10.0));
    assert_eq!(sample(&body, "idlegate_config_tick_seconds"), Some(0.5), "the file's, where nothing else says");
    // The file named by the environment.
    let body = metrics_of(&[], &[("IDLEGATE_CONFIG", &path)]).await;
    assert_eq!(sample(&body, "idlegate_config_max_connections"), Some(700.0));
}

/// `idlegate serve --config` with `text` as the file: its exit status and what it said.
fn refused(text: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.toml");
    std::fs::write(&file, text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_idlegate"))
        .args(["serve", "--config", &file.display().to_string(), "--listen", &free().to_string()])
        .args(["--admin-listen", &free().to_string(), "--api-listen", &free().to_string()])
        .env_remove("IDLEGATE_TIMEOUT")
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn an_unknown_key_or_a_bad_value_exits_2_naming_the_key_and_its_line() {
    let (code, said) = refused("timeout = \"20s\"\nmax_connections = 5\n");
    assert_eq!(code, Some(2), "{said}");
    assert!(said.contains("bad.toml line 2: unknown key `max_connections`"), "{said}");
    let (code, said) = refused("# comment\ntimeout = \"soon\"\n");
    assert_eq!(code, Some(2), "{said}");
    assert!(said.contains("bad.toml line 2: key `timeout`"), "{said}");
    let (code, said) = refused("\n\ntimeout = \"2500ms\"\n");
    assert_eq!(code, Some(2), "{said}");
    assert!(said.contains("--timeout") && said.contains("bad.toml line 3"), "{said}");
    let (code, said) = refused("timeout = \"1s\"\ntimeout = \"2s\"\n");
    assert_eq!(code, Some(2), "{said}");
    assert!(said.contains("bad.toml line 2"), "a key given twice: {said}");
}

#[tokio::test]
async fn the_shipped_file_is_the_template_and_the_gateway_starts_with_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let shipped = std::fs::read_to_string(root.join("deploy/idlegate.toml")).unwrap();
    let printed = Command::new(env!("CARGO_BIN_EXE_idlegate")).arg("config-template").output().unwrap();
    assert_eq!(
        shipped,
        String::from_utf8(printed.stdout).unwrap(),
        "deploy/idlegate.toml is out of date: target/debug/idlegate config-template > deploy/idlegate.toml"
    );
    // Every flag of `serve` is in it.
    let help = Command::new(env!("CARGO_BIN_EXE_idlegate")).args(["serve", "--help"]).output().unwrap();
    for line in help.stdout.lines().map_while(Result::ok) {
        let Some(flag) = line.trim_start().strip_prefix("--") else { continue };
        let key: String = flag.chars().take_while(|c| c.is_alphanumeric() || *c == '-').collect();
        if key != "help" && key != "config" {
            assert!(shipped.contains(&format!("\n{key} =")) || shipped.contains(&format!("\n# {key} =")), "{key}");
        }
    }
    let path = root.join("deploy/idlegate.toml").display().to_string();
    let body = metrics_of(&["--config", &path], &[]).await;
    assert_eq!(sample(&body, "idlegate_config_timeout_seconds"), Some(30.0));
}

/// A gateway process, killed when the test ends however it ends.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The status line's code of a WebSocket upgrade to `addr` from `origin`.
async fn upgrade_status(addr: std::net::SocketAddr, origin: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "GET /v1/ws HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nOrigin: {origin}\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut head = vec![0u8; 256];
    let n = tokio::time::timeout(common::PATIENCE, stream.read(&mut head)).await.unwrap().unwrap();
    let text = String::from_utf8_lossy(&head[..n]).into_owned();
    text.split(' ').nth(1).and_then(|code| code.parse().ok()).unwrap_or(0)
}

/// Waits until `series` on `admin` reaches `value`.
async fn until_metric(admin: std::net::SocketAddr, series: &str, value: f64) {
    let deadline = tokio::time::Instant::now() + common::PATIENCE;
    loop {
        if sample(&http_get(admin, "/metrics").await.1, series) == Some(value) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{series} never reached {value}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_sighup_applies_secrets_origins_and_rate_and_names_what_needs_a_restart() {
    use common::Client;
    use idlegate_proto::{Auth, CloseReason, Frame};
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("idlegate.toml");
    let write = |secret: &str, origin: &str, rate: u32, timeout: &str| {
        let text = format!(
            "auth-secret = \"{secret}\"\nws-allowed-origins = [\"{origin}\"]\nmax-data-rate = {rate}\ntimeout = \"{timeout}\"\n"
        );
        std::fs::write(&file, text).unwrap();
    };
    write("first-secret", "https://a.example", 100, "30s");
    let (listen, ws, admin) = (free(), free(), free());
    let log = dir.path().join("gateway.log");
    let child = Command::new(env!("CARGO_BIN_EXE_idlegate"))
        .args(["serve", "--config", &file.display().to_string(), "--listen", &listen.to_string()])
        .args(["--ws-listen", &ws.to_string(), "--admin-listen", &admin.to_string()])
        .args(["--api-listen", &free().to_string()])
        .env_remove("IDLEGATE_AUTH_SECRET")
        .env_remove("IDLEGATE_TIMEOUT")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let child = Killed(child);
    wait_listening(admin).await;
    let token = |secret: &str, uid: u64| {
        let auth = Auth::rotating([secret.as_bytes().to_vec()]).unwrap();
        auth.mint(uid, idlegate_proto::unix_now() + 600)
    };
    let mut before = Client::connect(listen).await;
    assert!(matches!(before.login_with(1, token("first-secret", 1).as_bytes()).await, Frame::Welcome { .. }));
    assert_eq!(upgrade_status(ws, "https://b.example").await, 403);
    let hup = || {
        let ok = Command::new("kill").args(["-HUP", &child.0.id().to_string()]).status().unwrap().success();
        assert!(ok);
    };

    write("second-secret", "https://b.example", 1, "20s");
    hup();
    until_metric(admin, r#"idlegate_config_reloads_total{result="ok"}"#, 1.0).await;
    // New logins take the new secret only; the session logged in before goes on.
    let mut old = Client::connect(listen).await;
    let refused = old.login_with(2, token("first-secret", 2).as_bytes()).await;
    assert!(matches!(refused, Frame::Bye { reason: CloseReason::AuthFailed, .. }), "{refused:?}");
    let mut new = Client::connect(listen).await;
    assert!(matches!(new.login_with(3, token("second-secret", 3).as_bytes()).await, Frame::Welcome { .. }));
    before.ping(b"still here").await;
    assert_eq!(upgrade_status(ws, "https://b.example").await, 101);
    assert_eq!(upgrade_status(ws, "https://a.example").await, 403);
    // The new rate: one DATA a second with the default burst (200); past it the session ends.
    let mut ended = None;
    let mut flood = bytes::BytesMut::new();
    for _ in 0..400 {
        idlegate_proto::put_frame(&Frame::Data(bytes::Bytes::from_static(b"x")), &mut flood);
    }
    new.send_raw(&flood).await;
    while let Some(frame) = new.recv().await {
        if let Frame::Bye { reason, text } = frame {
            ended = Some((reason, text));
        }
    }
    let (reason, text) = ended.expect("ended for its rate");
    assert_eq!(reason, CloseReason::ProtocolError);
    assert!(text.contains("more than 1 frames a second"), "{text}");

    // A file that does not parse changes nothing.
    std::fs::write(&file, "auth-secret = \"third\"\nno-such-key = 1\n").unwrap();
    hup();
    until_metric(admin, r#"idlegate_config_reloads_total{result="error"}"#, 1.0).await;
    let mut still = Client::connect(listen).await;
    assert!(matches!(still.login_with(4, token("second-secret", 4).as_bytes()).await, Frame::Welcome { .. }));

    drop(child);
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(said.contains("SIGHUP: configuration read again") && said.contains("--auth-secret"), "{said}");
    assert!(said.contains("takes effect only after a restart") && said.contains("--timeout"), "{said}");
    assert!(said.contains("no-such-key"), "{said}");
    // Issue 48: only real flags are named, and no empty list of applied ones.
    assert!(!said.contains("ServeArgs"), "{said}");
    assert!(!said.contains("applied= ") && !said.contains("applied=\n"), "{said}");
}

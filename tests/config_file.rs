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

//! What `deploy/` ships: the systemd unit passes `systemd-analyze verify` with no warning
//! (its `ExecStart` pointed at the binary built here, since verify checks that it exists;
//! the unit is not run here: these machines have no systemd as their init); and the FROM
//! scratch image builds with podman and serves from its own root filesystem under chroot
//! (containers cannot run here), as its non-root user, resolving `--redis` by name.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::redis::RedisServer;
use common::{free_addr, http_get, Client, PATIENCE};
use idlegate_proto::Frame;

#[test]
fn the_systemd_unit_verifies_with_no_warning() {
    let Some(analyze) = common::find_on_path(&["systemd-analyze"]) else {
        return common::skip_without("systemd-analyze", "apt-get install systemd");
    };
    let unit = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/idlegate.service")).unwrap();
    for needed in [
        "DynamicUser=yes",
        "LimitNOFILE=",
        "ProtectSystem=strict",
        "CapabilityBoundingSet=\n",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "Restart=on-failure",
    ] {
        assert!(unit.contains(needed), "the unit lacks {needed:?}");
    }
    let dir = tempfile::tempdir().unwrap();
    let here = dir.path().join("idlegate.service");
    std::fs::write(&here, unit.replace("/usr/local/bin/idlegate", env!("CARGO_BIN_EXE_idlegate"))).unwrap();
    let out = Command::new(analyze).arg("verify").arg(&here).output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "systemd-analyze verify failed: {said}");
    assert_eq!(said.trim(), "", "systemd-analyze verify warned");
}

/// A command's stdout, failing the test with its stderr when it fails.
fn run(command: &mut Command) -> String {
    let out = command.output().unwrap();
    assert!(out.status.success(), "{command:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The gateway, run from the image's root filesystem; killed with the test.
struct Chrooted(std::process::Child);

impl Drop for Chrooted {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn the_scratch_image_builds_and_serves_from_its_own_root_filesystem() {
    let Some(podman) = common::find_on_path(&["podman"]) else {
        return common::skip_without("podman", "apt-get install podman");
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let name = "localhost/idlegate:deploy-test";
    // deploy/image.sh builds the static binary (deploy/build.sh) and the image.
    let built = run(Command::new(root.join("deploy/image.sh")).arg(name).stderr(Stdio::inherit()));
    assert_eq!(built, name);
    let binary = root.join("target/x86_64-unknown-linux-gnu/release/idlegate");
    let linked = Command::new("ldd").arg(&binary).output().unwrap();
    let linked = String::from_utf8_lossy(&linked.stdout).into_owned();
    assert!(linked.contains("statically linked"), "not a static binary: {linked}");

    // What the image says of itself: its user, ports and health check.
    let inspected: serde_json::Value =
        serde_json::from_str(&run(Command::new(&podman).args(["image", "inspect", name]))).unwrap();
    let config = &inspected[0]["Config"];
    assert_eq!(config["User"], "65532:65532", "{config}");
    for port in ["7070/tcp", "7071/tcp", "7072/tcp"] {
        assert!(config["ExposedPorts"].get(port).is_some(), "{port} not exposed: {config}");
    }
    // Issue 48: the command reads the file a deployment mounts over the shipped one.
    assert_eq!(config["Cmd"], serde_json::json!(["serve", "--config", "/etc/idlegate/idlegate.toml"]), "{config}");
    let health = inspected.to_string();
    assert!(health.contains(r#""/usr/bin/idlegate","healthcheck""#), "no HEALTHCHECK through the binary: {health}");

    // Its root filesystem, as a runtime would mount it.
    let rootfs = tempfile::tempdir().unwrap();
    let container = run(Command::new(&podman).args(["create", name]).stderr(Stdio::null()));
    let mut export = Command::new(&podman).args(["export", &container]).stdout(Stdio::piped()).spawn().unwrap();
    let tar = export.stdout.take().unwrap();
    let untar = Command::new("tar").arg("-x").arg("-C").arg(rootfs.path()).stdin(tar).status();
    assert!(export.wait().unwrap().success(), "podman export");
    run(Command::new(&podman).args(["rm", &container]).stderr(Stdio::null()));
    assert!(untar.unwrap().success());
    for file in ["usr/bin/idlegate", "etc/passwd", "etc/idlegate/idlegate.toml", "etc/ssl/certs/ca-certificates.crt"] {
        assert!(rootfs.path().join(file).exists(), "the image lacks /{file}");
    }
    // The runtime's part: /etc/hosts.
    std::fs::write(rootfs.path().join("etc/hosts"), "127.0.0.1 localhost\n").unwrap();

    let Some(redis) = RedisServer::start().await else { return };
    let port = redis.url().rsplit(':').next().unwrap().to_string();
    let (listen, admin, api) = (free_addr(), free_addr(), free_addr());
    let chroot_binary = common::find_on_path(&["chroot"]).expect("coreutils' chroot");
    let chroot = |args: &[&str]| {
        let mut command = Command::new(&chroot_binary);
        command.arg("--userspec=65532:65532").arg(rootfs.path()).arg("/usr/bin/idlegate").args(args);
        // Nothing of the test's environment: the image's defaults and what is given.
        command.env_clear();
        command
    };
    let _gateway = Chrooted(
        chroot(&["serve", "--config", "/etc/idlegate/idlegate.toml", "--listen", &listen.to_string()])
            .args(["--admin-listen", &admin.to_string(), "--api-listen", &api.to_string()])
            .args(["--redis", &format!("redis://localhost:{port}"), "--node-id", "image"])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    // Its own health check, as the image's HEALTHCHECK runs it: ready once Redis is joined.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let probe = chroot(&["healthcheck", "--admin-listen", &admin.to_string()]).output().unwrap();
        if probe.status.success() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never ready: {}", String::from_utf8_lossy(&probe.stderr));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut client = Client::connect(listen).await;
    assert!(matches!(client.login(42).await, Frame::Welcome { .. }));
    // Through Redis, where the login lands a moment later.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let (status, body) = http_get(api, "/v1/presence/42").await;
        if status == 200 && body.contains(r#""online":true"#) && body.contains(r#""node":"image""#) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{status} {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Who it runs as: the image's user, not root.
    let pid = run(Command::new("pgrep")
        .args(["-f", &format!("idlegate serve --config /etc/idlegate/idlegate.toml --listen {listen}")]));
    let status = std::fs::read_to_string(format!("/proc/{}/status", pid.lines().next().unwrap())).unwrap();
    let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap().to_string();
    assert!(uid.split_whitespace().nth(1) == Some("65532"), "{uid}");
    client.ping(b"served").await;
    let _ = Command::new(&podman).args(["rmi", name]).stdout(Stdio::null()).stderr(Stdio::null()).status();
}

//! What the webhook examples share: a loopback port and a gateway process that dies with
//! the example. (A folder of its own, so Cargo does not take it for an example.)

use std::process::Child;

/// A free loopback port, for a listener the gateway binds itself.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A gateway process, killed when dropped.
pub struct Gateway(pub Child);

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Serves `app` (the example's receiver, at `/hook`) on a loopback port; returns where.
pub async fn serve_receiver(app: axum::Router) -> anyhow::Result<std::net::SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let hook = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(hook)
}

/// A folder holding `secrets`, the webhook secret file the gateway signs with.
pub fn secret_dir() -> anyhow::Result<tempfile::TempDir> {
    use base64::Engine;
    let dir = tempfile::tempdir()?;
    let secret = format!("whsec_{}", base64::engine::general_purpose::STANDARD.encode([5u8; 32]));
    std::fs::write(dir.path().join("secrets"), secret)?;
    Ok(dir)
}

/// `idlegate serve` on `door` relaying webhooks to `hook` signed with the secrets in `dir`,
/// room for `clients` logins from one address, with the rest of the flags the example adds.
pub fn webhook_gateway(
    binary: &std::path::Path,
    door: std::net::SocketAddr,
    clients: impl std::fmt::Display,
    hook: std::net::SocketAddr,
    dir: &tempfile::TempDir,
) -> std::process::Command {
    let mut command = std::process::Command::new(binary);
    command
        .args(["serve", "--listen", &door.to_string()])
        .args(["--admin-listen", &format!("127.0.0.1:{}", free_port())])
        .args(["--api-listen", &format!("127.0.0.1:{}", free_port())])
        .args(["--max-pending-logins-per-ip", &clients.to_string()])
        .args(["--webhook-url", &format!("http://{hook}/hook")])
        .arg("--webhook-secret-file")
        .arg(dir.path().join("secrets"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    command
}

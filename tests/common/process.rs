//! The release-shaped gateway as a process of its own, for what only a process shows: its
//! resident memory, its exit status, its behaviour under a flood of sockets.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

use super::{free_addr, http_get, wait_listening};

/// An `idlegate serve` process on loopback ports; killed when dropped.
pub struct GatewayProcess {
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    pub api: SocketAddr,
    child: Child,
    /// Where its log (stderr) goes, unless `IDLEGATE_TEST_LOGS` shows it.
    log: Option<tempfile::NamedTempFile>,
}

impl GatewayProcess {
    /// Starts `idlegate serve` with `extra` flags and waits until `/healthz` answers.
    pub async fn start(extra: &[&str]) -> GatewayProcess {
        GatewayProcess::start_as("proc", extra).await
    }

    /// The same, as node `node`.
    pub async fn start_as(node: &str, extra: &[&str]) -> GatewayProcess {
        let gw = GatewayProcess::spawn(node, extra).await;
        assert_eq!(http_get(gw.admin, "/healthz").await.0, 200);
        gw
    }

    /// Starts `idlegate serve` with `extra` flags whose HTTP listeners speak TLS: waits until
    /// both accept connections.
    pub async fn start_https(extra: &[&str]) -> GatewayProcess {
        let gw = GatewayProcess::spawn("proc", extra).await;
        wait_listening(gw.api).await;
        gw
    }

    async fn spawn(node: &str, extra: &[&str]) -> GatewayProcess {
        let (listen, admin, api) = (free_addr(), free_addr(), free_addr());
        let log = std::env::var_os("IDLEGATE_TEST_LOGS").is_none().then(|| tempfile::NamedTempFile::new().unwrap());
        let stderr = match &log {
            Some(file) => Stdio::from(file.reopen().unwrap()),
            None => Stdio::inherit(),
        };
        let child = Command::new(env!("CARGO_BIN_EXE_idlegate"))
            .args(["serve", "--listen", &listen.to_string(), "--admin-listen", &admin.to_string()])
            .args(["--api-listen", &api.to_string(), "--node-id", node])
            .args(extra)
            .env_remove("IDLEGATE_AUTH_SECRET")
            .env_remove("IDLEGATE_API_TOKEN")
            .stderr(stderr)
            .spawn()
            .expect("idlegate starts");
        wait_listening(admin).await;
        GatewayProcess { listen, admin, api, child, log }
    }

    /// Waits until its log holds `needle` (panics after the tests' patience, with the log).
    pub async fn wait_log(&self, needle: &str) {
        let deadline = tokio::time::Instant::now() + super::PATIENCE;
        while !self.log().contains(needle) {
            assert!(tokio::time::Instant::now() < deadline, "{needle:?} not logged: {}", self.log());
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// What it logged so far (empty when `IDLEGATE_TEST_LOGS` shows the log instead).
    pub fn log(&self) -> String {
        self.log.as_ref().map(|f| std::fs::read_to_string(f.path()).unwrap_or_default()).unwrap_or_default()
    }

    /// Sends the process `signal` (`HUP`, `TERM`) with `kill`.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.id().to_string();
        let ok = Command::new("kill").args([&format!("-{signal}"), &pid]).status().expect("kill runs").success();
        assert!(ok, "kill -{signal} {pid}");
    }

    /// Resident memory in bytes, from `/proc/<pid>/status`.
    pub fn rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("procfs");
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS");
        kb * 1024
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

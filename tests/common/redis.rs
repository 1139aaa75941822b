//! Real Redis servers for the cluster tests: Debian's `redis-server`, started on loopback
//! ports in temporary folders, one server or a three-master Redis Cluster.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::proxy::Proxy;
use super::{find_on_path, free_addr, skip_without, wait_listening, PATIENCE};

/// How to install what these tests need.
pub const INSTALL: &str = "apt-get install redis-server redis-tools";

/// One `redis-server` process; killed when dropped.
pub struct RedisServer {
    pub addr: SocketAddr,
    child: Option<Child>,
    dir: tempfile::TempDir,
    extra: Vec<String>,
}

impl RedisServer {
    /// Starts a server with no persistence, or `None` (after saying how to install it)
    /// when `redis-server` is missing outside CI.
    pub async fn start() -> Option<RedisServer> {
        Self::start_with(&[]).await
    }

    pub async fn start_with(extra: &[&str]) -> Option<RedisServer> {
        if find_on_path(&["redis-server"]).is_none() || find_on_path(&["redis-cli"]).is_none() {
            skip_without("redis-server", INSTALL);
            return None;
        }
        let mut server = RedisServer {
            addr: free_addr(),
            child: None,
            dir: tempfile::tempdir().unwrap(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        server.restart().await;
        Some(server)
    }

    /// `redis://` URL of this server.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Starts the server again on the same port (after [`RedisServer::stop`]); with no
    /// persistence it comes back empty, as after a crash.
    pub async fn restart(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.addr.port().to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.extra)
            .current_dir(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        self.child = Some(child);
        wait_listening(self.addr).await;
        wait_pong(self.addr).await;
    }

    /// Kills the server.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The event stream as Redis holds it, oldest first.
    pub fn events(&self) -> Vec<StreamEvent> {
        const SUMMARY: &str = "local out = {} \
            for _, e in ipairs(redis.call('XRANGE', KEYS[1], '-', '+')) do \
              local f = {} \
              for i = 1, #e[2], 2 do f[e[2][i]] = e[2][i + 1] end \
              out[#out + 1] = e[1] .. ' ' .. (f.t or '-') .. ' ' .. (f.uid or '-') .. ' ' .. (f.s or '-') .. ' ' .. (f.r or f.node or '-') .. ' ' .. (f.at or '0') .. ' ' .. (f.sp or '-') \
            end \
            return out";
        self.cli(&["EVAL", SUMMARY, "1", "{idlegate}:events"])
            .lines()
            .filter_map(|line| {
                let f: Vec<&str> = line.split(' ').collect();
                (f.len() == 7).then(|| StreamEvent {
                    id: f[0].into(),
                    kind: f[1].into(),
                    uid: f[2].parse().unwrap_or(0),
                    session: f[3].into(),
                    detail: f[4].into(),
                    at_ms: f[5].parse().unwrap_or(0),
                    superseded: f[6] == "1",
                })
            })
            .collect()
    }

    /// Keys matching `pattern` (`SCAN`, so a big keyspace does not block the server).
    pub fn keys(&self, pattern: &str) -> Vec<String> {
        self.cli(&["--scan", "--pattern", pattern]).lines().map(String::from).collect()
    }

    /// Runs `redis-cli` against this server; returns its output.
    pub fn cli(&self, args: &[&str]) -> String {
        cli(self.addr, args)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One entry of the cluster's event stream: `detail` is an offline's reason or an
/// online's node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamEvent {
    pub id: String,
    pub kind: String,
    pub uid: u64,
    pub session: String,
    pub detail: String,
    /// Its `at` field: when it happened, as the event says.
    pub at_ms: u64,
    /// An `online` that says it was superseded (`sp`): left out of the device bound.
    pub superseded: bool,
}

/// Checks the promise: every session's `online` has exactly one `offline` after it, and
/// no `offline` ends a session that was never online.
pub fn assert_paired(events: &[StreamEvent]) {
    use std::collections::HashMap;
    let mut sessions: HashMap<(u64, &str), (usize, usize)> = HashMap::new();
    // Per uid, whether it is online as a user: its user events alternate, online first.
    let mut users: HashMap<u64, bool> = HashMap::new();
    for e in events {
        match e.kind.as_str() {
            "user_online" => assert!(!users.insert(e.uid, true).unwrap_or(false), "user_online twice: {e:?}"),
            "user_offline" => assert!(users.insert(e.uid, false).unwrap_or(false), "user_offline while offline: {e:?}"),
            _ => {}
        }
        let entry = sessions.entry((e.uid, e.session.as_str())).or_default();
        match e.kind.as_str() {
            "online" => {
                assert_eq!(entry.1, 0, "online after its offline: {e:?}");
                entry.0 += 1;
            }
            "offline" => entry.1 += 1,
            _ => {}
        }
    }
    for ((uid, session), (on, off)) in sessions {
        if (on, off) != (0, 0) {
            assert_eq!((on, off), (1, 1), "uid {uid} session {session}: {on} online, {off} offline in {events:#?}");
        }
    }
}

/// Runs `redis-cli -h -p` with `args` (raw output, one value a line).
pub fn cli(addr: SocketAddr, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", &addr.ip().to_string(), "-p", &addr.port().to_string(), "--raw"])
        .args(args)
        .output()
        .expect("redis-cli runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn wait_pong(addr: SocketAddr) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while cli(addr, &["PING"]).trim() != "PONG" {
        assert!(tokio::time::Instant::now() < deadline, "redis on {addr} never answered PING");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Three masters made into a Redis Cluster with `redis-cli --cluster create`.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub async fn start() -> Option<RedisCluster> {
        let mut nodes = Vec::new();
        for _ in 0..3 {
            let extra =
                ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000"];
            nodes.push(RedisServer::start_with(&extra).await?);
        }
        let mut create = vec!["--cluster".to_string(), "create".to_string()];
        create.extend(nodes.iter().map(|n| n.addr.to_string()));
        create.extend(["--cluster-replicas", "0", "--cluster-yes"].map(String::from));
        let out = Command::new("redis-cli").args(&create).output().expect("redis-cli --cluster create runs");
        assert!(out.status.success(), "cluster create failed: {}", String::from_utf8_lossy(&out.stdout));
        let deadline = tokio::time::Instant::now() + PATIENCE;
        for node in &nodes {
            while !node.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok") {
                assert!(tokio::time::Instant::now() < deadline, "the cluster never became ok");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Some(RedisCluster { nodes })
    }

    /// The seeds, comma-separated, as `--redis` takes them.
    pub fn url(&self) -> String {
        self.nodes.iter().map(|n| n.url()).collect::<Vec<_>>().join(",")
    }

    /// Puts a proxy in front of each server and has the cluster name the proxies to its
    /// clients (`cluster-announce-port`), so that every client connection, redirections
    /// included, goes through them; the servers' bus goes straight. Returns the proxies in
    /// the order of `nodes`, and the seeds through them.
    pub async fn behind_proxies(&self) -> (Vec<Proxy>, String) {
        let mut proxies = Vec::new();
        for node in &self.nodes {
            let proxy = Proxy::start(node.addr).await.expect("the proxy starts");
            let port = proxy.addr.port().to_string();
            assert_eq!(node.cli(&["CONFIG", "SET", "cluster-announce-port", &port]).trim(), "OK");
            proxies.push(proxy);
        }
        // The gossip carries each server's new port to the others.
        let ports: Vec<String> = proxies.iter().map(|p| p.addr.port().to_string()).collect();
        let deadline = tokio::time::Instant::now() + PATIENCE;
        for node in &self.nodes {
            while !ports.iter().all(|p| node.cli(&["CLUSTER", "SLOTS"]).lines().any(|l| l == p)) {
                assert!(tokio::time::Instant::now() < deadline, "the servers never named the proxies");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        let url = proxies.iter().map(Proxy::url).collect::<Vec<_>>().join(",");
        (proxies, url)
    }

    /// The server holding the shared event stream.
    pub fn holding_events(&self) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| n.cli(&["EXISTS", "{idlegate}:events"]).trim() == "1")
            .expect("a server holds the stream")
    }
}

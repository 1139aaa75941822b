//! The processes a nemesis run starts and harms: Redis (one server behind a proxy per
//! gateway, or a Redis Cluster with a replica per primary) and the gateways, each a real
//! `idlegate serve` on loopback ports, under libfaketime when it is installed so that its
//! wall clock can jump. Every process is killed when its owner is dropped.

use std::fs::{File, OpenOptions};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::{sleep, Instant};

/// How long a process may take to listen after it starts.
const START_PATIENCE: Duration = Duration::from_secs(20);

/// Where Debian's libfaketime lives: the multithreaded variant, which a tokio runtime needs.
const LIBFAKETIME: [&str; 2] =
    ["/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1", "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1"];

/// A loopback address no one listens on (the kernel's pick; free when returned).
pub fn free_addr() -> std::io::Result<SocketAddr> {
    TcpListener::bind("127.0.0.1:0")?.local_addr()
}

/// Waits until something accepts on `addr`.
pub async fn wait_listening(addr: SocketAddr, what: &str) -> Result<(), String> {
    let deadline = Instant::now() + START_PATIENCE;
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        if Instant::now() > deadline {
            return Err(format!("{what} did not listen on {addr} within {START_PATIENCE:?}"));
        }
        sleep(Duration::from_millis(25)).await;
    }
    Ok(())
}

/// Runs `redis-cli -h 127.0.0.1 -p <port> args...` and answers its output.
pub fn redis_cli(addr: SocketAddr, args: &[&str]) -> Result<String, String> {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &addr.port().to_string()])
        .args(args)
        .output()
        .map_err(|e| format!("redis-cli: {e}"))?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn log_file(path: &Path) -> Result<File, String> {
    OpenOptions::new().create(true).append(true).open(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// One `redis-server` with no persistence: a restart brings it back empty, as a crash does.
pub struct RedisServer {
    pub addr: SocketAddr,
    dir: PathBuf,
    extra: Vec<String>,
    child: Option<Child>,
}

/// Holds the Redis server at `addr` for `pause` (DEBUG SLEEP: it answers nobody
/// meanwhile); returns once it answers again.
pub async fn debug_sleep(addr: SocketAddr, pause: Duration) -> Result<(), String> {
    let out = tokio::process::Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &addr.port().to_string()])
        .args(["DEBUG", "SLEEP", &format!("{:.3}", pause.as_secs_f64())])
        .output()
        .await
        .map_err(|e| format!("redis-cli: {e}"))?;
    if String::from_utf8_lossy(&out.stdout).trim() != "OK" {
        return Err(format!("DEBUG SLEEP: {}", String::from_utf8_lossy(&out.stdout).trim()));
    }
    Ok(())
}

impl RedisServer {
    pub async fn start(dir: PathBuf, extra: &[&str]) -> Result<RedisServer, String> {
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let addr = free_addr().map_err(|e| format!("a free port: {e}"))?;
        let mut server = RedisServer { addr, dir, extra: extra.iter().map(|s| s.to_string()).collect(), child: None };
        server.restart().await?;
        Ok(server)
    }

    /// Starts it (again) on its port.
    pub async fn restart(&mut self) -> Result<(), String> {
        let child = Command::new("redis-server")
            .args(["--port", &self.addr.port().to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            // `slow_redis` stalls it with DEBUG SLEEP, from this machine only.
            .args(["--enable-debug-command", "local"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .current_dir(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("redis-server: {e} (install it: apt-get install redis-server redis-tools)"))?;
        self.child = Some(child);
        wait_listening(self.addr, "redis-server").await
    }

    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// Kills it (SIGKILL): what it held is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A Redis Cluster of three primaries with a replica each, so a primary can fail over.
pub struct RedisCluster {
    pub servers: Vec<RedisServer>,
}

impl RedisCluster {
    pub async fn start(dir: &Path) -> Result<RedisCluster, String> {
        let mut servers = Vec::new();
        for i in 0..6 {
            let extra =
                ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000"];
            servers.push(RedisServer::start(dir.join(format!("redis-{i}")), &extra).await?);
        }
        let mut create = vec!["--cluster".to_string(), "create".to_string()];
        create.extend(servers.iter().map(|s| s.addr.to_string()));
        create.extend(["--cluster-replicas", "1", "--cluster-yes"].map(String::from));
        let out = Command::new("redis-cli").args(&create).output().map_err(|e| format!("redis-cli: {e}"))?;
        if !out.status.success() {
            return Err(format!("redis-cli --cluster create: {}", String::from_utf8_lossy(&out.stdout)));
        }
        let cluster = RedisCluster { servers };
        cluster.wait_ok().await?;
        Ok(cluster)
    }

    /// Waits until every server says the cluster is ok.
    pub async fn wait_ok(&self) -> Result<(), String> {
        let deadline = Instant::now() + START_PATIENCE;
        for s in &self.servers {
            while !redis_cli(s.addr, &["CLUSTER", "INFO"])?.contains("cluster_state:ok") {
                if Instant::now() > deadline {
                    return Err("the Redis Cluster never became ok".into());
                }
                sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }

    pub fn url(&self) -> String {
        format!("redis://{}", self.servers[0].addr)
    }

    /// Fails a primary over to its replica: `CLUSTER FAILOVER` on the replica of the
    /// primary `pick` chooses, then waits until the cluster is ok again.
    pub async fn failover(&self, pick: u64) -> Result<String, String> {
        let replicas: Vec<&RedisServer> = self
            .servers
            .iter()
            .filter(|s| redis_cli(s.addr, &["ROLE"]).map(|r| r.starts_with("slave")).unwrap_or(false))
            .collect();
        let Some(replica) = replicas.get(pick as usize % replicas.len().max(1)) else {
            return Err("no replica to fail over to".into());
        };
        let answer = redis_cli(replica.addr, &["CLUSTER", "FAILOVER"])?;
        if !answer.contains("OK") {
            return Err(format!("CLUSTER FAILOVER on {}: {answer}", replica.addr));
        }
        let deadline = Instant::now() + START_PATIENCE;
        while !redis_cli(replica.addr, &["ROLE"])?.starts_with("master") {
            if Instant::now() > deadline {
                return Err(format!("{} never became a primary", replica.addr));
            }
            sleep(Duration::from_millis(50)).await;
        }
        self.wait_ok().await?;
        Ok(replica.addr.to_string())
    }
}

/// The gateway's settings for a run: short enough that expiries, leases and reaps happen
/// many times in a few minutes.
#[derive(Debug, Clone)]
pub struct GatewaySettings {
    pub binary: PathBuf,
    pub timeout: Duration,
    pub tick: Duration,
    pub node_lease: Duration,
    pub redis_cluster: bool,
    pub max_devices: u64,
    /// `--webhook-url` and `--webhook-secret-file`, when the run receives webhooks.
    pub webhook: Option<(String, PathBuf)>,
    /// `--webhook-max-backoff`: the relay's longest wait between tries, one of the two
    /// lengths of a turn in promise 4 (progress within two turns).
    pub webhook_max_backoff: Duration,
    /// `--offline-grace` (none when zero).
    pub offline_grace: Duration,
}

/// One gateway process: node `id`, its ports fixed for the run (a restart after a kill
/// comes back where its clients look for it).
pub struct Gateway {
    pub id: String,
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    pub api: SocketAddr,
    redis_url: String,
    settings: GatewaySettings,
    log: PathBuf,
    /// libfaketime's offset file for this process, when libfaketime is installed.
    clock: Option<(PathBuf, PathBuf)>,
    /// The `cgroup.procs` the process starts in (its redirection to a Redis Cluster).
    cgroup: Option<std::ffi::CString>,
    child: Option<Child>,
}

impl Gateway {
    pub fn new(id: &str, redis_url: String, settings: &GatewaySettings, out: &Path) -> Result<Gateway, String> {
        let port = |what: &str| free_addr().map_err(|e| format!("a free port for {what}: {e}"));
        let clock = LIBFAKETIME
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
            .map(|lib| (lib, out.join(format!("{id}.faketime"))));
        Ok(Gateway {
            id: id.to_string(),
            listen: port("--listen")?,
            admin: port("--admin-listen")?,
            api: port("--api-listen")?,
            redis_url,
            settings: settings.clone(),
            log: out.join(format!("{id}.log")),
            clock,
            cgroup: None,
            child: None,
        })
    }

    /// Starts the process (and every restart) in the cgroup whose `cgroup.procs` this is.
    pub fn start_in(&mut self, procs: &Path) -> Result<(), String> {
        use std::os::unix::ffi::OsStrExt;
        let path = std::ffi::CString::new(procs.as_os_str().as_bytes()).map_err(|e| format!("{e}"))?;
        self.cgroup = Some(path);
        Ok(())
    }

    /// Whether its wall clock can be made to jump.
    pub fn has_clock(&self) -> bool {
        self.clock.is_some()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Starts the process and waits until it says ready (connected to Redis).
    pub async fn start(&mut self) -> Result<(), String> {
        let s = &self.settings;
        let mut cmd = Command::new(&s.binary);
        cmd.args(["serve", "--node-id", &self.id, "--redis", &self.redis_url])
            .args(["--listen", &self.listen.to_string(), "--admin-listen", &self.admin.to_string()])
            .args(["--api-listen", &self.api.to_string()])
            .args(["--timeout", &humantime::format_duration(s.timeout).to_string()])
            .args(["--tick", &humantime::format_duration(s.tick).to_string()])
            .args(["--node-lease", &humantime::format_duration(s.node_lease).to_string()])
            .args(["--max-devices", &s.max_devices.to_string()])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file(&self.log)?);
        if s.redis_cluster {
            cmd.arg("--redis-cluster");
        }
        if let Some((url, secret)) = &s.webhook {
            cmd.args(["--webhook-url", url]).arg("--webhook-secret-file").arg(secret);
            cmd.args(["--webhook-max-backoff", &humantime::format_duration(s.webhook_max_backoff).to_string()]);
        }
        if !s.offline_grace.is_zero() {
            cmd.args(["--offline-grace", &humantime::format_duration(s.offline_grace).to_string()]);
        }
        if let Some((lib, offset)) = &self.clock {
            set_offset(offset, 0)?;
            cmd.env("LD_PRELOAD", lib)
                .env("FAKETIME_TIMESTAMP_FILE", offset)
                .env("FAKETIME_NO_CACHE", "1")
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        if let Some(procs) = self.cgroup.clone() {
            use std::os::unix::process::CommandExt;
            // SAFETY: between fork and exec only open(2), write(2) and close(2) run, on a
            // path built before the fork: nothing allocates or takes a lock.
            unsafe {
                cmd.pre_exec(move || {
                    let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
                    if fd < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    // `0`: the writer itself, before its first connection.
                    let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                    let error = std::io::Error::last_os_error();
                    libc::close(fd);
                    if written == 1 {
                        Ok(())
                    } else {
                        Err(error)
                    }
                });
            }
        }
        let child = cmd.spawn().map_err(|e| format!("{}: {e}", s.binary.display()))?;
        self.child = Some(child);
        wait_listening(self.admin, &format!("gateway {}", self.id)).await?;
        let deadline = Instant::now() + START_PATIENCE;
        let url = format!("http://{}/readyz", self.admin);
        loop {
            let ready = reqwest::get(&url).await.map(|r| r.status().is_success()).unwrap_or(false);
            if ready {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("gateway {} never said ready (its log: {})", self.id, self.log.display()));
            }
            sleep(Duration::from_millis(50)).await;
        }
    }

    /// kill -9: no goodbye, no drain.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGSTOP (true) or SIGCONT (false).
    pub fn freeze(&self, stop: bool) {
        if let Some(pid) = self.pid() {
            signal(pid, if stop { libc::SIGSTOP } else { libc::SIGCONT });
        }
    }

    /// Moves the wall clock by `jump_s` (0: back to true time).
    pub fn set_clock(&self, jump_s: i64) -> Result<(), String> {
        match &self.clock {
            Some((_, offset)) => set_offset(offset, jump_s),
            None => Err("a clock fault needs libfaketime (apt-get install faketime)".into()),
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        // A stopped process cannot die until it is continued.
        self.freeze(false);
        self.kill();
    }
}

fn set_offset(file: &Path, jump_s: i64) -> Result<(), String> {
    std::fs::write(file, format!("{jump_s:+}\n")).map_err(|e| format!("{}: {e}", file.display()))
}

#[cfg(target_os = "linux")]
fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) on a child this process started and has not reaped.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// The stalled gateway's CPU: 1 ms in every 100 ms, enough for the kernel to move its
/// threads now and then, far too little to keep a tick or a lease.
const STALL_QUOTA_US: u64 = 1_000;
const STALL_PERIOD_US: u64 = 100_000;

/// Starves a gateway of CPU: a stall of its runtime, as a noisy neighbour or a CPU quota
/// makes one, while its sockets stay open. A cgroup of its own (v2, or v1's cpu controller)
/// limits it to [`STALL_QUOTA_US`] of CPU per [`STALL_PERIOD_US`]. Healed, the gateway goes
/// back to the cgroup it came from: left in its own, it would compete for CPU as one group
/// against every thread outside it, a stall that outlasts its fault (nemesis seed 10 at
/// `--max-devices 1`: a gateway stalled once lagged whenever the machine was busy, until a
/// lag cost it its lease, with no fault near).
pub struct Throttle {
    group: PathBuf,
    quota: PathBuf,
    v2: bool,
    /// The stalled process and the cgroup it came from (the controller's hierarchy root
    /// joined with its path there).
    home: std::sync::Mutex<Option<(u32, PathBuf)>>,
}

impl Throttle {
    /// A cgroup for one gateway's stalls (`name` unique to the run and the node), or why
    /// there cannot be one.
    pub fn new(name: &str) -> Result<Throttle, String> {
        let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
        let group = Self::root(v2).join(format!("idlegate-nemesis-{name}"));
        std::fs::create_dir_all(&group).map_err(|e| {
            format!(
                "the stall fault needs a writable cpu cgroup ({}): {e}; leave it out with --faults",
                group.display()
            )
        })?;
        let quota = group.join(if v2 { "cpu.max" } else { "cpu.cfs_quota_us" });
        Ok(Throttle { group, quota, v2, home: std::sync::Mutex::new(None) })
    }

    /// Where the CPU controller's hierarchy is mounted.
    fn root(v2: bool) -> PathBuf {
        PathBuf::from(if v2 { "/sys/fs/cgroup" } else { "/sys/fs/cgroup/cpu" })
    }

    /// The cgroup `pid` is in, for the CPU controller: `0::<path>` on v2, the line whose
    /// controllers include `cpu` on v1.
    fn cgroup_of(&self, pid: u32) -> Result<PathBuf, String> {
        let file = format!("/proc/{pid}/cgroup");
        let text = std::fs::read_to_string(&file).map_err(|e| format!("{file}: {e}"))?;
        let path = text
            .lines()
            .filter_map(|line| {
                let mut parts = line.splitn(3, ':');
                let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
                let ours = if self.v2 { controllers.is_empty() } else { controllers.split(',').any(|c| c == "cpu") };
                ours.then_some(path)
            })
            .next()
            .ok_or_else(|| format!("{file}: no cpu cgroup"))?;
        Ok(Self::root(self.v2).join(path.trim_start_matches('/')))
    }

    /// Starves `pid` (true), or gives the process it starved its CPU back and moves it home
    /// (false; `pid` is not needed).
    pub fn set(&self, pid: u32, stalled: bool) -> Result<(), String> {
        let write =
            |path: &Path, what: String| std::fs::write(path, what).map_err(|e| format!("{}: {e}", path.display()));
        let mut home = self.home.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if stalled {
            if self.v2 {
                write(&self.quota, format!("{STALL_QUOTA_US} {STALL_PERIOD_US}"))?;
            } else {
                write(&self.group.join("cpu.cfs_period_us"), STALL_PERIOD_US.to_string())?;
                write(&self.quota, STALL_QUOTA_US.to_string())?;
            }
            let from = self.cgroup_of(pid)?;
            // Every thread of the process (v1 moves one task per write to `tasks`;
            // cgroup.procs moves them all).
            write(&self.group.join("cgroup.procs"), pid.to_string())?;
            *home = Some((pid, from));
            Ok(())
        } else {
            write(&self.quota, if self.v2 { format!("max {STALL_PERIOD_US}") } else { "-1".to_string() })?;
            match home.take() {
                // A process that died meanwhile (a kill during the stall) left the group.
                Some((pid, from)) if Path::new(&format!("/proc/{pid}")).exists() => {
                    write(&from.join("cgroup.procs"), pid.to_string())
                }
                _ => Ok(()),
            }
        }
    }
}

impl Drop for Throttle {
    fn drop(&mut self) {
        let _ = self.set(0, false);
        // Removable only once empty: its processes are gone by then (the gateways drop first).
        let _ = std::fs::remove_dir(&self.group);
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// A healed stall puts the gateway back in the cgroup it came from (nemesis seed 10 at
    /// `--max-devices 1`: left in its own, it stayed starved whenever the machine was busy).
    #[test]
    fn a_healed_stall_moves_the_process_home() {
        let throttle = match Throttle::new(&format!("test-{}", std::process::id())) {
            Ok(throttle) => throttle,
            Err(e) if std::env::var_os("CI").is_none() => {
                eprintln!("skipped: {e} (needs root and a writable cpu cgroup, as the nemesis's stalls do)");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        let mut child = Command::new("sleep").arg("30").spawn().expect("sleep runs");
        let pid = child.id();
        let home = throttle.cgroup_of(pid).expect("its cgroup");
        throttle.set(pid, true).expect("stalled");
        assert_eq!(throttle.cgroup_of(pid).expect("its cgroup"), throttle.group);
        throttle.set(0, false).expect("healed");
        assert_eq!(throttle.cgroup_of(pid).expect("its cgroup"), home);
        let _ = child.kill();
        let _ = child.wait();
    }
}

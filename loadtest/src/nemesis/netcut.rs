//! One gateway's way to a Redis Cluster, under the nemesis's control: the gateway runs in a
//! cgroup of its own, and an iptables `REDIRECT` sends every connection it opens to any
//! cluster server through its own transparent proxy (`Proxy::start_transparent`), which
//! carries the connection on to the server it dialled. Pausing or delaying that proxy cuts
//! or slows the gateway's link to every server at once, whichever server a redirection
//! (`MOVED`, `ASK`, `CLUSTER SLOTS`) sends it to; the cluster's own bus and the nemesis's
//! own commands (failover, `DEBUG SLEEP`) go straight.
//!
//! The rules live in a network namespace of the run's own ([`isolate`]), so nothing is
//! left on the machine when the run ends, however it ends.

use std::path::PathBuf;
use std::process::Command;

/// Moves this process, and every process and thread it starts from now on, into a network
/// namespace of its own with only loopback up. Called before the runtime starts threads: a
/// thread keeps the namespace it was started in.
pub fn isolate() -> Result<(), String> {
    // SAFETY: unshare(2) with a flag and no pointers.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(format!(
            "partition and delay on a Redis Cluster need a network namespace of the run's own \
             (unshare(CLONE_NEWNET) as root): {}; run as root, or leave them out with --faults",
            std::io::Error::last_os_error()
        ));
    }
    run("ip", &["link", "set", "lo", "up"])
}

fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("{program}: {e} (apt-get install iproute2 iptables)"))?;
    if !out.status.success() {
        return Err(format!("{program} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(())
}

/// Where cgroup v2 is mounted: the root on a unified system, `unified/` on a hybrid one.
fn cgroup2_root() -> Result<PathBuf, String> {
    ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.join("cgroup.procs").exists() && p.join("cgroup.subtree_control").exists())
        .ok_or_else(|| "partition and delay on a Redis Cluster need cgroup v2 (iptables -m cgroup)".to_string())
}

/// One gateway's redirection: its cgroup and the nat rule that sends its connections to the
/// cluster's servers through `proxy_port`. Removed when dropped (the gateway's processes
/// must be gone first: a cgroup is removable only once empty).
pub struct Redirect {
    group: PathBuf,
}

impl Redirect {
    /// A cgroup `name` (unique to the run and the node; on a unified system the same as the
    /// stall fault's, so that a stall keeps the gateway in it) and a rule sending its
    /// connections to 127.0.0.1 at `ports` to `proxy_port`.
    pub fn new(name: &str, ports: &[u16], proxy_port: u16) -> Result<Redirect, String> {
        let root = cgroup2_root()?;
        let relative = format!("idlegate-nemesis-{name}");
        let group = root.join(&relative);
        std::fs::create_dir_all(&group).map_err(|e| format!("{}: {e}", group.display()))?;
        let redirect = Redirect { group };
        let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
        let to = proxy_port.to_string();
        run(
            "iptables",
            &[
                "-w",
                "-t",
                "nat",
                "-A",
                "OUTPUT",
                "-p",
                "tcp",
                "-d",
                "127.0.0.1",
                "-m",
                "multiport",
                "--dports",
                &ports.join(","),
                "-m",
                "cgroup",
                "--path",
                &relative,
                "-j",
                "REDIRECT",
                "--to-ports",
                &to,
            ],
        )?;
        Ok(redirect)
    }

    /// The cgroup's `cgroup.procs`: a process that writes `0` to it moves itself in.
    pub fn procs(&self) -> PathBuf {
        self.group.join("cgroup.procs")
    }
}

impl Drop for Redirect {
    fn drop(&mut self) {
        // The rule goes with the namespace; the cgroup is the machine's.
        let _ = std::fs::remove_dir(&self.group);
    }
}

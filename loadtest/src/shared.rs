//! Several loadtest processes in one run (`--shared-dir`, `--processes`): one process holds
//! at most about 19,000 sockets here, so a run over a cluster takes several. They meet in a
//! folder at the end of the run, so the gateways' online count is read while every
//! process's clients are still connected, and checked against their sum.
//!
//! The meeting is a two-phase barrier of files: each process writes `<phase>-<uid base>`
//! (written under a temporary name and renamed, so a reader never sees half a file) and
//! waits until every process has written its own. After `ready` nobody's count changes;
//! after `read` everybody has read the gateways, and the clients may close.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long a process waits for the others at the barrier: they run the same schedule, so
/// they arrive within seconds; a minute means one of them is gone.
const PATIENCE: Duration = Duration::from_secs(60);

/// How often the folder is read while waiting.
const POLL: Duration = Duration::from_millis(50);

/// This process's place in a shared run.
#[derive(Debug, Clone)]
pub struct Shared {
    dir: PathBuf,
    processes: u32,
    /// This process's name in the folder: its first uid, unique by construction.
    me: u64,
}

// === impl Shared ===

impl Shared {
    /// Joins the run in `dir`; refuses a folder an earlier run left files in, whose counts
    /// would be taken for this run's.
    pub fn join(dir: &Path, processes: u32, uid_base: u64) -> Result<Shared, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("--shared-dir {}: {e}", dir.display()))?;
        let shared = Shared { dir: dir.to_path_buf(), processes, me: uid_base };
        if !shared.arrived("ready")?.is_empty() {
            return Err(format!(
                "--shared-dir {}: holds the files of an earlier run; give each run a fresh folder",
                dir.display()
            ));
        }
        Ok(shared)
    }

    /// How many processes share the run.
    pub fn processes(&self) -> u32 {
        self.processes
    }

    /// Posts `value` for `phase` and waits for every process's; returns all of them.
    pub async fn meet(&self, phase: &str, value: i64) -> Result<Vec<i64>, String> {
        let path = self.dir.join(format!("{phase}-{}", self.me));
        let temporary = self.dir.join(format!(".{phase}-{}.tmp", self.me));
        std::fs::write(&temporary, value.to_string())
            .and_then(|()| std::fs::rename(&temporary, &path))
            .map_err(|e| format!("--shared-dir: cannot write {}: {e}", path.display()))?;
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let values = self.arrived(phase)?;
            if values.len() >= self.processes as usize {
                return Ok(values);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(format!(
                    "--shared-dir: {} of {} processes reached '{phase}' within {PATIENCE:?}",
                    values.len(),
                    self.processes
                ));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The values posted for `phase` so far.
    fn arrived(&self, phase: &str) -> Result<Vec<i64>, String> {
        let prefix = format!("{phase}-");
        let entries = std::fs::read_dir(&self.dir).map_err(|e| format!("--shared-dir {}: {e}", self.dir.display()))?;
        let mut values = Vec::new();
        for entry in entries.flatten() {
            if !entry.file_name().to_string_lossy().starts_with(&prefix) {
                continue;
            }
            let text = std::fs::read_to_string(entry.path()).map_err(|e| format!("{}: {e}", entry.path().display()))?;
            values.push(text.trim().parse().map_err(|e| format!("{}: {e}", entry.path().display()))?);
        }
        Ok(values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_process_gets_every_count_and_a_used_folder_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let a = Shared::join(dir.path(), 2, 1).unwrap();
        let b = Shared::join(dir.path(), 2, 1001).unwrap();
        let (ra, rb) = tokio::join!(a.meet("ready", 5), b.meet("ready", 7));
        let (mut ra, mut rb) = (ra.unwrap(), rb.unwrap());
        ra.sort();
        rb.sort();
        assert_eq!(ra, [5, 7]);
        assert_eq!(rb, [5, 7]);
        assert!(Shared::join(dir.path(), 2, 2001).unwrap_err().contains("earlier run"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_missing_process_ends_the_wait_with_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let a = Shared::join(dir.path(), 2, 1).unwrap();
        let err = a.meet("ready", 5).await.unwrap_err();
        assert!(err.contains("1 of 2"), "{err}");
    }
}

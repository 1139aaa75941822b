//! MQTT.js (npm's `mqtt`, unmodified) driven from a test through `tests/data/mqttjs/driver.mjs`:
//! one JSON command a line in, one JSON event a line out.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::time::{timeout, Instant};

use super::{find_on_path, skip_without, PATIENCE};

pub fn mqttjs_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/mqttjs")
}

/// The driver around MQTT.js (`tests/data/mqttjs/driver.mjs`), or `None` after saying how
/// to install what is missing.
pub async fn driver() -> Option<Driver> {
    if find_on_path(&["node"]).is_none() {
        skip_without("node", "apt-get install nodejs npm");
        return None;
    }
    if !mqttjs_dir().join("node_modules/mqtt/package.json").exists() {
        skip_without("MQTT.js", "cd tests/data/mqttjs && npm ci");
        return None;
    }
    let mut child = Command::new("node")
        .arg(mqttjs_dir().join("driver.mjs"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node runs");
    let stdin = child.stdin.take().unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    Some(Driver { _child: child, stdin, lines, seen: VecDeque::new() })
}

/// MQTT.js clients, commanded a line at a time; see `driver.mjs`.
pub struct Driver {
    _child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    /// Events read while waiting for another, oldest first.
    seen: VecDeque<Value>,
}

impl Driver {
    pub async fn send(&mut self, command: Value) {
        self.stdin.write_all(format!("{command}\n").as_bytes()).await.unwrap();
        self.stdin.flush().await.unwrap();
    }

    /// The next `event` of client `id`, waiting up to `PATIENCE` for it; other events stay
    /// for later.
    pub async fn expect(&mut self, id: &str, event: &str) -> Value {
        self.expect_within(id, event, PATIENCE).await
    }

    /// The same, waiting up to `patience`.
    pub async fn expect_within(&mut self, id: &str, event: &str, patience: std::time::Duration) -> Value {
        let wanted = |v: &Value| v["id"] == json!(id) && v["event"] == json!(event);
        if let Some(i) = self.seen.iter().position(wanted) {
            return self.seen.remove(i).unwrap();
        }
        let deadline = Instant::now() + patience;
        loop {
            let line = timeout(deadline - Instant::now(), self.lines.next_line())
                .await
                .unwrap_or_else(|_| panic!("no {event} for {id}; seen {:?}", self.seen))
                .unwrap()
                .expect("the driver runs");
            let got: Value = serde_json::from_str(&line).unwrap();
            if wanted(&got) {
                return got;
            }
            self.seen.push_back(got);
        }
    }
}

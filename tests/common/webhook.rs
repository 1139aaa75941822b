//! The webhook receiver the tests deliver to: `tests/data/webhook/receiver.js` under Node,
//! verifying every request with npm's `standardwebhooks`, as a backend would; the tests
//! read what it got, one JSON line per request.

use std::path::Path;
use std::process::Stdio;

use base64::Engine;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::{skip_without, PATIENCE};

pub const INSTALL: &str = "apt-get install nodejs npm && (cd tests/data/webhook && npm ci)";

pub fn receiver_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/webhook"))
}

pub fn ready() -> bool {
    if super::find_on_path(&["node"]).is_none() || !receiver_dir().join("node_modules/standardwebhooks").is_dir() {
        skip_without("node and the standardwebhooks package", INSTALL);
        return false;
    }
    true
}

/// Two secrets, newest first, and the text of the file holding them.
pub fn secrets() -> (String, String, String) {
    let encode = |b: u8| format!("whsec_{}", base64::engine::general_purpose::STANDARD.encode([b; 32]));
    let (newest, older) = (encode(7), encode(9));
    let file = format!("{newest}\n{older}\n");
    (newest, older, file)
}

/// The receiver, listening on `port`, verifying with `secret`; `env` scripts its failures.
pub struct Receiver {
    // Killed when the receiver is dropped.
    _child: Child,
    pub lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    pub port: u16,
}

impl Receiver {
    pub async fn start(port: u16, secret: &str, env: &[(&str, &str)]) -> Receiver {
        let mut child = Command::new("node")
            .arg(receiver_dir().join("receiver.js"))
            .arg(port.to_string())
            .env("SECRET", secret)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("node runs");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = tokio::time::timeout(PATIENCE, lines.next_line()).await.expect("the receiver starts").unwrap();
        let port = first.as_deref().and_then(|l| l.strip_prefix("LISTENING ")).expect("LISTENING").parse().unwrap();
        Receiver { _child: child, lines, port }
    }

    /// The next request the receiver got.
    pub async fn next(&mut self) -> Value {
        let line = tokio::time::timeout(PATIENCE, self.lines.next_line()).await.expect("a request in time").unwrap();
        serde_json::from_str(&line.expect("the receiver is running")).unwrap()
    }

    /// Requests until the acknowledged ones hold an event matching `done`; all of them.
    pub async fn until(&mut self, done: impl Fn(&Value) -> bool) -> Vec<Value> {
        let mut got = Vec::new();
        loop {
            let request = self.next().await;
            let finished = request["acknowledged"] == true && events(&request).iter().any(&done);
            got.push(request);
            if finished {
                return got;
            }
        }
    }
}

pub fn events(request: &Value) -> Vec<Value> {
    request["body"]["events"].as_array().cloned().unwrap_or_default()
}

/// The acknowledged events of `requests`, in order.
pub fn delivered(requests: &[Value]) -> Vec<Value> {
    requests.iter().filter(|r| r["acknowledged"] == true).flat_map(events).collect()
}

pub fn is(kind: &'static str, uid: u64) -> impl Fn(&Value) -> bool {
    move |e: &Value| e["type"] == kind && e["uid"] == uid
}

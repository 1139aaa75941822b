//! A client program (openssl s_client, gnutls-cli, a Python or Node script) run for a test:
//! its input fed in pieces, its output and exit status collected.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

/// How long one client run may take before it is killed.
pub const CLIENT_PATIENCE: Duration = Duration::from_secs(20);

/// Pause after each piece of input: line-reading clients (s_client, gnutls-cli) act on a
/// line before the next arrives.
const BETWEEN_PIECES: Duration = Duration::from_millis(300);

/// Runs `command` with `input` on its stdin, a piece at a time, then closes its stdin and
/// waits for it to exit (killing it past [`CLIENT_PATIENCE`]): (exit status, stdout and
/// stderr together).
pub fn run_client(mut command: Command, input: &[&[u8]]) -> (Option<i32>, String) {
    let mut child =
        command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("the client runs");
    let mut stdin = child.stdin.take().unwrap();
    let read_all = |mut from: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut out = Vec::new();
            let _ = from.read_to_end(&mut out);
            out
        })
    };
    let stdout = read_all(Box::new(child.stdout.take().unwrap()));
    let stderr = read_all(Box::new(child.stderr.take().unwrap()));
    for piece in input {
        let _ = std::io::Write::write_all(&mut stdin, piece);
        std::thread::sleep(BETWEEN_PIECES);
    }
    drop(stdin);
    let poll = Duration::from_millis(50);
    let mut status = None;
    for _ in 0..CLIENT_PATIENCE.as_millis() / poll.as_millis() {
        if let Some(exit) = child.try_wait().unwrap() {
            status = Some(exit.code());
            break;
        }
        std::thread::sleep(poll);
    }
    let status = status.unwrap_or_else(|| {
        let _ = child.kill();
        let _ = child.wait();
        None
    });
    let out = [stdout, stderr].map(|r| String::from_utf8_lossy(&r.join().unwrap()).into_owned()).concat();
    (status, out)
}

//! Out of file descriptors, tried from outside: the real gateway under `prlimit
//! --nofile=300:300` with `--max-connections 1000`. Twenty clients keep pinging while 600
//! more connect: every one of the 600 gets an answer (a WELCOME, or BYE(server_full) with a
//! retry hint), none waits in silence; `/healthz` and the API keep answering; the twenty are
//! unaffected; and once the 600 leave, new clients are served again.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::{find_on_path, free_addr, http_get, skip_without, wait_listening, Client};
use idlegate_proto::{CloseReason, Frame};
use tokio::time::{sleep, Instant};

const PINGERS: u64 = 20;
const CROWD: u64 = 600;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_out_of_descriptors_answers_everyone_and_recovers() {
    let Some(prlimit) = find_on_path(&["prlimit"]) else {
        return skip_without("prlimit", "apt-get install util-linux");
    };
    let (addr, admin, api) = (free_addr(), free_addr(), free_addr());
    let mut gateway = tokio::process::Command::new(prlimit)
        .arg("--nofile=300:300")
        .arg(env!("CARGO_BIN_EXE_idlegate"))
        .args(["serve", "--listen", &addr.to_string(), "--admin-listen", &admin.to_string()])
        .args(["--api-listen", &api.to_string(), "--max-connections", "1000", "--login-timeout", "30s"])
        .env_remove("IDLEGATE_AUTH_SECRET")
        .env_remove("IDLEGATE_API_TOKEN")
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    wait_listening(addr).await;

    let mut pingers = Vec::new();
    for uid in 0..PINGERS {
        let mut c = Client::connect(addr).await;
        assert!(matches!(c.login(uid).await, Frame::Welcome { .. }));
        pingers.push(c);
    }

    // The crowd: each connects and logs in, and must hear back either way.
    let crowd: Vec<_> = (0..CROWD)
        .map(|i| {
            tokio::spawn(async move {
                let mut c = Client::connect(addr).await;
                c.send(Frame::Login {
                    uid: 1_000 + i,
                    token: bytes::Bytes::new(),
                    device: Default::default(),
                    timeout_ms: None,
                })
                .await;
                match c.recv().await {
                    Some(Frame::Welcome { .. }) => Ok(c),
                    Some(Frame::Bye { reason: CloseReason::ServerFull, text }) => {
                        assert!(idlegate_proto::retry_hint(&text).is_some(), "no retry hint: {text}");
                        Err(())
                    }
                    other => panic!("client {i} got {other:?}"),
                }
            })
        })
        .collect();
    // Meanwhile the probes and the pingers are served.
    for c in &mut pingers {
        c.ping(b"still here").await;
    }
    let mut served = Vec::new();
    let mut refused = 0;
    for task in crowd {
        match task.await.unwrap() {
            Ok(c) => served.push(c),
            Err(()) => refused += 1,
        }
    }
    assert_eq!(http_get(admin, "/healthz").await.0, 200, "the liveness probe is answered");
    assert_eq!(http_get(api, "/v1/online").await.0, 200, "the API is answered");
    for c in &mut pingers {
        c.ping(b"unaffected").await;
    }
    assert!(refused > 0 && !served.is_empty(), "served {} refused {refused}", served.len());
    assert_eq!(served.len() as u64 + refused, CROWD);

    // They leave; new clients are served again.
    drop(served);
    let deadline = Instant::now() + common::PATIENCE;
    loop {
        let mut c = Client::connect(addr).await;
        c.send(Frame::Login { uid: 99_999, token: bytes::Bytes::new(), device: Default::default(), timeout_ms: None })
            .await;
        match c.recv().await {
            Some(Frame::Welcome { .. }) => break,
            _ => assert!(Instant::now() < deadline, "never served again"),
        }
        sleep(Duration::from_millis(100)).await;
    }
    let _ = gateway.kill().await;
}

//! A randomized churn over several gateways on one Redis: logins of a few uids on random
//! nodes, dropped before or after their WELCOME, logouts, kicks through the API of another
//! node, sessions held while others log in. The schedule comes from a seed; what Redis
//! interleaves does not, which is the point: fixed scripts of two logins did not show the
//! defects this finds within seconds. Afterwards an independent checker
//! (`common/checker.rs`) reads the shared stream as a backend would.
//!
//! `IDLEGATE_CHURN_SEEDS=1,2,3` picks other seeds (and as many as wanted) for a longer run.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::checker::{violations, OVERLAP};
use common::cluster::*;
use common::redis::{RedisServer, StreamEvent};
use common::*;
use idlegate::Frame;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The seeds CI runs: each a different schedule, a few seconds each.
const SEEDS: [u64; 3] = [1, 2, 3];
/// Few uids, so that logins of one uid on different nodes meet all the time.
const UIDS: u64 = 12;
/// Clients churning at once, and the steps each takes.
const ACTORS: u64 = 8;
const STEPS: usize = 120;
/// Sessions one actor holds open while it goes on.
const HELD: usize = 3;

fn seeds() -> Vec<u64> {
    match std::env::var("IDLEGATE_CHURN_SEEDS") {
        Ok(list) => list.split(',').filter_map(|s| s.trim().parse().ok()).collect(),
        Err(_) => SEEDS.to_vec(),
    }
}

/// One actor's part of the schedule.
async fn actor(seed: u64, actor: u64, doors: Vec<SocketAddr>, apis: Vec<SocketAddr>) {
    let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(1_000_003).wrapping_add(actor));
    let mut held: Vec<Client> = Vec::new();
    for _ in 0..STEPS {
        let uid = rng.gen_range(0..UIDS);
        let mut client = Client::connect(doors[rng.gen_range(0..doors.len())]).await;
        client.send(Frame::Login { uid, token: bytes::Bytes::new(), device: Default::default() }).await;
        match rng.gen_range(0..6) {
            // Gone before its WELCOME could be read.
            0 => drop(client),
            // Welcomed (or kicked already), then gone.
            1 => {
                client.recv().await;
            }
            // A logout after a moment.
            2 => {
                if matches!(client.recv().await, Some(Frame::Welcome { .. })) {
                    tokio::time::sleep(Duration::from_millis(rng.gen_range(0..20))).await;
                    client.send(Frame::Logout).await;
                    client.recv().await;
                }
            }
            // Kicked through another node's API.
            3 => {
                client.recv().await;
                let api = apis[rng.gen_range(0..apis.len())];
                http(api, "DELETE", &format!("/v1/sessions/{uid}"), &[], "").await;
            }
            // Held while the actor goes on; the oldest held one goes.
            _ => {
                client.recv().await;
                held.push(client);
                if held.len() > HELD {
                    held.remove(0);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(0..5))).await;
    }
}

/// Runs one seed's churn on three gateways; returns the stream Redis holds afterwards.
async fn churn(redis: &RedisServer, seed: u64) -> Vec<StreamEvent> {
    let mut nodes = gateways(&redis.url(), &["a", "b", "c"]).await;
    let doors: Vec<SocketAddr> = nodes.iter().map(|n| n.addr).collect();
    let apis: Vec<SocketAddr> = nodes.iter().map(|n| n.api).collect();
    let tasks: Vec<_> = (0..ACTORS).map(|a| tokio::spawn(actor(seed, a, doors.clone(), apis.clone()))).collect();
    for task in tasks {
        task.await.expect("an actor finished");
    }
    // Every client is gone: every session ends, and every node writes its ends.
    eventually("every uid is offline everywhere", || async {
        redis.cli(&["HLEN", "{idlegate}:users"]).trim() == "0"
            && redis.keys("{idlegate}:sessions:*").iter().all(|k| redis.cli(&["HLEN", k]).trim() == "0")
    })
    .await;
    for node in &mut nodes {
        node.shutdown().await;
    }
    redis.events()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_churn_over_three_gateways_keeps_every_event_promise() {
    for seed in seeds() {
        let Some(redis) = RedisServer::start().await else { return };
        let events = churn(&redis, seed).await;
        let online = events.iter().filter(|e| e.kind == "online").count();
        assert!(online >= ACTORS as usize * STEPS / 2, "seed {seed}: only {online} logins reached the stream");
        let (overlaps, found): (Vec<String>, Vec<String>) =
            violations(&events, 1, true).into_iter().partition(|v| v.contains(OVERLAP));
        for overlap in &overlaps {
            eprintln!("seed {seed}: {overlap}");
        }
        assert!(
            found.is_empty(),
            "seed {seed}: {} violations in {} events; the first ones:\n{}",
            found.len(),
            events.len(),
            found.iter().take(5).cloned().collect::<Vec<_>>().join("\n\n")
        );
        eprintln!(
            "seed {seed}: {online} sessions, {} events, no violation, {} device-bound overlaps",
            events.len(),
            overlaps.len()
        );
    }
}

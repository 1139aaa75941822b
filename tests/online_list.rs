//! `GET /v1/online/uids`, the paged list of who is online, and docs/API.md's recipe for
//! catching up after a gap: scan the pages, then apply the stream's user events after the
//! scan's `as_of`. Held alone and on a three-node cluster (a scan of Redis's users hash),
//! with clients logging in and out all through the scan: the picture the recipe gives is
//! the truth the gateway answers once the churn stops. Also `last_seen_ms` in
//! `POST /v1/presence/query`.

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::cluster::{api_json, cluster_config, eventually, wait_ready};
use common::redis::RedisServer;
use common::{Client, Sse, TestServer};
use idlegate::Config;
use idlegate_proto::Frame;
use serde_json::{json, Value};

/// Every page from the first, `limit` at a time: the uids in order of pages, and `as_of`
/// (asserted the same on every page). `between` runs after each page.
async fn scan(api: SocketAddr, limit: usize, mut between: impl FnMut()) -> (Vec<u64>, String) {
    let (mut uids, mut as_of, mut cursor) = (Vec::new(), None::<String>, None::<String>);
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/online/uids?limit={limit}&cursor={c}"),
            None => format!("/v1/online/uids?limit={limit}"),
        };
        let (status, page) = common::http(api, "GET", &path, &[], "").await;
        assert_eq!(status, 200, "{page}");
        let page: Value = serde_json::from_str(&page).unwrap();
        let got: Vec<u64> = page["uids"].as_array().unwrap().iter().map(|u| u.as_u64().unwrap()).collect();
        assert!(got.len() <= limit, "a page of {} over the limit {limit}", got.len());
        uids.extend(got);
        let this = page["as_of"].as_str().unwrap().to_string();
        assert_eq!(*as_of.get_or_insert(this.clone()), this, "as_of is the scan's");
        between();
        match page["cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => return (uids, as_of.unwrap()),
        }
    }
}

/// Logs uids of `range` in and out on `doors` until `stop`, each uid's sessions coming and
/// going; returns the clients still logged in when it stopped (they stay so).
async fn churn(doors: Vec<SocketAddr>, range: std::ops::Range<u64>, stop: Arc<AtomicBool>) -> Vec<Client> {
    let mut held: Vec<Option<Client>> = (range.start..range.end).map(|_| None).collect();
    let mut k: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        // A fixed walk over the range: each step logs a uid in, or out if it was in.
        k = k.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let i = ((k >> 33) % held.len() as u64) as usize;
        let uid = range.start + i as u64;
        match held[i].take() {
            Some(mut client) => {
                client.send(Frame::Logout).await;
                client.recv().await;
            }
            None => {
                let mut client = Client::connect(doors[i % doors.len()]).await;
                assert!(matches!(client.login(uid).await, Frame::Welcome { .. }));
                held[i] = Some(client);
            }
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    held.into_iter().flatten().collect()
}

/// The recipe: the scan's uids, then the stream's `user_online` and `user_offline` after
/// `as_of`, read from `api` until `until` (an event id the stream has reached) is applied.
async fn replay(api: SocketAddr, as_of: &str, scanned: &[u64], until: &str) -> BTreeSet<u64> {
    let mut picture: BTreeSet<u64> = scanned.iter().copied().collect();
    let header = format!("Last-Event-ID: {as_of}");
    let (status, mut sse) = Sse::open(api, "/v1/events", &[&header]).await;
    assert_eq!(status, 200);
    loop {
        let event = sse.next().await.expect("the stream goes on");
        assert_ne!(event.event, "gap", "the log kept everything after as_of");
        match event.event.as_str() {
            "user_online" => {
                picture.insert(event.data["uid"].as_u64().unwrap());
            }
            "user_offline" => {
                picture.remove(&event.data["uid"].as_u64().unwrap());
            }
            _ => {}
        }
        if event.id == until {
            return picture;
        }
    }
}

/// The uids of `range` online now, by `POST /v1/presence/query`.
async fn truth(gw: &TestServer, range: std::ops::Range<u64>) -> BTreeSet<u64> {
    let body = json!({ "uids": range.collect::<Vec<_>>() }).to_string();
    let (status, answer) = api_json(gw, "POST", "/v1/presence/query", &body).await;
    assert_eq!(status, 200);
    answer["online"].as_array().unwrap().iter().map(|u| u.as_u64().unwrap()).collect()
}

/// The newest event id, as a consumer "from now" would start after it: a marker event
/// logged by `uid` logging in, read from the stream.
async fn mark(gw: &TestServer, uid: u64) -> (String, Client) {
    let (_, mut sse) = Sse::open(gw.api, "/v1/events", &[]).await;
    let mut client = gw.client().await;
    assert!(matches!(client.login(uid).await, Frame::Welcome { .. }));
    loop {
        let event = sse.next().await.unwrap();
        if event.event == "user_online" && event.data["uid"] == uid {
            return (event.id, client);
        }
    }
}

/// Pages of a gateway alone: in order of uid, at most `limit`, every uid once; a cursor it
/// did not hand out, a limit out of range and an unknown parameter are refused (400).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alone_the_pages_list_every_uid_online_once_in_order() {
    let gw = TestServer::start(Config::default()).await;
    let mut clients = Vec::new();
    for uid in 1..=250u64 {
        let mut c = gw.client().await;
        assert!(matches!(c.login(uid * 7).await, Frame::Welcome { .. }));
        clients.push(c);
    }
    let (uids, _) = scan(gw.api, 100, || {}).await;
    assert_eq!(uids, (1..=250u64).map(|u| u * 7).collect::<Vec<_>>());
    for (path, said) in [
        ("/v1/online/uids?cursor=nonsense", "cursor"),
        ("/v1/online/uids?limit=0", "limit"),
        ("/v1/online/uids?limit=10001", "limit"),
        ("/v1/online/uids?page=2", "page"),
    ] {
        let (status, body) = common::http(gw.api, "GET", path, &[], "").await;
        assert_eq!(status, 400, "{path}: {body}");
        assert!(body.contains(said), "{path}: {body}");
    }
}

/// The recipe alone, clients logging in and out through the whole scan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alone_the_recipe_gives_the_exact_picture_under_churn() {
    let gw = TestServer::start(Config::default()).await;
    the_recipe_gives_the_exact_picture_under_churn(&gw, vec![gw.addr]).await;
}

/// The recipe on a three-node cluster: the pages scan Redis's users hash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_the_recipe_gives_the_exact_picture_under_churn() {
    let Some(redis) = RedisServer::start().await else { return };
    let mut nodes = Vec::new();
    for name in ["a", "b", "c"] {
        let gw = TestServer::start(cluster_config(&redis.url(), name)).await;
        wait_ready(&gw).await;
        nodes.push(gw);
    }
    let doors = nodes.iter().map(|n| n.addr).collect();
    the_recipe_gives_the_exact_picture_under_churn(&nodes[0], doors).await;
}

async fn the_recipe_gives_the_exact_picture_under_churn(gw: &TestServer, doors: Vec<SocketAddr>) {
    const UIDS: std::ops::Range<u64> = 1_000..1_400;
    let stop = Arc::new(AtomicBool::new(false));
    let churning = tokio::spawn(churn(doors, UIDS, stop.clone()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Small pages, with time between them: the churn moves on all through the scan.
    let (scanned, as_of) = scan(gw.api, 25, || std::thread::sleep(Duration::from_millis(20))).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    let _still_in = churning.await.unwrap();
    // Everything the churn did is in the stream before this marker.
    let (until, _marker) = mark(gw, 1).await;
    let picture = replay(gw.api, &as_of, &scanned, &until).await;
    let mut want = truth(gw, UIDS).await;
    want.insert(1);
    assert!(!want.is_empty() && want.len() < UIDS.count(), "the churn left some uids online, not all");
    assert_eq!(picture, want);
}

/// A uid in its offline grace is online as a user: it is on the pages, on a cluster too
/// (its field stays in the users hash until its `user_offline`), and leaves them after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_uid_in_its_offline_grace_is_listed_until_its_user_offline() {
    let Some(redis) = RedisServer::start().await else { return };
    let config = Config { offline_grace: Duration::from_secs(2), ..cluster_config(&redis.url(), "a") };
    let gw = TestServer::start(config).await;
    wait_ready(&gw).await;
    let mut client = gw.client().await;
    assert!(matches!(client.login(77).await, Frame::Welcome { .. }));
    eventually("the login reached Redis", || async { scan(gw.api, 10, || {}).await.0 == [77] }).await;
    drop(client);
    eventually("its session ended, its grace begun", || async {
        common::cluster::presence(&gw, 77).await["grace_until_ms"].is_u64()
    })
    .await;
    let (uids, _) = scan(gw.api, 10, || {}).await;
    assert_eq!(uids, [77], "in its grace");
    eventually("the grace runs out", || async { scan(gw.api, 10, || {}).await.0.is_empty() }).await;
}

/// `POST /v1/presence/query` says when each offline uid was last online, when known; alone
/// and on a cluster (pipelined reads of keys spread over the shards).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_says_when_each_offline_uid_was_last_seen() {
    let Some(redis) = RedisServer::start().await else { return };
    let alone = TestServer::start(Config::default()).await;
    let node = TestServer::start(cluster_config(&redis.url(), "a")).await;
    wait_ready(&node).await;
    for gw in [&alone, &node] {
        let mut client = gw.client().await;
        assert!(matches!(client.login(5).await, Frame::Welcome { .. }));
        client.send(Frame::Logout).await;
        client.recv().await;
        let mut online = gw.client().await;
        assert!(matches!(online.login(6).await, Frame::Welcome { .. }));
        let body = json!({ "uids": [5, 6, 9] }).to_string();
        eventually("uid 5's end is remembered", || async {
            let (_, answer) = api_json(gw, "POST", "/v1/presence/query", &body).await;
            answer["last_seen_ms"]["5"].as_u64().is_some()
        })
        .await;
        let (_, answer) = api_json(gw, "POST", "/v1/presence/query", &body).await;
        assert_eq!(answer["online"], json!([6]));
        assert_eq!(answer["offline"], json!([5, 9]));
        let seen = answer["last_seen_ms"].as_object().unwrap();
        assert_eq!(seen.keys().collect::<Vec<_>>(), ["5"], "{answer}");
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
        assert!(seen["5"].as_u64().unwrap().abs_diff(now) < 60_000, "{answer}");
    }
}

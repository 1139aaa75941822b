//! Watch lists and status over real sockets on one gateway: the snapshot and the changes a
//! watcher gets, the policies (`listed` with the backend's lists and a token's claim,
//! `open`, `none`), the bounds, and an independent checker of every watcher's view against
//! the event stream under random churn.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::watch_checker::{check, states, Seen, StreamUserEvent};
use common::{http, short_config, Client, Sse, TestServer, PATIENCE};
use idlegate::{Config, JwtAuth, JwtRules, WatchConfig, WatchPolicy};
use idlegate_proto::{CloseReason, Frame, PresenceEntry, PresenceKind};
use rand::{Rng, SeedableRng};
use tokio::sync::Mutex;

fn config(policy: WatchPolicy) -> Config {
    Config { watch: WatchConfig { policy: Some(policy), ..WatchConfig::default() }, ..short_config() }
}

/// The next PRESENCE frame (PONGs skipped).
async fn presence(client: &mut Client) -> (PresenceKind, Vec<PresenceEntry>) {
    loop {
        match client.recv().await {
            Some(Frame::Presence { kind, entries }) => return (kind, entries),
            Some(Frame::Pong(_)) => {}
            other => panic!("expected PRESENCE, got {other:?}"),
        }
    }
}

/// One entry's (uid, online, status).
fn brief(entries: &[PresenceEntry]) -> Vec<(u64, bool, &str)> {
    entries.iter().map(|e| (e.uid, e.online, e.status.as_str())).collect()
}

fn nobody(uid: u64) -> PresenceEntry {
    PresenceEntry { uid, online: false, at_ms: 0, status: String::new(), last_seen_ms: None }
}

#[tokio::test]
async fn a_watcher_gets_a_snapshot_then_each_transition_once_in_the_stream_s_order() {
    let server = TestServer::start(config(WatchPolicy::Open)).await;
    let (_, mut sse) = Sse::open(server.api, "/v1/events?types=user_online,user_offline,status", &[]).await;
    let mut watcher = server.client().await;
    watcher.login(1).await;
    sse.expect("user_online", 1).await;
    // A uid that never logged in; repeats count once.
    watcher.send(Frame::Watch(vec![2, 2])).await;
    assert_eq!(presence(&mut watcher).await, (PresenceKind::Snapshot, vec![nobody(2)]));

    let mut watched = server.client().await;
    watched.login(2).await;
    let (kind, entries) = presence(&mut watcher).await;
    assert_eq!((kind, brief(&entries)), (PresenceKind::Change, vec![(2, true, "")]));
    let online = sse.expect("user_online", 2).await;
    assert_eq!(entries[0].at_ms, online.data["at_ms"].as_u64().unwrap(), "at_ms is the user event's");

    watched.send(Frame::Status("away ☕".into())).await;
    let (_, entries) = presence(&mut watcher).await;
    assert_eq!(brief(&entries), [(2, true, "away ☕")]);
    let status = sse.expect("status", 2).await;
    assert_eq!(status.data["status"], "away ☕");
    // The same status again is no change, for the watcher; the stream logs what was set.
    watched.send(Frame::Status("away ☕".into())).await;
    sse.expect("status", 2).await;

    // A second watcher's snapshot has the status.
    let mut second = server.client().await;
    second.login(3).await;
    sse.expect("user_online", 3).await;
    second.send(Frame::Watch(vec![2])).await;
    let (kind, entries) = presence(&mut second).await;
    assert_eq!((kind, brief(&entries)), (PresenceKind::Snapshot, vec![(2, true, "away ☕")]));

    watched.send(Frame::Logout).await;
    watched.expect_bye(CloseReason::Logout).await;
    let offline = sse.expect("user_offline", 2).await;
    for client in [&mut watcher, &mut second] {
        let (kind, entries) = presence(client).await;
        assert_eq!((kind, brief(&entries)), (PresenceKind::Change, vec![(2, false, "")]), "the status ends with it");
        assert_eq!(entries[0].last_seen_ms, offline.data["ended_ms"].as_u64());
    }
    // The next online stretch begins with no status; an UNWATCH stops the changes.
    second.send(Frame::Unwatch(vec![2])).await;
    second.ping(b"after unwatch").await;
    let mut again = server.client().await;
    again.login(2).await;
    let (_, entries) = presence(&mut watcher).await;
    assert_eq!(brief(&entries), [(2, true, "")]);
    second.ping(b"nothing came").await;
    let metrics = server.admin_get("/metrics").await.1;
    assert_eq!(common::sample(&metrics, r#"idlegate_presence_entries_total{kind="snapshot"}"#), Some(2.0));
    assert_eq!(common::sample(&metrics, r#"idlegate_presence_entries_total{kind="change"}"#), Some(5.0));
    assert_eq!(common::sample(&metrics, "idlegate_watch_entries"), Some(1.0));
    assert_eq!(common::sample(&metrics, r#"idlegate_events_total{type="status"}"#), Some(2.0));
}

#[tokio::test]
async fn under_listed_only_the_backend_s_list_is_watched_and_a_shrunk_list_revokes() {
    let server =
        TestServer::start(Config { watch: WatchConfig { max_watch: 3, ..WatchConfig::default() }, ..short_config() })
            .await;
    listed_and_revoked(&[server]).await;
}

/// The same on two gateways sharing one Redis: the lists live in Redis, put through one
/// node and read through the other; the watcher is on the first node, its lists changed
/// and the uids it watches moved through the second, whose change reaches the first
/// node's fan-out through its inbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_cluster_the_lists_live_in_redis_and_a_change_through_any_node_revokes() {
    let Some(redis) = common::redis::RedisServer::start().await else { return };
    let mut nodes = Vec::new();
    for node in ["a", "b"] {
        let config = common::cluster::cluster_config(&redis.url(), node);
        let watch = WatchConfig { max_watch: 3, ..WatchConfig::default() };
        let server = TestServer::start(Config { watch, ..config }).await;
        common::cluster::wait_ready(&server).await;
        nodes.push(server);
    }
    listed_and_revoked(&nodes).await;
    assert_eq!(redis.keys("idlegate:watchlist:*"), Vec::<String>::new(), "the deleted list left nothing");
}

/// Under `listed`, with the lists put, read and deleted through the last of `nodes`, the
/// watched uids moved there too, and the watcher on the first.
async fn listed_and_revoked(nodes: &[TestServer]) {
    let (first, server) = (&nodes[0], &nodes[nodes.len() - 1]);
    let (code, body) = http(server.api, "PUT", "/v1/watchlists/1", &[], r#"{"uids": ["2", 2]}"#).await;
    assert_eq!((code, body.as_str()), (200, r#"{"uid":1,"uids":["2"]}"#), "strings in, strings out");
    assert_eq!(http(first.api, "GET", "/v1/watchlists/1", &[], "").await, (200, r#"{"uid":1,"uids":[2]}"#.into()));
    let (code, body) = http(server.api, "PUT", "/v1/watchlists/9", &[], r#"{"uids": [1, 2, 3, 4]}"#).await;
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("--max-watch"), "{body}");
    assert_eq!(http(server.api, "PUT", "/v1/watchlists/9", &[], r#"{"uids": 1}"#).await.0, 400);
    assert_eq!(http(server.api, "GET", "/v1/watchlists/9", &[], "").await.0, 404);

    let mut two = server.client().await;
    two.login(2).await;
    let mut three = server.client().await;
    three.login(3).await;
    // In a cluster a WELCOME does not wait for Redis: the snapshot says online once the
    // stream does, as presence does.
    let query = r#"{"uids": [2, 3]}"#;
    common::cluster::eventually("2 and 3 are online in the stream", || async {
        http(first.api, "POST", "/v1/presence/query", &[], query).await.1.contains(r#""online":[2,3]"#)
    })
    .await;
    let mut watcher = first.client().await;
    watcher.login(1).await;
    watcher.send(Frame::Watch(vec![3, 2])).await;
    // 3 is online, and not listed: it reads as a uid that never logged in.
    let (kind, entries) = presence(&mut watcher).await;
    assert_eq!(kind, PresenceKind::Snapshot);
    let by_uid: HashMap<u64, &PresenceEntry> = entries.iter().map(|e| (e.uid, e)).collect();
    assert_eq!((by_uid[&2].online, by_uid[&3]), (true, &nobody(3)));
    // 3's transitions never reach it; 2's do.
    three.send(Frame::Logout).await;
    three.expect_bye(CloseReason::Logout).await;
    two.send(Frame::Status("busy".into())).await;
    assert_eq!(brief(&presence(&mut watcher).await.1), [(2, true, "busy")]);

    // The list now holds 3, not 2: 2 is revoked, and told as nobody.
    assert_eq!(http(server.api, "PUT", "/v1/watchlists/1", &[], r#"{"uids": [3]}"#).await.0, 200);
    assert_eq!(presence(&mut watcher).await, (PresenceKind::Change, vec![nobody(2)]));
    two.send(Frame::Status("gone".into())).await;
    watcher.send(Frame::Watch(vec![3])).await;
    let (kind, entries) = presence(&mut watcher).await;
    assert_eq!((kind, entries[0].online), (PresenceKind::Snapshot, false));
    assert!(entries[0].last_seen_ms.is_some(), "listed now: its real state, last seen included");
    assert_eq!(http(server.api, "DELETE", "/v1/watchlists/1", &[], "").await.0, 204);
    assert_eq!(presence(&mut watcher).await, (PresenceKind::Change, vec![nobody(3)]));
    assert_eq!(http(server.api, "DELETE", "/v1/watchlists/1", &[], "").await.0, 404);
    watcher.ping(b"nothing else").await;
}

#[tokio::test]
async fn a_token_s_watch_claim_lists_whom_its_session_may_watch() {
    let dir = tempfile::tempdir().unwrap();
    let script = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/jwt/watch_claim.py"));
    let ok = std::process::Command::new("python3").args(["-c", "import jwt"]).status().is_ok_and(|s| s.success());
    if !ok {
        common::skip_without("PyJWT", "python3 -m pip install pyjwt cryptography");
        return;
    }
    let out = std::process::Command::new("python3").arg(script).arg(dir.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let tokens: HashMap<String, String> = serde_json::from_slice(&out.stdout).unwrap();
    let rules = JwtRules { watch_claim: Some("contacts".into()), ..JwtRules::default() };
    let jwt = JwtAuth::load(None, Some(&dir.path().join("secret.txt")), rules).unwrap();
    let server = TestServer::start(Config { jwt: Some(jwt), ..short_config() }).await;

    let mut watcher = server.client().await;
    assert!(matches!(watcher.login_with(1, tokens["listed"].as_bytes()).await, Frame::Welcome { .. }));
    let mut two = server.client().await;
    assert!(matches!(two.login_with(4, tokens["bare"].as_bytes()).await, Frame::Welcome { .. }));
    // 2 and 3 are in the claim (a number and a string); 4 is online but not.
    watcher.send(Frame::Watch(vec![2, 3, 4])).await;
    let (_, entries) = presence(&mut watcher).await;
    assert_eq!(entries.iter().find(|e| e.uid == 4), Some(&nobody(4)));
    assert_eq!(entries.len(), 3);
    // A claim that is not an array of uids refuses the token.
    let mut bad = server.client().await;
    match bad.login_with(5, tokens["bad"].as_bytes()).await {
        Frame::Bye { reason: CloseReason::AuthFailed, text } => assert!(text.contains("contacts"), "{text}"),
        other => panic!("expected BYE(auth_failed), got {other:?}"),
    }
}

#[tokio::test]
async fn policy_none_refuses_the_frames_and_bounds_close_with_their_flag() {
    let server = TestServer::start(config(WatchPolicy::None)).await;
    for frame in [Frame::Watch(vec![2]), Frame::Unwatch(vec![2]), Frame::Status("hi".into())] {
        let mut client = server.client().await;
        client.login(1).await;
        client.send(frame).await;
        let text = client.expect_bye(CloseReason::ProtocolError).await;
        assert!(text.contains("--watch-policy none"), "{text}");
    }

    let server = TestServer::start(Config {
        watch: WatchConfig { policy: Some(WatchPolicy::Open), max_watch: 3, max_entries: 4, ..WatchConfig::default() },
        ..short_config()
    })
    .await;
    let mut a = server.client().await;
    a.login(1).await;
    a.send(Frame::Watch(vec![7, 8, 9])).await;
    assert_eq!(presence(&mut a).await.1.len(), 3);
    // A list may not pass --max-watch, nor the node --max-watch-entries.
    a.send(Frame::Watch(vec![10])).await;
    assert!(a.expect_bye(CloseReason::ProtocolError).await.contains("--max-watch"));
    let mut b = server.client().await;
    b.login(2).await;
    b.send(Frame::Watch(vec![7, 8])).await;
    assert_eq!(presence(&mut b).await.1.len(), 2, "a's entries went with its connection");
    let mut c = server.client().await;
    c.login(3).await;
    c.send(Frame::Watch(vec![7, 8, 9])).await;
    assert!(c.expect_bye(CloseReason::ServerFull).await.contains("--max-watch-entries"));
    let mut d = server.client().await;
    d.login(4).await;
    d.send(Frame::Status("x".repeat(65))).await;
    assert!(d.expect_bye(CloseReason::ProtocolError).await.contains("--max-status-bytes"));
    // A malformed WATCH is a protocol error that names it; everyone else is served.
    let mut e = server.client().await;
    e.login(5).await;
    e.send_raw(&common::raw_frame(idlegate_proto::kind::WATCH, b"\x01\x02\x03")).await;
    assert!(e.expect_bye(CloseReason::ProtocolError).await.contains("WATCH"));
    b.ping(b"still served").await;
    let metrics = server.admin_get("/metrics").await.1;
    assert_eq!(common::sample(&metrics, r#"idlegate_watch_refused_total{bound="session"}"#), Some(1.0));
    assert_eq!(common::sample(&metrics, r#"idlegate_watch_refused_total{bound="node"}"#), Some(1.0));
}

/// What one watcher got, uid by uid.
type Views = Arc<Mutex<HashMap<u64, Vec<Seen>>>>;

/// Reads `client`'s PRESENCE frames into `views` until the connection closes; until `stop`,
/// every few milliseconds it also UNWATCHes one of `own` and WATCHes it again at once, so
/// the uid leaves the index (nobody else watches it) and comes back with a fresh snapshot
/// taken in the middle of the churn.
fn record(mut client: Client, own: Vec<u64>, views: Views, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut next = 0;
        loop {
            tokio::select! {
                frame = client.recv() => {
                    let Some(frame) = frame else { return };
                    let Frame::Presence { kind, entries } = frame else { continue };
                    let mut views = views.lock().await;
                    for e in entries {
                        let view = (e.online, e.status);
                        let seen = if kind == PresenceKind::Change { Seen::Change(view) } else { Seen::State(view) };
                        views.entry(e.uid).or_default().push(seen);
                    }
                }
                () = tokio::time::sleep(Duration::from_millis(3)), if !stop.load(Ordering::Relaxed) => {
                    let uid = own[next % own.len()];
                    next += 1;
                    client.send(Frame::Unwatch(vec![uid])).await;
                    client.send(Frame::Watch(vec![uid])).await;
                }
            }
        }
    })
}

/// Random logins, logouts, drops and statuses of `uids` (two devices each) by four clients
/// at once (`grace`: with an offline grace), on one gateway or, with `redis`, on three
/// gateways sharing it, each login on a node drawn from the seed; watched by watchers (on
/// every node) that log in and WATCH them all throughout, so their snapshots land in the
/// middle of the churn. At the end, once every uid is offline, a marker uid every watcher
/// watches logs in: once each has seen it, everything before it in the stream has been
/// delivered. Then each watcher's view of each uid is checked against the stream.
async fn churn(seed: u64, grace: Duration, redis: Option<&str>) {
    const UIDS: u64 = 12;
    const CHURNERS: u64 = 4;
    const STEPS: usize = 200;
    const WATCHERS: u64 = 12;
    const MARKER: u64 = 999;
    let config = |node: &str| {
        let base = match redis {
            Some(url) => common::cluster::cluster_config(url, node),
            None => short_config(),
        };
        Config {
            max_devices: 2,
            offline_grace: grace,
            timeout: Duration::from_secs(30),
            tick: Duration::from_millis(100),
            watch: WatchConfig { policy: Some(WatchPolicy::Open), ..WatchConfig::default() },
            ..base
        }
    };
    let mut servers = Vec::new();
    for node in if redis.is_some() { &["a", "b", "c"][..] } else { &["a"][..] } {
        let server = TestServer::start(config(node)).await;
        if redis.is_some() {
            common::cluster::wait_ready(&server).await;
        }
        servers.push(server);
    }
    let server = &servers[0];
    let doors: Vec<std::net::SocketAddr> = servers.iter().map(|s| s.addr).collect();
    let (_, mut sse) = Sse::open(server.api, "/v1/events?types=user_online,user_offline,status", &[]).await;
    // Each churner moves its own uids: uid u belongs to churner u % CHURNERS.
    let churners: Vec<_> = (0..CHURNERS)
        .map(|c| {
            let doors = doors.clone();
            tokio::spawn(async move {
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed * 100 + c);
                let mine: Vec<u64> = (1..=UIDS).filter(|u| u % CHURNERS == c).collect();
                let mut sessions: HashMap<(u64, usize), Client> = HashMap::new();
                for _ in 0..STEPS {
                    let key = (mine[rng.gen_range(0..mine.len())], rng.gen_range(0..2usize));
                    match (sessions.remove(&key), rng.gen_range(0..4)) {
                        (None, _) => {
                            let mut client = Client::connect(doors[rng.gen_range(0..doors.len())]).await;
                            client.login_device(key.0, ["phone", "laptop"][key.1]).await;
                            sessions.insert(key, client);
                        }
                        (Some(mut client), 0) => client.send(Frame::Logout).await,
                        (Some(client), 1) => drop(client),
                        (Some(mut client), _) => {
                            let status = ["", "away", "busy", "in a call"][rng.gen_range(0..4)];
                            client.send(Frame::Status(status.into())).await;
                            sessions.insert(key, client);
                        }
                    }
                }
                for (_, mut client) in sessions.drain() {
                    client.send(Frame::Logout).await;
                }
            })
        })
        .collect();
    // Each uid is watched by two watchers, so an UNWATCH sometimes leaves it watched (the
    // snapshot then comes from the index) and sometimes not (from the registry).
    let stop = Arc::new(AtomicBool::new(false));
    let mut views = Vec::new();
    let mut readers = Vec::new();
    for w in 0..WATCHERS {
        let own: Vec<u64> = (1..=UIDS).filter(|u| u % (WATCHERS / 2) == w % (WATCHERS / 2)).collect();
        let mut client = servers[w as usize % servers.len()].client().await;
        client.login(100 + w).await;
        client.send(Frame::Watch(own.iter().copied().chain([MARKER]).collect())).await;
        let views_of = Views::default();
        readers.push(record(client, own, views_of.clone(), stop.clone()));
        views.push((w, views_of));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for churner in churners {
        churner.await.unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    // Once every uid is offline as a user (its grace over too), the marker's login goes
    // last through the stream and through each watcher's fan-out.
    let all: Vec<String> = (1..=UIDS).map(|uid| uid.to_string()).collect();
    let query = format!(r#"{{"uids": [{}]}}"#, all.join(","));
    tokio::time::timeout(PATIENCE, async {
        while !http(server.api, "POST", "/v1/presence/query", &[], &query).await.1.contains(r#""online":[]"#) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("every uid went offline");
    let mut marker = server.client().await;
    marker.login(MARKER).await;
    let mut events = Vec::new();
    loop {
        let e = sse.next().await.expect("the stream goes on");
        let uid = e.data["uid"].as_u64().unwrap();
        if uid == MARKER {
            break;
        }
        let event = match e.event.as_str() {
            "user_online" => StreamUserEvent::Online,
            "user_offline" => StreamUserEvent::Offline,
            "status" => StreamUserEvent::Status(e.data["status"].as_str().unwrap().to_string()),
            other => panic!("{other}"),
        };
        if (1..=UIDS).contains(&uid) {
            events.push((uid, event));
        }
    }
    let marked =
        |seen: Option<&Vec<Seen>>| seen.is_some_and(|seen| seen.last() == Some(&Seen::Change((true, String::new()))));
    tokio::time::timeout(PATIENCE, async {
        for (_, views_of) in &views {
            while !marked(views_of.lock().await.get(&MARKER)) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    })
    .await
    .expect("every watcher saw the marker");
    let states = states(&events);
    let mut found = Vec::new();
    let mut mid_stream = 0;
    for (w, views_of) in &views {
        let views_of = views_of.lock().await;
        for uid in (1..=UIDS).filter(|u| u % (WATCHERS / 2) == w % (WATCHERS / 2)) {
            let seen = views_of.get(&uid).cloned().unwrap_or_default();
            assert!(!seen.is_empty(), "watcher {w} got no snapshot of uid {uid}");
            mid_stream += usize::from(seen[0] != Seen::State((false, String::new())));
            let empty = Vec::new();
            let violations = check(uid, &seen, states.get(&uid).unwrap_or(&empty));
            found.extend(violations.into_iter().map(|v| format!("watcher {w}: {v}")));
        }
    }
    assert!(found.is_empty(), "seed {seed}: {} violations:\n{}", found.len(), found.join("\n"));
    let transitions: usize = states.values().map(|s| s.len() - 1).sum();
    assert!(transitions > 100, "the churn made {transitions} transitions: too few to check anything");
    assert!(mid_stream > 0, "no snapshot landed while a uid was online: the churn did not overlap the watches");
    for reader in readers {
        reader.abort();
    }
    drop(marker);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_random_churn_every_watcher_s_view_is_the_stream_s_from_its_snapshot_on() {
    for seed in [1, 2, 3] {
        churn(seed, Duration::ZERO, None).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_offline_grace_too() {
    for seed in [4, 5] {
        churn(seed, Duration::from_millis(300), None).await;
    }
}

/// The same on three gateways sharing one Redis: each watcher's fan-out follows the
/// cluster's stream, snapshots come from Redis (`PRESENCE_OF`), and logins, statuses and
/// takeovers land on any node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_three_gateways_every_watcher_s_view_is_the_stream_s_too() {
    for (seed, grace) in [(6, Duration::ZERO), (7, Duration::from_millis(300))] {
        let Some(redis) = common::redis::RedisServer::start().await else { return };
        churn(seed, grace, Some(&redis.url())).await;
    }
}

#[test]
fn the_watch_checker_finds_a_repeat_a_hole_and_a_stale_end() {
    let on = || (true, String::new());
    let off = || (false, String::new());
    let away = || (true, "away".to_string());
    let events = vec![
        (7, StreamUserEvent::Online),
        (7, StreamUserEvent::Status("away".into())),
        (7, StreamUserEvent::Status("away".into())),
        (7, StreamUserEvent::Offline),
        (7, StreamUserEvent::Online),
    ];
    let states = &states(&events)[&7];
    assert_eq!(states.len(), 5, "a status set again is no transition");
    let good = [Seen::State(on()), Seen::Change(away()), Seen::Change(off()), Seen::Change(on())];
    assert!(check(7, &good, states).is_empty());
    let from_start =
        [Seen::State(off()), Seen::Change(on()), Seen::Change(away()), Seen::Change(off()), Seen::Change(on())];
    assert!(check(7, &from_start, states).is_empty());
    let repeat = [Seen::State(on()), Seen::Change(away()), Seen::Change(away())];
    assert!(!check(7, &repeat, states).is_empty());
    let hole = [Seen::State(away()), Seen::Change(on())];
    assert!(!check(7, &hole, states).is_empty());
    let stale = [Seen::State(on()), Seen::Change(away())];
    assert!(!check(7, &stale, states).is_empty());
    let resync = [Seen::State(on()), Seen::State(off()), Seen::Change(on())];
    assert!(check(7, &resync, states).is_empty());
    assert!(!check(7, &[Seen::Change(on())], states).is_empty(), "a change before a snapshot");
}

//! The Rust client library (`crates/idlegate-client`) against a real gateway over real
//! sockets, by every door: it logs in, receives pushes, sends DATA a backend sees, keeps
//! itself alive from WELCOME, comes back after a restart no sooner than the gateway's hint,
//! stays away after a kick or a logout until asked, and replaces a refused token.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use bytes::Bytes;
use common::tls::{doors, server_with};
use common::{free_addr, http, sample, short_config, Sse, TestServer, PATIENCE};
use idlegate::{Auth, Config};
use idlegate_client::{Backoff, Client, Event, Events, Options, SendError, State, TokenError};
use idlegate_proto::CloseReason;
use serde_json::json;
use tokio::time::{timeout, Instant};

/// Longest wait for a client to come back after a restart: the gateway's shutdown hints
/// reach 11 s.
const RESTART_PATIENCE: Duration = Duration::from_secs(20);

/// The next event that is not a push, or a failure after [`PATIENCE`].
async fn next_state(events: &mut Events) -> State {
    next_state_within(events, PATIENCE).await
}

async fn next_state_within(events: &mut Events, patience: Duration) -> State {
    loop {
        match timeout(patience, events.recv()).await.expect("a state change in time").expect("the client runs") {
            Event::State(state) => return state,
            Event::Push(_) | Event::Refreshed { .. } | Event::Presence { .. } => {}
        }
    }
}

/// Waits until the client is online; its session id.
async fn online(events: &mut Events) -> String {
    online_within(events, PATIENCE).await
}

async fn online_within(events: &mut Events, patience: Duration) -> String {
    loop {
        match next_state_within(events, patience).await {
            State::Online { session, .. } => return session,
            State::Connecting { .. } => {}
            other => panic!("expected to come online, got {other:?}"),
        }
    }
}

/// The next push, skipping state changes.
async fn next_push(events: &mut Events) -> Bytes {
    loop {
        match timeout(PATIENCE, events.recv()).await.expect("a push in time").expect("the client runs") {
            Event::Push(payload) => return payload,
            Event::State(_) | Event::Refreshed { .. } | Event::Presence { .. } => {}
        }
    }
}

async fn push(server: &TestServer, uid: u64, payload: &[u8]) {
    let body = json!({"uids": [uid], "payload": BASE64.encode(payload)}).to_string();
    let (status, answer) = http(server.api, "POST", "/v1/push", &[], &body).await;
    assert_eq!(status, 200, "{answer}");
}

async fn pings(server: &TestServer) -> f64 {
    let (_, body) = server.admin_get("/metrics").await;
    sample(&body, "idlegate_frames_received_total{kind=\"ping\"}").unwrap_or(0.0)
}

#[tokio::test]
async fn every_door_logs_in_receives_a_push_and_sends_data_a_backend_sees() {
    let (mut server, ca, _dir) = server_with(short_config()).await;
    let (_, mut backend) = Sse::open(server.api, "/v1/events?types=online,offline,data", &[]).await;
    for (uid, (transport, addr)) in (1u64..).zip(doors(&server)) {
        let mut options = Options::new(uid);
        if let Some(ca) = &ca {
            options = options.ca_pem(&std::fs::read(&ca.cert).unwrap()).unwrap();
        }
        let url = format!("{transport}://{addr}");
        let (client, mut events) = Client::connect(&url, options).unwrap();
        let session = online(&mut events).await;
        assert_eq!(session.len(), 16, "{transport}: a session id of 16 hex digits: {session}");
        assert_eq!(backend.expect("online", uid).await.data["session"], json!(session), "{transport}");

        push(&server, uid, b"to you").await;
        assert_eq!(next_push(&mut events).await, Bytes::from_static(b"to you"), "{transport}");
        client.try_send(&b"from me"[..]).unwrap();
        let data = backend.expect("data", uid).await;
        assert_eq!(data.data["payload"], json!(BASE64.encode("from me")), "{transport}");

        client.logout();
        let state = next_state(&mut events).await;
        assert_eq!(state, State::Offline { reason: CloseReason::Logout, text: String::new(), retry_in: None });
        assert_eq!(backend.expect("offline", uid).await.data["reason"], json!("logout"), "{transport}");
    }
    server.shutdown().await;
}

/// Issue 50: a client that asks for a timeout of its own gets the gateway's class for it,
/// says so in its state, and pings after a third of what it got.
#[tokio::test]
async fn a_client_asks_for_its_own_timeout_and_pings_at_a_third_of_what_it_got() {
    // Classes of short_config's 100 ms tick from 600 ms up: 1.4 s is one (each at most a
    // quarter above the one before, whole ticks), or the next above it.
    let config = short_config();
    let classes = config.timeout_classes();
    let granted = classes.timeout_ms(classes.for_asked(1_400, None));
    assert!((1_400..=1_750).contains(&granted), "{granted}");
    let mut server = TestServer::start(config).await;
    let options = Options::new(19).timeout(Duration::from_millis(1_400));
    let (client, mut events) = Client::connect(&format!("tcp://{}", server.addr), options).unwrap();
    assert_eq!(next_state(&mut events).await, State::Connecting { attempt: 0 });
    match next_state(&mut events).await {
        State::Online { timeout, keepalive, .. } => {
            assert_eq!(timeout, Duration::from_millis(granted));
            assert_eq!(keepalive, Duration::from_millis(granted) / 3);
        }
        other => panic!("{other:?}"),
    }
    // Silent for longer than the default 600 ms timeout: its own keeps it, on its pings.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_online(&client);
    server.shutdown().await;
}

#[tokio::test]
async fn it_pings_after_a_third_of_the_timeout_of_silence_and_data_saves_the_pings() {
    // short_config: timeout 600 ms, so a keepalive of 200 ms.
    let mut server = TestServer::start(short_config()).await;
    let (_, mut backend) = Sse::open(server.api, "/v1/events?types=offline", &[]).await;
    let (client, mut events) = Client::connect(&format!("tcp://{}", server.addr), Options::new(9)).unwrap();
    let keepalive = match next_state(&mut events).await {
        State::Connecting { attempt: 0 } => match next_state(&mut events).await {
            State::Online { timeout, keepalive, .. } => {
                assert_eq!(timeout, Duration::from_millis(600));
                keepalive
            }
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    };
    assert_eq!(keepalive, Duration::from_millis(200));

    // Silent for five timeouts: alive on its pings alone, about one per keepalive.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let silent = pings(&server).await;
    assert!((8.0..=16.0).contains(&silent), "{silent} pings in 3 s of silence with a 200 ms keepalive");
    assert_online(&client);

    // DATA every 50 ms for two seconds: activity enough, no ping needed.
    for _ in 0..40 {
        client.try_send(&b"busy"[..]).unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let busy = pings(&server).await - silent;
    assert!(busy <= 1.0, "{busy} pings while DATA went out every 50 ms");

    client.close();
    let offline = backend.expect("offline", 9).await;
    assert_eq!(offline.data["reason"], json!("disconnect"), "never expired: {offline:?}");
    server.shutdown().await;
}

fn assert_online(client: &Client) {
    let state = client.state();
    assert!(matches!(state, State::Online { .. }), "{state:?}");
}

#[tokio::test]
async fn after_a_restart_it_comes_back_no_sooner_than_the_hint_with_what_it_queued() {
    let config = short_config();
    let mut server = TestServer::start(config.clone()).await;
    let options = Options::new(4).max_queued(3);
    let (client, mut events) = Client::connect(&format!("tcp://{}", server.addr), options).unwrap();
    online(&mut events).await;

    server.shutdown().await;
    let (text, retry_in) = match next_state(&mut events).await {
        State::Offline { reason: CloseReason::Shutdown, text, retry_in: Some(retry_in) } => (text, retry_in),
        other => panic!("expected BYE(shutdown) with a retry, got {other:?}"),
    };
    let cut = Instant::now();
    let hint = Duration::from_millis(idlegate_proto::retry_hint(&text).expect("a shutdown BYE carries a hint"));
    assert!(retry_in >= hint, "waits {retry_in:?}, less than the hint {hint:?}");

    // While it is away, three messages wait; the fourth comes back.
    for n in 0..3u8 {
        client.try_send(vec![n]).unwrap();
    }
    assert_eq!(client.try_send(vec![3]), Err(SendError::Full(Bytes::from(vec![3]))));

    let mut server = server.restart(config).await;
    let (_, mut backend) = Sse::open(server.api, "/v1/events?types=online,data", &[]).await;
    online_within(&mut events, RESTART_PATIENCE).await;
    assert!(cut.elapsed() >= hint, "back after {:?}, before the hint of {hint:?}", cut.elapsed());
    backend.expect("online", 4).await;
    for n in 0..3u8 {
        assert_eq!(backend.expect("data", 4).await.data["payload"], json!(BASE64.encode([n])));
    }
    server.shutdown().await;
}

#[tokio::test]
async fn kicked_by_a_newer_login_of_its_device_it_stays_away_until_asked() {
    let mut server = TestServer::start(short_config()).await;
    let url = format!("ws://{}", server.ws);
    let options = || Options::new(5).device("phone".parse().unwrap());
    let (first, mut first_events) = Client::connect(&url, options()).unwrap();
    online(&mut first_events).await;
    let (second, mut second_events) = Client::connect(&url, options()).unwrap();
    online(&mut second_events).await;

    match next_state(&mut first_events).await {
        State::Offline { reason: CloseReason::Kicked, retry_in: None, .. } => {}
        other => panic!("expected a kick with no retry, got {other:?}"),
    }
    // It stays away: the second keeps its session for longer than a timeout.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(matches!(second.state(), State::Online { .. }), "{:?}", second.state());
    assert!(matches!(first.state(), State::Offline { .. }), "{:?}", first.state());

    // Asked, it takes the session back.
    first.reconnect();
    online(&mut first_events).await;
    assert!(matches!(next_state(&mut second_events).await, State::Offline { reason: CloseReason::Kicked, .. }));
    server.shutdown().await;
}

#[tokio::test]
async fn a_refused_token_is_asked_for_again_with_refresh() {
    let auth = Auth::new("s3cret");
    let mut server = TestServer::start(Config { auth: Some(auth.clone()), ..short_config() }).await;
    let asked = Arc::new(Mutex::new(Vec::new()));
    let provider = {
        let asked = asked.clone();
        move |uid: u64, refresh: bool| {
            asked.lock().unwrap().push(refresh);
            // A cached token that has expired, until the client asks for a fresh one.
            let expiry = if refresh { idlegate_proto::unix_now() + 600 } else { idlegate_proto::unix_now() - 1 };
            let token = auth.mint(uid, expiry);
            async move { Ok::<_, TokenError>(token) }
        }
    };
    let fast = Backoff { base: Duration::from_millis(10), cap: Duration::from_millis(50) };
    let options = Options::new(6).token_provider(provider).backoff(fast);
    let (_client, mut events) = Client::connect(&format!("tcp://{}", server.addr), options).unwrap();
    assert!(matches!(next_state(&mut events).await, State::Connecting { attempt: 0 }));
    match next_state(&mut events).await {
        State::Offline { reason: CloseReason::AuthFailed, retry_in: Some(_), .. } => {}
        other => panic!("expected BYE(auth_failed), got {other:?}"),
    }
    online(&mut events).await;
    assert_eq!(*asked.lock().unwrap(), [false, true]);
    server.shutdown().await;
}

#[tokio::test]
async fn a_gateway_that_is_not_there_is_retried_in_growing_windows() {
    let backoff = Backoff { base: Duration::from_millis(20), cap: Duration::from_millis(80) };
    let url = format!("tcp://{}", free_addr());
    let (client, mut events) = Client::connect(&url, Options::new(1).backoff(backoff)).unwrap();
    for attempt in 0..5 {
        assert_eq!(next_state(&mut events).await, State::Connecting { attempt });
        match next_state(&mut events).await {
            State::Offline { reason: CloseReason::Disconnect, text, retry_in: Some(wait) } => {
                assert!(wait <= backoff.window(attempt), "attempt {attempt}: {wait:?}");
                assert!(text.contains("refused"), "says why: {text}");
            }
            other => panic!("{other:?}"),
        }
    }
    client.close();
    loop {
        if let State::Offline { retry_in: None, text, .. } = next_state(&mut events).await {
            assert_eq!(text, "closed by the application");
            break;
        }
    }
    assert!(timeout(PATIENCE, events.recv()).await.unwrap().is_none(), "the task ends");
}

/// An application that stops reading its events does not stop the keepalive: pushes past
/// the events channel wait in the client while it goes on pinging, the session outlives
/// many timeouts, and every push arrives once the application reads again. Before, the
/// task waited on the full channel inside the loop that pings, and the gateway expired the
/// session while `state()` still said `Online`.
#[tokio::test]
async fn an_application_that_stops_reading_does_not_stop_the_keepalive() {
    // short_config: timeout 600 ms.
    let mut server = TestServer::start(short_config()).await;
    let (_, mut backend) = Sse::open(server.api, "/v1/events?types=offline", &[]).await;
    let (client, mut events) = Client::connect(&format!("tcp://{}", server.addr), Options::new(11)).unwrap();
    let session = online(&mut events).await;
    const PUSHES: usize = 400;
    for i in 0..PUSHES {
        push(&server, 11, format!("{i}").as_bytes()).await;
    }
    // Five timeouts while nobody reads.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_online(&client);
    let (_, presence) = http(server.api, "GET", "/v1/presence/11", &[], "").await;
    let presence: serde_json::Value = serde_json::from_str(&presence).unwrap();
    assert_eq!(presence["sessions"][0]["session"], json!(session), "the same session, still online: {presence}");
    for i in 0..PUSHES {
        assert_eq!(next_push(&mut events).await, Bytes::from(format!("{i}")), "every push, in order");
    }
    client.close();
    assert_eq!(backend.expect("offline", 11).await.data["reason"], json!("disconnect"), "never expired");
    server.shutdown().await;
}

/// An application further behind than the client keeps for it is told so: the session
/// ends here as a slow consumer (state `Offline`, then a reconnect), not with pushes
/// vanishing unseen.
#[tokio::test]
async fn an_application_far_behind_ends_its_session_as_a_slow_consumer() {
    let mut server = TestServer::start(short_config()).await;
    let (client, mut events) = Client::connect(&format!("tcp://{}", server.addr), Options::new(12)).unwrap();
    online(&mut events).await;
    let body = json!({"uids": [12], "payload": BASE64.encode("x")}).to_string();
    for _ in 0..2_000 {
        http(server.api, "POST", "/v1/push", &[], &body).await;
    }
    let mut pushes = 0;
    let state = loop {
        match timeout(PATIENCE, events.recv()).await.expect("an event").expect("the client runs") {
            Event::Push(_) => pushes += 1,
            Event::State(state) => break state,
            Event::Refreshed { .. } | Event::Presence { .. } => {}
        }
    };
    match state {
        State::Offline { reason: CloseReason::SlowConsumer, text, retry_in: Some(_) } => {
            assert!(text.contains("events behind"), "{text}")
        }
        other => panic!("expected a slow-consumer end after {pushes} pushes, got {other:?}"),
    }
    online(&mut events).await;
    client.close();
    server.shutdown().await;
}

/// A WebSocket upgrade the gateway has no room for is answered 503 with `Retry-After`; the
/// client reads it as BYE(server_full) and waits at least that long.
#[tokio::test]
async fn a_503_upgrade_is_retried_no_sooner_than_its_retry_after() {
    let mut server = TestServer::start(Config { max_connections: 1, ..short_config() }).await;
    let mut held = server.client().await;
    assert!(matches!(held.login(1).await, idlegate_proto::Frame::Welcome { .. }));
    let (client, mut events) = Client::connect(&format!("ws://{}", server.ws), Options::new(13)).unwrap();
    loop {
        match next_state(&mut events).await {
            State::Connecting { .. } => {}
            State::Offline { reason: CloseReason::ServerFull, text, retry_in: Some(retry_in) } => {
                let hint = idlegate_proto::retry_hint(&text).expect("the Retry-After as the hint");
                assert!(hint >= 1_000 && hint.is_multiple_of(1_000), "whole seconds: {text}");
                assert!(retry_in >= Duration::from_millis(hint), "{retry_in:?} before the {hint} ms hint");
                break;
            }
            other => panic!("expected a server_full refusal, got {other:?}"),
        }
    }
    client.close();
    server.shutdown().await;
}

/// The next PRESENCE the client hands over, as (kind, [(uid, online, status)]).
async fn next_presence(events: &mut Events) -> (idlegate_client::PresenceKind, Vec<(u64, bool, String)>) {
    next_presence_within(events, PATIENCE).await
}

async fn next_presence_within(
    events: &mut Events,
    patience: Duration,
) -> (idlegate_client::PresenceKind, Vec<(u64, bool, String)>) {
    loop {
        match timeout(patience, events.recv()).await.expect("a presence in time").expect("the client runs") {
            Event::Presence { kind, entries } => {
                return (kind, entries.into_iter().map(|e| (e.uid, e.online, e.status)).collect());
            }
            Event::State(_) | Event::Push(_) | Event::Refreshed { .. } => {}
        }
    }
}

/// `watch` and `set_status` before the first connection, sent once it is up; a change of
/// the watched uid handed over; and after a restart of the gateway, the list watched again
/// (a fresh snapshot) and the status set again (a `status` event on the new gateway).
#[tokio::test]
async fn the_client_watches_uids_sets_its_status_and_does_both_again_after_a_restart() {
    use idlegate::{WatchConfig, WatchPolicy};
    use idlegate_client::PresenceKind;
    let config =
        Config { watch: WatchConfig { policy: Some(WatchPolicy::Open), ..WatchConfig::default() }, ..short_config() };
    let mut server = TestServer::start(config.clone()).await;
    let (_, mut stream) = Sse::open(server.api, "/v1/events?types=status", &[]).await;
    let options = Options::new(1).backoff(Backoff { base: Duration::from_millis(50), cap: Duration::from_millis(100) });
    let (client, mut events) = Client::connect(&format!("tcp://{}", server.addr), options).unwrap();
    client.watch([7]);
    client.set_status("reading");
    assert_eq!(next_presence(&mut events).await, (PresenceKind::Snapshot, vec![(7, false, String::new())]));
    assert_eq!(stream.expect("status", 1).await.data["status"], json!("reading"));
    let mut seven = server.client().await;
    seven.login(7).await;
    assert_eq!(next_presence(&mut events).await, (PresenceKind::Change, vec![(7, true, String::new())]));
    client.unwatch([7]);
    client.watch([8]);
    assert_eq!(next_presence(&mut events).await, (PresenceKind::Snapshot, vec![(8, false, String::new())]));

    server.shutdown().await;
    let server = server.restart(config).await;
    let (_, mut stream) = Sse::open(server.api, "/v1/events?types=status", &[]).await;
    // The new gateway (after its shutdown's retry hint): 8 watched again (7 no longer), the
    // status set again.
    assert_eq!(
        next_presence_within(&mut events, RESTART_PATIENCE).await,
        (PresenceKind::Snapshot, vec![(8, false, String::new())])
    );
    assert_eq!(stream.expect("status", 1).await.data["status"], json!("reading"));
    client.close();
}

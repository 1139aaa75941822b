//! Tokens that expire inside a live session (`--enforce-token-expiry`) and their refresh
//! over the live connection, against a real gateway, with tokens minted by PyJWT
//! (`tests/data/jwt/series.py`: token k of a uid expires 20 + 15k s after minting):
//!
//! - the Rust client (`idlegate-client`) refreshes a 20-second token three times in one
//!   session, its id unchanged, and the backend sees one `online` carrying the token's
//!   claims, in the presence answer too;
//! - on every frame door (TCP, TLS, WebSocket, WSS): REFRESH answered by REFRESHED with the
//!   new expiry, then BYE(token_expired) once that expiry passes, never before it (close
//!   4010 on WebSocket), the `offline` event saying `token_expired` with the claims; and a
//!   REFRESH carrying another uid's token ends the session as auth_failed;
//! - MQTT 5 (MQTT.js, unmodified) re-authenticates with AUTH (0x19) under the
//!   `idlegate-token` method and is answered AUTH (Success) with the expiry; a session that
//!   does not refresh gets DISCONNECT 0xA0; another uid's token gets DISCONNECT 0x87; an
//!   MQTT 3.1.1 session, which has no way to refresh, is closed at its token's expiry.
//!
//! Needs Python with `pyjwt` (and Node with MQTT.js for the MQTT part); skips without them,
//! except under CI.

mod common;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::jwt::{claims, config, exp, mint};
use common::mqttjs::driver;
use common::tls::{doors, server_with};
use common::ws::{DoorClient, Got};
use common::{http, unix_ms, Sse, TestServer};
use idlegate_client::{Client, Event, Options, State, TokenError};
use idlegate_proto::{unix_now, CloseReason, Frame, Transport, BYE_CLOSE_BASE};
use serde_json::{json, Value};
use tokio::time::{sleep, timeout};

/// How long a session of these tests may take: its tokens run for at most a minute.
const SESSION_PATIENCE: Duration = Duration::from_secs(90);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_client_refreshes_a_20_second_token_three_times_in_one_session() {
    const UID: u64 = 7;
    let dir = tempfile::tempdir().unwrap();
    let Some(mut tokens) = mint(dir.path(), 4, &[UID]) else { return };
    let server = TestServer::start(config(dir.path())).await;
    let (_, mut backend) = Sse::open(server.api, "/v1/events?types=online,offline", &[]).await;
    let tokens = tokens.remove(&UID).unwrap();
    let expiries: Vec<u64> = tokens.iter().map(|t| exp(t)).collect();
    let handed = Arc::new(Mutex::new(VecDeque::from(tokens)));
    let provider = {
        let handed = handed.clone();
        move |_uid: u64, _refresh: bool| {
            let next = handed.lock().unwrap().pop_front();
            async move { next.ok_or_else(|| TokenError::from("no token left")) }
        }
    };
    let options = Options::new(UID).token_provider(provider);
    let (client, mut events) = Client::connect(&format!("tcp://{}", server.addr), options).unwrap();
    let mut sessions = Vec::new();
    let mut refreshed = Vec::new();
    while refreshed.len() < 3 {
        match timeout(SESSION_PATIENCE, events.recv()).await.expect("events in time").expect("the client runs") {
            Event::State(State::Online { session, .. }) => sessions.push(session),
            Event::State(State::Connecting { .. }) => {}
            Event::State(other) => panic!("the session ended: {other:?}"),
            Event::Refreshed { expires } => refreshed.push(expires),
            Event::Push(_) | Event::Presence { .. } => {}
        }
    }
    assert_eq!(sessions.len(), 1, "one session: {sessions:?}");
    assert_eq!(refreshed, expiries[1..], "each REFRESHED says the new token's exp");
    assert!(handed.lock().unwrap().is_empty(), "the provider was asked for each refresh");
    assert!(matches!(client.state(), State::Online { session, .. } if session == sessions[0]));

    // The backend saw one online, with the token's claims, and no offline.
    let online = backend.expect("online", UID).await;
    assert_eq!(online.data["session"], json!(sessions[0]));
    assert_eq!(online.data["claims"], claims(UID));
    let (status, presence) = http(server.api, "GET", &format!("/v1/presence/{UID}"), &[], "").await;
    let presence: Value = serde_json::from_str(&presence).unwrap();
    assert_eq!((status, presence["sessions"][0]["claims"].clone()), (200, claims(UID)), "{presence}");
    client.logout();
    let offline = backend.expect("offline", UID).await;
    assert_eq!((offline.data["reason"].clone(), offline.data["claims"].clone()), (json!("logout"), claims(UID)));
}

/// Logs in on `transport` with `token`; the WELCOME's session id.
async fn login(client: &mut DoorClient, uid: u64, token: &str) -> String {
    let token = Bytes::copy_from_slice(token.as_bytes());
    client.send(Frame::Login { uid, token, device: Default::default(), timeout_ms: None }).await;
    match client.recv().await {
        Got::Frame(Frame::Welcome { session, .. }) => session,
        other => panic!("no WELCOME: {other:?}"),
    }
}

/// Pings every 5 s until the gateway says something other than PONG; that, and when.
async fn ping_until_told(client: &mut DoorClient) -> (Got, u64) {
    timeout(SESSION_PATIENCE, async {
        loop {
            client.send(Frame::Ping(Bytes::new())).await;
            match timeout(Duration::from_secs(5), client.recv()).await {
                Ok(Got::Frame(Frame::Pong(_))) => sleep(Duration::from_secs(5)).await,
                Ok(told) => return (told, unix_ms()),
                Err(_) => {}
            }
        }
    })
    .await
    .expect("the gateway ends the session in time")
}

/// One door: a refresh taken, then the session ended at the new token's expiry.
async fn refresh_then_expire(
    transport: Transport,
    addr: std::net::SocketAddr,
    ca: Option<&common::tls::TestCa>,
    uid: u64,
    tokens: &[String],
) {
    let mut client = DoorClient::connect(transport, addr, ca).await;
    login(&mut client, uid, &tokens[0]).await;
    sleep(Duration::from_secs(10)).await;
    client.send(Frame::Refresh(Bytes::copy_from_slice(tokens[1].as_bytes()))).await;
    let expires = exp(&tokens[1]);
    loop {
        match client.recv().await {
            Got::Frame(Frame::Refreshed { expires: told }) => {
                assert_eq!(told, expires, "{transport}");
                break;
            }
            Got::Frame(Frame::Pong(_)) => {}
            other => panic!("{transport}: no REFRESHED: {other:?}"),
        }
    }
    let (told, at_ms) = ping_until_told(&mut client).await;
    // Never before the expiry (the wall clock and the gateway's ticks agree to a few ms).
    assert!(at_ms + 50 >= expires * 1000, "{transport}: ended {} ms before its exp", expires * 1000 - at_ms);
    match told {
        Got::Frame(Frame::Bye { reason: CloseReason::TokenExpired, .. }) => {}
        other => panic!("{transport}: expected BYE(token_expired), got {other:?}"),
    }
    if matches!(transport, Transport::Ws | Transport::Wss) {
        let code = BYE_CLOSE_BASE + 10;
        assert_eq!(client.recv().await, Got::Close(code, "token_expired".into()), "{transport}");
    }
}

/// One door: a REFRESH carrying another uid's token ends the session.
async fn refresh_with_another_uid(
    transport: Transport,
    addr: std::net::SocketAddr,
    ca: Option<&common::tls::TestCa>,
    uid: u64,
    mine: &str,
    other: &str,
) {
    let mut client = DoorClient::connect(transport, addr, ca).await;
    login(&mut client, uid, mine).await;
    client.send(Frame::Refresh(Bytes::copy_from_slice(other.as_bytes()))).await;
    match client.recv().await {
        Got::Frame(Frame::Bye { reason: CloseReason::AuthFailed, text }) => {
            assert_eq!(text, r#"REFRESH refused: JWT uid claim "sub" names another uid"#, "{transport}");
        }
        other => panic!("{transport}: expected BYE(auth_failed), got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_frame_door_refreshes_then_ends_the_session_at_the_new_token_s_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let uids = [101, 102, 103, 104, 201, 202, 203, 204, 999];
    let Some(tokens) = mint(dir.path(), 2, &uids) else { return };
    let (server, ca, _tls_dir) = server_with(config(dir.path())).await;
    let (_, mut backend) = Sse::open(server.api, "/v1/events?types=offline", &[]).await;
    let doors = doors(&server);
    let expiring = doors.iter().enumerate().map(|(i, &(transport, addr))| {
        let uid = 101 + i as u64;
        refresh_then_expire(transport, addr, ca.as_ref(), uid, &tokens[&uid])
    });
    let refused = doors.iter().enumerate().map(|(i, &(transport, addr))| {
        let uid = 201 + i as u64;
        refresh_with_another_uid(transport, addr, ca.as_ref(), uid, &tokens[&uid][0], &tokens[&999][0])
    });
    futures_util::future::join(futures_util::future::join_all(expiring), futures_util::future::join_all(refused)).await;
    let mut reasons = HashMap::new();
    for _ in 0..2 * doors.len() {
        let offline = backend.next().await.expect("an offline event");
        let uid = offline.data["uid"].as_u64().unwrap();
        assert_eq!(offline.data["claims"], claims(uid), "{:?}", offline.data);
        reasons.insert(uid, offline.data["reason"].as_str().unwrap().to_string());
    }
    for i in 0..doors.len() as u64 {
        assert_eq!(reasons[&(101 + i)], "token_expired");
        assert_eq!(reasons[&(201 + i)], "auth_failed");
    }
    assert_eq!(server.metrics.closed_count(CloseReason::TokenExpired), doors.len() as u64);
}

/// MQTT 5 reason codes the test reads.
const NOT_AUTHORIZED: u64 = 0x87;
const MAXIMUM_CONNECT_TIME: u64 = 0xA0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_5_re_authenticates_under_idlegate_token_and_mqtt_3_1_1_ends_at_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let Some(tokens) = mint(dir.path(), 2, &[301, 302, 303, 304, 999]) else { return };
    let Some(mut mqtt) = driver().await else { return };
    let server = TestServer::start(config(dir.path())).await;
    let url = format!("mqtt://{}", server.mqtt);
    let enhanced = |id: &str, uid: u64, token: &str| {
        json!({"op": "connect", "id": id, "url": url, "username": uid.to_string(), "protocolVersion": 5,
               "keepalive": 5, "authMethod": "idlegate-token", "authData": token})
    };
    // 301 refreshes, 303 does not, 304 refreshes with another uid's token: all MQTT 5 with
    // the token as Authentication Data. 302 is MQTT 3.1.1 with the token as password.
    for (id, uid) in [("refreshing", 301), ("silent", 303), ("other", 304)] {
        mqtt.send(enhanced(id, uid, &tokens[&uid][0])).await;
        mqtt.expect(id, "connect").await;
    }
    mqtt.send(json!({"op": "connect", "id": "old", "url": url, "username": "302", "password": tokens[&302][0],
                     "protocolVersion": 4, "keepalive": 5}))
        .await;
    mqtt.expect("old", "connect").await;

    mqtt.send(json!({"op": "reauth", "id": "other", "authData": tokens[&999][0]})).await;
    assert_eq!(mqtt.expect("other", "disconnect").await["reasonCode"], json!(NOT_AUTHORIZED));

    sleep(Duration::from_secs(10)).await;
    mqtt.send(json!({"op": "reauth", "id": "refreshing", "authData": tokens[&301][1]})).await;
    let auth = mqtt.expect("refreshing", "auth").await;
    assert_eq!(
        (auth["reasonCode"].clone(), auth["expires"].clone()),
        (json!(0), json!(exp(&tokens[&301][1]).to_string()))
    );

    // The first tokens expire 20 s after minting: the silent MQTT 5 session is told 0xA0, the
    // 3.1.1 one is closed (3.1.1 has no code), the refreshed one stays until its new exp.
    let disconnect = mqtt.expect_within("silent", "disconnect", SESSION_PATIENCE).await;
    assert_eq!(disconnect["reasonCode"], json!(MAXIMUM_CONNECT_TIME));
    assert!(unix_ms() + 50 >= exp(&tokens[&303][0]) * 1000, "never before the exp");
    mqtt.expect_within("old", "close", SESSION_PATIENCE).await;
    assert!(unix_now() < exp(&tokens[&301][1]), "the refreshed session outlived its first token");
    let refreshed = mqtt.expect_within("refreshing", "disconnect", SESSION_PATIENCE).await;
    assert_eq!(refreshed["reasonCode"], json!(MAXIMUM_CONNECT_TIME));
    assert!(unix_ms() + 50 >= exp(&tokens[&301][1]) * 1000);
    assert_eq!(server.metrics.closed_count(CloseReason::TokenExpired), 3);
}

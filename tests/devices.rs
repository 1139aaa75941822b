//! Several devices per uid over real sockets: each session lives and expires on its own,
//! pushes reach every device (or the one named), the (n+1)-th device evicts the least
//! recently active, a relogin kicks only its own device, and a backend sees exactly one
//! `user_online` and one `user_offline` per time the uid as a whole came and went.

mod common;

use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use bytes::Bytes;
use common::{http, raw_frame, short_config, Client, Sse, TestServer};
use idlegate::Config;
use idlegate_proto::{kind, CloseReason, Frame};
use serde_json::{json, Value};

fn devices(n: usize) -> Config {
    Config { max_devices: n, node_id: "node-a".into(), ..short_config() }
}

async fn api(server: &TestServer, method: &str, path: &str, body: &Value) -> (u16, Value) {
    let body = if body.is_null() { String::new() } else { body.to_string() };
    let (status, text) = http(server.api, method, path, &[], &body).await;
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn push(server: &TestServer, body: Value) -> Value {
    let (status, answer) = api(server, "POST", "/v1/push", &body).await;
    assert_eq!(status, 200, "{answer}");
    answer
}

/// Pings `client` every tick until `other` receives a frame, which it returns: keeps one
/// device alive while another falls silent.
async fn keep_alive_until(client: &mut Client, other: &mut Client) -> Option<Frame> {
    let mut every = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            frame = other.recv() => return frame,
            _ = every.tick() => client.ping(b"k").await,
        }
    }
}

#[tokio::test]
async fn two_devices_of_one_uid_get_pushes_and_a_backend_sees_the_user_come_and_go_once() {
    let mut server = TestServer::start(devices(2)).await;
    let (_, mut events) = Sse::open(server.api, "/v1/events", &[]).await;
    let mut phone = server.client().await;
    let phone_session = phone.login_device(7, "phone").await;
    let online = events.expect("online", 7).await;
    assert_eq!((online.data["device"].clone(), online.data["session"].clone()), (json!("phone"), json!(phone_session)));
    events.expect("user_online", 7).await;
    let mut desktop = server.client().await;
    let desktop_session = desktop.login_device(7, "desktop").await;
    assert_ne!(phone_session, desktop_session);
    let online = events.expect("online", 7).await;
    assert_eq!(online.data["device"], json!("desktop"));
    assert_eq!((server.metrics.online_users.get(), server.metrics.online_sessions.get()), (1, 2));

    // Presence lists both; the top level is the most recently active one's.
    desktop.ping(b"p").await;
    let (_, presence) = api(&server, "GET", "/v1/presence/7", &Value::Null).await;
    let sessions = presence["sessions"].as_array().unwrap();
    let mut names: Vec<&str> = sessions.iter().map(|s| s["device"].as_str().unwrap()).collect();
    names.sort_unstable();
    assert_eq!(names, ["desktop", "phone"], "{presence}");
    assert!(sessions.iter().all(|s| s["node"] == "node-a" && s["silent_ms"].is_u64()), "{presence}");

    // A push reaches both devices; one naming a device reaches that one only.
    let hi = BASE64.encode(b"hi");
    let answer = push(&server, json!({"uids": [7, 8], "payload": hi})).await;
    assert_eq!(answer, json!({"sent": [7], "offline": [8], "unsubscribed": [], "sessions": 2}));
    for c in [&mut phone, &mut desktop] {
        assert_eq!(c.recv().await, Some(Frame::Push(Bytes::from_static(b"hi"))));
    }
    let answer = push(&server, json!({"uids": [7], "payload": BASE64.encode(b"to phone"), "device": "phone"})).await;
    assert_eq!(answer, json!({"sent": [7], "offline": [], "unsubscribed": [], "sessions": 1}));
    assert_eq!(phone.recv().await, Some(Frame::Push(Bytes::from_static(b"to phone"))));
    let answer = push(&server, json!({"uids": [7], "payload": hi, "device": "tablet"})).await;
    assert_eq!(answer, json!({"sent": [], "offline": [7], "unsubscribed": [], "sessions": 0}));

    // The phone falls silent while the desktop pings: the phone alone expires, and the uid
    // stays online as a user.
    let bye = keep_alive_until(&mut desktop, &mut phone).await;
    assert!(matches!(bye, Some(Frame::Bye { reason: CloseReason::IdleTimeout, .. })), "{bye:?}");
    let offline = events.expect("offline", 7).await;
    assert_eq!(
        (offline.data["device"].clone(), offline.data["reason"].clone()),
        (json!("phone"), json!("idle_timeout"))
    );
    assert_eq!((server.metrics.online_users.get(), server.metrics.online_sessions.get()), (1, 1));

    // The desktop logs out: its offline, then the uid's user_offline with that reason.
    desktop.send(Frame::Logout).await;
    desktop.expect_bye(CloseReason::Logout).await;
    let offline = events.expect("offline", 7).await;
    assert_eq!(
        (offline.data["session"].clone(), offline.data["device"].clone()),
        (json!(desktop_session), json!("desktop"))
    );
    let user_offline = events.expect("user_offline", 7).await;
    assert_eq!(user_offline.data["reason"], json!("logout"));
    assert_eq!((server.metrics.online_users.get(), server.metrics.online_sessions.get()), (0, 0));
    let (_, presence) = api(&server, "GET", "/v1/presence/7", &Value::Null).await;
    let seen = user_offline.data["ended_ms"].clone();
    assert_eq!(presence, json!({"uid": 7, "online": false, "sessions": [], "last_seen_ms": seen}));
    server.shutdown().await;
    assert_eq!(events.next().await, None, "nothing else was logged");
}

#[tokio::test]
async fn a_device_over_the_limit_evicts_the_least_recently_active_and_a_relogin_kicks_only_its_own() {
    let mut server = TestServer::start(devices(2)).await;
    let (_, mut events) = Sse::open(server.api, "/v1/events?types=online,offline,user_online,user_offline", &[]).await;
    let mut a = server.client().await;
    a.login_device(5, "a").await;
    let mut b = server.client().await;
    b.login_device(5, "b").await;
    for _ in 0..3 {
        events.next().await.unwrap();
    }
    // a speaks on a later tick than b's login: b is the least recently active.
    tokio::time::sleep(Duration::from_millis(250)).await;
    a.ping(b"late").await;
    let mut c = server.client().await;
    c.login_device(5, "c").await;
    let text = b.expect_bye(CloseReason::Kicked).await;
    assert!(text.contains("least recently active of 2 devices"), "{text}");
    let evicted = events.expect("offline", 5).await;
    assert_eq!((evicted.data["device"].clone(), evicted.data["reason"].clone()), (json!("b"), json!("kicked")));
    assert_eq!(events.expect("online", 5).await.data["device"], json!("c"));

    // A relogin of device a kicks a's old session only; c is untouched, and the uid never
    // went away (no user events).
    let mut a2 = server.client().await;
    a2.login_device(5, "a").await;
    assert_eq!(a.expect_bye(CloseReason::Kicked).await, "", "a relogin's BYE says nothing of devices");
    assert_eq!(events.expect("offline", 5).await.data["device"], json!("a"));
    assert_eq!(events.expect("online", 5).await.data["device"], json!("a"));
    c.ping(b"still here").await;

    // The API ends one device, then the rest.
    assert_eq!(http(server.api, "DELETE", "/v1/sessions/5?device=c", &[], "").await.0, 204);
    c.expect_bye(CloseReason::Kicked).await;
    assert_eq!(events.expect("offline", 5).await.data["device"], json!("c"));
    assert_eq!(http(server.api, "DELETE", "/v1/sessions/5?device=c", &[], "").await.0, 404);
    assert_eq!(http(server.api, "DELETE", "/v1/sessions/5", &[], "").await.0, 204);
    a2.expect_bye(CloseReason::Kicked).await;
    assert_eq!(events.expect("offline", 5).await.data["device"], json!("a"));
    assert_eq!(events.expect("user_offline", 5).await.data["reason"], json!("kicked"));
    assert_eq!(server.metrics.event_count(idlegate_proto::EventKind::UserOnline), 1);
    assert_eq!(server.metrics.event_count(idlegate_proto::EventKind::UserOffline), 1);
    server.shutdown().await;
}

#[tokio::test]
async fn with_one_device_any_login_of_the_uid_takes_over_as_before() {
    let mut server = TestServer::start(devices(1)).await;
    let mut old = server.client().await;
    old.login(3).await;
    let mut phone = server.client().await;
    phone.login_device(3, "phone").await;
    // The default device is not "another device" the limit leaves room for: one session.
    let text = old.expect_bye(CloseReason::Kicked).await;
    assert!(text.contains("another device (--max-devices 1)"), "{text}");
    let mut again = server.client().await;
    again.login_device(3, "phone").await;
    assert_eq!(phone.expect_bye(CloseReason::Kicked).await, "");
    assert_eq!((server.metrics.online_users.get(), server.metrics.online_sessions.get()), (1, 1));
    server.shutdown().await;
}

#[tokio::test]
async fn bad_device_names_get_a_protocol_error_naming_the_field_and_others_are_served() {
    let mut server = TestServer::start(devices(4)).await;
    let mut bystander = server.client().await;
    bystander.login_device(1, "ok").await;
    let uid = [0, 0, 0, 0, 0, 0, 0, 9];
    let long = [b'x'; 33];
    let bad: [(&[u8], &str); 4] =
        [(b"tok\x00", "empty"), (&long, "33 bytes"), (b"\xff\xfe", "not UTF-8"), (b"a\x07b", "control character")];
    for (name, why) in bad {
        let mut c = server.client().await;
        let mut payload = uid.to_vec();
        if !name.starts_with(b"tok") {
            payload.push(0);
        }
        payload.extend_from_slice(name);
        c.send_raw(&raw_frame(kind::LOGIN, &payload)).await;
        let text = c.expect_bye(CloseReason::ProtocolError).await;
        assert!(text.contains("device") && text.contains(why), "{why}: {text}");
        bystander.ping(b"fine").await;
    }
    // The API refuses a bad name with 400 and says which field.
    let (status, answer) =
        api(&server, "POST", "/v1/push", &json!({"uids": [1], "payload": "", "device": "a\nb"})).await;
    assert_eq!(status, 400);
    assert!(answer["error"].as_str().unwrap().starts_with("device: "), "{answer}");
    assert_eq!(http(server.api, "DELETE", &format!("/v1/sessions/1?device={}", "x".repeat(33)), &[], "").await.0, 400);
    assert_eq!(server.metrics.online_sessions.get(), 1);
    server.shutdown().await;
}

//! MQTT.js (npm's `mqtt`, unmodified) against every MQTT door: plain (`mqtt://`), TLS
//! (`mqtts://`), and inside the WebSocket door (`ws://` and `wss://`, subprotocol `mqtt`).
//! On each: bad credentials refused with MQTT 5's code, a login with a token, the Server
//! Keep Alive adopted by the library (and the client kept alive on it past the timeout), a
//! push received on a subscribed topic, QoS 0 and 1 PUBLISHes seen by the backend as `data`
//! with their topic, a takeover (DISCONNECT 0x8E), a silent client expired in the window with
//! DISCONNECT 0x8D and its will in its `offline` event, a clean DISCONNECT without one.
//!
//! The library lives in `tests/data/mqttjs` (`npm ci` there; `.ci/run` does it); without it
//! or Node the tests skip with a message, and under CI they fail instead.

mod common;

use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use common::mqttjs::driver;
use common::{http, Sse, TestServer};
use idlegate::{Auth, Config};
use serde_json::{json, Value};
use tokio::time::Instant;

/// MQTT's windows as `tests/mqtt.rs` has them: a 9 s timeout gives MQTT 5 clients a Server
/// Keep Alive of 3 s.
fn config(auth: &Auth) -> Config {
    Config {
        timeout: Duration::from_secs(9),
        // The longest class too: a client that asks for no keepalive (0) or a longer one
        // is held to 9 s and told a Server Keep Alive of 6 s.
        max_timeout: Some(Duration::from_secs(9)),
        tick: Duration::from_millis(100),
        login_timeout: Duration::from_secs(5),
        auth: Some(auth.clone()),
        // The gateway's WebSocket pings off: MQTT.js's WebSocket answers them, and the
        // scenario watches a client that never pings expire, on every door alike.
        ws_keepalive_pings: false,
        ..Config::default()
    }
}

/// The Server Keep Alive a client asking for 60 s is told when the longest timeout class is
/// 9 s, in seconds: the shortest whose 1.5 times reaches 9 s.
const SERVER_KEEP_ALIVE: u64 = 6;

/// MQTT 5 reason codes the tests read.
const BAD_USERNAME_OR_PASSWORD: u64 = 0x86;
const KEEP_ALIVE_TIMEOUT: u64 = 0x8D;
const SESSION_TAKEN_OVER: u64 = 0x8E;

/// One door's run; `url` is the door's, `ca` the test CA for TLS doors.
async fn scenario(server: &mut TestServer, auth: &Auth, url: &str, ca: Option<&str>) {
    let Some(mut mqtt) = driver().await else { return };
    let (_, mut events) = Sse::open(server.api, "/v1/events?types=online,offline,data", &[]).await;
    let token = |uid: u64| auth.mint(uid, idlegate_proto::unix_now() + 600);
    let connect = |id: &str, uid: u64, password: String, client_id: &str, keepalive: u64| {
        json!({"op": "connect", "id": id, "url": url, "username": uid.to_string(), "password": password,
               "clientId": client_id, "protocolVersion": 5, "keepalive": keepalive, "ca": ca})
    };

    // Bad credentials: CONNACK 0x86, no session.
    mqtt.send(connect("bad", 300, "forged".into(), "phone", 60)).await;
    assert_eq!(mqtt.expect("bad", "error").await["code"], json!(BAD_USERNAME_OR_PASSWORD), "{url}");

    // A login with a token: the library adopts the Server Keep Alive over its own 60 s.
    mqtt.send(connect("a", 301, token(301), "phone", 60)).await;
    assert_eq!(mqtt.expect("a", "connect").await["keepalive"], json!(SERVER_KEEP_ALIVE), "{url}");
    events.expect("online", 301).await;

    // A push on a subscribed topic.
    mqtt.send(json!({"op": "subscribe", "id": "a", "topic": "idlegate/#"})).await;
    mqtt.expect("a", "suback").await;
    let body = json!({"uids": [301], "payload": BASE64.encode("to mqtt.js")}).to_string();
    let (status, answer) = http(server.api, "POST", "/v1/push", &[], &body).await;
    assert_eq!((status, serde_json::from_str::<Value>(&answer).unwrap()["sessions"].clone()), (200, json!(1)));
    let message = mqtt.expect("a", "message").await;
    assert_eq!((message["topic"].clone(), message["payload"].clone()), (json!("idlegate/push"), json!("to mqtt.js")));

    // QoS 0 and 1: data events with their topic (QoS 1 acknowledged once logged).
    for qos in [0, 1] {
        let topic = format!("sensors/q{qos}");
        mqtt.send(json!({"op": "publish", "id": "a", "topic": topic, "payload": "21.5", "qos": qos})).await;
        mqtt.expect("a", "published").await;
        let data = events.expect("data", 301).await;
        assert_eq!(
            (data.data["topic"].clone(), data.data["payload"].clone()),
            (json!(topic), json!(BASE64.encode("21.5")))
        );
    }

    // A second CONNECT of the same uid and client identifier takes the session over.
    mqtt.send(connect("b", 301, token(301), "phone", 60)).await;
    mqtt.expect("b", "connect").await;
    assert_eq!(mqtt.expect("a", "disconnect").await["reasonCode"], json!(SESSION_TAKEN_OVER), "{url}");
    mqtt.expect("a", "close").await;
    let kicked = events.expect("offline", 301).await;
    assert_eq!((kicked.data["reason"].clone(), kicked.data.get("will")), (json!("kicked"), None));
    events.expect("online", 301).await;

    // A client that never pings (keepalive 0) goes offline in the window, its will in its
    // offline event; meanwhile "b", idle but for the library's pings at the Server Keep
    // Alive, stays.
    let mut silent = connect("c", 302, token(302), "", 0);
    silent["will"] = json!({"topic": "wills/c", "payload": "gone"});
    mqtt.send(silent).await;
    mqtt.expect("c", "connect").await;
    let since = Instant::now();
    events.expect("online", 302).await;
    let expired = events.expect("offline", 302).await;
    let silence = since.elapsed();
    assert_eq!(expired.data["reason"], json!("idle_timeout"));
    assert_eq!(expired.data["will"], json!({"topic": "wills/c", "payload": BASE64.encode("gone")}));
    assert_eq!(mqtt.expect("c", "disconnect").await["reasonCode"], json!(KEEP_ALIVE_TIMEOUT), "{url}");
    let (window, tick) = (Duration::from_secs(9), Duration::from_millis(100));
    // Counted from the CONNACK's arrival here, a little after the login's tick.
    assert!(silence > window - tick - Duration::from_millis(300), "{url}: offline after {silence:?}");
    assert!(silence < window + Duration::from_secs(1), "{url}: offline after {silence:?}");

    // "b" outlived the timeout on its pings alone; it publishes, then leaves cleanly: a
    // logout, no will.
    mqtt.send(json!({"op": "publish", "id": "b", "topic": "after", "payload": "still here", "qos": 1})).await;
    mqtt.expect("b", "published").await;
    assert_eq!(events.expect("data", 301).await.data["topic"], json!("after"));
    mqtt.send(json!({"op": "end", "id": "b"})).await;
    mqtt.expect("b", "ended").await;
    let left = events.expect("offline", 301).await;
    assert_eq!((left.data["reason"].clone(), left.data.get("will")), (json!("logout"), None));
}

#[tokio::test]
async fn mqtt_js_over_tcp() {
    let auth = Auth::new("s3cret");
    let mut server = TestServer::start(config(&auth)).await;
    let url = format!("mqtt://{}", server.mqtt);
    scenario(&mut server, &auth, &url, None).await;
    server.shutdown().await;
}

#[tokio::test]
async fn mqtt_js_over_websocket() {
    let auth = Auth::new("s3cret");
    let mut server = TestServer::start(config(&auth)).await;
    let url = format!("ws://{}/v1/ws", server.ws);
    scenario(&mut server, &auth, &url, None).await;
    server.shutdown().await;
}

#[tokio::test]
async fn mqtt_js_over_tls_and_websocket_in_tls() {
    let auth = Auth::new("s3cret");
    let (mut server, ca, _dir) = common::tls::server_with(config(&auth)).await;
    let Some(ca) = ca else { return };
    let url = format!("mqtts://{}", server.mqtts.unwrap());
    scenario(&mut server, &auth, &url, Some(&ca.cert)).await;
    let url = format!("wss://{}/v1/ws", server.wss.unwrap());
    scenario(&mut server, &auth, &url, Some(&ca.cert)).await;
    server.shutdown().await;
}

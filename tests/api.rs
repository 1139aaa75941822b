//! The backend API over real HTTP and TCP on loopback: every route, every error status,
//! pushes reaching clients byte for byte, kicks, and the event stream: exactly one event per
//! login, DATA frame and session end, resumable, with a gap when the log wrapped, and a
//! consumer that never reads costing the gateway nothing.

mod common;

use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use bytes::Bytes;
use common::{http, raw_frame, sample, short_config, Sse, TestServer};
use idlegate::Config;
use idlegate_proto::{CloseReason, Frame};
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

fn config() -> Config {
    Config { node_id: "node-a".into(), ..Config::default() }
}

async fn get(server: &TestServer, path: &str) -> (u16, Value) {
    let (status, body) = http(server.api, "GET", path, &[], "").await;
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

async fn post(server: &TestServer, path: &str, body: &Value) -> (u16, Value) {
    let (status, body) = http(server.api, "POST", path, &[], &body.to_string()).await;
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// Asserts `answer` is an error with `status` whose message mentions `mentions`.
fn assert_error(answer: (u16, Value), status: u16, mentions: &str) {
    assert_eq!(answer.0, status, "{answer:?}");
    let message = answer.1["error"].as_str().unwrap_or_else(|| panic!("no error field: {answer:?}"));
    assert!(message.contains(mentions), "{message:?} should mention {mentions:?}");
}

#[tokio::test]
async fn presence_query_and_online_answer_for_the_uids_logged_in() {
    let mut server = TestServer::start(config()).await;
    let mut c = server.client().await;
    let before = idlegate_proto::unix_now() * 1000;
    c.login(42).await;
    let _not_logged_in = server.client().await;

    let (status, body) = get(&server, "/v1/presence/42").await;
    assert_eq!(status, 200);
    assert_eq!(
        (body["uid"].clone(), body["online"].clone(), body["node"].clone()),
        (json!(42), json!(true), json!("node-a"))
    );
    let since = body["since_ms"].as_u64().unwrap();
    assert!(since >= before && since <= idlegate_proto::unix_now() * 1000 + 1000, "since_ms {since}");
    assert!(body["silent_ms"].as_u64().unwrap() <= 30_000, "{body}");
    let sessions = body["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 1, "{body}");
    assert_eq!((sessions[0]["device"].clone(), sessions[0]["node"].clone()), (json!(""), json!("node-a")));
    assert_eq!(sessions[0]["since_ms"], body["since_ms"]);
    assert_eq!(sessions[0]["session"].as_str().map(str::len), Some(16), "{body}");
    assert_eq!(get(&server, "/v1/presence/43").await, (200, json!({"uid": 43, "online": false, "sessions": []})));

    let answer = post(&server, "/v1/presence/query", &json!({"uids": [42, 43, 42]})).await;
    assert_eq!(answer, (200, json!({"online": [42, 42], "offline": [43], "last_seen_ms": {}})));
    // The connection without a LOGIN counts as a connection, not as online.
    for _ in 0..100 {
        if get(&server, "/v1/online").await.1["connections"] == json!(2) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let this = json!({"node": "node-a", "online": 1, "connections": 2});
    assert_eq!(
        get(&server, "/v1/online").await,
        (200, json!({"online": 1, "connections": 2, "local": this, "nodes": [this]}))
    );

    c.send(Frame::Logout).await;
    c.expect_bye(CloseReason::Logout).await;
    assert_eq!(get(&server, "/v1/presence/42").await.1["online"], json!(false));
    let (_, metrics) = server.admin_get("/metrics").await;
    let presence = "idlegate_api_requests_total{code=\"200\",route=\"/v1/presence/{uid}\"}";
    assert_eq!(sample(&metrics, presence), Some(3.0), "{metrics}");
    server.shutdown().await;
}

#[tokio::test]
async fn silent_ms_grows_with_silence_and_resets_with_a_frame() {
    let mut server = TestServer::start(Config { tick: Duration::from_millis(100), ..config() }).await;
    let mut c = server.client().await;
    c.login(5).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let silent = get(&server, "/v1/presence/5").await.1["silent_ms"].as_u64().unwrap();
    assert!(silent >= 400, "400 ms of silence reported as {silent} ms");
    c.ping(b"p").await;
    let silent = get(&server, "/v1/presence/5").await.1["silent_ms"].as_u64().unwrap();
    assert!(silent < 400, "a fresh PING still reported as {silent} ms of silence");
    server.shutdown().await;
}

#[tokio::test]
async fn bad_requests_get_json_errors_naming_what_was_wrong() {
    let mut server = TestServer::start(Config { max_frame_bytes: 1024, ..config() }).await;
    assert_error(get(&server, "/v1/presence/abc").await, 400, "uid");
    assert_error(get(&server, "/v1/presence/-1").await, 400, "uid");
    assert_error(get(&server, "/v1/presence/18446744073709551616").await, 400, "uid");
    let (status, body) = http(server.api, "POST", "/v1/presence/query", &[], "{not json").await;
    assert_error((status, serde_json::from_str(&body).unwrap()), 400, "JSON");
    assert_error(post(&server, "/v1/presence/query", &json!({})).await, 400, "uids");
    assert_error(post(&server, "/v1/presence/query", &json!({"uids": 5})).await, 400, "uids");
    assert_error(post(&server, "/v1/presence/query", &json!({"uids": [1, -1]})).await, 400, "uids[1]");
    assert_error(post(&server, "/v1/presence/query", &json!({"uids": [1.5]})).await, 400, "uids[0]");
    assert_error(post(&server, "/v1/presence/query", &json!({"uids": [true]})).await, 400, "uids[0]");
    let too_many: Vec<u64> = (0..10_001).collect();
    assert_error(post(&server, "/v1/presence/query", &json!({ "uids": too_many })).await, 400, "10000");
    let at_limit: Vec<u64> = (0..10_000).collect();
    assert_eq!(post(&server, "/v1/presence/query", &json!({ "uids": at_limit })).await.0, 200);

    assert_error(post(&server, "/v1/push", &json!({"uids": [1]})).await, 400, "payload");
    assert_error(post(&server, "/v1/push", &json!({"uids": [1], "payload": "%%%"})).await, 400, "base64");
    assert_error(post(&server, "/v1/push", &json!({"uids": [1], "payload": 3})).await, 400, "payload");
    let over = BASE64.encode(vec![0u8; 1024]);
    assert_error(post(&server, "/v1/push", &json!({"uids": [1], "payload": over})).await, 400, "1023");
    let at_limit = BASE64.encode(vec![0u8; 1023]);
    assert_eq!(post(&server, "/v1/push", &json!({"uids": [1], "payload": at_limit})).await.0, 200);

    let (status, body) = http(server.api, "DELETE", "/v1/sessions/9", &[], "").await;
    assert_error((status, serde_json::from_str(&body).unwrap()), 404, "offline");
    assert_error(get(&server, "/v1/nothing").await, 404, "/v1/nothing");
    let (status, body) = http(server.api, "DELETE", "/v1/online", &[], "").await;
    assert_error((status, serde_json::from_str(&body).unwrap()), 405, "DELETE");
    assert_error(get(&server, "/v1/events?after=yesterday").await, 400, "after");
    assert_error(get(&server, "/v1/events?types=online,gossip").await, 400, "gossip");

    let huge = format!("{{\"uids\":[1],\"payload\":\"{}\"}}", "A".repeat(5 * 1024 * 1024));
    let (status, body) = http(server.api, "POST", "/v1/push", &[], &huge).await;
    assert_error((status, serde_json::from_str(&body).unwrap()), 413, "limit");
    server.shutdown().await;
}

#[tokio::test]
async fn a_token_guards_every_route() {
    let mut server = TestServer::start(Config { api_token: Some("s3cret".into()), ..config() }).await;
    for headers in [&[][..], &["Authorization: Bearer wrong"], &["Authorization: s3cret"]] {
        for (method, path) in [("GET", "/v1/online"), ("GET", "/v1/events"), ("DELETE", "/v1/sessions/1")] {
            let (status, body) = http(server.api, method, path, headers, "").await;
            assert_error((status, serde_json::from_str(&body).unwrap()), 401, "token");
        }
    }
    // The scheme is case-insensitive (RFC 9110).
    for header in ["Authorization: Bearer s3cret", "Authorization: bearer s3cret", "Authorization: BEARER s3cret"] {
        let (status, body) = http(server.api, "GET", "/v1/online", &[header], "").await;
        assert_eq!(
            (status, serde_json::from_str::<Value>(&body).unwrap()["online"].clone()),
            (200, json!(0)),
            "{header}"
        );
    }
    server.shutdown().await;
}

#[tokio::test]
async fn request_counters_exist_at_zero_before_any_request() {
    let mut server = TestServer::start(config()).await;
    let (_, body) = server.admin_get("/metrics").await;
    for (route, code) in
        [("/v1/presence/{uid}", 200), ("/v1/push", 200), ("/v1/sessions/{uid}", 204), ("unmatched", 404)]
    {
        let series = format!("idlegate_api_requests_total{{code=\"{code}\",route=\"{route}\"}}");
        assert_eq!(sample(&body, &series), Some(0.0), "{series}");
    }
    for series in
        ["idlegate_connections_closed_total{door=\"tcp\",reason=\"kicked\"}", "idlegate_pushes_total{result=\"sent\"}"]
    {
        assert_eq!(sample(&body, series), Some(0.0), "{series}");
    }
    // The API's latency, by route: at 0 before, one observation after a request.
    let latency = "idlegate_api_request_duration_seconds_count{route=\"/v1/presence/{uid}\"}";
    assert_eq!(sample(&body, latency), Some(0.0), "{latency}");
    get(&server, "/v1/presence/1").await;
    assert_eq!(sample(&server.admin_get("/metrics").await.1, latency), Some(1.0), "{latency}");
    server.shutdown().await;
}

#[tokio::test]
async fn pushes_reach_online_clients_byte_for_byte() {
    let mut server = TestServer::start(config()).await;
    let mut a = server.client().await;
    let mut b = server.client().await;
    a.login(1).await;
    b.login(2).await;
    let payload: Vec<u8> = (0..=255).collect();
    let body = json!({"uids": [1, 2, 3, 2], "payload": BASE64.encode(&payload)});
    assert_eq!(
        post(&server, "/v1/push", &body).await,
        (200, json!({"sent": [1, 2], "offline": [3], "unsubscribed": [], "sessions": 2}))
    );
    for c in [&mut a, &mut b] {
        assert_eq!(c.recv().await, Some(Frame::Push(Bytes::from(payload.clone()))));
    }
    // Pushes and replies share the connection in order; an empty payload is a push too.
    let empty = json!({"uids": [1], "payload": ""});
    assert_eq!(post(&server, "/v1/push", &empty).await.1["sent"], json!([1]));
    assert_eq!(a.recv().await, Some(Frame::Push(Bytes::new())));
    a.ping(b"after").await;
    let (_, metrics) = server.admin_get("/metrics").await;
    assert_eq!(sample(&metrics, "idlegate_pushes_total{result=\"sent\"}"), Some(3.0));
    assert_eq!(sample(&metrics, "idlegate_pushes_total{result=\"offline\"}"), Some(1.0));
    server.shutdown().await;
}

#[tokio::test]
async fn a_push_does_not_keep_a_silent_uid_alive() {
    let config = Config { node_id: "n".into(), ..short_config() };
    let (timeout, tick) = (config.timeout, config.tick);
    let mut server = TestServer::start(config).await;
    let mut c = server.client().await;
    c.login(8).await;
    let silent_since = Instant::now();
    let api = server.api;
    let pusher = tokio::spawn(async move {
        loop {
            let body = json!({"uids": [8], "payload": "aGk="}).to_string();
            let (_, answer) = http(api, "POST", "/v1/push", &[], &body).await;
            if answer.contains("\"offline\":[8]") {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let mut pushes = 0;
    loop {
        match c.recv().await {
            Some(Frame::Push(p)) => {
                assert_eq!(&p[..], b"hi");
                pushes += 1;
            }
            Some(Frame::Bye { reason, .. }) => {
                assert_eq!(reason, CloseReason::IdleTimeout);
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(silent_since.elapsed() > timeout - tick, "expired after {:?}", silent_since.elapsed());
    assert!(pushes >= 3, "only {pushes} pushes arrived while the client was silent");
    pusher.await.unwrap();
    server.shutdown().await;
}

#[tokio::test]
async fn delete_kicks_the_session_and_only_it() {
    let mut server = TestServer::start(config()).await;
    let mut kicked = server.client().await;
    let mut bystander = server.client().await;
    kicked.login(7).await;
    bystander.login(8).await;
    let (status, body) = http(server.api, "DELETE", "/v1/sessions/7", &[], "").await;
    assert_eq!((status, body.as_str()), (204, ""));
    kicked.expect_bye(CloseReason::Kicked).await;
    assert_eq!(get(&server, "/v1/presence/7").await.1["online"], json!(false));
    assert_eq!(http(server.api, "DELETE", "/v1/sessions/7", &[], "").await.0, 404);
    bystander.ping(b"fine").await;
    assert_eq!(server.metrics.closed_count(CloseReason::Kicked), 1);
    assert_eq!(server.metrics.online_users.get(), 1);
    server.shutdown().await;
}

#[tokio::test]
async fn every_login_data_frame_and_session_end_is_one_event_in_order() {
    let mut server = TestServer::start(Config { node_id: "node-a".into(), ..short_config() }).await;
    let (status, mut events) = Sse::open(server.api, "/v1/events", &[]).await;
    assert_eq!(status, 200);

    // Login, two DATA frames (binary, and empty), logout.
    let mut a = server.client().await;
    a.login(1).await;
    let online = events.expect("online", 1).await;
    assert_eq!((online.data["node"].clone(), online.data["device"].clone()), (json!("node-a"), json!("")));
    let session = online.data["session"].clone();
    // The uid's first session: it came online as a user too, right after.
    let user = events.expect("user_online", 1).await;
    assert_eq!(user.data.as_object().unwrap().len(), 2, "uid and at_ms: {:?}", user.data);
    a.send(Frame::Data(Bytes::from_static(b"\x00\xffpay"))).await;
    a.send(Frame::Data(Bytes::new())).await;
    let first = events.expect("data", 1).await;
    assert_eq!(BASE64.decode(first.data["payload"].as_str().unwrap()).unwrap(), b"\x00\xffpay");
    assert_eq!(events.expect("data", 1).await.data["payload"], json!(""));
    a.send(Frame::Logout).await;
    a.expect_bye(CloseReason::Logout).await;
    let offline = events.expect("offline", 1).await;
    assert_eq!((offline.data["session"].clone(), offline.data["reason"].clone()), (session, json!("logout")));
    assert_eq!(events.expect("user_offline", 1).await.data["reason"], json!("logout"));

    // A disconnect without a word.
    let mut b = server.client().await;
    b.login(2).await;
    events.expect("online", 2).await;
    events.expect("user_online", 2).await;
    drop(b);
    assert_eq!(events.expect("offline", 2).await.data["reason"], json!("disconnect"));
    events.expect("user_offline", 2).await;

    // A newer LOGIN kicks: offline (kicked) of the old session, then online of the new; the
    // uid itself never went offline.
    let mut old = server.client().await;
    old.login(3).await;
    let old_session = events.expect("online", 3).await.data["session"].clone();
    events.expect("user_online", 3).await;
    let mut new = server.client().await;
    new.login(3).await;
    let kicked = events.expect("offline", 3).await;
    assert_eq!((kicked.data["session"].clone(), kicked.data["reason"].clone()), (old_session.clone(), json!("kicked")));
    let new_session = events.expect("online", 3).await.data["session"].clone();
    assert_ne!(new_session, old_session);
    old.expect_bye(CloseReason::Kicked).await;

    // A protocol error after login.
    let mut rude = server.client().await;
    rude.login(4).await;
    events.expect("online", 4).await;
    events.expect("user_online", 4).await;
    rude.send_raw(&raw_frame(0x7f, b"")).await;
    rude.expect_bye(CloseReason::ProtocolError).await;
    assert_eq!(events.expect("offline", 4).await.data["reason"], json!("protocol_error"));
    events.expect("user_offline", 4).await;

    // A kick through the API.
    assert_eq!(http(server.api, "DELETE", "/v1/sessions/3", &[], "").await.0, 204);
    let api_kick = events.expect("offline", 3).await;
    assert_eq!((api_kick.data["session"].clone(), api_kick.data["reason"].clone()), (new_session, json!("kicked")));
    assert_eq!(events.expect("user_offline", 3).await.data["reason"], json!("kicked"));

    // Silence: the ring expires it.
    let mut silent = server.client().await;
    silent.login(5).await;
    events.expect("online", 5).await;
    events.expect("user_online", 5).await;
    silent.expect_bye(CloseReason::IdleTimeout).await;
    assert_eq!(events.expect("offline", 5).await.data["reason"], json!("idle_timeout"));
    assert_eq!(events.expect("user_offline", 5).await.data["reason"], json!("idle_timeout"));

    // Nothing else was logged in between: the next event is this marker.
    let mut marker = server.client().await;
    marker.login(99).await;
    events.expect("online", 99).await;
    events.expect("user_online", 99).await;
    assert_eq!(server.metrics.event_count(idlegate_proto::EventKind::Online), 7);
    assert_eq!(server.metrics.event_count(idlegate_proto::EventKind::UserOnline), 6);
    assert_eq!(server.metrics.event_count(idlegate_proto::EventKind::UserOffline), 5);
    assert_eq!(server.metrics.event_count(idlegate_proto::EventKind::Data), 2);
    assert_eq!(server.metrics.event_count(idlegate_proto::EventKind::Offline), 6);
    // Shutdown ends the stream, after the last offline (shutdown) events.
    server.shutdown().await;
    assert_eq!(events.expect("offline", 99).await.data["reason"], json!("shutdown"));
    assert_eq!(events.expect("user_offline", 99).await.data["reason"], json!("shutdown"));
    assert_eq!(events.next().await, None);
}

#[tokio::test]
async fn a_consumer_resumes_after_its_last_id_and_learns_of_a_gap() {
    let mut server = TestServer::start(Config { event_log_capacity: 8, ..config() }).await;
    let (_, mut live) = Sse::open(server.api, "/v1/events", &[]).await;
    let mut c = server.client().await;
    c.login(1).await;
    for i in 0..3u8 {
        c.send(Frame::Data(Bytes::from(vec![i]))).await;
    }
    live.expect("online", 1).await;
    let first = live.expect("user_online", 1).await;
    let mut data_ids = Vec::new();
    for _ in 0..3 {
        data_ids.push(live.expect("data", 1).await.id);
    }

    // Resume with Last-Event-ID: everything after it, then the live tail.
    let header = format!("Last-Event-ID: {}", data_ids[0]);
    let (_, mut resumed) = Sse::open(server.api, "/v1/events", &[&header]).await;
    assert_eq!(resumed.expect("data", 1).await.id, data_ids[1]);
    assert_eq!(resumed.expect("data", 1).await.id, data_ids[2]);
    c.send(Frame::Data(Bytes::from_static(b"live"))).await;
    let live_id = resumed.expect("data", 1).await.id;
    assert_eq!(live.expect("data", 1).await.id, live_id);

    // Ten more events wrap the 8-event log past the first one: a gap, then what is held.
    for _ in 0..10 {
        c.send(Frame::Data(Bytes::from_static(b"more"))).await;
    }
    while server.metrics.event_count(idlegate_proto::EventKind::Data) < 14 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (_, mut late) = Sse::open(server.api, &format!("/v1/events?after={}", first.id), &[]).await;
    let gap = late.next().await.unwrap();
    assert_eq!(gap.event, "gap");
    // Events after the online: 3 + 1 + 10 = 14, of which the log holds the last 8.
    assert_eq!(gap.data, json!({"missed": 6}));
    let mut held = 0;
    while held < 8 {
        late.expect("data", 1).await;
        held += 1;
    }

    // ?types= filters; ids stay those of the log.
    let (_, mut only_offline) =
        Sse::open(server.api, &format!("/v1/events?after={}&types=offline", first.id), &[]).await;
    assert_eq!(only_offline.next().await.unwrap().event, "gap");
    c.send(Frame::Logout).await;
    assert_eq!(only_offline.expect("offline", 1).await.data["reason"], json!("logout"));
    // The user-level events are a type of their own.
    let (_, mut only_users) =
        Sse::open(server.api, &format!("/v1/events?after={}&types=user_offline", first.id), &[]).await;
    assert_eq!(only_users.next().await.unwrap().event, "gap");
    assert_eq!(only_users.expect("user_offline", 1).await.data["reason"], json!("logout"));
    server.shutdown().await;

    // After a restart, a resume from an id of the earlier run: a gap of unknown size, said
    // as such (not `"missed":0`).
    let restarted = server.restart(Config { event_log_capacity: 8, ..config() }).await;
    let (_, mut across) = Sse::open(restarted.api, &format!("/v1/events?after={}", first.id), &[]).await;
    let gap = across.next().await.unwrap();
    assert_eq!(gap.event, "gap");
    assert_eq!(gap.data, json!({"missed": null, "earlier_process": true}));
}

/// `?tail=n` hands the last n events, counting the user-level events a session event
/// caused, and then the live ones.
#[tokio::test]
async fn tail_counts_events() {
    let server = TestServer::start(config()).await;
    let mut c = server.client().await;
    c.login(1).await;
    c.send(Frame::Data(Bytes::from_static(b"d"))).await;
    let (_, mut watch) = Sse::open(server.api, "/v1/events?tail=3", &[]).await;
    // online, user_online, data: the last three.
    assert_eq!(watch.next().await.unwrap().event, "online");
    let (_, mut tail) = Sse::open(server.api, "/v1/events?tail=2", &[]).await;
    assert_eq!(tail.next().await.unwrap().event, "user_online");
    assert_eq!(tail.next().await.unwrap().event, "data");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_that_never_reads_costs_the_gateway_nothing() {
    const SESSIONS: u64 = 3_000;
    let mut server = TestServer::start(Config { event_log_capacity: 1_000, ..config() }).await;
    // Opens the stream and never reads a byte of it.
    let mut stuck = tokio::net::TcpStream::connect(server.api).await.unwrap();
    stuck.write_all(b"GET /v1/events HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let mut pinger = server.client().await;
    pinger.login(1_000_000).await;
    for _ in 0..100 {
        if server.metrics.event_consumers.get() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(server.metrics.event_consumers.get(), 1);

    let addr = server.addr;
    let churn: Vec<_> = (0..4)
        .map(|w| {
            tokio::spawn(async move {
                for uid in (w..SESSIONS).step_by(4) {
                    let mut c = common::Client::connect(addr).await;
                    c.login(uid).await;
                    c.send(Frame::Data(Bytes::from(vec![7u8; 512]))).await;
                    c.send(Frame::Logout).await;
                    c.expect_bye(CloseReason::Logout).await;
                }
            })
        })
        .collect();
    while !churn.iter().all(|t| t.is_finished()) {
        pinger.ping(b"still served").await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for t in churn {
        t.await.unwrap();
    }
    let m = &server.metrics;
    assert_eq!(m.event_count(idlegate_proto::EventKind::Offline), SESSIONS);
    assert!(m.event_log_events.get() <= 1_000, "the log holds {}", m.event_log_events.get());
    drop(stuck);
    for _ in 0..200 {
        if m.event_consumers.get() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(m.event_consumers.get(), 0, "a closed consumer is forgotten");
    server.shutdown().await;
}

#[tokio::test]
async fn a_client_that_does_not_read_its_pushes_is_closed_as_slow_consumer() {
    let mut server = TestServer::start(config()).await;
    let mut slow = server.client().await;
    slow.login(9).await;
    let mut bystander = server.client().await;
    bystander.login(10).await;
    // Pushes the client never reads: the kernel's buffers fill, then the gateway's bounded
    // queue, and the uid is answered offline from then on.
    let body = json!({"uids": [9], "payload": BASE64.encode(vec![7u8; 60_000])});
    let mut sent = 0;
    loop {
        let (status, answer) = post(&server, "/v1/push", &body).await;
        assert_eq!(status, 200, "{answer}");
        if answer["offline"] == json!([9]) {
            break;
        }
        sent += 1;
        assert!(sent < 2_000, "never counted as a slow consumer");
    }
    bystander.ping(b"unaffected").await;
    // Reading now, the client finds what was queued, then its BYE.
    let mut received = 0;
    loop {
        match slow.recv().await {
            Some(Frame::Push(p)) => {
                assert_eq!(p.len(), 60_000);
                received += 1;
            }
            Some(Frame::Bye { reason, .. }) => {
                assert_eq!(reason, CloseReason::SlowConsumer);
                break;
            }
            other => panic!("expected PUSH or BYE, got {other:?}"),
        }
    }
    assert!(received > 0 && received <= sent, "received {received} of {sent}");
    assert_eq!(get(&server, "/v1/presence/9").await.1["online"], json!(false));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_open_status_pages_are_all_served() {
    const PAGES: usize = 100;
    let mut server = TestServer::start(config()).await;
    let mut c = server.client().await;
    c.login(1).await;
    // Each page holds an event stream open on the admin listener and polls its summary.
    let mut streams = Vec::new();
    for _ in 0..PAGES {
        let (status, stream) = Sse::open(server.admin, "/v1/events?types=online,offline", &[]).await;
        assert_eq!(status, 200);
        streams.push(stream);
    }
    for _ in 0..PAGES {
        let (status, body) = common::http_get(server.admin, "/status.json").await;
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(server.admin_get("/healthz").await.0, 200);
    // Every page sees the next login, and clients are served as before.
    let mut next = server.client().await;
    next.login(2).await;
    for s in &mut streams {
        s.expect("online", 2).await;
    }
    c.ping(b"served").await;
    assert_eq!(server.metrics.event_consumers.get(), PAGES as i64);
    server.shutdown().await;
}

#[tokio::test]
async fn uids_may_be_strings_for_javascript_and_come_back_as_strings() {
    let mut server = TestServer::start(config()).await;
    let big = u64::MAX - 1;
    let mut c = server.client().await;
    c.login(big).await;
    let asked = json!({"uids": [big.to_string(), "42"]});
    let want = json!({"online": [big.to_string()], "offline": ["42"], "last_seen_ms": {}});
    assert_eq!(post(&server, "/v1/presence/query", &asked).await, (200, want));
    let (status, body) = post(&server, "/v1/presence/query", &json!({"uids": ["4x"]})).await;
    assert_error((status, body), 400, "uids[0]");
    server.shutdown().await;
}

#[tokio::test]
async fn tail_starts_a_stream_at_the_last_events() {
    let mut server = TestServer::start(config()).await;
    let mut clients = Vec::new();
    for uid in 1..=5 {
        let mut c = server.client().await;
        c.login(uid).await;
        clients.push(c);
    }
    // Four events back: uid 4's online and user_online, then uid 5's.
    let (status, mut sse) = Sse::open(server.api, "/v1/events?tail=4", &[]).await;
    assert_eq!(status, 200);
    for uid in [4, 5] {
        sse.expect("online", uid).await;
        sse.expect("user_online", uid).await;
    }
    let (status, _) = http(server.api, "GET", "/v1/events?tail=many", &[], "").await;
    assert_eq!(status, 400);
    server.shutdown().await;
}

/// An offline uid's presence answer says when it was last online, while the gateway
/// remembers it (`--last-seen-capacity`, the least recently seen forgotten first).
#[tokio::test]
async fn an_offline_uid_is_answered_with_when_it_was_last_seen() {
    let server = TestServer::start(Config { last_seen_capacity: 2, ..config() }).await;
    let (_, never) = get(&server, "/v1/presence/404").await;
    assert_eq!(never, json!({"uid": 404, "online": false, "sessions": []}));
    let mut ended = Vec::new();
    for uid in [1u64, 2, 3] {
        let mut c = server.client().await;
        c.login(uid).await;
        let before = common::unix_ms();
        c.send(Frame::Logout).await;
        c.expect_bye(idlegate_proto::CloseReason::Logout).await;
        ended.push(before);
    }
    // Two remembered: 1, the least recently seen, is forgotten.
    let (_, one) = get(&server, "/v1/presence/1").await;
    assert!(one.get("last_seen_ms").is_none(), "{one}");
    for (uid, before) in [(2u64, ended[1]), (3, ended[2])] {
        let (_, answer) = get(&server, &format!("/v1/presence/{uid}")).await;
        let seen = answer["last_seen_ms"].as_u64().unwrap_or_else(|| panic!("{answer}"));
        assert!(seen >= before && answer["online"] == json!(false), "{answer}");
    }
}

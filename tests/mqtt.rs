//! The MQTT door with real, unmodified clients (Debian's `mosquitto_pub` and
//! `mosquitto_sub`) and with raw packets where a client library would hide what is tested:
//! a push received on a subscribed topic, PUBLISH at QoS 0 and 1 seen by a backend as
//! `data`, refusals with each version's CONNACK code, MQTT 5's Server Keep Alive, a silent
//! client expired in the window with DISCONNECT 0x8D, a takeover with 0x8E.
//!
//! Without mosquitto-clients the tests that run them skip with a message; under CI they
//! fail instead.

mod common;

use std::process::Stdio;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use common::mqtt::packet as packet_of;
use common::{find_on_path, http, skip_without, Sse, TestServer, PATIENCE};
use idlegate::Config;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::Command;
use tokio::time::{timeout, Instant};

/// A gateway whose classes reach down to 1 s, so a silent client's expiry shows in
/// seconds: each MQTT client is held to its own keepalive (issue 50), from 1 s up to the
/// default 30 minutes.
fn config() -> Config {
    Config {
        timeout: Duration::from_secs(9),
        min_timeout: Some(Duration::from_secs(1)),
        tick: Duration::from_millis(100),
        login_timeout: Duration::from_secs(2),
        ..Config::default()
    }
}

const INSTALL: &str = "apt-get install mosquitto-clients";

/// `mosquitto_pub` and `mosquitto_sub`, or `None` after saying how to install them.
fn clients() -> Option<()> {
    if find_on_path(&["mosquitto_pub"]).is_none() || find_on_path(&["mosquitto_sub"]).is_none() {
        skip_without("mosquitto_pub and mosquitto_sub", INSTALL);
        return None;
    }
    Some(())
}

async fn pub_(server: &TestServer, args: &[&str]) -> std::process::Output {
    let port = server.mqtt.port().to_string();
    let mut command = Command::new("mosquitto_pub");
    command.args(["-h", "127.0.0.1", "-p", &port]).args(args);
    timeout(PATIENCE, command.output()).await.expect("mosquitto_pub ends").expect("mosquitto_pub runs")
}

#[tokio::test]
async fn mosquitto_sub_receives_a_push_and_mosquitto_pub_s_messages_reach_the_backend() {
    let Some(()) = clients() else { return };
    let mut server = TestServer::start(config()).await;
    let (_, mut events) = Sse::open(server.api, "/v1/events?types=online,offline,data", &[]).await;
    for version in ["mqttv5", "mqttv311"] {
        // A subscriber that prints one message and exits.
        let port = server.mqtt.port().to_string();
        let sub = Command::new("mosquitto_sub")
            .args(["-h", "127.0.0.1", "-p", &port, "-u", "42", "-P", "token", "-i", "phone", "-k", "5"])
            .args(["-t", "idlegate/#", "-C", "1", "-V", version])
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("mosquitto_sub runs");
        let online = events.expect("online", 42).await;
        assert_eq!(online.data["device"], json!("phone"), "{version}");
        // mosquitto_sub subscribes right after CONNACK; a push before its SUBSCRIBE finds
        // no subscription, so push until the one message it waits for arrives.
        let body = json!({"uids": [42], "payload": BASE64.encode("to mqtt")}).to_string();
        let deadline = Instant::now() + PATIENCE;
        let mut sub = sub;
        while sub.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "{version}: mosquitto_sub never received a push");
            let (status, answer) = http(server.api, "POST", "/v1/push", &[], &body).await;
            assert_eq!(status, 200, "{answer}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let output = sub.wait_with_output().await.unwrap();
        assert!(output.status.success(), "{version}: {output:?}");
        assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "to mqtt", "{version}");
        assert_eq!(events.expect("offline", 42).await.data["reason"], json!("logout"), "{version}");

        for qos in ["0", "1"] {
            let out = pub_(
                &server,
                &["-u", "43", "-P", "t", "-k", "5", "-V", version, "-q", qos, "-t", "a/b", "-m", "hello"],
            )
            .await;
            assert!(out.status.success(), "{version} QoS {qos}: {out:?}");
            events.expect("online", 43).await;
            let data = events.expect("data", 43).await;
            assert_eq!(data.data["payload"], json!(BASE64.encode("hello")), "{version} QoS {qos}");
            assert_eq!(data.data["topic"], json!("a/b"), "{version} QoS {qos}");
            assert_eq!(events.expect("offline", 43).await.data["reason"], json!("logout"));
        }
    }
    server.shutdown().await;
}

#[tokio::test]
async fn refusals_use_each_version_s_connack_codes() {
    let Some(()) = clients() else { return };
    let auth = idlegate::Auth::new("s3cret");
    let mut server = TestServer::start(Config { auth: Some(auth.clone()), ..config() }).await;
    let good = auth.mint(7, idlegate_proto::unix_now() + 600);
    for (args, says) in [
        (vec!["-u", "seven", "-P", good.as_str(), "-V", "mqttv5", "-k", "5"], "bad user name or password"),
        (vec!["-u", "7", "-P", "forged", "-V", "mqttv5", "-k", "5"], "bad user name or password"),
        (vec!["-u", "7", "-P", "forged", "-V", "mqttv311", "-k", "5"], "bad user name or password"),
        // A 3.1.1 client cannot be told another keepalive: one no timeout class holds it to
        // (above the longest, 30 minutes) is not authorised rather than accepted and then
        // expired early.
        (vec!["-u", "7", "-P", good.as_str(), "-V", "mqttv311", "-k", "3600"], "not authorised"),
        (
            vec!["-u", "7", "-P", good.as_str(), "-V", "mqttv311", "-k", "5", "-i", &"x".repeat(33)],
            "identifier rejected",
        ),
    ] {
        let out = pub_(&server, &[&args[..], &["-t", "a", "-m", "x"]].concat()).await;
        let stderr = String::from_utf8_lossy(&out.stderr).to_lowercase();
        assert!(!out.status.success() && stderr.contains(says), "{args:?}: {stderr}");
    }
    // Each refusal is counted by why, the keepalive apart from other protocol errors.
    let door = idlegate_proto::Transport::Mqtt;
    common::cluster::eventually("the refusals are counted", || async {
        server.metrics.refused_login_count(door, "auth_failed") == 3
            && server.metrics.refused_login_count(door, "mqtt_keepalive") == 1
            && server.metrics.refused_login_count(door, "protocol_error") == 1
    })
    .await;
    // And the right credentials get in.
    let out = pub_(&server, &["-u", "7", "-P", &good, "-k", "5", "-t", "a", "-m", "x"]).await;
    assert!(out.status.success(), "{out:?}");
    server.shutdown().await;
}

/// An MQTT 5 CONNECT as uid `uid` (no password), client identifier `id`, keepalive `keep`.
fn connect_v5(uid: &str, id: &str, keep: u16) -> Vec<u8> {
    connect_v5_with(uid, id, keep, None)
}

/// The same with a will of `topic` and `payload`.
fn connect_v5_will(uid: &str, id: &str, keep: u16, topic: &str, payload: &[u8]) -> Vec<u8> {
    connect_v5_with(uid, id, keep, Some((topic, payload)))
}

fn connect_v5_with(uid: &str, id: &str, keep: u16, will: Option<(&str, &[u8])>) -> Vec<u8> {
    let put = |body: &mut Vec<u8>, s: &[u8]| {
        body.extend_from_slice(&(s.len() as u16).to_be_bytes());
        body.extend_from_slice(s);
    };
    let flags = 0x82 | if will.is_some() { 0x04 } else { 0 };
    let mut body = vec![0, 4, b'M', b'Q', b'T', b'T', 5, flags];
    body.extend_from_slice(&keep.to_be_bytes());
    body.push(0); // no properties
    put(&mut body, id.as_bytes());
    if let Some((topic, payload)) = will {
        body.push(0); // no will properties
        put(&mut body, topic.as_bytes());
        put(&mut body, payload);
    }
    put(&mut body, uid.as_bytes());
    // The remaining length as MQTT's variable-length integer: a large will needs more than
    // one byte of it.
    packet_of(0x10, &body)
}

/// A connection that sent `connect` and was accepted (CONNACK 0).
async fn session(addr: std::net::SocketAddr, connect: &[u8]) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(connect).await.unwrap();
    let connack = packet(&mut stream).await.expect("a CONNACK");
    assert_eq!(connack[3], 0, "accepted: {connack:02x?}");
    stream
}

/// Reads one whole packet (short ones: a one-byte remaining length).
async fn packet(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut head = [0u8; 2];
    timeout(PATIENCE, stream.read_exact(&mut head)).await.expect("a packet in time").ok()?;
    let mut body = vec![0u8; usize::from(head[1])];
    stream.read_exact(&mut body).await.ok()?;
    Some([&head[..], &body].concat())
}

/// Issue 50: an MQTT 5 client is held to the keepalive it asked for, and told so (Server
/// Keep Alive); silent, it is disconnected after more than its class less a tick and
/// within 1.5 times its keepalive ([MQTT-3.1.2-24]), never while it keeps it.
#[tokio::test]
async fn mqtt_5_is_held_to_its_own_keepalive_and_a_silent_client_goes_offline_within_one_and_a_half_times_it() {
    let mut server = TestServer::start(config()).await;
    let classes = config().timeout_classes();
    let (_, mut events) = Sse::open(server.api, "/v1/events?types=online,offline", &[]).await;
    for keep in [2u16, 3] {
        let class_ms = classes.timeout_ms(classes.for_keep_alive(keep, None).expect("a class for the keepalive"));
        assert!(class_ms > u64::from(keep) * 1000 && class_ms <= u64::from(keep) * 1500, "{class_ms}");
        let mut silent = TcpStream::connect(server.mqtt).await.unwrap();
        silent.write_all(&connect_v5("9", "sensor", keep)).await.unwrap();
        let connack = packet(&mut silent).await.unwrap();
        assert_eq!(&connack[..4], &[0x20, connack[1], 0, 0], "CONNACK success: {connack:02x?}");
        // Server Keep Alive (0x13): the keepalive asked for, which its class holds.
        let at = connack.windows(3).position(|w| w == [0x13, 0, keep as u8]);
        assert!(at.is_some(), "Server Keep Alive {keep} s in {connack:02x?}");
        events.expect("online", 9).await;
        let since = Instant::now();
        let disconnect = packet(&mut silent).await.expect("DISCONNECT before the close");
        let silence = since.elapsed();
        assert_eq!(&disconnect[..3], &[0xE0, disconnect[1], 0x8D], "keep alive timeout: {disconnect:02x?}");
        assert_eq!(events.expect("offline", 9).await.data["reason"], json!("idle_timeout"));
        let (class, tick) = (Duration::from_millis(class_ms), config().tick);
        assert!(silence > class - tick - Duration::from_millis(200), "keepalive {keep}: offline after {silence:?}");
        assert!(silence < Duration::from_millis(u64::from(keep) * 1500 + 500), "keepalive {keep}: after {silence:?}");
    }
    server.shutdown().await;
}

/// Issue 50: mosquitto's clients with their default keepalive (60 s) connect and work on
/// both versions; an MQTT 5 client that asks for no keepalive (0) is given one, the one the
/// longest class holds it to.
#[tokio::test]
async fn mosquitto_s_default_keepalive_connects_and_keepalive_0_is_given_one() {
    let mut server = TestServer::start(config()).await;
    if clients().is_some() {
        for version in ["mqttv5", "mqttv311"] {
            let out = pub_(&server, &["-u", "44", "-V", version, "-t", "a", "-m", "x"]).await;
            assert!(out.status.success(), "{version}: {out:?}");
        }
    }
    let classes = config().timeout_classes();
    let longest = classes.iter().last().unwrap();
    let told = classes.keep_alive_for(longest).to_be_bytes();
    let mut none = TcpStream::connect(server.mqtt).await.unwrap();
    none.write_all(&connect_v5("45", "meter", 0)).await.unwrap();
    let connack = packet(&mut none).await.unwrap();
    assert_eq!(connack[3], 0, "accepted: {connack:02x?}");
    assert!(connack.windows(3).any(|w| w == [0x13, told[0], told[1]]), "Server Keep Alive {told:?} in {connack:02x?}");
    server.shutdown().await;
}

#[tokio::test]
async fn a_second_connect_of_a_client_identifier_takes_the_session_over() {
    let mut server = TestServer::start(config()).await;
    let mut first = session(server.mqtt, &connect_v5("5", "desk", 2)).await;
    let mut second = session(server.mqtt, &connect_v5("5", "desk", 2)).await;
    let taken = packet(&mut first).await.expect("DISCONNECT to the first");
    assert_eq!(&taken[..3], &[0xE0, taken[1], 0x8E], "session taken over: {taken:02x?}");
    assert_eq!(packet(&mut first).await, None, "then closed");
    // PINGREQ on the second: PINGRESP.
    second.write_all(&[0xC0, 0]).await.unwrap();
    assert_eq!(packet(&mut second).await.unwrap(), [0xD0, 0]);
    server.shutdown().await;
}

#[tokio::test]
async fn malformed_packets_close_only_their_own_connection() {
    let mut server = TestServer::start(config()).await;
    let mut good = session(server.mqtt, &connect_v5("1", "", 2)).await;
    for bad in [
        vec![0x30, 0xff, 0xff, 0xff, 0xff, 0x01], // remaining length of five bytes
        vec![0x82, 0x00],                         // SUBSCRIBE before CONNECT
        vec![0x10, 0x03, 0x00, 0x04, b'M'],       // CONNECT cut short
        vec![0x10, 0x7f],                         // a CONNECT that never comes (then EOF)
    ] {
        let mut client = TcpStream::connect(server.mqtt).await.unwrap();
        client.write_all(&bad).await.unwrap();
        let _ = client.shutdown().await;
        let mut rest = Vec::new();
        // Closed by the gateway (a reset counts), not left open.
        let closed = timeout(PATIENCE, client.read_to_end(&mut rest)).await;
        assert!(closed.is_ok(), "{bad:02x?} left the connection open");
    }
    good.write_all(&[0xC0, 0]).await.unwrap();
    assert_eq!(packet(&mut good).await.unwrap(), [0xD0, 0], "the others are still served");
    server.shutdown().await;
}

#[tokio::test]
async fn mosquitto_pub_comes_in_over_mqtts_on_every_suite() {
    let Some(()) = clients() else { return };
    let (mut server, ca, _dir) = common::tls::server_with(config()).await;
    let Some(ca) = ca else { return };
    let (_, mut events) = Sse::open(server.api, "/v1/events?types=data", &[]).await;
    let port = server.mqtts.unwrap().port().to_string();
    // TLS 1.3 (OpenSSL's choice of suite), then each TLS 1.2 suite the door offers.
    let runs: [&[&str]; 4] = [
        &["--tls-version", "tlsv1.3"],
        &["--tls-version", "tlsv1.2", "--ciphers", "ECDHE-ECDSA-AES128-GCM-SHA256"],
        &["--tls-version", "tlsv1.2", "--ciphers", "ECDHE-ECDSA-AES256-GCM-SHA384"],
        &["--tls-version", "tlsv1.2", "--ciphers", "ECDHE-ECDSA-CHACHA20-POLY1305"],
    ];
    for (uid, tls) in (44..).zip(runs) {
        let message = format!("over {}", tls.join(" "));
        let out = Command::new("mosquitto_pub")
            .args(["-h", "127.0.0.1", "-p", &port, "--cafile", &ca.cert, "--insecure"])
            .args(tls)
            .args(["-u", &uid.to_string(), "-k", "5", "-q", "1", "-t", "t", "-m", &message])
            .output()
            .await
            .unwrap();
        assert!(out.status.success(), "{tls:?}: {out:?}");
        let data = events.expect("data", uid).await;
        assert_eq!(data.data["payload"], json!(BASE64.encode(&message)), "{tls:?}");
    }
    server.shutdown().await;
}

/// An MQTT 5 PUBLISH at QoS 0 of `payload` on `topic`.
fn publish_v5(topic: &str, payload: &[u8]) -> Vec<u8> {
    let mut body = (topic.len() as u16).to_be_bytes().to_vec();
    body.extend_from_slice(topic.as_bytes());
    body.push(0); // no properties
    body.extend_from_slice(payload);
    [&[0x30, body.len() as u8][..], &body].concat()
}

#[tokio::test]
async fn a_publish_s_topic_rides_in_its_data_event_and_across_a_cluster() {
    // Alone: a topic with JSON's special characters comes back escaped, exactly.
    let mut server = TestServer::start(config()).await;
    let (_, mut events) = Sse::open(server.api, "/v1/events?types=data", &[]).await;
    let mut client = session(server.mqtt, &connect_v5("3", "", 60)).await;
    client.write_all(&publish_v5("q\"uote/ü/b\\x", b"v")).await.unwrap();
    assert_eq!(events.expect("data", 3).await.data["topic"], json!("q\"uote/ü/b\\x"));
    // DATA from the other doors has no topic.
    let mut tcp = server.client().await;
    tcp.login(4).await;
    tcp.send(idlegate_proto::Frame::Data(bytes::Bytes::from_static(b"d"))).await;
    assert_eq!(events.expect("data", 4).await.data.get("topic"), None);
    server.shutdown().await;

    // In a cluster: published on node a, read from node b's stream.
    let Some(redis) = common::redis::RedisServer::start().await else { return };
    let nodes = common::cluster::gateways(&redis.url(), &["a", "b"]).await;
    let (_, mut from_b) = Sse::open(nodes[1].api, "/v1/events?types=data", &[]).await;
    let mut client = session(nodes[0].mqtt, &connect_v5("5", "", 60)).await;
    client.write_all(&publish_v5("sensors/t", b"21.5")).await.unwrap();
    let data = from_b.expect("data", 5).await;
    assert_eq!(
        (data.data["topic"].clone(), data.data["payload"].clone()),
        (json!("sensors/t"), json!(BASE64.encode("21.5")))
    );
    for mut node in nodes {
        node.shutdown().await;
    }
}

/// Issue 48, defect 6: `--event-log-bytes` counted DATA payloads only: 20,000 dropped
/// sessions with 5 KB wills held 102 MiB past a 1 MiB bound. Now every byte an event holds
/// counts, wills included, and the oldest events go to keep the bound.
#[tokio::test]
async fn wills_count_against_the_event_logs_byte_bound() {
    const BOUND: usize = 64 * 1024;
    let mut server = TestServer::start(Config { event_log_bytes: BOUND, ..config() }).await;
    let (_, mut events) = Sse::open(server.api, "/v1/events?types=offline", &[]).await;
    let payload = vec![b'w'; 5_000];
    for uid in 100..140u64 {
        let dropped = session(server.mqtt, &connect_v5_will(&uid.to_string(), "", 60, "status/gone", &payload)).await;
        drop(dropped);
        let offline = events.expect("offline", uid).await;
        assert_eq!(offline.data["will"]["payload"], json!(BASE64.encode(&payload)));
    }
    let (_, metrics) = server.admin_get("/metrics").await;
    let bytes = common::sample(&metrics, "idlegate_event_log_bytes").expect("the gauge");
    let held = common::sample(&metrics, "idlegate_event_log_events").expect("the gauge");
    assert!(bytes <= BOUND as f64, "{bytes} bytes held");
    assert!(held < 40.0, "the oldest events went: {held} held of 80");
    server.shutdown().await;
}

#[tokio::test]
async fn a_will_rides_in_the_offline_event_unless_the_client_disconnects_cleanly() {
    let mut server = TestServer::start(config()).await;
    let (_, mut events) = Sse::open(server.api, "/v1/events?types=offline", &[]).await;
    let will = |topic: &str, payload: &[u8]| json!({"topic": topic, "payload": BASE64.encode(payload)});

    // Silent: expired (its keepalive of 2 s holds it to a class of at most 3 s), will told.
    let _silent = session(server.mqtt, &connect_v5_will("21", "", 2, "status/21", b"gone\0")).await;
    let offline = events.expect("offline", 21).await;
    assert_eq!(
        (offline.data["reason"].clone(), offline.data["will"].clone()),
        (json!("idle_timeout"), will("status/21", b"gone\0"))
    );

    // A clean DISCONNECT: a logout, no will.
    let mut clean = session(server.mqtt, &connect_v5_will("22", "", 60, "status/22", b"x")).await;
    clean.write_all(&[0xE0, 0]).await.unwrap();
    let offline = events.expect("offline", 22).await;
    assert_eq!((offline.data["reason"].clone(), offline.data.get("will")), (json!("logout"), None));

    // Taken over: the older session's will, once; the newer one's stays for its own end.
    let _old = session(server.mqtt, &connect_v5_will("23", "d", 60, "status/23", b"old")).await;
    let new = session(server.mqtt, &connect_v5_will("23", "d", 60, "status/23", b"new")).await;
    let kicked = events.expect("offline", 23).await;
    assert_eq!(
        (kicked.data["reason"].clone(), kicked.data["will"].clone()),
        (json!("kicked"), will("status/23", b"old"))
    );
    drop(new);
    let dropped = events.expect("offline", 23).await;
    assert_eq!(
        (dropped.data["reason"].clone(), dropped.data["will"].clone()),
        (json!("disconnect"), will("status/23", b"new"))
    );
    server.shutdown().await;

    // In a cluster: the will travels through the shared stream.
    let Some(redis) = common::redis::RedisServer::start().await else { return };
    let nodes = common::cluster::gateways(&redis.url(), &["a", "b"]).await;
    let (_, mut from_b) = Sse::open(nodes[1].api, "/v1/events?types=offline", &[]).await;
    let client = session(nodes[0].mqtt, &connect_v5_will("24", "", 60, "status/24", b"a|b\0c")).await;
    drop(client);
    let offline = from_b.expect("offline", 24).await;
    assert_eq!(offline.data["will"], will("status/24", b"a|b\0c"));
    for mut node in nodes {
        node.shutdown().await;
    }
}

/// The next line a child printed, within a patience that covers its idle spell.
async fn next_line(lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>) -> Option<String> {
    timeout(PATIENCE * 3, lines.next_line()).await.expect("the client says something").unwrap()
}

/// Python with paho-mqtt, or `None` after saying how to install it.
fn paho() -> Option<()> {
    let ok = std::process::Command::new("python3")
        .args(["-c", "import paho.mqtt"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        skip_without("paho-mqtt", "python3 -m pip install paho-mqtt");
        return None;
    }
    Some(())
}

#[tokio::test]
async fn paho_follows_the_server_keep_alive_publishes_and_receives_a_push() {
    let Some(()) = paho() else { return };
    let mut server = TestServer::start(capped()).await;
    let port = server.mqtt.port();
    paho_session(&server, port, "tcp").await;
    server.shutdown().await;
}

/// The same through the WebSocket door, paho offering the `mqtt` subprotocol.
#[tokio::test]
async fn paho_does_the_same_over_websocket() {
    let Some(()) = paho() else { return };
    // The gateway's WebSocket pings off: this test is about paho following the Server Keep
    // Alive by itself. With them on, paho (which pinged about every 3.1 s at a Server Keep Alive of 3 s, just past
    // the gateway's threshold) once dropped its connection and reconnected in CI; why is
    // not known yet (docs/PROTOCOL.md says so).
    let mut server = TestServer::start(Config { ws_keepalive_pings: false, ..capped() }).await;
    let port = server.ws.port();
    paho_session(&server, port, "websockets").await;
    server.shutdown().await;
}

/// A gateway whose longest timeout is 9 s: paho's keepalive of 60 s is beyond every class, so
/// it is told a Server Keep Alive of 6 s, which the 9 s class holds it to.
fn capped() -> Config {
    Config { max_timeout: Some(Duration::from_secs(9)), ..config() }
}

/// paho (`tests/data/paho_client.py`) as uid 77 on `port` over `transport`: the Server Keep
/// Alive read and lived on past the timeout, a PUBLISH seen as data, a push received.
async fn paho_session(server: &TestServer, port: u16, transport: &str) {
    use tokio::io::AsyncBufReadExt;
    let (_, mut events) = Sse::open(server.api, "/v1/events?types=offline,data", &[]).await;
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/paho_client.py");
    // Idle for longer than the 9 s timeout: alive only if paho pings every 6 s, as CONNACK
    // says, rather than every 60 s, as it asked.
    let idle = (config().timeout + Duration::from_secs(3)).as_secs().to_string();
    let port = port.to_string();
    let mut child = Command::new("python3")
        .arg(&script)
        .args(["127.0.0.1", &port, "77", &idle, transport])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python3 runs");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    // The Server Keep Alive paho read, and the Session Expiry Interval: it asked for an
    // hour, and is told 0, no session kept past the connection (issue 48).
    assert_eq!(next_line(&mut lines).await.as_deref(), Some("connected 6 0"), "what paho read in CONNACK");
    assert_eq!(next_line(&mut lines).await.as_deref(), Some("published"));
    let data = events.expect("data", 77).await;
    assert_eq!(
        (data.data["topic"].clone(), data.data["payload"].clone()),
        (json!("sensors/paho"), json!(BASE64.encode("from paho")))
    );
    let body = json!({"uids": [77], "payload": BASE64.encode("to paho")}).to_string();
    let (status, answer) = http(server.api, "POST", "/v1/push", &[], &body).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(next_line(&mut lines).await.as_deref(), Some("push to paho"));
    assert_eq!(next_line(&mut lines).await.as_deref(), Some("alive"));
    assert_eq!(events.expect("offline", 77).await.data["reason"], json!("logout"), "never expired");
    assert!(child.wait().await.unwrap().success());
}

/// An MQTT 5 SUBSCRIBE (packet id 1) or UNSUBSCRIBE (packet id 2) of `filter`.
fn subscription_v5(subscribe: bool, filter: &str) -> Vec<u8> {
    let mut body = vec![0, if subscribe { 1 } else { 2 }, 0]; // packet id, no properties
    body.extend_from_slice(&(filter.len() as u16).to_be_bytes());
    body.extend_from_slice(filter.as_bytes());
    if subscribe {
        body.push(0); // options: QoS 0
    }
    [&[if subscribe { 0x82 } else { 0xA2 }, body.len() as u8][..], &body].concat()
}

/// `POST /v1/push` of `payload` to `uids`, on `topic` when given: the answer.
async fn push(api: std::net::SocketAddr, uids: &[u64], payload: &str, topic: Option<&str>) -> serde_json::Value {
    let mut body = json!({"uids": uids, "payload": BASE64.encode(payload)});
    if let Some(topic) = topic {
        body["topic"] = json!(topic);
    }
    let (status, answer) = http(api, "POST", "/v1/push", &[], &body.to_string()).await;
    assert_eq!(status, 200, "{answer}");
    serde_json::from_str(&answer).unwrap()
}

/// The PUBLISH an MQTT 5 session reads: (topic, payload).
async fn published(stream: &mut TcpStream) -> (String, Vec<u8>) {
    let p = packet(stream).await.expect("a PUBLISH");
    assert_eq!(p[0], 0x30, "a QoS 0 PUBLISH: {p:02x?}");
    let len = usize::from(u16::from_be_bytes([p[2], p[3]]));
    let topic = String::from_utf8(p[4..4 + len].to_vec()).unwrap();
    (topic, p[4 + len + 1..].to_vec()) // after the topic, an empty property list
}

/// `POST /v1/push`'s `topic`: an MQTT session takes a push only on a topic one of its
/// subscriptions matches and is counted only then; a uid online only on such sessions is
/// `unsubscribed`, not `sent` nor `offline`; a TCP session of the same uid takes every push.
/// Alone, and with the MQTT session on another node than the API asked.
#[tokio::test]
async fn pushes_reach_mqtt_sessions_only_on_topics_they_subscribed_to() {
    let config = || Config { max_devices: 4, ..config() };
    let mut server = TestServer::start(config()).await;
    let mut tcp = server.client().await;
    tcp.login(50).await;
    let mut mqtt = session(server.mqtt, &connect_v5("50", "m", 60)).await;
    let mut only_mqtt = session(server.mqtt, &connect_v5("51", "", 60)).await;

    let answer = push(server.api, &[50, 51, 52], "a", None).await;
    assert_eq!(answer, json!({"sent": [50], "offline": [52], "unsubscribed": [51], "sessions": 1}));
    assert_eq!(tcp.recv().await, Some(idlegate_proto::Frame::Push(bytes::Bytes::from_static(b"a"))));

    for client in [&mut mqtt, &mut only_mqtt] {
        client.write_all(&subscription_v5(true, "alerts/#")).await.unwrap();
        assert_eq!(packet(client).await.unwrap(), [0x90, 4, 0, 1, 0, 0], "SUBACK, QoS 0 granted");
    }
    let answer = push(server.api, &[50, 51], "fire", Some("alerts/fire")).await;
    assert_eq!(answer, json!({"sent": [50, 51], "offline": [], "unsubscribed": [], "sessions": 3}));
    for client in [&mut mqtt, &mut only_mqtt] {
        assert_eq!(published(client).await, ("alerts/fire".to_string(), b"fire".to_vec()));
    }
    // The default topic (--mqtt-push-topic) is not under alerts/#.
    let answer = push(server.api, &[51], "b", None).await;
    assert_eq!(answer, json!({"sent": [], "offline": [], "unsubscribed": [51], "sessions": 0}));
    only_mqtt.write_all(&subscription_v5(false, "alerts/#")).await.unwrap();
    assert_eq!(packet(&mut only_mqtt).await.unwrap(), [0xB0, 4, 0, 2, 0, 0], "UNSUBACK");
    let answer = push(server.api, &[51], "c", Some("alerts/fire")).await;
    assert_eq!(answer["unsubscribed"], json!([51]), "unsubscribed: {answer}");
    // Only what was pushed to it came: the next packet is the PINGRESP to this PINGREQ.
    only_mqtt.write_all(&[0xC0, 0]).await.unwrap();
    assert_eq!(packet(&mut only_mqtt).await.unwrap(), [0xD0, 0]);

    for bad in [json!("a/+"), json!(""), json!(7)] {
        let body = json!({"uids": [51], "payload": "", "topic": bad}).to_string();
        let (status, answer) = http(server.api, "POST", "/v1/push", &[], &body).await;
        assert_eq!(status, 400, "topic {bad}: {answer}");
        assert!(answer.contains("topic"), "{answer}");
    }
    server.shutdown().await;

    // Across nodes: the MQTT session on node b, the push asked of node a.
    let Some(redis) = common::redis::RedisServer::start().await else { return };
    let nodes = common::cluster::gateways(&redis.url(), &["a", "b"]).await;
    let mut remote = session(nodes[1].mqtt, &connect_v5("60", "", 60)).await;
    remote.write_all(&subscription_v5(true, "alerts/+")).await.unwrap();
    assert_eq!(packet(&mut remote).await.unwrap()[0], 0x90);
    let deadline = Instant::now() + PATIENCE;
    loop {
        // The route is written to Redis in the node's next batch: until then, 60 is offline.
        let answer = push(nodes[0].api, &[60], "x", Some("other")).await;
        if answer["unsubscribed"] == json!([60]) {
            break;
        }
        assert_eq!(answer["offline"], json!([60]), "{answer}");
        assert!(Instant::now() < deadline, "uid 60 never came online in the cluster");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let answer = push(nodes[0].api, &[60], "y", Some("alerts/now")).await;
    assert_eq!(answer, json!({"sent": [60], "offline": [], "unsubscribed": [], "sessions": 1}));
    assert_eq!(published(&mut remote).await, ("alerts/now".to_string(), b"y".to_vec()));
    for mut node in nodes {
        node.shutdown().await;
    }
}

/// In a cluster, a will outlives its node: kept in Redis while its session lives, it rides
/// in the `offline` event another node logs, when a login there takes the session over and
/// when the reaper ends it as `node_lost` with its dead node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_will_rides_in_node_lost_and_in_a_takeover_from_another_node() {
    let Some(redis) = common::redis::RedisServer::start().await else { return };
    let nodes = common::cluster::gateways(&redis.url(), &["a"]).await;
    let mqtt_b = common::free_addr();
    let extra = ["--mqtt-listen", &mqtt_b.to_string(), "--timeout", "10s"];
    let (mut b, _) = common::cluster::node_b_process(&redis.url(), &extra).await;
    let (_, mut events) = Sse::open(nodes[0].api, "/v1/events?types=offline,data", &[]).await;
    let will = |topic: &str, payload: &[u8]| json!({"topic": topic, "payload": BASE64.encode(payload)});

    // Two sessions on node b with wills; a PUBLISH after each CONNECT, seen on node a,
    // shows its will is in Redis (the node's changes are applied in order).
    let mut lost = session(mqtt_b, &connect_v5_will("25", "", 60, "status/25", b"lost")).await;
    let mut taken = session(mqtt_b, &connect_v5_will("26", "d", 60, "status/26", b"taken")).await;
    for (client, uid) in [(&mut lost, 25), (&mut taken, 26)] {
        client.write_all(&publish_v5("t", b"here")).await.unwrap();
        events.expect("data", uid).await;
    }
    // A login of uid 26 on node a's door, same client identifier: b's session is taken over,
    // and node a logs its end, with b's will.
    let _newer = session(nodes[0].mqtt, &connect_v5("26", "d", 60)).await;
    let kicked = events.expect("offline", 26).await;
    assert_eq!(
        (kicked.data["reason"].clone(), kicked.data["will"].clone()),
        (json!("kicked"), will("status/26", b"taken"))
    );

    b.kill().unwrap();
    b.wait().unwrap();
    let reaped = events.expect("offline", 25).await;
    assert_eq!(
        (reaped.data["reason"].clone(), reaped.data["will"].clone()),
        (json!("node_lost"), will("status/25", b"lost"))
    );
    for mut node in nodes {
        node.shutdown().await;
    }
}

/// An MQTT 5 SUBSCRIBE of `filters` (QoS 0 each) under packet id `id`.
fn subscribe_v5(id: u16, filters: &[&str]) -> Vec<u8> {
    let mut body = id.to_be_bytes().to_vec();
    body.push(0); // no properties
    for filter in filters {
        body.extend_from_slice(&(filter.len() as u16).to_be_bytes());
        body.extend_from_slice(filter.as_bytes());
        body.push(0);
    }
    assert!(body.len() < 128, "a one-byte remaining length");
    [&[0x82, body.len() as u8][..], &body].concat()
}

/// `--mqtt-max-subscriptions` holds a session's filters, packet by packet, with MQTT 5's
/// codes filter by filter: past the bound 0x97, an invalid filter 0x8F, a shared
/// subscription 0x9E (CONNACK said none are available); a filter held already is granted
/// again, and a refused one takes no push.
#[tokio::test]
async fn subscriptions_are_bounded_per_session_and_refused_filter_by_filter() {
    let mut server = TestServer::start(Config { mqtt_max_subscriptions: 4, ..config() }).await;
    let mut stream = session(server.mqtt, &connect_v5("42", "phone", 3)).await;
    stream.write_all(&subscribe_v5(1, &["a", "b", "c", "a/#/b", "$share/g/t", "d", "e"])).await.unwrap();
    let suback = packet(&mut stream).await.expect("a SUBACK");
    assert_eq!(suback, [0x90, 10, 0, 1, 0, 0, 0, 0, 0x8F, 0x9E, 0, 0x97]);
    stream.write_all(&subscribe_v5(2, &["f", "a"])).await.unwrap();
    assert_eq!(packet(&mut stream).await.expect("a SUBACK"), [0x90, 5, 0, 2, 0, 0x97, 0]);
    assert_eq!(push(server.api, &[42], "no", Some("e")).await["unsubscribed"], json!([42]));
    assert_eq!(push(server.api, &[42], "yes", Some("d")).await["sent"], json!([42]));
    assert_eq!(published(&mut stream).await, ("d".to_string(), b"yes".to_vec()));
    // Room again after an UNSUBSCRIBE.
    stream.write_all(&subscription_v5(false, "a")).await.unwrap();
    assert_eq!(packet(&mut stream).await.expect("an UNSUBACK"), [0xB0, 4, 0, 2, 0, 0]);
    stream.write_all(&subscribe_v5(3, &["f"])).await.unwrap();
    assert_eq!(packet(&mut stream).await.expect("a SUBACK"), [0x90, 4, 0, 3, 0, 0]);
    server.shutdown().await;
}

/// An MQTT 5 CONNECT of uid `uid`, client id `id`, CONNECT properties `props`, an
/// optional will and password; clean start.
fn connect_v5_full(uid: &str, id: &str, props: &[u8], will: Option<(&str, &[u8])>, password: &[u8]) -> Vec<u8> {
    let put = |body: &mut Vec<u8>, s: &[u8]| {
        body.extend_from_slice(&(s.len() as u16).to_be_bytes());
        body.extend_from_slice(s);
    };
    let flags = 0x82 | if will.is_some() { 0x04 } else { 0 } | if password.is_empty() { 0 } else { 0x40 };
    let mut body = vec![0, 4, b'M', b'Q', b'T', b'T', 5, flags, 0, 3];
    body.push(props.len() as u8);
    body.extend_from_slice(props);
    put(&mut body, id.as_bytes());
    if let Some((topic, payload)) = will {
        body.push(0);
        put(&mut body, topic.as_bytes());
        put(&mut body, payload);
    }
    put(&mut body, uid.as_bytes());
    if !password.is_empty() {
        put(&mut body, password);
    }
    packet_of(0x10, &body)
}

/// The properties of an MQTT 5 CONNACK: (id, value bytes) pairs, as far as this test
/// reads them (the ones the gateway sends).
fn connack_properties(connack: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut props = Vec::new();
    let mut at = 5; // type, length, flags, code, property length (one byte here)
    while at < connack.len() {
        let id = connack[at];
        let len = match id {
            0x13 => 2,
            0x24 | 0x25 | 0x2A => 1,
            0x27 => 4,
            0x12 | 0x1F => 2 + usize::from(u16::from_be_bytes([connack[at + 1], connack[at + 2]])),
            other => panic!("property {other:#x} in {connack:02x?}"),
        };
        props.push((id, connack[at + 1..at + 1 + len].to_vec()));
        at += 1 + len;
    }
    props
}

/// MQTT 5 3.14.2.1: DISCONNECT with reason 0x04 (Disconnect with Will Message) ends the
/// session with its will in the `offline` event, where a plain DISCONNECT drops it.
#[tokio::test]
async fn disconnect_with_will_message_keeps_the_will() {
    let mut server = TestServer::start(config()).await;
    let (_, mut events) = Sse::open(server.api, "/v1/events?types=offline", &[]).await;
    let connect = connect_v5_full("61", "d", &[], Some(("gone/61", b"bye")), b"");
    let mut stream = session(server.mqtt, &connect).await;
    stream.write_all(&[0xE0, 2, 0x04, 0]).await.unwrap();
    let offline = events.expect("offline", 61).await;
    assert_eq!(offline.data["reason"], json!("disconnect"));
    assert_eq!(offline.data["will"], json!({"topic": "gone/61", "payload": BASE64.encode("bye")}));
    server.shutdown().await;
}

/// MQTT 5's Maximum Packet Size both ways: CONNACK says the gateway's (0x27) and, for an
/// empty client identifier, the one assigned (0x12); a push larger than the client's is
/// not sent to it and not counted; a packet larger than the gateway's gets DISCONNECT
/// 0x95, a CONNECT larger than its bound CONNACK 0x95.
#[tokio::test]
async fn maximum_packet_size_holds_both_ways() {
    let mut server = TestServer::start(Config { max_frame_bytes: 1_024, ..config() }).await;
    // The client takes packets of at most 40 bytes.
    let props = [0x27, 0, 0, 0, 40];
    let mut stream = TcpStream::connect(server.mqtt).await.unwrap();
    stream.write_all(&connect_v5_full("62", "", &props, None, b"")).await.unwrap();
    let connack = packet(&mut stream).await.expect("a CONNACK");
    assert_eq!(connack[3], 0, "{connack:02x?}");
    let props = connack_properties(&connack);
    assert!(props.contains(&(0x27, 1_024u32.to_be_bytes().to_vec())), "{props:?}");
    let assigned = props.iter().find(|(id, _)| *id == 0x12).expect("an assigned client identifier");
    assert_eq!(assigned.1.len(), 2 + 16, "the session's id: {assigned:?}");
    stream.write_all(&subscription_v5(true, "t")).await.unwrap();
    assert_eq!(packet(&mut stream).await.unwrap()[0], 0x90);
    // "t" and 34 bytes make a 40-byte PUBLISH; 35 would make 41.
    let over = push(server.api, &[62], &"x".repeat(35), Some("t")).await;
    assert_eq!((over["sessions"].clone(), over["unsubscribed"].clone()), (json!(0), json!([62])), "{over}");
    let fits = push(server.api, &[62], &"y".repeat(34), Some("t")).await;
    assert_eq!(fits["sessions"], json!(1), "{fits}");
    assert_eq!(published(&mut stream).await, ("t".to_string(), vec![b'y'; 34]));
    // Past the gateway's 1,024 bytes.
    stream.write_all(&packet_of(0x30, &[&[0, 1, b't', 0][..], &[b'z'; 1_100]].concat())).await.unwrap();
    let disconnect = packet(&mut stream).await.expect("a DISCONNECT");
    assert_eq!(&disconnect[..3], &[0xE0, disconnect[1], 0x95], "{disconnect:02x?}");
    // A CONNECT over the bound before any session.
    let mut big = TcpStream::connect(server.mqtt).await.unwrap();
    big.write_all(&connect_v5_full("63", "d", &[], None, &vec![b'p'; 8 * 1024])).await.unwrap();
    let refused = packet(&mut big).await.expect("a CONNACK");
    assert_eq!(&refused[..4], &[0x20, refused[1], 0, 0x95], "{refused:02x?}");
    server.shutdown().await;
}

/// A CONNECT carrying a 4 KiB password (a JWT from an identity provider) is read whole:
/// answered for its token, not cut off as too large.
#[tokio::test]
async fn a_connect_with_a_4_kib_password_is_read() {
    let mut server = TestServer::start(config()).await;
    let mut stream = TcpStream::connect(server.mqtt).await.unwrap();
    stream.write_all(&connect_v5_full("64", "d", &[], Some(("w", b"will")), &vec![b'j'; 4096])).await.unwrap();
    let connack = packet(&mut stream).await.expect("a CONNACK");
    assert_eq!(connack[3], 0, "no auth configured: accepted: {connack:02x?}");
    server.shutdown().await;
}

/// MQTT's MUSTs a gateway keeps on what clients send: a PUBLISH topic with a wildcard
/// closes ([MQTT-3.3.2-2], 0x90), a Topic Alias nobody offered closes (0x94), and a 3.1.1
/// client with an empty client identifier and CleanSession 0 is refused with 0x02
/// ([MQTT-3.1.3-8]).
#[tokio::test]
async fn topic_names_aliases_and_empty_identifiers_follow_the_spec() {
    let mut server = TestServer::start(config()).await;
    let mut wild = session(server.mqtt, &connect_v5("65", "d", 3)).await;
    wild.write_all(&publish_v5("a/+", b"x")).await.unwrap();
    assert_eq!(packet(&mut wild).await.expect("a DISCONNECT")[2], 0x90);
    let mut alias = session(server.mqtt, &connect_v5("66", "d", 3)).await;
    // PUBLISH "t" with property Topic Alias (0x23) 1.
    alias.write_all(&packet_of(0x30, &[0, 1, b't', 3, 0x23, 0, 1, b'x'])).await.unwrap();
    assert_eq!(packet(&mut alias).await.expect("a DISCONNECT")[2], 0x94);
    // 3.1.1, username, CleanSession 0, keepalive 5, empty client identifier.
    let mut body = vec![0, 4, b'M', b'Q', b'T', b'T', 4, 0x80, 0, 5, 0, 0];
    body.extend_from_slice(&[0, 2, b'6', b'7']);
    let mut c = TcpStream::connect(server.mqtt).await.unwrap();
    c.write_all(&packet_of(0x10, &body)).await.unwrap();
    assert_eq!(packet(&mut c).await.expect("a CONNACK"), [0x20, 2, 0, 0x02]);
    server.shutdown().await;
}

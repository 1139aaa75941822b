//! Presence over MQTT with real, unmodified clients: `mosquitto_sub` subscribed to a uid's
//! presence topic gets its current state, then one PUBLISH per change; `mosquitto_pub` and
//! paho set their user's status with a PUBLISH to the status topic, which the event stream
//! carries as a `status` event; paho watches over MQTT 5, 3.1.1 and MQTT over WebSocket.
//!
//! Without mosquitto-clients or paho-mqtt the tests that run them skip with a message; under
//! CI they fail instead.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::{find_on_path, short_config, skip_without, Sse, TestServer, PATIENCE};
use idlegate::{Config, WatchConfig, WatchPolicy};
use idlegate_proto::{CloseReason, Frame};
use serde_json::{json, Value};
use tokio::io::AsyncBufReadExt;
use tokio::process::Command;
use tokio::time::timeout;

fn config(policy: WatchPolicy) -> Config {
    Config {
        timeout: Duration::from_secs(9),
        // A user's second device sets its status while the first stays on.
        max_devices: 2,
        watch: WatchConfig { policy: Some(policy), ..WatchConfig::default() },
        ..short_config()
    }
}

type Lines = tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>;

async fn next_line(lines: &mut Lines) -> Option<String> {
    timeout(PATIENCE, lines.next_line()).await.expect("a line in time").expect("stdout reads")
}

/// The next presence message's JSON.
async fn next_presence(lines: &mut Lines) -> Value {
    loop {
        let line = next_line(lines).await.expect("a presence message");
        if line != "published" {
            return serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
        }
    }
}

/// (online, status, kind) of a presence message.
fn brief(message: &Value) -> (bool, &str, &str) {
    (message["online"].as_bool().unwrap(), message["status"].as_str().unwrap(), message["kind"].as_str().unwrap())
}

#[tokio::test]
async fn mosquitto_sub_watches_a_uid_and_mosquitto_pub_sets_a_status() {
    if find_on_path(&["mosquitto_pub"]).is_none() || find_on_path(&["mosquitto_sub"]).is_none() {
        skip_without("mosquitto_pub and mosquitto_sub", "apt-get install mosquitto-clients");
        return;
    }
    let mut server = TestServer::start(config(WatchPolicy::Open)).await;
    let (_, mut events) = Sse::open(server.api, "/v1/events?types=user_online,user_offline,status", &[]).await;
    for (version, uid) in [("mqttv5", 7u64), ("mqttv311", 17)] {
        let (uid_text, topic) = (uid.to_string(), format!("idlegate/presence/{uid}"));
        let port = server.mqtt.port().to_string();
        let mut sub = Command::new("mosquitto_sub")
            .args(["-h", "127.0.0.1", "-p", &port, "-u", "1", "-P", "token", "-k", "5", "-V", version])
            .args(["-t", &topic, "-C", "4"])
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("mosquitto_sub runs");
        let mut lines = tokio::io::BufReader::new(sub.stdout.take().unwrap()).lines();
        events.expect("user_online", 1).await;
        // The current state first: a uid never seen.
        let snapshot = next_presence(&mut lines).await;
        assert_eq!(snapshot, json!({"uid": uid, "online": false, "at_ms": 0, "status": "", "kind": "snapshot"}));
        let mut seven = server.client().await;
        seven.login(uid).await;
        let online = events.expect("user_online", uid).await;
        let change = next_presence(&mut lines).await;
        assert_eq!(brief(&change), (true, "", "change"), "{version}");
        assert_eq!(change["at_ms"], online.data["at_ms"]);
        // A second session of the uid sets the status (QoS 1: acknowledged), and leaves.
        let out = Command::new("mosquitto_pub")
            .args(["-h", "127.0.0.1", "-p", &port, "-u", &uid_text, "-P", "t", "-i", "phone", "-V", version])
            .args(["-q", "1", "-t", "idlegate/status", "-m", "on the train"])
            .output();
        let out = timeout(PATIENCE, out).await.expect("mosquitto_pub ends").expect("mosquitto_pub runs");
        assert!(out.status.success(), "{version}: {out:?}");
        assert_eq!(events.expect("status", uid).await.data["status"], "on the train");
        assert_eq!(brief(&next_presence(&mut lines).await), (true, "on the train", "change"), "{version}");
        seven.send(Frame::Logout).await;
        seven.expect_bye(CloseReason::Logout).await;
        let offline = events.expect("user_offline", uid).await;
        let change = next_presence(&mut lines).await;
        assert_eq!(brief(&change), (false, "", "change"), "{version}");
        assert_eq!(change["last_seen_ms"], offline.data["ended_ms"]);
        assert!(timeout(PATIENCE, sub.wait()).await.unwrap().unwrap().success(), "{version}");
        events.expect("user_offline", 1).await;
    }
    server.shutdown().await;
}

#[tokio::test]
async fn paho_watches_over_mqtt_5_3_1_1_and_websocket_and_policy_none_refuses_the_topic() {
    let paho = std::process::Command::new("python3").args(["-c", "import paho.mqtt"]).status();
    if !paho.is_ok_and(|s| s.success()) {
        skip_without("paho-mqtt", "python3 -m pip install paho-mqtt");
        return;
    }
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/paho_presence.py");
    let mut server = TestServer::start(config(WatchPolicy::Open)).await;
    let (_, mut events) = Sse::open(server.api, "/v1/events?types=status", &[]).await;
    for (version, transport, uid) in [("mqttv5", "tcp", 11), ("mqttv311", "tcp", 12), ("mqttv5", "websockets", 13)] {
        let port = if transport == "tcp" { server.mqtt.port() } else { server.ws.port() };
        let mut child = Command::new("python3")
            .arg(&script)
            .args(["127.0.0.1", &port.to_string(), &uid.to_string(), "8", "3", version, transport])
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("python3 runs");
        let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        assert_eq!(brief(&next_presence(&mut lines).await), (false, "", "snapshot"), "{version} {transport}");
        // Its own status, acknowledged, in the stream.
        assert_eq!(events.expect("status", uid).await.data["status"], "paho here");
        let mut eight = server.client().await;
        eight.login(8).await;
        assert_eq!(brief(&next_presence(&mut lines).await), (true, "", "change"), "{version} {transport}");
        eight.send(Frame::Logout).await;
        eight.expect_bye(CloseReason::Logout).await;
        assert_eq!(brief(&next_presence(&mut lines).await), (false, "", "change"), "{version} {transport}");
        let status = timeout(PATIENCE, child.wait()).await.unwrap().unwrap();
        assert!(status.success(), "{version} {transport}");
    }
    server.shutdown().await;

    // Under none the presence topic is refused in SUBACK (the connection stays).
    let mut server = TestServer::start(config(WatchPolicy::None)).await;
    let out = Command::new("python3")
        .arg(&script)
        .args(["127.0.0.1", &server.mqtt.port().to_string(), "11", "8", "1"])
        .output();
    let out = timeout(PATIENCE, out).await.unwrap().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("SUBACK refused"), "{out:?}");
    server.shutdown().await;
}

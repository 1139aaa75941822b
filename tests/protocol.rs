//! The wire protocol over real loopback TCP: every frame kind, every BYE reason, and the
//! gateway serving everyone else while one client misbehaves.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{raw_frame, sample, short_config, Sse, TestServer};
use idlegate::{Auth, Config};
use idlegate_proto::{kind, CloseReason, Frame};
use tokio::time::Instant;

#[tokio::test]
async fn login_ping_data_logout_byte_for_byte() {
    let mut server = TestServer::start(Config::default()).await;
    let mut c = server.client().await;
    c.send_raw(&raw_frame(kind::LOGIN, &[0, 0, 0, 0, 0, 0, 0, 42, b't'])).await;
    // WELCOME: length 25, kind 0x81, timeout 30000 ms, tick 1000 ms, then the session id
    // (16 hex digits, checked below and copied).
    let mut want = vec![0, 0, 0, 25, 0x81, 0, 0, 0x75, 0x30, 0, 0, 0x03, 0xe8];
    // PONG echoes the PING payload; DATA gets no reply; LOGOUT gets BYE(logout).
    c.send_raw(&raw_frame(kind::PING, b"abc")).await;
    c.send_raw(&raw_frame(kind::DATA, b"app")).await;
    c.send_raw(&raw_frame(kind::LOGOUT, b"")).await;
    want.extend_from_slice(&[0, 0, 0, 4, 0x82, b'a', b'b', b'c']);
    want.extend_from_slice(&[0, 0, 0, 2, 0x8f, 2]);
    let mut got = Vec::new();
    tokio::time::timeout(common::PATIENCE, tokio::io::AsyncReadExt::read_to_end(&mut c.stream, &mut got))
        .await
        .unwrap()
        .unwrap();
    let session = got.get(13..29).unwrap_or_default().to_vec();
    assert!(session.len() == 16 && session.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')), "{got:?}");
    want.splice(13..13, session);
    assert_eq!(got, want);

    let (_, body) = server.admin_get("/metrics").await;
    assert_eq!(sample(&body, "idlegate_logins_total"), Some(1.0));
    assert_eq!(sample(&body, "idlegate_online_users"), Some(0.0));
    for kind in ["login", "ping", "data", "logout"] {
        assert_eq!(sample(&body, &format!("idlegate_frames_received_total{{kind=\"{kind}\"}}")), Some(1.0), "{kind}");
    }
    assert_eq!(sample(&body, "idlegate_connections_closed_total{door=\"tcp\",reason=\"logout\"}"), Some(1.0));
    server.shutdown().await;
}

#[tokio::test]
async fn silent_client_gets_idle_timeout_inside_the_window_and_pinger_stays() {
    let config = short_config();
    let (timeout, tick) = (config.timeout, config.tick);
    let mut server = TestServer::start(config).await;
    let mut silent = server.client().await;
    let mut pinger = server.client().await;
    assert!(matches!(pinger.login(2).await, Frame::Welcome { timeout_ms: 600, tick_ms: 100, .. }));
    assert!(matches!(silent.login(1).await, Frame::Welcome { .. }));
    let silent_since = Instant::now();

    let keep_pinging = tokio::spawn(async move {
        // Three timeouts' worth of pings, each well inside the window.
        for _ in 0..9 {
            tokio::time::sleep(timeout / 3).await;
            pinger.ping(b"k").await;
        }
        pinger
    });
    silent.expect_bye(CloseReason::IdleTimeout).await;
    // The lower bound is the guarantee's; the upper bound would be a timing assertion on a
    // shared machine, so the ring's exact tick is tested with paused time instead.
    assert!(silent_since.elapsed() > timeout - tick, "expired after {:?}", silent_since.elapsed());
    let mut pinger = keep_pinging.await.unwrap();
    pinger.send(Frame::Logout).await;
    pinger.expect_bye(CloseReason::Logout).await;
    assert_eq!(server.metrics.closed_count(CloseReason::IdleTimeout), 1);
    assert_eq!(server.metrics.online_users.get(), 0);
    server.shutdown().await;
}

#[tokio::test]
async fn duplicate_login_kicks_the_older_connection_only() {
    let mut server = TestServer::start(Config::default()).await;
    let mut old = server.client().await;
    old.login(7).await;
    let mut new = server.client().await;
    assert!(matches!(new.login(7).await, Frame::Welcome { .. }));
    old.expect_bye(CloseReason::Kicked).await;
    // The old connection's cleanup left the new session alone.
    new.ping(b"still here").await;
    assert_eq!(server.metrics.online_users.get(), 1);
    new.send(Frame::Logout).await;
    new.expect_bye(CloseReason::Logout).await;
    assert_eq!(server.metrics.online_users.get(), 0);
    server.shutdown().await;
}

#[tokio::test]
async fn every_protocol_error_gets_its_bye_and_others_keep_being_served() {
    let mut server = TestServer::start(Config { max_frame_bytes: 1024, ..Config::default() }).await;
    let mut bystander = server.client().await;
    bystander.login(1000).await;

    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("unknown kind", [raw_frame(kind::LOGIN, &[0; 8]), raw_frame(0x7f, b"")].concat()),
        ("ping before login", raw_frame(kind::PING, b"")),
        ("data before login", raw_frame(kind::DATA, b"x")),
        ("short login", raw_frame(kind::LOGIN, &[0; 7])),
        ("second login", [raw_frame(kind::LOGIN, &[0; 8]), raw_frame(kind::LOGIN, &[0; 8])].concat()),
        ("zero length", vec![0, 0, 0, 0]),
        ("length over the limit", vec![0, 0, 4, 1]),
        ("huge length", vec![0xff, 0xff, 0xff, 0xff]),
        ("gateway frame from a client", raw_frame(kind::PONG, b"")),
        (
            "first frame over the login limit",
            raw_frame(kind::LOGIN, &[0; idlegate_proto::MAX_LOGIN_FRAME_BYTES as usize]),
        ),
        // Version 5: a timeout field of 3 bytes, and one of zero milliseconds.
        ("short login timeout", raw_frame(kind::LOGIN, &[0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 1, 2, 3])),
        ("zero login timeout", raw_frame(kind::LOGIN, &[0, 0, 0, 0, 0, 0, 0, 1, 0, b'd', 0, 0, 0, 0, 0])),
    ];
    for (name, bytes) in cases {
        let mut c = server.client().await;
        c.send_raw(&bytes).await;
        // A LOGIN that went through first is answered before the error.
        let mut frame = c.recv().await;
        if matches!(frame, Some(Frame::Welcome { .. })) {
            frame = c.recv().await;
        }
        match frame {
            Some(Frame::Bye { reason: CloseReason::ProtocolError, text }) => assert!(!text.is_empty(), "{name}"),
            other => panic!("{name}: expected BYE(protocol_error), got {other:?}"),
        }
        assert_eq!(c.recv().await, None, "{name}: closed after BYE");
        bystander.ping(b"fine").await;
    }
    assert_eq!(server.metrics.closed_count(CloseReason::ProtocolError), 12);
    assert_eq!(server.metrics.online_users.get(), 1);
    server.shutdown().await;
}

#[tokio::test]
async fn no_login_in_time_gets_login_timeout_even_mid_header() {
    let mut server = TestServer::start(short_config()).await;
    let mut nothing = server.client().await;
    let mut half_header = server.client().await;
    half_header.send_raw(&[0, 0]).await;
    let mut half_frame = server.client().await;
    half_frame.send_raw(&[0, 0, 0, 9, kind::LOGIN, 0, 0]).await;
    for c in [&mut nothing, &mut half_header, &mut half_frame] {
        c.expect_bye(CloseReason::LoginTimeout).await;
    }
    assert_eq!(server.metrics.closed_count(CloseReason::LoginTimeout), 3);
    server.shutdown().await;
}

#[tokio::test]
async fn tokens_are_checked_when_a_secret_is_set() {
    let auth = Auth::new("s3cret");
    let mut server = TestServer::start(Config { auth: Some(auth.clone()), ..Config::default() }).await;
    let expiry = idlegate_proto::unix_now() + 3600;

    let mut good = server.client().await;
    assert!(matches!(good.login_with(5, auth.mint(5, expiry).as_bytes()).await, Frame::Welcome { .. }));

    let expired = auth.mint(6, idlegate_proto::unix_now() - 1);
    let other_uid = auth.mint(5, expiry);
    let wrong_secret = Auth::new("nope").mint(6, expiry);
    for token in [b"".as_slice(), b"garbage", expired.as_bytes(), other_uid.as_bytes(), wrong_secret.as_bytes()] {
        let mut c = server.client().await;
        c.send(Frame::Login {
            uid: 6,
            token: Bytes::copy_from_slice(token),
            device: Default::default(),
            timeout_ms: None,
        })
        .await;
        c.expect_bye(CloseReason::AuthFailed).await;
    }
    good.ping(b"ok").await;
    assert_eq!(server.metrics.closed_count(CloseReason::AuthFailed), 5);
    assert_eq!(server.metrics.online_users.get(), 1);
    server.shutdown().await;
}

#[tokio::test]
async fn over_max_connections_gets_server_full_and_the_rest_are_served() {
    let mut server = TestServer::start(Config { max_connections: 2, ..Config::default() }).await;
    let mut a = server.client().await;
    let mut b = server.client().await;
    a.login(1).await;
    b.login(2).await;
    let mut c = server.client().await;
    let text = c.expect_bye(CloseReason::ServerFull).await;
    assert!(text.ends_with("; 2 connections open"), "{text}");
    let hint = idlegate_proto::retry_hint(&text).expect("a retry hint");
    assert!((1_000..3_000).contains(&hint), "{text}");
    a.ping(b"a").await;
    b.ping(b"b").await;
    // A slot frees up when a client leaves.
    a.send(Frame::Logout).await;
    a.expect_bye(CloseReason::Logout).await;
    let mut d = server.client().await;
    assert!(matches!(d.login(4).await, Frame::Welcome { .. }));
    assert_eq!(server.metrics.closed_count(CloseReason::ServerFull), 1);
    server.shutdown().await;
}

#[tokio::test]
async fn shutdown_sends_bye_to_everyone_and_ends_every_session() {
    let mut server = TestServer::start(Config::default()).await;
    let mut clients = Vec::new();
    for uid in 0..20 {
        let mut c = server.client().await;
        c.login(uid).await;
        clients.push(c);
    }
    let mut not_logged_in = server.client().await;
    assert_eq!(server.admin_get("/readyz").await.0, 200);
    assert_eq!(server.metrics.online_users.get(), 20);
    server.shutdown().await;
    let mut hints = std::collections::BTreeSet::new();
    for c in &mut clients {
        let text = c.expect_bye(CloseReason::Shutdown).await;
        let hint = idlegate_proto::retry_hint(&text).unwrap_or_else(|| panic!("no retry hint in {text:?}"));
        assert!((1_000..11_000).contains(&hint), "{text}");
        hints.insert(hint);
    }
    assert!(hints.len() > 10, "20 clients told to come back at {} moments only", hints.len());
    not_logged_in.expect_bye(CloseReason::Shutdown).await;
    assert_eq!(server.metrics.online_users.get(), 0);
    assert_eq!(server.metrics.connections_open.get(), 0);
    assert_eq!(server.metrics.closed_count(CloseReason::Shutdown), 21);
    assert!(tokio::net::TcpStream::connect(server.addr).await.is_err(), "no longer accepting");
}

#[tokio::test]
async fn admin_endpoint_serves_health_readiness_and_metrics() {
    let mut server = TestServer::start(Config::default()).await;
    assert_eq!(server.admin_get("/healthz").await, (200, "ok\n".into()));
    assert_eq!(server.admin_get("/readyz").await, (200, "ready\n".into()));
    let (status, body) = server.admin_get("/metrics").await;
    assert_eq!(status, 200);
    assert!(body.contains("idlegate_build_info{version=\""), "{body}");
    assert_eq!(server.admin_get("/nope").await.0, 404);
    server.shutdown().await;
}

#[tokio::test]
async fn frames_split_across_reads_and_large_frames_are_reassembled() {
    let mut server = TestServer::start(Config::default()).await;
    let mut c = server.client().await;
    c.login(9).await;
    // One byte per write, with pauses so each arrives in a read of its own.
    for b in raw_frame(kind::PING, b"split") {
        c.send_raw(&[b]).await;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(c.recv().await, Some(Frame::Pong(Bytes::from_static(b"split"))));
    // A frame far larger than one read, then a small one in the same write.
    let big = vec![7u8; 60_000];
    c.send_raw(&[raw_frame(kind::PING, &big), raw_frame(kind::PING, b"after")].concat()).await;
    assert_eq!(c.recv().await, Some(Frame::Pong(Bytes::from(big))));
    assert_eq!(c.recv().await, Some(Frame::Pong(Bytes::from_static(b"after"))));
    c.send(Frame::Logout).await;
    c.expect_bye(CloseReason::Logout).await;
    server.shutdown().await;
}

#[test]
fn the_hex_examples_in_protocol_md_are_what_the_encoder_writes() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/PROTOCOL.md")).unwrap();
    let examples = [
        (
            "| LOGIN uid 42, no token |",
            Frame::Login { uid: 42, token: Bytes::new(), device: Default::default(), timeout_ms: None },
        ),
        (
            "| LOGIN uid 42, no token, device `tab` |",
            Frame::Login { uid: 42, token: Bytes::new(), device: "tab".parse().unwrap(), timeout_ms: None },
        ),
        (
            "| LOGIN uid 42, no token, device `tab`, timeout 120000 ms |",
            Frame::Login {
                uid: 42,
                token: Bytes::new(),
                device: "tab".parse().unwrap(),
                timeout_ms: std::num::NonZeroU32::new(120_000),
            },
        ),
        (
            "| LOGIN uid 42, no token, default device, timeout 120000 ms |",
            Frame::Login {
                uid: 42,
                token: Bytes::new(),
                device: Default::default(),
                timeout_ms: std::num::NonZeroU32::new(120_000),
            },
        ),
        ("| PING with payload `hi` |", Frame::Ping(Bytes::from_static(b"hi"))),
        ("| DATA with payload `app` |", Frame::Data(Bytes::from_static(b"app"))),
        ("| LOGOUT |", Frame::Logout),
        (
            "| WELCOME 30000 ms / 1000 ms, session `00000000000000ff` |",
            Frame::Welcome { timeout_ms: 30_000, tick_ms: 1_000, session: "00000000000000ff".into() },
        ),
        ("| PONG with payload `hi` |", Frame::Pong(Bytes::from_static(b"hi"))),
        ("| PUSH with payload `hi` |", Frame::Push(Bytes::from_static(b"hi"))),
        ("| BYE idle_timeout, no text |", Frame::Bye { reason: CloseReason::IdleTimeout, text: String::new() }),
        ("| BYE protocol_error, text `bad` |", Frame::Bye { reason: CloseReason::ProtocolError, text: "bad".into() }),
    ];
    for (row, frame) in examples {
        let line = doc.lines().find(|l| l.starts_with(row)).unwrap_or_else(|| panic!("no example row {row}"));
        let hex: String = line[row.len()..].chars().filter(|c| c.is_ascii_hexdigit()).collect();
        let mut wire = bytes::BytesMut::new();
        tokio_util::codec::Encoder::encode(&mut idlegate_proto::FrameCodec::default(), frame, &mut wire).unwrap();
        let want: String = wire.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, want, "{row}");
    }
}

#[tokio::test]
async fn when_too_many_wait_to_log_in_the_oldest_is_shed_with_a_retry_hint() {
    let mut server = TestServer::start(Config { max_pending_logins: 2, ..Config::default() }).await;
    let mut online = server.client().await;
    online.login(1).await;
    let mut waiting_a = server.client().await;
    let mut waiting_b = server.client().await;
    // Two wait to log in: a third makes the oldest give way, told when to come back, so
    // sockets that never log in cannot keep the door shut.
    let mut newcomer = server.client().await;
    let text = waiting_a.expect_bye(CloseReason::ServerFull).await;
    assert!(text.contains("waiting to log in"), "{text}");
    assert!(idlegate_proto::retry_hint(&text).is_some(), "{text}");
    // The logged-in client was never affected; the others log in.
    online.ping(b"fine").await;
    assert!(matches!(newcomer.login(2).await, Frame::Welcome { .. }));
    assert!(matches!(waiting_b.login(3).await, Frame::Welcome { .. }));
    let (_, body) = server.admin_get("/metrics").await;
    assert_eq!(sample(&body, "idlegate_connections_shed_total{why=\"pending_logins\"}"), Some(1.0));
    assert_eq!(sample(&body, "idlegate_pending_logins"), Some(0.0));
    server.shutdown().await;
}

#[tokio::test]
async fn a_client_over_the_data_rate_is_ended_and_says_why() {
    let config = Config { max_data_rate: 10, max_data_burst: 5, ..Config::default() };
    let mut server = TestServer::start(config).await;
    let mut polite = server.client().await;
    polite.login(1).await;
    let mut flood = server.client().await;
    flood.login(2).await;
    for _ in 0..3 {
        polite.send(Frame::Data(bytes::Bytes::from_static(b"ok"))).await;
    }
    for _ in 0..100 {
        flood.send(Frame::Data(bytes::Bytes::from_static(b"flood"))).await;
    }
    let text = flood.expect_bye(CloseReason::ProtocolError).await;
    assert!(text.contains("--max-data-rate") && text.contains("10 frames a second"), "{text}");
    // The polite client, under the rate, is served on.
    polite.ping(b"fine").await;
    let (_, body) = server.admin_get("/metrics").await;
    let logged = sample(&body, "idlegate_events_total{type=\"data\"}").unwrap();
    assert!((3.0..=3.0 + 5.0 + 10.0 * 2.0).contains(&logged), "the flood logged {logged} data events");
    server.shutdown().await;
}

#[tokio::test]
async fn tokens_rotate_have_a_lifetime_and_refusals_say_why() {
    let (new, old) = (idlegate::Auth::new("new"), idlegate::Auth::new("old"));
    let auth = idlegate::Auth::rotating([b"new".to_vec(), b"old".to_vec()]).unwrap().with_max_ttl(3600);
    let mut server = TestServer::start(Config { auth: Some(auth), ..Config::default() }).await;
    let now = idlegate_proto::unix_now();
    // Both secrets are accepted while one rotates out.
    for (uid, minter) in [(1, &new), (2, &old)] {
        let mut c = server.client().await;
        let token = minter.mint(uid, now + 600);
        assert!(matches!(c.login_with(uid, token.as_bytes()).await, Frame::Welcome { .. }), "uid {uid}");
    }
    let cases = [
        (new.mint(3, now - 1), "token expired"),
        (idlegate::Auth::new("other").mint(3, now + 600), "token did not verify"),
        (new.mint(3, now + 7 * 24 * 3600), "--max-token-ttl"),
        (format!("0{}", new.mint(3, now + 600)), "token malformed"),
    ];
    for (token, why) in cases {
        let mut c = server.client().await;
        c.send(Frame::Login { uid: 3, token: bytes::Bytes::from(token), device: Default::default(), timeout_ms: None })
            .await;
        let text = c.expect_bye(CloseReason::AuthFailed).await;
        assert!(text.contains(why), "{why}: {text}");
        assert!(!text.contains("new") && !text.contains("old"), "no secret in {text}");
    }
    server.shutdown().await;
}

/// Issue 50: a LOGIN of version 5 asks for a timeout and gets its class, the shortest at or
/// above what it asked within `--min-timeout` and `--max-timeout`, which WELCOME says; a
/// version 4 LOGIN gets `--timeout`. Each session goes offline after its own timeout: a
/// silent session of the shortest class expires while one of the longest, as silent, stays.
#[tokio::test]
async fn a_login_gets_the_timeout_class_it_asks_for_and_expires_after_its_own_timeout() {
    let config = Config {
        min_timeout: Some(Duration::from_millis(300)),
        max_timeout: Some(Duration::from_secs(3)),
        timeout_classes: vec![Duration::from_secs(1)],
        ..short_config()
    };
    let tick = config.tick;
    let mut server = TestServer::start(config).await;
    let login = |uid: u64, timeout_ms: Option<u32>| Frame::Login {
        uid,
        token: Bytes::new(),
        device: Default::default(),
        timeout_ms: timeout_ms.and_then(std::num::NonZeroU32::new),
    };
    // The classes: the bounds, the listed one and --timeout.
    let cases = [
        (None, 600),
        (Some(1), 300),
        (Some(300), 300),
        (Some(301), 600),
        (Some(601), 1_000),
        (Some(2_000), 3_000),
        (Some(u32::MAX), 3_000),
    ];
    for (uid, (asked, got)) in (1..).zip(cases) {
        let mut c = server.client().await;
        c.send(login(uid, asked)).await;
        match c.recv().await {
            Some(Frame::Welcome { timeout_ms, tick_ms: 100, .. }) => assert_eq!(timeout_ms, got, "asked {asked:?}"),
            other => panic!("asked {asked:?}: expected WELCOME, got {other:?}"),
        }
    }
    let (_, mut events) = Sse::open(server.api, "/v1/events?types=online", &[]).await;
    let mut short = server.client().await;
    short.send(login(100, Some(300))).await;
    let mut long = server.client().await;
    long.send(login(101, Some(3_000))).await;
    assert!(matches!(short.recv().await, Some(Frame::Welcome { timeout_ms: 300, .. })));
    assert!(matches!(long.recv().await, Some(Frame::Welcome { timeout_ms: 3_000, .. })));
    // The backend sees each session's timeout in its online event, and in presence.
    assert_eq!(events.expect("online", 100).await.data["timeout_ms"], 300);
    assert_eq!(events.expect("online", 101).await.data["timeout_ms"], 3_000);
    let (status, body) = common::http(server.api, "GET", "/v1/presence/101", &[], "").await;
    assert_eq!(status, 200, "{body}");
    let presence: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(presence["sessions"][0]["timeout_ms"], 3_000, "{presence}");
    let since = Instant::now();
    short.expect_bye(CloseReason::IdleTimeout).await;
    assert!(since.elapsed() > Duration::from_millis(300) - tick, "expired after {:?}", since.elapsed());
    // As silent, the long one is still there: its PING is answered (and it was silent for
    // more than the short one's whole timeout).
    long.ping(b"here").await;
    server.shutdown().await;
}

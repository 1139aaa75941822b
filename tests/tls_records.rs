//! The TLS door's records once the handshake is over, which the gateway protects itself
//! with the keys rustls hands over (`src/transport/records.rs`), checked against rustls's
//! client (OpenSSL's is checked by `tests/tls.rs`): every cipher suite of TLS 1.3 and 1.2
//! carries frames both ways, records split at 16 KiB both ways, key updates, close_notify;
//! a record that does not decrypt or is too long ends only its own connection, with the
//! alert that says why, while another client is served.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::client_process::run_client;
use common::tls::{server_with, TestCa};
use common::{short_config, PATIENCE};
use futures_util::{SinkExt, StreamExt};
use idlegate::Config;
use idlegate_proto::{Frame, FrameCodec, TLS_ALPN};
use rustls::crypto::ring::cipher_suite as suites;
use rustls::{AlertDescription, SupportedCipherSuite};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::codec::Framed;

type Client = Framed<tokio_rustls::client::TlsStream<TcpStream>, FrameCodec>;

/// A PING payload over 16 KiB, so each way it crosses records.
const BIG: usize = 40_000;

fn config() -> Config {
    Config { timeout: Duration::from_secs(30), login_timeout: Duration::from_secs(5), ..short_config() }
}

async fn connect(ca: &TestCa, addr: std::net::SocketAddr, suite: SupportedCipherSuite) -> Client {
    let connector = tokio_rustls::TlsConnector::from(ca.client_config_with(&[TLS_ALPN], vec![suite]));
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
    let tls = connector.connect(name, tcp).await.expect("handshake");
    assert_eq!(tls.get_ref().1.negotiated_cipher_suite(), Some(suite));
    Framed::new(tls, FrameCodec::default())
}

async fn recv(client: &mut Client) -> Frame {
    tokio::time::timeout(PATIENCE, client.next()).await.expect("an answer in time").expect("open").expect("a frame")
}

async fn ping(client: &mut Client, payload: Bytes) {
    client.send(Frame::Ping(payload.clone())).await.unwrap();
    assert_eq!(recv(client).await, Frame::Pong(payload));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_suite_carries_frames_records_of_16_kib_key_updates_and_close_notify() {
    let (mut server, ca, _dir) = server_with(config()).await;
    let (Some(ca), Some(door)) = (ca, server.tls) else { return };
    let big = Bytes::from((0..BIG).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
    for suite in [
        suites::TLS13_AES_128_GCM_SHA256,
        suites::TLS13_AES_256_GCM_SHA384,
        suites::TLS13_CHACHA20_POLY1305_SHA256,
        suites::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        suites::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        suites::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ] {
        let mut client = connect(&ca, door, suite).await;
        client
            .send(Frame::Login { uid: 10, token: Bytes::new(), device: Default::default(), timeout_ms: None })
            .await
            .unwrap();
        assert!(matches!(recv(&mut client).await, Frame::Welcome { .. }), "{suite:?}");
        ping(&mut client, Bytes::from_static(b"small")).await;
        ping(&mut client, big.clone()).await;
        if suite.tls13().is_some() {
            // rustls asks for the gateway's update too: both directions change keys, twice.
            for round in 0..2 {
                client.get_mut().get_mut().1.refresh_traffic_keys().unwrap();
                ping(&mut client, Bytes::from(format!("after update {round}"))).await;
                ping(&mut client, big.clone()).await;
            }
        }
        // The client's close_notify: the gateway ends the connection, with nothing more sent.
        client.get_mut().get_mut().1.send_close_notify();
        client.get_mut().flush().await.unwrap();
        let rest = tokio::time::timeout(PATIENCE, client.next()).await.expect("closed in time");
        assert!(rest.is_none(), "{suite:?}: {rest:?}");
    }
    server.shutdown().await;
}

/// After a handshake and a login with `suite`, writes `record` straight to the socket and
/// returns the alert the gateway answers with, read by the client's own TLS state.
async fn alert_for(
    ca: &TestCa,
    door: std::net::SocketAddr,
    suite: SupportedCipherSuite,
    record: &[u8],
) -> rustls::Error {
    let mut client = connect(ca, door, suite).await;
    client
        .send(Frame::Login { uid: 20, token: Bytes::new(), device: Default::default(), timeout_ms: None })
        .await
        .unwrap();
    assert!(matches!(recv(&mut client).await, Frame::Welcome { .. }));
    let (mut tcp, mut tls) = client.into_inner().into_inner();
    tcp.write_all(record).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(PATIENCE, tcp.read_to_end(&mut answer)).await.expect("closed in time").unwrap();
    let mut answer = &answer[..];
    while !answer.is_empty() {
        tls.read_tls(&mut answer).unwrap();
        if let Err(e) = tls.process_new_packets() {
            return e;
        }
    }
    panic!("{suite:?}: no alert in the gateway's answer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_that_does_not_decrypt_or_is_too_long_gets_its_alert_and_others_are_served() {
    let (mut server, ca, _dir) = server_with(config()).await;
    let (Some(ca), Some(door)) = (ca, server.tls) else { return };
    let mut bystander = connect(&ca, door, suites::TLS13_AES_128_GCM_SHA256).await;
    bystander
        .send(Frame::Login { uid: 1, token: Bytes::new(), device: Default::default(), timeout_ms: None })
        .await
        .unwrap();
    assert!(matches!(recv(&mut bystander).await, Frame::Welcome { .. }));
    let forged: Vec<u8> = [23, 3, 3, 0, 40].into_iter().chain([0x5a; 40]).collect();
    let too_long = [23, 3, 3, 0x48, 0x01];
    for suite in [suites::TLS13_AES_256_GCM_SHA384, suites::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256] {
        let alert = alert_for(&ca, door, suite, &forged).await;
        assert_eq!(alert, rustls::Error::AlertReceived(AlertDescription::BadRecordMac), "{suite:?}");
        let alert = alert_for(&ca, door, suite, &too_long).await;
        assert_eq!(alert, rustls::Error::AlertReceived(AlertDescription::RecordOverflow), "{suite:?}");
        ping(&mut bystander, Bytes::from_static(b"still here")).await;
    }
    server.shutdown().await;
}

/// OpenSSL's client over every suite of both versions, and its KeyUpdate (`K`, asking the
/// gateway to update too): the PONG after the update comes back under the new keys.
#[test]
fn openssl_s_client_exchanges_frames_under_every_suite_and_a_key_update() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (mut server, ca, _dir) = rt.block_on(server_with(config()));
    let (Some(ca), Some(door)) = (ca, server.tls) else { return };
    let login = [0, 0, 0, 9, 1, 0, 0, 0, 0, 0, 0, 0, 42];
    let ping = |payload: &[u8]| {
        let mut frame = ((payload.len() + 1) as u32).to_be_bytes().to_vec();
        frame.push(2);
        frame.extend_from_slice(payload);
        frame
    };
    for (version, flag, suite) in [
        ("-tls1_3", "-ciphersuites", "TLS_AES_128_GCM_SHA256"),
        ("-tls1_3", "-ciphersuites", "TLS_AES_256_GCM_SHA384"),
        ("-tls1_3", "-ciphersuites", "TLS_CHACHA20_POLY1305_SHA256"),
        ("-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-GCM-SHA256"),
        ("-tls1_2", "-cipher", "ECDHE-ECDSA-AES256-GCM-SHA384"),
        ("-tls1_2", "-cipher", "ECDHE-ECDSA-CHACHA20-POLY1305"),
    ] {
        let mut command = std::process::Command::new("openssl");
        command.args(["s_client", "-connect", &door.to_string(), "-CAfile", &ca.cert, "-alpn", "idlegate"]);
        command.args([version, flag, suite]);
        // s_client reads its input in lines: a command line (`K`, it says KEYUPDATE on
        // stderr) must start one.
        let (before, after) = (ping(b"before\n"), ping(b"after\n"));
        let mut input: Vec<&[u8]> = vec![&login, &before];
        if version == "-tls1_3" {
            input.push(b"K\n");
        }
        input.push(&after);
        let (_, out) = run_client(command, &input);
        assert!(out.contains(&format!("Cipher is {suite}")), "{suite}: {out}");
        assert!(out.contains("before") && out.contains("after"), "{suite}: {out}");
        if version == "-tls1_3" {
            assert!(out.contains("KEYUPDATE"), "{suite}: {out}");
        }
    }
    rt.block_on(server.shutdown());
}

/// A handshake the door refuses ends with rustls's alert, not a silent close (RFC 8446 §6.2,
/// RFC 5246 §7.2.2): a client offering only another ALPN protocol hears
/// no_application_protocol, as the HTTPS listener's clients do (issue 34: they saw an
/// unexpected end of file).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_handshake_gets_its_alert() {
    let (mut server, ca, _dir) = server_with(config()).await;
    let (Some(ca), Some(door)) = (ca, server.tls) else { return };
    for suite in [suites::TLS13_AES_128_GCM_SHA256, suites::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256] {
        let connector = tokio_rustls::TlsConnector::from(ca.client_config_with(&[b"h2"], vec![suite]));
        let tcp = TcpStream::connect(door).await.unwrap();
        let name = rustls::pki_types::ServerName::IpAddress(door.ip().into());
        let e = connector.connect(name, tcp).await.expect_err("no protocol in common");
        let e = e.into_inner().and_then(|e| e.downcast::<rustls::Error>().ok()).map(|e| *e);
        assert_eq!(e, Some(rustls::Error::AlertReceived(AlertDescription::NoApplicationProtocol)), "{suite:?}");
    }
    server.shutdown().await;
}

/// A ClientHello announced at 16 KiB and trickled in is refused at once with decode_error:
/// nobody authenticated holds more than 8 KiB of handshake (rustls would join 64 KiB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_past_the_cap_gets_decode_error() {
    let (mut server, _ca, _dir) = server_with(config()).await;
    let Some(door) = server.tls else { return };
    let mut tcp = TcpStream::connect(door).await.unwrap();
    // A handshake record of 16,384 bytes, a ClientHello's first bytes of it sent.
    tcp.write_all(&[22, 3, 1, 0x40, 0x00, 1, 0, 0x3f, 0xfc, 3, 3]).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(PATIENCE, tcp.read_to_end(&mut answer)).await.expect("closed in time").unwrap();
    // An unprotected fatal decode_error (RFC 8446 §6), and nothing else.
    assert_eq!(answer, [21, 3, 3, 0, 2, 2, 50]);
    server.shutdown().await;
}

/// Issue 48, defect 12 (a TLS conformance suite's probes): a first record over the
/// record-size limit got `decode_error`, the handshake cap's alert, where RFC 8446 §5.1
/// requires `record_overflow` (rustls's own server answers so); and an SSL 2.0-format
/// ClientHello, or a first record whose header is no TLS record's, was held open until the
/// login timeout, then closed with no alert. The record's size is now checked before the
/// cap, and a header that is no TLS record's goes to rustls at once, which refuses it with
/// its alert (`decode_error`), long before the login timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_record_gets_record_overflow_and_no_tls_header_is_refused_at_once() {
    let (mut server, _ca, _dir) = server_with(Config { login_timeout: Duration::from_secs(60), ..config() }).await;
    let Some(door) = server.tls else { return };
    let answer = |first: &'static [u8]| async move {
        let mut tcp = TcpStream::connect(door).await.unwrap();
        tcp.write_all(first).await.unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(PATIENCE, tcp.read_to_end(&mut answer)).await.expect("closed in time").unwrap();
        answer
    };
    // A handshake record of 16,400 bytes (over 2^14), a ClientHello's first bytes sent.
    assert_eq!(answer(&[22, 3, 1, 0x40, 0x10, 1, 0, 0x40, 0x0c, 3, 3]).await, [21, 3, 3, 0, 2, 2, 22]);
    // An SSL 2.0 ClientHello (RFC 6101 appendix E.2: a two-byte length with its top bit
    // set, MSG-CLIENT-HELLO, version 3.1, then lengths the record never fills).
    let ssl2 = &[0x80, 0x2e, 0x01, 0x03, 0x01, 0x00, 0x15, 0x00, 0x00, 0x00, 0x10];
    assert_eq!(answer(ssl2).await, [21, 3, 3, 0, 2, 2, 50], "decode_error, as rustls says");
    // Plain HTTP on the TLS door.
    assert_eq!(answer(b"GET / HTTP/1.1\r\n").await, [21, 3, 3, 0, 2, 2, 50]);
    // A handshake record of no length.
    assert_eq!(answer(&[22, 3, 1, 0, 0]).await, [21, 3, 3, 0, 2, 2, 50]);
    server.shutdown().await;
}

//! An attack battery against the TLS door over real sockets: a real handshake with rustls's
//! client, the keys from its key log, then raw records no TLS library sends (the defects
//! issue 34 named, each alert kind, floods of empty records, warnings and KeyUpdates,
//! oversize records, bad tags). Each answer is checked against the RFC (the alert this
//! battery expects, by case) and against what rustls answers on the gateway's own HTTPS
//! listener (`--api-tls`, tokio-rustls) for the same records, where only the deviations
//! `tests/common/differential.rs` lists may differ. Another client is served throughout.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use bytes::Bytes;
use common::differential::{judge, run_with, End, Op, Server};
use common::raw_tls::{ALERT, APPLICATION_DATA, CHANGE_CIPHER_SPEC, HANDSHAKE};
use common::short_config;
use common::tls::server_with;
use common::ws::{DoorClient, Got};
use idlegate::Config;
use idlegate_proto::{Frame, Transport};
use rustls::crypto::ring::cipher_suite as suites;

/// How long a read waits for more of the server's answer.
const QUIET: Duration = Duration::from_millis(300);

const UNEXPECTED_MESSAGE: u8 = 10;
const BAD_RECORD_MAC: u8 = 20;
const RECORD_OVERFLOW: u8 = 22;
const ILLEGAL_PARAMETER: u8 = 47;

/// A server over a socket: each feed writes, then reads until the server falls quiet.
struct Socket {
    stream: TcpStream,
    end: End,
}

impl Socket {
    fn connect(addr: SocketAddr) -> Socket {
        let stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(QUIET)).unwrap();
        Socket { stream, end: End::Open }
    }
}

impl Server for Socket {
    fn feed(&mut self, bytes: &[u8]) -> (Vec<u8>, Vec<u8>, End) {
        if self.end == End::Open && self.stream.write_all(bytes).is_err() {
            self.end = End::Failed(None);
        }
        let mut wire = Vec::new();
        let mut buf = [0; 16 * 1024];
        while self.end == End::Open {
            match self.stream.read(&mut buf) {
                Ok(0) => self.end = End::Failed(None),
                Ok(n) => wire.extend_from_slice(&buf[..n]),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => break,
                Err(_) => self.end = End::Failed(None),
            }
        }
        (Vec::new(), wire, self.end)
    }

    fn send(&mut self, _data: &[u8]) -> Vec<u8> {
        // Neither application here echoes: the battery checks how sessions end.
        Vec::new()
    }
}

/// (name, records, the door's alert by RFC under TLS 1.3, and under TLS 1.2; `None`: the
/// case does not apply to that version). `Closed` is a close_notify taken and answered.
type Case = (&'static str, Vec<Op>, Option<End>, Option<End>);

fn battery() -> Vec<Case> {
    let failed = |alert| Some(End::Failed(Some(alert)));
    vec![
        ("a tag that does not verify", vec![Op::BadTag], failed(BAD_RECORD_MAC), failed(BAD_RECORD_MAC)),
        (
            "a header of 18,433 bytes",
            vec![Op::Raw(vec![APPLICATION_DATA, 3, 3, 0x48, 0x01])],
            failed(RECORD_OVERFLOW),
            failed(RECORD_OVERFLOW),
        ),
        ("padding past 2^14 + 1", vec![Op::Padded(vec![b'G'; 16 * 1024], 2)], failed(RECORD_OVERFLOW), None),
        ("an unprotected alert", vec![Op::Raw(vec![ALERT, 3, 3, 0, 2, 2, 40])], failed(UNEXPECTED_MESSAGE), None),
        ("an unknown outer content type", vec![Op::Outer(99)], failed(UNEXPECTED_MESSAGE), failed(UNEXPECTED_MESSAGE)),
        (
            "a change_cipher_spec after the handshake",
            vec![Op::Raw(vec![CHANGE_CIPHER_SPEC, 3, 3, 0, 1, 1])],
            failed(UNEXPECTED_MESSAGE),
            failed(UNEXPECTED_MESSAGE),
        ),
        ("close_notify", vec![Op::Alert(1, 0)], Some(End::Closed), Some(End::Closed)),
        ("a fatal alert from the client", vec![Op::Alert(2, 40)], Some(End::Failed(None)), Some(End::Failed(None))),
        ("five warnings", vec![Op::Alert(1, 90); 5], failed(UNEXPECTED_MESSAGE), failed(UNEXPECTED_MESSAGE)),
        ("an alert of unknown level", vec![Op::Alert(3, 0)], failed(ILLEGAL_PARAMETER), failed(ILLEGAL_PARAMETER)),
        ("33 KeyUpdates", vec![Op::KeyUpdate(1); 33], failed(UNEXPECTED_MESSAGE), None),
        ("33 empty records", vec![Op::Empty; 33], failed(UNEXPECTED_MESSAGE), failed(UNEXPECTED_MESSAGE)),
        ("a KeyUpdate asking 2", vec![Op::KeyUpdate(2)], failed(ILLEGAL_PARAMETER), None),
        ("a KeyUpdate in two records", vec![Op::SplitKeyUpdate], failed(UNEXPECTED_MESSAGE), None),
        (
            "a renegotiation",
            vec![Op::Handshake(vec![1, 0, 0, 0])],
            failed(UNEXPECTED_MESSAGE),
            failed(UNEXPECTED_MESSAGE),
        ),
        ("a header version 3.1", vec![Op::Version([3, 1])], None, failed(BAD_RECORD_MAC)),
        ("an empty handshake record", vec![Op::Raw(vec![HANDSHAKE, 3, 3, 0, 0])], None, Some(End::Failed(Some(50)))),
    ]
}

fn config() -> Config {
    Config { timeout: Duration::from_secs(60), login_timeout: Duration::from_secs(30), api_tls: true, ..short_config() }
}

#[test]
fn raw_records_get_the_rfcs_answer_and_rustlss_on_the_https_listener() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (mut server, ca, _dir) = rt.block_on(server_with(config()));
    let (Some(ca), Some(door)) = (ca, server.tls) else { return };
    let mut bystander = rt.block_on(DoorClient::connect(Transport::Tls, door, Some(&ca)));
    rt.block_on(bystander.login(7));
    let mut failures = Vec::new();
    for suite in [suites::TLS13_AES_128_GCM_SHA256, suites::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256] {
        let tls13 = suite.tls13().is_some();
        let door_config = ca.client_config_with(&[idlegate_proto::TLS_ALPN], vec![suite]);
        let https_config = ca.client_config_with(&[b"http/1.1"], vec![suite]);
        for (name, ops, rfc13, rfc12) in battery() {
            let Some(rfc) = (if tls13 { rfc13 } else { rfc12 }) else { continue };
            let ours = run_with(&mut Socket::connect(door), &door_config, &ops, &[]);
            let theirs = run_with(&mut Socket::connect(server.api), &https_config, &ops, &[]);
            if ours.end != rfc {
                failures.push(format!("{suite:?} {name}: the door ended {:?}, the RFC says {rfc:?}", ours.end));
            }
            if let Err(why) = judge(suite, &ops, &ours, &theirs) {
                failures.push(format!("{name}: {why}"));
            }
            let ping = Frame::Ping(Bytes::from(name));
            rt.block_on(bystander.send(ping));
            let pong = rt.block_on(bystander.recv());
            assert_eq!(pong, Got::Frame(Frame::Pong(Bytes::from(name))), "{name}: the bystander is still served");
        }
    }
    rt.block_on(server.shutdown());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

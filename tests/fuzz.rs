//! Random input against everything a client controls: byte streams, split at random points,
//! through the codec and through a real gateway's connection, and arbitrary LOGIN tokens
//! through `auth`. Nothing panics, no frame costs more buffer than it brought, and the
//! outcome never depends on how the bytes were split.

mod common;

use bytes::{BufMut, BytesMut};
use common::{raw_frame, TestServer};
use idlegate::{Auth, Config};
use idlegate_proto::{kind, Frame, FrameCodec, FrameError, HEADER_LEN};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Frame limit the fuzzed codec runs with: small, so random lengths often cross it.
const MAX: u32 = 300;

/// One piece of a random stream: mostly well-formed frames, sometimes garbage.
fn piece() -> impl Strategy<Value = Vec<u8>> {
    let kind = prop_oneof![
        Just(kind::LOGIN),
        Just(kind::PING),
        Just(kind::DATA),
        Just(kind::LOGOUT),
        Just(kind::PONG),
        any::<u8>()
    ];
    prop_oneof![
        6 => (kind, proptest::collection::vec(any::<u8>(), 0..40)).prop_map(|(k, p)| raw_frame(k, &p)),
        1 => proptest::collection::vec(any::<u8>(), 0..12),
        1 => (any::<u32>()).prop_map(|len| len.to_be_bytes().to_vec()),
    ]
}

fn stream() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(piece(), 0..12).prop_map(|pieces| pieces.concat())
}

/// Split points: sorted offsets, deduplicated.
fn splits(len: usize, cuts: &[usize]) -> Vec<usize> {
    let mut at: Vec<usize> = cuts.iter().map(|c| c % (len + 1)).collect();
    at.push(len);
    at.sort_unstable();
    at.dedup();
    at
}

/// What decoding yields: the frames, then the error that stopped it (as text), if any.
fn decode_in_pieces(bytes: &[u8], cuts: &[usize]) -> (Vec<Frame>, Option<String>) {
    let mut codec = FrameCodec::new(MAX);
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    let mut from = 0;
    // The most the buffer's allocations ever held: a reserve may take back the room of an
    // allocation it already has (BytesMut reclaims it once the frames split off are gone),
    // which costs nothing new.
    let mut allocated = 0;
    for to in splits(bytes.len(), cuts) {
        buf.extend_from_slice(&bytes[from..to]);
        from = to;
        loop {
            let capacity_before = buf.capacity();
            allocated = allocated.max(capacity_before);
            match codec.decode(&mut buf) {
                Ok(Some(frame)) => frames.push(frame),
                Ok(None) => {
                    // The codec reserves with what arrived, never with what a header claims.
                    // Doubling from a 64-byte step, as BytesMut rounds it.
                    let bound = (2 * buf.len() + 128).min(HEADER_LEN + MAX as usize + buf.len());
                    assert!(
                        buf.capacity() <= bound.max(allocated),
                        "reserved {} for {} buffered bytes (had {capacity_before}, allocated {allocated})",
                        buf.capacity(),
                        buf.len()
                    );
                    break;
                }
                Err(e) => return (frames, Some(e.to_string())),
            }
        }
    }
    (frames, None)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    #[test]
    fn the_codec_gives_the_same_frames_or_error_however_the_stream_is_split(
        bytes in stream(),
        cuts in proptest::collection::vec(any::<usize>(), 0..20),
    ) {
        let whole = decode_in_pieces(&bytes, &[]);
        let split = decode_in_pieces(&bytes, &cuts);
        let bytewise = decode_in_pieces(&bytes, &(0..bytes.len()).collect::<Vec<_>>());
        prop_assert_eq!(&whole, &split);
        prop_assert_eq!(&whole, &bytewise);
        for frame in &whole.0 {
            prop_assert!(frame.body_len() <= MAX as usize);
        }
    }

    #[test]
    fn any_token_is_refused_without_panicking_unless_it_was_minted(
        uid in any::<u64>(),
        token in proptest::collection::vec(any::<u8>(), 0..120),
        now in any::<u64>(),
    ) {
        let auth = Auth::new("s3cret");
        prop_assert!(auth.verify(uid, &token, now).is_err());
    }

    #[test]
    fn a_minted_token_verifies_and_any_change_to_it_does_not(
        uid in any::<u64>(),
        expiry in 1u64..u64::MAX,
        at in any::<usize>(),
        flip in 1u8..=255,
    ) {
        let auth = Auth::new("s3cret");
        let token = auth.mint(uid, expiry);
        prop_assert_eq!(auth.verify(uid, token.as_bytes(), expiry - 1), Ok(expiry));
        let mut bad = token.into_bytes();
        let i = at % bad.len();
        bad[i] ^= flip;
        prop_assert!(auth.verify(uid, &bad, expiry - 1).is_err());
        prop_assert!(auth.verify(uid.wrapping_add(1), &auth.mint(uid, expiry).into_bytes(), expiry - 1).is_err());
    }
}

/// Everything the gateway sends on one connection fed `bytes` in `pieces`, until it closes
/// (or, if it never does, until our side closes).
async fn gateway_answer(server: &TestServer, bytes: &[u8], cuts: &[usize]) -> Vec<u8> {
    door_answer(server.addr, bytes, cuts).await
}

/// Everything the door at `addr` sends on one connection fed `bytes` in pieces, until it
/// closes (or, if it never does, until our side closes).
async fn door_answer(addr: std::net::SocketAddr, bytes: &[u8], cuts: &[usize]) -> Vec<u8> {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    let mut from = 0;
    for to in splits(bytes.len(), cuts) {
        if s.write_all(&bytes[from..to]).await.is_err() {
            break;
        }
        from = to;
        tokio::task::yield_now().await;
    }
    let _ = s.shutdown().await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(common::PATIENCE, s.read_to_end(&mut answer)).await.expect("the gateway closes");
    answer
}

/// A LOGIN for `uid` followed by the random stream, so most cases reach the logged-in state.
fn after_login(uid: u64, bytes: &[u8]) -> Vec<u8> {
    let mut v = raw_frame(kind::LOGIN, &uid.to_be_bytes());
    v.put_slice(bytes);
    v
}

/// The gateway's answer with every WELCOME's session id blanked: each login gets an id of its
/// own, the rest must be the same byte for byte.
fn without_session_ids(answer: Vec<u8>) -> Vec<u8> {
    let mut rest = BytesMut::from(&answer[..]);
    let mut codec = FrameCodec::new(u32::MAX);
    let mut out = BytesMut::new();
    while let Ok(Some(frame)) = codec.decode(&mut rest) {
        let frame = match frame {
            Frame::Welcome { timeout_ms, tick_ms, .. } => {
                Frame::Welcome { timeout_ms, tick_ms, session: String::new() }
            }
            other => other,
        };
        tokio_util::codec::Encoder::encode(&mut codec, frame, &mut out).unwrap();
    }
    out.extend_from_slice(&rest);
    out.to_vec()
}

#[test]
fn the_gateway_answers_the_same_however_a_stream_is_split_and_keeps_serving() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let mut server = TestServer::start(Config { max_frame_bytes: MAX, ..Config::default() }).await;
        let mut bystander = server.client().await;
        bystander.login(u64::MAX).await;
        let mut runner =
            proptest::test_runner::TestRunner::new(ProptestConfig { cases: 150, ..ProptestConfig::default() });
        let strategy = (stream(), proptest::collection::vec(any::<usize>(), 1..12), any::<bool>());
        let mut case = 0u64;
        let mut failures = Vec::new();
        for _ in 0..150 {
            let (bytes, cuts, login_first) = strategy.new_tree(&mut runner).unwrap().current();
            case += 1;
            // Each case uses its own uid, so no case kicks another.
            let bytes = if login_first { after_login(case, &bytes) } else { bytes };
            let whole = without_session_ids(gateway_answer(&server, &bytes, &[]).await);
            let split = without_session_ids(gateway_answer(&server, &bytes, &cuts).await);
            if whole != split {
                failures.push(format!("case {case}: {bytes:02x?} split at {cuts:?}: {whole:02x?} != {split:02x?}"));
            }
            // Everything the gateway sent decodes as frames.
            let mut answer = BytesMut::from(&whole[..]);
            let mut codec = FrameCodec::new(u32::MAX);
            while let Some(frame) = codec.decode(&mut answer).map_err(|e: FrameError| e.to_string()).unwrap() {
                assert!(!matches!(frame, Frame::Login { .. }), "the gateway sent a LOGIN");
            }
            bystander.ping(b"still served").await;
        }
        assert!(failures.is_empty(), "{} of {case} cases differ:\n{}", failures.len(), failures.join("\n"));
        server.shutdown().await;
    });
}

/// An MQTT 5 packet: `first` byte, then `body` with a one-byte remaining length.
fn mqtt(first: u8, body: &[u8]) -> Vec<u8> {
    [&[first, body.len() as u8][..], body].concat()
}

/// An MQTT 5 CONNECT for `uid`, client identifier "f", keepalive 5 s.
fn mqtt_connect(uid: u64) -> Vec<u8> {
    let user = uid.to_string();
    let mut body = vec![0, 4, b'M', b'Q', b'T', b'T', 5, 0x82, 0, 5, 0, 0, 1, b'f'];
    body.extend_from_slice(&(user.len() as u16).to_be_bytes());
    body.extend_from_slice(user.as_bytes());
    mqtt(0x10, &body)
}

/// One piece of a random MQTT stream: mostly well-formed packets, sometimes garbage.
fn mqtt_piece() -> impl Strategy<Value = Vec<u8>> {
    let payload = || proptest::collection::vec(any::<u8>(), 0..20);
    prop_oneof![
        2 => Just(mqtt(0xC0, &[])),
        2 => payload().prop_map(|p| mqtt(0x30, &[&[0, 1, b'a', 0][..], &p].concat())),
        2 => (payload(), any::<u16>()).prop_map(|(p, id)| {
            let id = id.max(1).to_be_bytes();
            mqtt(0x32, &[&[0, 1, b'a', id[0], id[1], 0][..], &p].concat())
        }),
        1 => Just(mqtt(0x82, &[0, 1, 0, 0, 1, b'#', 0])),
        1 => Just(mqtt(0xA2, &[0, 2, 0, 0, 1, b'#'])),
        1 => Just(mqtt(0x34, &[0, 1, b'a', 0, 1, 0])),
        1 => proptest::collection::vec(any::<u8>(), 0..12),
        1 => (any::<u8>(), payload()).prop_map(|(first, p)| mqtt(first, &p)),
    ]
}

#[test]
fn the_mqtt_door_answers_the_same_however_a_stream_is_split_and_keeps_serving() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let mut server = TestServer::start(Config { max_frame_bytes: MAX, ..Config::default() }).await;
        let mut bystander = tokio::net::TcpStream::connect(server.mqtt).await.unwrap();
        bystander.write_all(&mqtt_connect(u64::MAX)).await.unwrap();
        let mut connack = [0u8; 32];
        let n = bystander.read(&mut connack).await.unwrap();
        assert_eq!(connack[0], 0x20, "{:02x?}", &connack[..n]);
        let mut runner =
            proptest::test_runner::TestRunner::new(ProptestConfig { cases: 150, ..ProptestConfig::default() });
        let strategy = (
            proptest::collection::vec(mqtt_piece(), 0..10).prop_map(|p| p.concat()),
            proptest::collection::vec(any::<usize>(), 1..12),
            any::<bool>(),
        );
        let mut failures = Vec::new();
        // Answers seen starting with a CONNACK and holding a PUBACK: the streams reach the
        // session, not only the refusals.
        let (mut sessions, mut acks) = (0, 0);
        for case in 1..=150u64 {
            let (bytes, cuts, connect_first) = strategy.new_tree(&mut runner).unwrap().current();
            let bytes = if connect_first { [mqtt_connect(case), bytes].concat() } else { bytes };
            let whole = door_answer(server.mqtt, &bytes, &[]).await;
            let split = door_answer(server.mqtt, &bytes, &cuts).await;
            if whole != split {
                failures.push(format!("case {case}: {bytes:02x?} split at {cuts:?}: {whole:02x?} != {split:02x?}"));
            }
            if whole.starts_with(&[0x20]) && whole.get(3) == Some(&0) {
                sessions += 1;
                acks += usize::from(whole.windows(2).any(|w| w == [0x40, 2]));
            }
            // The bystander is still served: PINGREQ, PINGRESP.
            bystander.write_all(&[0xC0, 0]).await.unwrap();
            let mut pong = [0u8; 2];
            bystander.read_exact(&mut pong).await.unwrap();
            assert_eq!(pong, [0xD0, 0], "case {case}");
        }
        assert!(failures.is_empty(), "{} of 150 cases differ:\n{}", failures.len(), failures.join("\n"));
        assert!(sessions > 30 && acks > 5, "{sessions} sessions, {acks} with a PUBACK");
        server.shutdown().await;
    });
}

//! The TLS door's record layer against rustls's own, record for record.
//!
//! Two sessions, one handshake each with the same server configuration: the door's layer
//! (rustls's handshake, then the hand-over to `src/transport/records.rs`), and rustls's
//! `ServerConnection`, whose record layer never hands over. A raw client
//! (`common/raw_tls.rs`: rustls's client for the handshake, then ring under the logged
//! keys) seals one generated stream of records for each, under each session's keys: valid
//! data, empty records, padding, records too long, tags that do not verify, wrong and
//! unknown content types, other header versions, alerts of every level, KeyUpdates single,
//! repeated, unknown and split over two records, other handshake messages, bytes outside
//! any record's protection; delivered to both at the same split points. Both must give the
//! same plaintext, end the same way (still open, closed by the client's close_notify, or
//! failed with the same alert), and agree on key updates: where one answers the client's
//! request, so does the other, and data sent afterwards reads under the keys the client
//! then holds. Where the door's layer answers otherwise on purpose, [`DEVIATIONS`] names
//! the case and the RFC that allows it; nothing else may differ.
//!
//! Proptest runs a few hundred streams in `cargo test`, with its failures kept in
//! `tests/tls_differential.proptest-regressions`; `fuzz/` runs the same comparison for as
//! long as one likes (docs/SECURITY.md says how).

mod common;

use common::differential::{compare, Op, SUITES};
use common::raw_tls::{ALERT, APPLICATION_DATA, CHANGE_CIPHER_SPEC, HANDSHAKE};
use proptest::prelude::*;

fn op() -> impl Strategy<Value = Op> {
    let bytes = || proptest::collection::vec(any::<u8>(), 0..40);
    prop_oneof![
        6 => bytes().prop_map(Op::Data),
        2 => Just(Op::Empty),
        3 => prop_oneof![Just(0u8), Just(1u8), any::<u8>()].prop_map(Op::KeyUpdate),
        1 => Just(Op::SplitKeyUpdate),
        2 => (prop_oneof![Just(1u8), Just(2u8), any::<u8>()], prop_oneof![Just(0u8), Just(90u8), Just(100u8), any::<u8>()])
            .prop_map(|(level, description)| Op::Alert(level, description)),
        1 => prop_oneof![Just(vec![1u8, 0, 0, 0]), Just(vec![20u8, 0, 0, 1, 0]), bytes()].prop_map(Op::Handshake),
        1 => (bytes(), 0usize..300).prop_map(|(payload, padding)| Op::Padded(payload, padding)),
        1 => (0usize..300).prop_map(Op::Oversize),
        1 => Just(Op::BadTag),
        1 => prop_oneof![Just(CHANGE_CIPHER_SPEC), Just(ALERT), Just(HANDSHAKE), Just(24u8), any::<u8>()].prop_map(Op::Outer),
        1 => prop_oneof![Just([3u8, 1]), Just([3u8, 4]), Just([2u8, 0]), Just([0u8, 2]), Just([0xfeu8, 0xfd]), any::<[u8; 2]>()].prop_map(Op::Version),
        1 => Just(Op::NoType),
        1 => (prop_oneof![Just(CHANGE_CIPHER_SPEC), Just(24u8), Just(0u8), any::<u8>()], bytes())
            .prop_map(|(typ, payload)| Op::Inner(typ, payload)),
        1 => prop_oneof![Just(vec![ALERT, 3, 3, 0, 2, 1, 0]), Just(vec![CHANGE_CIPHER_SPEC, 3, 3, 0, 1, 1]), bytes()]
            .prop_map(Op::Raw),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn the_door_answers_every_record_stream_as_rustls_does(
        suite in proptest::sample::select(SUITES.to_vec()),
        ops in proptest::collection::vec(op(), 1..10),
        cuts in proptest::collection::vec(any::<usize>(), 0..4),
    ) {
        if let Err(why) = compare(suite, &ops, &cuts) {
            return Err(TestCaseError::fail(why));
        }
    }
}

/// The cases the defects were found in, each on every suite, whole and cut byte by byte.
#[test]
fn the_named_cases_match_rustls_on_every_suite() {
    let cases: Vec<(&str, Vec<Op>)> = vec![
        ("data", vec![Op::Data(b"hello".to_vec()), Op::Data(vec![7; 16 * 1024])]),
        ("33 key updates", vec![Op::KeyUpdate(1); 33]),
        (
            "32 key updates, data, 32 more",
            [vec![Op::KeyUpdate(0); 32], vec![Op::Data(b"x".to_vec())], vec![Op::KeyUpdate(1); 32]].concat(),
        ),
        ("5 warnings", vec![Op::Alert(1, 90); 5]),
        ("4 warnings, data", [vec![Op::Alert(1, 90); 4], vec![Op::Data(b"y".to_vec())]].concat()),
        ("33 empty records", vec![Op::Empty; 33]),
        ("32 empty records, data", [vec![Op::Empty; 32], vec![Op::Data(b"z".to_vec())]].concat()),
        ("padding past 2^14 + 1", vec![Op::Padded(vec![1; 16 * 1024], 2)]),
        ("oversize", vec![Op::Oversize(1)]),
        ("bad tag", vec![Op::BadTag]),
        ("close_notify then data", vec![Op::Alert(1, 0), Op::Data(b"after".to_vec())]),
        ("fatal alert", vec![Op::Alert(2, 40)]),
        ("renegotiation", vec![Op::Handshake(vec![1, 0, 0, 0])]),
        ("header version 3,1", vec![Op::Version([3, 1])]),
        ("unknown outer type", vec![Op::Outer(99)]),
        ("protected change_cipher_spec", vec![Op::Inner(CHANGE_CIPHER_SPEC, vec![1])]),
        ("no content type", vec![Op::NoType]),
        ("plaintext alert", vec![Op::Raw(vec![ALERT, 3, 3, 0, 2, 2, 40])]),
        ("a header of 17,000 bytes", vec![Op::Raw(vec![APPLICATION_DATA, 3, 3, 0x42, 0x68])]),
        ("a header of 18,432 bytes", vec![Op::Raw(vec![APPLICATION_DATA, 3, 3, 0x48, 0x00])]),
        ("a header of 65,535 bytes", vec![Op::Raw(vec![APPLICATION_DATA, 3, 3, 0xff, 0xff])]),
        ("an empty handshake record", vec![Op::Raw(vec![HANDSHAKE, 3, 3, 0, 0])]),
        ("version 2.0", vec![Op::Version([2, 0])]),
        ("version 3.4", vec![Op::Version([3, 4])]),
        ("SSL 2's version", vec![Op::Version([0, 2])]),
        ("DTLS 1.2's version", vec![Op::Version([0xfe, 0xfd])]),
        ("a header cut after a bad version", vec![Op::Data(vec![1; 8]), Op::Raw(vec![ALERT, 0x8f, 0x4e, 0x2f])]),
        ("heartbeat", vec![Op::Inner(24, vec![1, 0, 0])]),
    ];
    let mut failures = Vec::new();
    for suite in SUITES {
        for (name, ops) in &cases {
            // Whole, then in pieces of 7 bytes (the first 512 of them).
            let pieces: Vec<usize> = (0..512).map(|i| i * 7).collect();
            for (how, cuts) in [("whole", &[][..]), ("in pieces", &pieces[..])] {
                if let Err(why) = compare(suite, ops, cuts) {
                    failures.push(format!("{name} ({how}): {why}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} differences:\n{}", failures.len(), failures.join("\n"));
}

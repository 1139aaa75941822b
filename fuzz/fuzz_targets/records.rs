//! The differential test of `tests/tls_differential.rs` for as long as libFuzzer runs: the
//! input picks a cipher suite, a stream of records (each op from a byte or a few) and the
//! points it is cut at; the door's TLS layer and rustls's own must answer alike, or differ
//! only where the test's list of deviations allows.

#![no_main]

#[path = "../../tests/common/raw_tls.rs"]
mod raw_tls;

#[path = "../../tests/common/differential.rs"]
mod differential;

use differential::{compare, Op, SUITES};
use libfuzzer_sys::fuzz_target;

/// Reads ops from the fuzzer's bytes: one byte names the op, the next ones its arguments.
fn ops(mut input: &[u8]) -> Vec<Op> {
    let mut take = |n: usize| -> Vec<u8> {
        let n = n.min(input.len());
        let (head, rest) = input.split_at(n);
        input = rest;
        head.to_vec()
    };
    let mut ops = Vec::new();
    while ops.len() < 64 {
        let Some(&kind) = take(1).first() else { break };
        let arg = take(1).first().copied().unwrap_or(0);
        let op = match kind % 14 {
            0 => Op::Data(take(usize::from(arg % 48))),
            1 => Op::Empty,
            2 => Op::KeyUpdate(arg % 3),
            3 => Op::SplitKeyUpdate,
            4 => Op::Alert(arg % 3, take(1).first().copied().unwrap_or(0)),
            5 => Op::Handshake(take(usize::from(arg % 8))),
            6 => Op::Padded(take(usize::from(arg % 16)), usize::from(take(1).first().copied().unwrap_or(0))),
            7 => Op::Oversize(usize::from(arg)),
            8 => Op::BadTag,
            9 => Op::Outer(arg),
            10 => Op::Version([arg, take(1).first().copied().unwrap_or(3)]),
            11 => Op::NoType,
            12 => Op::Inner(arg, take(4)),
            _ => Op::Raw(take(usize::from(arg % 16))),
        };
        ops.push(op);
    }
    ops
}

fuzz_target!(|input: &[u8]| {
    let [suite, cut_a, cut_b, rest @ ..] = input else { return };
    let suite = SUITES[usize::from(*suite) % SUITES.len()];
    let cuts = [usize::from(*cut_a) * 7, usize::from(*cut_b) * 131];
    if let Err(why) = compare(suite, &ops(rest), &cuts) {
        panic!("{why}");
    }
});

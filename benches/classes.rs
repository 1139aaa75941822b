//! What timeout classes add to a tick: one shard's rings ([`ClassRings`]) with sessions in
//! 1, 5 or every default class (5 s to 30 min at a 1 s tick), the same number of sessions
//! in each case, swept on
//! - `quiet_tick`: a tick on which nothing falls due (the step per class alone);
//! - `tick_1000_due`: a tick on which 1,000 sessions fall due, spread over the classes.
//!
//! A sweep should cost what it expires plus a step per class: the quiet tick grows with the
//! classes in use, the busy one by little more than that.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion};
use idlegate::bench::{Class, ClassRings};
use idlegate::Config;

/// Sessions in the shard, spread evenly over the classes in use.
const SESSIONS: u64 = 10_000;

/// Sessions that fall due on the busy tick.
const DUE: u64 = 1_000;

/// A shard's rings for every class of `windows` (ticks each), with `SESSIONS` sessions
/// spread over the classes `used` (each with its window), `due` of them falling due on the
/// tick returned: every ring's cursor just before it, the other sessions short of their
/// deadline.
fn shard(windows: &[u64], used: &[(Class, u64)], due: u64) -> (ClassRings, u64) {
    let mut rings = ClassRings::new(windows);
    let k = used.len();
    let longest = used.iter().map(|&(_, w)| w).max().unwrap_or(1);
    // The busy tick: `longest`, so the longest class's due sessions are touched on tick 0.
    let busy = longest;
    // Classes by window, longest first, so the cursor only moves forward.
    let mut order: Vec<(usize, Class, u64)> = used.iter().enumerate().map(|(i, &(c, w))| (i, c, w)).collect();
    order.sort_by_key(|&(_, _, w)| std::cmp::Reverse(w));
    for &(i, class, window) in &order {
        rings.advance(busy - window);
        let mine = (0..SESSIONS).filter(|uid| uid % k as u64 == i as u64);
        for (n, uid) in mine.enumerate() {
            // The first due / k of each class fall due on the busy tick; the rest later.
            if (n as u64) < due / k as u64 {
                rings.insert(class, uid, busy - window);
            }
        }
    }
    rings.advance(busy - 1);
    for &(i, class, _) in &order {
        let mine = (0..SESSIONS).filter(|uid| uid % k as u64 == i as u64);
        for (n, uid) in mine.enumerate() {
            if (n as u64) >= due / k as u64 {
                rings.insert(class, uid, busy - 1);
            }
        }
    }
    (rings, busy)
}

/// One tick's sweep; hands the rings back, so their freeing falls outside the timing.
fn sweep(mut rings: ClassRings, busy: u64, mut out: Vec<u64>, expected: u64) -> (ClassRings, Vec<u64>) {
    rings.advance(busy);
    let taken = rings.expire(usize::MAX, &mut out);
    assert_eq!(taken as u64, expected, "the sweep took {taken}");
    (rings, black_box(out))
}

fn classes(c: &mut Criterion) {
    let defaults = Config::default().timeout_classes();
    let all: Vec<(Class, u64)> = defaults.iter().map(|class| (class, defaults.window(class))).collect();
    let windows: Vec<u64> = all.iter().map(|&(_, w)| w).collect();
    for (name, due) in [("quiet_tick", 0), ("tick_1000_due", DUE)] {
        let mut group = c.benchmark_group(name);
        for k in [1, 5, all.len()] {
            // One class: the default's own (30 s); five: spread across the range.
            let picked: Vec<(Class, u64)> = match k {
                1 => vec![all[all.iter().position(|&(c, _)| c == defaults.default_class()).unwrap_or(0)]],
                5 => (0..5).map(|i| all[i * (all.len() - 1) / 4]).collect(),
                _ => all.clone(),
            };
            let due = due - due % k as u64;
            group.bench_function(BenchmarkId::new("classes", k), |b| {
                b.iter_batched(
                    || (shard(&windows, &picked, due), Vec::with_capacity(due as usize)),
                    |((rings, busy), out)| sweep(rings, busy, out, due),
                    BatchSize::LargeInput,
                )
            });
        }
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    targets = classes
}
criterion_main!(benches);

//! Checks the model within a bound given on the command line, for published runs deeper
//! than CI's (docs/RELIABILITY.md): prints the states generated and unique, the depth
//! reached, the time, and each property's outcome; exits 1 if a promise broke.
//!
//!     cargo run --release -p idlegate-model --bin model-check -- NODES DEVICES LOGINS FAULTS [SECONDS]
//!
//! With SECONDS, checking stops after that long (the depth reached is then the figure).

// No async runtime here, and nothing whose time a test would pause: the wall time of a
// CPU-bound check is what is reported.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use idlegate_model::{Bounds, Mutation, System};
use stateright::{Checker, Model};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let number = |i: usize, default: u64| args.get(i).map_or(default, |a| a.parse().expect("a number"));
    let bounds = Bounds {
        nodes: number(0, 2) as u8,
        devices: number(1, 2) as u8,
        logins: number(2, 3) as u8,
        faults: number(3, 2) as u8,
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut builder = System::new(bounds, Mutation::None).checker().threads(threads);
    let limit = args.get(4).map(|seconds| Duration::from_secs(seconds.parse().expect("seconds")));
    if let Some(limit) = limit {
        builder = builder.timeout(limit);
    }
    let started = Instant::now();
    // Depth first: its memory is the visited states' fingerprints and one path, where a
    // breadth-first frontier of whole states outgrows the machine past the CI bound.
    let checker = builder.spawn_dfs().join();
    let took = started.elapsed();
    println!("bounds: {bounds:?}, {threads} threads");
    println!(
        "states: {} generated, {} unique; depth {}; {:.1} s; {}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        took.as_secs_f64(),
        // A checker stopped by its time limit says it is done too: the time tells.
        if limit.is_some_and(|limit| took >= limit) || !checker.is_done() {
            "stopped at the time limit: no counterexample among the states explored"
        } else {
            "exhausted"
        }
    );
    let mut broken = false;
    for property in checker.model().properties() {
        let found = checker.discovery(property.name);
        let (outcome, bad) = match (property.expectation, &found) {
            (stateright::Expectation::Sometimes, Some(_)) => ("reached", false),
            (stateright::Expectation::Sometimes, None) => ("not reached", checker.is_done()),
            (_, None) => ("holds", false),
            (_, Some(_)) => ("BROKEN", true),
        };
        broken |= bad;
        println!("  {outcome}: {}", property.name);
        if bad {
            if let Some(path) = found {
                println!("    {:?}", path.into_actions());
            }
        }
    }
    if broken {
        std::process::exit(1);
    }
}

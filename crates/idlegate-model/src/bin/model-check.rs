//! Checks the model within a bound given on the command line, for published runs deeper
//! than CI's (docs/RELIABILITY.md): prints the states generated and unique, the depth
//! reached, the time, and each property's outcome; exits 1 if a promise broke.
//!
//!     cargo run --release -p idlegate-model --bin model-check -- NODES DEVICES LOGINS FAULTS [SECONDS [FAILOVERS [bfs]]]
//!
//! With SECONDS (0: none), checking stops after that long (the depth reached is then the
//! figure). FAILOVERS (default 0) are failovers of Redis that lose writes, beside the
//! faults. `bfs` checks breadth first (shortest counterexamples; memory grows with the
//! frontier).

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
        failovers: number(5, 0) as u8,
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    // `IDLEGATE_MODEL_VERBOSE=1`: each counterexample's sessions, users and nodes at every step.
    let verbose = std::env::var_os("IDLEGATE_MODEL_VERBOSE").is_some();
    let mut builder = System::new(bounds, Mutation::None).checker().threads(threads);
    let limit = args
        .get(4)
        .map(|seconds| Duration::from_secs(seconds.parse().expect("seconds")))
        .filter(|limit| !limit.is_zero());
    if let Some(limit) = limit {
        builder = builder.timeout(limit);
    }
    let started = Instant::now();
    // Depth first: its memory is the visited states' fingerprints and one path, where a
    // breadth-first frontier of whole states outgrows the machine past the CI bound.
    let checker: Box<dyn Checker<System>> = if args.get(6).is_some_and(|a| a == "bfs") {
        Box::new(builder.spawn_bfs().join())
    } else {
        Box::new(builder.spawn_dfs().join())
    };
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
            "stopped at the time limit, not exhausted"
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
                let states = path.clone().into_states();
                for (action, state) in path.into_actions().iter().zip(states.iter().skip(1)) {
                    println!("    {action:?}");
                    println!("      log: {:?}", state.store.log);
                    if verbose {
                        println!("      sessions: {:?} users: {:?}", state.store.sessions, state.store.users);
                        for n in &state.nodes {
                            println!(
                                "      node {}#{}: live {:?} queue {:?} known {:?}",
                                n.id, n.run, n.live, n.queue, n.known
                            );
                        }
                    }
                }
            }
        }
    }
    if broken {
        std::process::exit(1);
    }
}

//! The model checked exhaustively within the CI bound (issue 53), and the mutations that
//! show the checker is not vacuous: each broken script breaks a promise within the same
//! bound.

use idlegate_model::{Bounds, Mutation, System};
use stateright::{Checker, Expectation, HasDiscoveries, Model};

/// Checks `mutation` within the CI bound, on every core; with `until`, stops at the first
/// discovery of any property it names.
fn check(mutation: Mutation, until: &[&'static str]) -> impl Checker<System> {
    check_within(Bounds::CI, mutation, until)
}

fn check_within(bounds: Bounds, mutation: Mutation, until: &[&'static str]) -> impl Checker<System> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut checker = System::new(bounds, mutation).checker().threads(threads);
    if !until.is_empty() {
        checker = checker.finish_when(HasDiscoveries::AnyOf(until.iter().copied().collect()));
    }
    checker.spawn_bfs().join()
}

#[test]
fn the_protocol_keeps_every_promise_within_the_ci_bound() {
    let checker = check(Mutation::None, &[]);
    eprintln!(
        "{} states ({} unique), depth {}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth()
    );
    checker.assert_properties();
}

/// Every promise holds within `bounds`, and every reachability check is reached but those
/// the bound cannot reach (`out_of_reach`).
fn assert_within(bounds: Bounds, out_of_reach: &[&str]) {
    let checker = check_within(bounds, Mutation::None, &[]);
    eprintln!(
        "{bounds:?}: {} states ({} unique), depth {}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth()
    );
    assert!(checker.is_done(), "not exhausted");
    for property in checker.model().properties() {
        let found = checker.discovery(property.name).is_some();
        match property.expectation {
            Expectation::Sometimes if out_of_reach.contains(&property.name) => {}
            Expectation::Sometimes => assert!(found, "not reached: {}", property.name),
            _ => assert!(!found, "broken: {}: {:?}", property.name, checker.discovery(property.name)),
        }
    }
}

#[test]
fn the_protocol_keeps_every_promise_when_redis_loses_writes() {
    // No fault beside the failover: no lease runs out.
    assert_within(Bounds::CI_FAILOVER, &["a member is reaped", "a fenced node rejoins"]);
}

#[test]
fn the_protocol_keeps_every_promise_when_redis_loses_writes_around_a_reaping() {
    // One login: no login kicks another.
    assert_within(Bounds::CI_FAILOVER_FAULTS, &["a login on one node kicks a session of another"]);
}

#[test]
fn without_its_fence_check_apply_lets_a_fenced_member_write() {
    const FENCE: &str = "nothing a fenced member sent is applied";
    check(Mutation::NoFenceCheck, &[FENCE]).assert_any_discovery(FENCE);
}

#[test]
fn a_reap_that_logs_a_session_twice_is_found() {
    const ONCE: &str = "each session online once, and offline at most once, after it";
    check(Mutation::ReapLogsTwice, &[ONCE]).assert_any_discovery(ONCE);
}

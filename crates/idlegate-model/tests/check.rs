//! The model checked exhaustively within the CI bound (issue 53), and the mutations that
//! show the checker is not vacuous: each broken script breaks a promise within the same
//! bound.

use idlegate_model::{Bounds, Mutation, System};
use stateright::{Checker, HasDiscoveries, Model};

/// Checks `mutation` within the CI bound, on every core; with `until`, stops at the first
/// discovery of any property it names.
fn check(mutation: Mutation, until: &[&'static str]) -> impl Checker<System> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut checker = System::new(Bounds::CI, mutation).checker().threads(threads);
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

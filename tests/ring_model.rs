//! The ring against a plain model: a map of uid -> last activity tick, where a uid expires
//! once the cursor reaches `last + window`. Random touches, inserts, removes, advances
//! (single ticks and catch-ups over missed ticks) and chunked expiries must agree exactly.
//! The model keeps each uid's handle as the registry's sessions do, and also the handles of
//! uids no longer tracked: a stale handle must find nothing, even once its entry is reused.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use idlegate::bench::{Handle, Ring, Touch};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Insert(u64),
    Touch(u64),
    Remove(u64),
    /// Moves the cursor by this many ticks (0 = none; more than one = a late ticker).
    Advance(u64),
    /// Takes at most this many overdue uids out.
    Expire(usize),
}

fn op() -> impl Strategy<Value = Op> {
    // A small uid space so operations keep hitting the same uids.
    let uid = 0u64..24;
    prop_oneof![
        3 => uid.clone().prop_map(Op::Insert),
        4 => uid.clone().prop_map(Op::Touch),
        1 => uid.prop_map(Op::Remove),
        3 => prop_oneof![4 => Just(1u64), 1 => 0u64..40].prop_map(Op::Advance),
        2 => prop_oneof![Just(usize::MAX), 1usize..4].prop_map(Op::Expire),
    ]
}

/// The model: last activity per tracked uid; expiry is derived, not stored.
struct Model {
    window: u64,
    elapsed: u64,
    last: BTreeMap<u64, u64>,
}

impl Model {
    fn overdue(&self) -> BTreeSet<u64> {
        self.last.iter().filter(|(_, &t)| t + self.window <= self.elapsed).map(|(&uid, _)| uid).collect()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn ring_matches_model(window in 1u64..8, ops in prop::collection::vec(op(), 1..300)) {
        let mut ring = Ring::new(window);
        let mut model = Model { window, elapsed: 0, last: BTreeMap::new() };
        // The handle of each uid's latest insert, tracked or not any more.
        let mut handles: HashMap<u64, Handle> = HashMap::new();
        let handle = |handles: &HashMap<u64, Handle>, uid| handles.get(&uid).copied().unwrap_or(Handle::NONE);
        for op in ops {
            match op {
                Op::Insert(uid) => {
                    // A new login: the uid's previous filing, if any, is retired first.
                    if model.last.remove(&uid).is_some() {
                        prop_assert!(ring.remove(handle(&handles, uid), uid));
                    }
                    handles.insert(uid, ring.insert(uid, model.elapsed));
                    model.last.insert(uid, model.elapsed);
                }
                Op::Touch(uid) => {
                    let got = ring.touch(handle(&handles, uid), uid, model.elapsed);
                    let want = match model.last.get_mut(&uid) {
                        None => Touch::NotTracked,
                        Some(t) if *t == model.elapsed => Touch::Unchanged,
                        Some(t) => {
                            *t = model.elapsed;
                            Touch::Moved
                        }
                    };
                    prop_assert_eq!(got, want, "touch {}", uid);
                }
                Op::Remove(uid) => {
                    prop_assert_eq!(ring.remove(handle(&handles, uid), uid), model.last.remove(&uid).is_some());
                }
                Op::Advance(by) => {
                    model.elapsed += by;
                    ring.advance(model.elapsed);
                }
                Op::Expire(max) => {
                    let overdue = model.overdue();
                    let mut out = Vec::new();
                    let n = ring.expire(max, &mut out);
                    prop_assert_eq!(n, out.len());
                    prop_assert_eq!(n, overdue.len().min(max));
                    let got: BTreeSet<u64> = out.iter().copied().collect();
                    prop_assert_eq!(got.len(), out.len(), "a uid expired twice");
                    prop_assert!(got.is_subset(&overdue), "expired {:?}, overdue {:?}", got, overdue);
                    // Oldest deadlines go first: nothing left overdue is older than what went.
                    let newest_taken = got.iter().map(|u| model.last[u]).max();
                    for uid in &got {
                        model.last.remove(uid);
                    }
                    if let Some(newest) = newest_taken {
                        let left = model.overdue();
                        prop_assert!(left.iter().all(|u| model.last[u] >= newest));
                    }
                }
            }
            prop_assert_eq!(ring.len(), model.last.len());
            for (&uid, &h) in &handles {
                prop_assert_eq!(ring.contains(h, uid), model.last.contains_key(&uid), "uid {}", uid);
                let want = model.last.get(&uid).map(|t| t + window);
                prop_assert_eq!(ring.deadline(h, uid), want, "deadline of {}", uid);
            }
            prop_assert_eq!(ring.overdue_len(), model.overdue().len());
            for k in 1..=window + 1 {
                let due = model
                    .last
                    .values()
                    .filter(|&&t| t + window == model.elapsed + k)
                    .count();
                prop_assert_eq!(ring.due_in(k), due, "due in {}", k);
            }
        }
    }
}

//! The promises, checked on the stream as a consumer read it and on what Redis holds (issue
//! 53): the event promises of docs/API.md for the one uid, the fence, presence, and
//! sessions on healthy nodes. Where Redis lost writes the consumer met a `gap`, and the
//! rules for what a gap explains are `loadtest verdict`'s (`loadtest/src/verdict.rs`): a
//! session announced again after a gap, still open, is the same session; one ended before
//! a gap may begin again in the new history; a missing partner must lie across a gap; user
//! events and the device count start afresh after one.

use std::collections::{BTreeMap, BTreeSet};

use stateright::{Model, Property};

use crate::node::Up;
use crate::store::{Device, Event, Member, Reason, Sid};
use crate::system::{Action, State, System};

/// Every property the checker holds the model to.
pub fn all() -> Vec<Property<System>> {
    vec![
        Property::always("each session online once, and offline at most once, after it", |_, s: &State| {
            sessions_once(&s.store.log)
        }),
        Property::always("the stream Redis holds logs each session once", |_, s: &State| {
            redis_sessions_once(&s.store.stream)
        }),
        Property::always("user events alternate and agree with the session events", |_, s: &State| {
            user_events_agree(&s.store.log)
        }),
        Property::always("no device online twice in stream order", |_, s: &State| device_once(&s.store.log)),
        Property::always("nothing a fenced member sent is applied", |_, s: &State| !s.store.applied_fenced),
        Property::always("presence never holds a session after its offline", |_, s: &State| presence_agrees(s)),
        Property::always("a session on a node that stays connected is never ended for it", |_, s: &State| {
            healthy_kept(&s.store.log, &s.store.lapsed)
        }),
        Property::always("once everything settled, every online has its offline", |_, s: &State| {
            !settled(s) || every_online_ended(&s.store.log, owed_gap(s))
        }),
        // Liveness within the bound: where the system has nothing left to do (what can
        // still happen is a new login or a new fault) and no client is connected, every
        // session has ended and Redis holds nothing: no session held for good, no kick
        // unread.
        Property::always("where nothing is left to do, everything has ended", |model: &System, s: &State| {
            let mut next = Vec::new();
            model.actions(s, &mut next);
            let quiet = next.iter().all(|a| {
                matches!(
                    a,
                    Action::Login { .. }
                        | Action::Crash { .. }
                        | Action::CutOff { .. }
                        | Action::Apply { reply: false, .. }
                        | Action::Replicate
                        | Action::Failover
                )
            });
            !quiet || (settled(s) && every_online_ended(&s.store.log, owed_gap(s)))
        }),
        // Reachability: the bound does reach what the promises are about.
        Property::sometimes("a member is reaped", |_, s: &State| {
            s.store.log.iter().any(|e| matches!(e, Event::Offline { reason: Reason::NodeLost, .. }))
        }),
        Property::sometimes("a login on one node kicks a session of another", |_, s: &State| kicked_across(s)),
        Property::sometimes("a fenced node rejoins", |_, s: &State| {
            s.nodes.iter().any(|n| n.run > 0 && n.up != Up::Down)
        }),
        Property::sometimes("everything settles after sessions came and went", |_, s: &State| {
            settled(s) && !s.store.stream.is_empty()
        }),
    ]
}

/// The reachability checks that need a failover in the bound.
pub fn failover() -> Vec<Property<System>> {
    vec![
        Property::sometimes("a failover loses a session's online", |_, s: &State| {
            s.store.log.contains(&Event::Gap)
                && s.store.log.iter().filter(|e| matches!(e, Event::Online { .. })).count()
                    > s.store.stream.iter().filter(|e| matches!(e, Event::Online { .. })).count()
        }),
        Property::sometimes("a node reconciles after lost writes", |_, s: &State| s.store.reconciled),
    ]
}

/// Each session's `online` comes once, and its `offline` at most once, after it; a gap
/// explains an `online` again (Redis lost it, its node announced it again) or an `offline`
/// whose `online` is missing, as the verdict's rules say.
pub fn sessions_once(log: &[Event]) -> bool {
    let mut seen: BTreeMap<Sid, (Option<usize>, Option<usize>)> = BTreeMap::new();
    let mut gaps: Vec<usize> = Vec::new();
    for (at, event) in log.iter().enumerate() {
        match *event {
            Event::Online { sid, .. } => {
                let (online, offline) = seen.entry(sid).or_default();
                match (*online, *offline) {
                    (None, None) => *online = Some(at),
                    // Announced again after a gap, still open.
                    (Some(first), None) if gaps.iter().any(|&g| g > first) => *online = Some(at),
                    // Ended before a gap, announced in the new history.
                    (_, Some(ended)) if gaps.iter().any(|&g| g > ended) => (*online, *offline) = (Some(at), None),
                    _ => return false,
                }
            }
            Event::Offline { sid, .. } => {
                let (online, offline) = seen.entry(sid).or_default();
                // Ended again after a gap: the history that logged it first was lost, and it
                // ends once more in the new one (the stream Redis holds logs it once,
                // `redis_sessions_once`). The model shows this cannot be ruled out where a
                // failover loses an ending some other node logged for the session's node (a
                // reaping, a login's `=` entry); `loadtest verdict` holds the campaigns to
                // the stricter rule (docs/RELIABILITY.md section 12).
                let again = offline.is_some_and(|first| gaps.iter().any(|&g| g > first));
                if (offline.is_some() && !again) || (online.is_none() && gaps.is_empty()) {
                    return false;
                }
                *offline = Some(at);
            }
            Event::Gap => gaps.push(at),
            Event::UserOnline | Event::UserOffline | Event::Epoch => {}
        }
    }
    true
}

/// The stream Redis holds, one history, logs each session's `online` once and its `offline`
/// at most once, after it, with no exemption: what a failover took back is not in it.
pub fn redis_sessions_once(stream: &[Event]) -> bool {
    let history: Vec<Event> = stream.iter().copied().filter(|e| *e != Event::Epoch).collect();
    sessions_once(&history)
}

/// `user_online` and `user_offline` alternate, starting with `user_online`; a
/// `user_online` comes while a session is online, a `user_offline` while none is. After a
/// gap the uid's state is unknown until its next user event, and only sessions announced
/// after the gap count.
pub fn user_events_agree(log: &[Event]) -> bool {
    let (mut user, mut live, mut gapped) = (Some(false), 0u32, false);
    let mut announced: BTreeSet<Sid> = BTreeSet::new();
    for event in log {
        match *event {
            Event::Online { sid, .. } => {
                announced.insert(sid);
                live += 1;
            }
            Event::Offline { sid, .. } => {
                if announced.contains(&sid) {
                    live = live.saturating_sub(1);
                }
            }
            Event::UserOnline => {
                if user == Some(true) || (live == 0 && !gapped) {
                    return false;
                }
                user = Some(true);
            }
            Event::UserOffline => {
                if user == Some(false) || live > 0 {
                    return false;
                }
                user = Some(false);
            }
            Event::Gap => {
                (user, live, gapped) = (None, 0, true);
            }
            Event::Epoch => {}
        }
    }
    true
}

/// No device has two sessions online at once, reading the log in order as a consumer
/// counting devices does: leaving out logins announced superseded (the one overlap the
/// bound allows, docs/API.md), and starting afresh after a gap.
pub fn device_once(log: &[Event]) -> bool {
    let mut on: Vec<(Sid, Device)> = Vec::new();
    for event in log {
        match *event {
            Event::Online { superseded: true, .. } => {}
            Event::Online { sid, device, .. } => {
                // Announced again after a gap: the same session.
                on.retain(|&(s, _)| s != sid);
                if on.iter().any(|&(_, d)| d == device) {
                    return false;
                }
                on.push((sid, device));
            }
            Event::Offline { sid, .. } => on.retain(|&(s, _)| s != sid),
            Event::Gap => on.clear(),
            Event::UserOnline | Event::UserOffline | Event::Epoch => {}
        }
    }
    true
}

/// Every session a member's hash holds (what presence answers from) has no `offline` in
/// the stream Redis holds: a failover may bring back a session whose `offline` it lost
/// (a consumer may have read it) until its node reconciles.
pub fn presence_agrees(s: &State) -> bool {
    let ended: BTreeSet<Sid> = s
        .store
        .stream
        .iter()
        .filter_map(|e| match *e {
            Event::Offline { sid, .. } => Some(sid),
            _ => None,
        })
        .collect();
    s.store.sessions.values().flatten().all(|(_, sid)| !ended.contains(sid))
}

/// A session ends `node_lost` only if the lease of the member that announced it ran out,
/// and `shutdown` (its node fenced) only if a lease of its node ran out while it lived:
/// one its node announced again under a new name after a fence ends `shutdown` for that
/// fence.
pub fn healthy_kept(stream: &[Event], lapsed: &BTreeSet<Member>) -> bool {
    let mut member_of: BTreeMap<Sid, Member> = BTreeMap::new();
    for event in stream {
        match *event {
            Event::Online { sid, member, .. } => {
                member_of.insert(sid, member);
            }
            Event::Offline { sid, reason: Reason::NodeLost }
                if !member_of.get(&sid).is_some_and(|m| lapsed.contains(m)) =>
            {
                return false;
            }
            Event::Offline { sid, reason: Reason::Shutdown }
                if !member_of.get(&sid).is_some_and(|m| lapsed.iter().any(|l| l.node == m.node && l.run <= m.run)) =>
            {
                return false;
            }
            _ => {}
        }
    }
    true
}

/// Nothing is left to happen to any session: every node runs and reaches Redis with
/// nothing queued and no client, none has a loss of writes to report, no kick waits, Redis
/// holds no session, and nothing of a reaped member is left behind.
pub fn settled(s: &State) -> bool {
    s.nodes.iter().all(|n| n.up == Up::Connected && n.queue.is_empty() && n.live.is_empty())
        // No node saw more of the stream, or applied more, than Redis holds: its next lease
        // would tell.
        && s.nodes.iter().all(|n| n.known.is_none_or(|(e, m)| e != s.store.epoch || m <= s.store.n))
        && s.nodes.iter().all(|n| s.store.applied.get(&n.member()).copied().unwrap_or(0) >= n.prev)
        && s.store.inbox.values().all(Vec::is_empty)
        && s.store.sessions.is_empty()
        && s.store.superseded.keys().all(|(m, _)| !s.store.reaped.contains_key(m))
}

/// Whether the consumer is owed a gap it has not met yet: it read numbers the stream Redis
/// holds does not reach (every node that saw them died before it told Redis, `LEASE`), and
/// the next event logged reports it (`cluster/stream.rs`).
pub fn owed_gap(s: &State) -> bool {
    s.store.read > s.store.n
}

/// Every `online` has its `offline`, or a gap after it (the offline may be what was lost),
/// counting one `owed` at the end.
pub fn every_online_ended(log: &[Event], owed: bool) -> bool {
    if owed {
        return true;
    }
    let mut open = BTreeSet::new();
    for event in log {
        match *event {
            Event::Online { sid, .. } => {
                open.insert(sid);
            }
            Event::Offline { sid, .. } => {
                open.remove(&sid);
            }
            Event::Gap => open.clear(),
            Event::UserOnline | Event::UserOffline | Event::Epoch => {}
        }
    }
    open.is_empty()
}

/// A session ended `kicked` by a login of another member: the login's `online` comes
/// right after the `offline` it caused.
fn kicked_across(s: &State) -> bool {
    let stream = &s.store.log;
    let member_of = |sid: Sid| {
        stream.iter().find_map(|e| match *e {
            Event::Online { sid: x, member, .. } if x == sid => Some(member),
            _ => None,
        })
    };
    stream.windows(2).any(|pair| match (pair[0], pair[1]) {
        (Event::Offline { sid, reason: Reason::Kicked }, Event::Online { member, .. }) => {
            member_of(sid).is_some_and(|m| m != member)
        }
        _ => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Member = Member { node: 0, run: 0 };

    #[test]
    fn the_checks_find_what_they_name() {
        let on = |sid, device| Event::Online { sid, device, member: A, superseded: false };
        let off = |sid| Event::Offline { sid, reason: Reason::Logout };
        assert!(sessions_once(&[on(0, 0), off(0)]));
        assert!(!sessions_once(&[on(0, 0), off(0), off(0)]), "offline twice");
        assert!(!sessions_once(&[off(0)]), "offline before online");
        assert!(!sessions_once(&[on(0, 0), off(0), on(0, 0)]), "online after offline");
        assert!(user_events_agree(&[on(0, 0), Event::UserOnline, off(0), Event::UserOffline]));
        assert!(!user_events_agree(&[on(0, 0), Event::UserOnline, Event::UserOnline]));
        assert!(!user_events_agree(&[on(0, 0), Event::UserOnline, Event::UserOffline]), "a session still on");
        assert!(device_once(&[on(0, 0), on(1, 1)]));
        assert!(!device_once(&[on(0, 0), on(1, 0)]));
        assert!(device_once(&[on(0, 0), off(0), on(1, 0)]));
        let late = Event::Online { sid: 1, device: 0, member: A, superseded: true };
        assert!(device_once(&[on(0, 0), late, Event::Offline { sid: 1, reason: Reason::Kicked }]), "superseded");
        let lost = Event::Offline { sid: 0, reason: Reason::NodeLost };
        assert!(!healthy_kept(&[on(0, 0), lost], &BTreeSet::new()));
        assert!(healthy_kept(&[on(0, 0), lost], &BTreeSet::from([A])));
        assert!(every_online_ended(&[on(0, 0), off(0)], false) && !every_online_ended(&[on(0, 0)], false));
    }

    /// What a gap explains, as `loadtest verdict` says, and what it does not.
    #[test]
    fn a_gap_explains_what_was_lost_and_nothing_else() {
        let on = |sid, device| Event::Online { sid, device, member: A, superseded: false };
        let off = |sid| Event::Offline { sid, reason: Reason::Logout };
        let gap = Event::Gap;
        assert!(sessions_once(&[on(0, 0), gap, on(0, 0), off(0)]), "announced again after a gap");
        assert!(sessions_once(&[on(0, 0), off(0), gap, on(0, 0), off(0)]), "a new history");
        assert!(sessions_once(&[gap, off(0)]), "its online lost");
        assert!(sessions_once(&[on(0, 0), off(0), gap, off(0)]), "ended again in a new history");
        assert!(!sessions_once(&[on(0, 0), off(0), off(0)]), "offline twice in one history");
        assert!(!redis_sessions_once(&[on(0, 0), off(0), Event::Epoch, off(0)]), "Redis's own history");
        assert!(!sessions_once(&[on(0, 0), on(0, 0)]), "online twice without a gap");
        assert!(user_events_agree(&[on(0, 0), Event::UserOnline, gap, Event::UserOnline]));
        assert!(!user_events_agree(&[gap, on(0, 0), Event::UserOnline, Event::UserOnline]));
        assert!(!user_events_agree(&[gap, on(0, 0), Event::UserOffline]), "a session announced after the gap");
        assert!(device_once(&[on(0, 0), gap, on(1, 0)]));
        assert!(!device_once(&[on(0, 0), gap, on(1, 0), on(2, 0)]));
        assert!(every_online_ended(&[on(0, 0), gap], false));
        assert!(every_online_ended(&[on(0, 0)], true), "a gap owed");
    }
}

//! The promises, checked on the stream the model emits and on what Redis holds (issue 53):
//! the event promises of docs/API.md for the one uid, the fence, presence, and sessions on
//! healthy nodes.

use std::collections::{BTreeMap, BTreeSet};

use stateright::{Model, Property};

use crate::node::Up;
use crate::store::{Device, Event, Member, Reason, Sid};
use crate::system::{Action, State, System};

/// Every property the checker holds the model to.
pub fn all() -> Vec<Property<System>> {
    vec![
        Property::always("each session online once, and offline at most once, after it", |_, s: &State| {
            sessions_once(&s.store.stream)
        }),
        Property::always("user events alternate and agree with the session events", |_, s: &State| {
            user_events_agree(&s.store.stream)
        }),
        Property::always("no device online twice in stream order", |_, s: &State| device_once(&s.store.stream)),
        Property::always("nothing a fenced member sent is applied", |_, s: &State| !s.store.applied_fenced),
        Property::always("presence never holds a session after its offline", |_, s: &State| presence_agrees(s)),
        Property::always("a session on a node that stays connected is never ended for it", |_, s: &State| {
            healthy_kept(&s.store.stream, &s.store.lapsed)
        }),
        Property::always("once everything settled, every online has its offline", |_, s: &State| {
            !settled(s) || every_online_ended(&s.store.stream)
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
                )
            });
            !quiet || (settled(s) && every_online_ended(&s.store.stream))
        }),
        // Reachability: the bound does reach what the promises are about.
        Property::sometimes("a member is reaped", |_, s: &State| {
            s.store.stream.iter().any(|e| matches!(e, Event::Offline { reason: Reason::NodeLost, .. }))
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

/// Each session's `online` comes once, and its `offline` at most once, after it.
pub fn sessions_once(stream: &[Event]) -> bool {
    let (mut online, mut offline) = (BTreeSet::new(), BTreeSet::new());
    for event in stream {
        match *event {
            Event::Online { sid, .. } => {
                if !online.insert(sid) || offline.contains(&sid) {
                    return false;
                }
            }
            Event::Offline { sid, .. } => {
                if !online.contains(&sid) || !offline.insert(sid) {
                    return false;
                }
            }
            Event::UserOnline | Event::UserOffline => {}
        }
    }
    true
}

/// `user_online` and `user_offline` alternate, starting with `user_online`; a
/// `user_online` comes while a session is online, a `user_offline` while none is.
pub fn user_events_agree(stream: &[Event]) -> bool {
    let (mut user, mut sessions) = (false, 0i32);
    for event in stream {
        match event {
            Event::Online { .. } => sessions += 1,
            Event::Offline { .. } => sessions -= 1,
            Event::UserOnline => {
                if user || sessions < 1 {
                    return false;
                }
                user = true;
            }
            Event::UserOffline => {
                if !user || sessions != 0 {
                    return false;
                }
                user = false;
            }
        }
    }
    true
}

/// No device has two sessions online at once, reading the stream in order as a consumer
/// counting devices does: leaving out logins announced superseded (the one overlap the
/// bound allows, docs/API.md).
pub fn device_once(stream: &[Event]) -> bool {
    let mut on: BTreeMap<Device, Sid> = BTreeMap::new();
    let mut device_of: BTreeMap<Sid, Device> = BTreeMap::new();
    for event in stream {
        match *event {
            Event::Online { superseded: true, .. } => {}
            Event::Online { sid, device, .. } => {
                if on.insert(device, sid).is_some() {
                    return false;
                }
                device_of.insert(sid, device);
            }
            Event::Offline { sid, .. } => {
                if let Some(device) = device_of.get(&sid) {
                    if on.get(device) == Some(&sid) {
                        on.remove(device);
                    }
                }
            }
            Event::UserOnline | Event::UserOffline => {}
        }
    }
    true
}

/// Every session a member's hash holds (what presence answers from) has no `offline` in
/// the stream.
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
/// nothing queued and no client, no kick waits, Redis holds no session, and nothing of a
/// reaped member is left behind.
pub fn settled(s: &State) -> bool {
    s.nodes.iter().all(|n| n.up == Up::Connected && n.queue.is_empty() && n.live.is_empty())
        && s.store.inbox.values().all(Vec::is_empty)
        && s.store.sessions.is_empty()
        && s.store.superseded.keys().all(|(m, _)| !s.store.reaped.contains_key(m))
}

/// Every `online` has its `offline`.
pub fn every_online_ended(stream: &[Event]) -> bool {
    let mut open = BTreeSet::new();
    for event in stream {
        match *event {
            Event::Online { sid, .. } => {
                open.insert(sid);
            }
            Event::Offline { sid, .. } => {
                open.remove(&sid);
            }
            _ => {}
        }
    }
    open.is_empty()
}

/// A session ended `kicked` by a login of another member: the login's `online` comes
/// right after the `offline` it caused.
fn kicked_across(s: &State) -> bool {
    let stream = &s.store.stream;
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
        assert!(every_online_ended(&[on(0, 0), off(0)]) && !every_online_ended(&[on(0, 0)]));
    }
}

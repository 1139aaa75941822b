//! Redis as the cluster's scripts see it: the keys the promises depend on, for one uid, and
//! each script one atomic step with the inputs and outputs of `src/cluster/scripts.rs`.
//!
//! | here | in Redis |
//! |---|---|
//! | `members`, `leases` | `{idlegate}:members`, `{idlegate}:lease:<member>` |
//! | `sessions` | `{idlegate}:sessions:<member>` (the uid's field per device) |
//! | `users` | `{idlegate}:users` (the uid's held list, in order, `!` for superseded) |
//! | `applied` | `{idlegate}:applied:<member>` |
//! | `reaped` | `{idlegate}:reaped:<member>` (the fence, holding the applied marker as it fell) |
//! | `superseded` | `{idlegate}:superseded:<member>` (device -> the newest login replaced before it was announced) |
//! | `routes` | `idlegate:route:<uid>` (device -> owner, since, end mark, chain) |
//! | `inbox` | `{idlegate}:inbox:<member>` (its kicks) |
//! | `stream` | `{idlegate}:events` |
//!
//! A session's login time (`since_ms`) is its number here: sessions are numbered in the
//! order they log in, as the nodes' clocks order them when they agree.

use std::collections::{BTreeMap, BTreeSet};

/// One run of a node (`<node-id>#<8 hex digits>` in the gateway).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Member {
    pub node: u8,
    pub run: u8,
}

/// A session, numbered in login order across the model (the gateway's ids are unique, and
/// fixed-width hex, so the scripts compare them as numbers too).
pub type Sid = u8;

/// A device of the one uid.
pub type Device = u8;

/// Why a session ended, as its `offline` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    Logout,
    Disconnect,
    Kicked,
    NodeLost,
    /// Its node found itself fenced and ended every session it held (`Cluster::rejoin`).
    Shutdown,
}

/// An event of the stream, for the one uid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Event {
    /// `superseded` (`sp`): a login replaced before it was announced; a consumer counting
    /// the uid's devices leaves it out.
    Online {
        sid: Sid,
        device: Device,
        member: Member,
        superseded: bool,
    },
    Offline {
        sid: Sid,
        reason: Reason,
    },
    UserOnline,
    UserOffline,
}

/// An owner a route's chain names: whom a login replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Entry {
    pub member: Member,
    pub sid: Sid,
    pub device: Device,
    /// `=<reason>|...`: the session ended by itself (`ROUTE_END`) before its `offline` was
    /// logged; `APPLY` logs that end, as its node would.
    pub ended: Option<Reason>,
}

/// `ROUTE_SET`'s answer.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Routed {
    /// Whom the login replaced (at most [`MAX_CHAIN`] entries; empty for none).
    Chain(Vec<Entry>),
    /// `!`: a newer login of another member holds the device; this one is announced as
    /// superseded and ended by its node.
    Superseded,
}

/// A device's route.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Route {
    pub member: Member,
    pub sid: Sid,
    /// Its login's time.
    pub since: Sid,
    pub ended: Option<Reason>,
    pub chain: Vec<Entry>,
}

/// Entries a chain holds at most (`ROUTE_SET`'s `MAX_CHAIN`).
pub const MAX_CHAIN: usize = 4;

/// One change of a batch, as `APPLY` takes it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Change {
    /// `L`: a login, with `ROUTE_SET`'s answer for this try (`None` before it is routed).
    Login { sid: Sid, device: Device, routed: Option<Routed> },
    /// `E` (`E1` with `last`: its node saw it as the uid's last session there): an ending.
    End { sid: Sid, device: Device, reason: Reason, last: bool },
}

/// What `APPLY` answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Applied {
    /// The member is fenced; `applied` is its applied marker as the fence fell.
    Fenced {
        applied: u32,
    },
    /// Every change of the batch was applied before (a retry after a lost reply).
    Already,
    Written,
}

/// Faults of the scripts the checker must find (a mutation per test, issue 53).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Mutation {
    #[default]
    None,
    /// `APPLY` without its first line: a reaped member's batch is applied.
    NoFenceCheck,
    /// `REAP` logs each session's `node_lost` twice.
    ReapLogsTwice,
}

/// A session on the uid's held list (`{idlegate}:users`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Held {
    pub member: Member,
    pub sid: Sid,
    pub device: Device,
    /// `!`: announced superseded.
    pub superseded: bool,
}

/// Redis; see the module documentation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Store {
    pub members: BTreeSet<Member>,
    pub leases: BTreeSet<Member>,
    /// Each member's sessions, device and session, in the hash's order: a small hash keeps
    /// its fields in the order they were first set, which is the order `REAP`'s `HSCAN`
    /// reads them in.
    pub sessions: BTreeMap<Member, Vec<(Device, Sid)>>,
    pub users: Vec<Held>,
    pub applied: BTreeMap<Member, u32>,
    pub reaped: BTreeMap<Member, u32>,
    pub superseded: BTreeMap<(Member, Device), Sid>,
    pub routes: BTreeMap<Device, Route>,
    pub inbox: BTreeMap<Member, Vec<Sid>>,
    pub stream: Vec<Event>,
    /// Not in Redis: members whose lease ever lapsed, for the promise that a session on a
    /// node that stays connected is never ended for it.
    pub lapsed: BTreeSet<Member>,
    /// Not in Redis: whether a script ever applied a change of a fenced member.
    pub applied_fenced: bool,
}

impl Store {
    /// `LEASE`: refreshes `member`'s lease and lists it, unless it is reaped (false).
    pub fn lease(&mut self, member: Member) -> bool {
        if self.reaped.contains_key(&member) {
            return false;
        }
        self.leases.insert(member);
        self.members.insert(member);
        true
    }

    /// The lease of `member` runs out (its node cut off or dead).
    pub fn lapse(&mut self, member: Member) {
        self.leases.remove(&member);
        self.lapsed.insert(member);
    }

    /// `ROUTE_SET` of `me`'s login `sid` on `device` (devices never outnumber
    /// `--max-devices` here, so no other device's route makes room).
    pub fn route_set(&mut self, me: Member, sid: Sid, device: Device) -> Routed {
        let mut out: Vec<Entry> = Vec::new();
        if let Some(old) = self.routes.get(&device).cloned() {
            if old.sid == sid {
                // The same login again: under the same member (a retry), or under its
                // node's new name after a fence, whose the route becomes.
                if old.member != me {
                    self.routes
                        .insert(device, Route { member: me, sid, since: sid, ended: None, chain: old.chain.clone() });
                }
                return Routed::Chain(old.chain);
            }
            // A newer live login of another member holds the device.
            if old.ended.is_none() && old.member != me && old.since > sid {
                return Routed::Superseded;
            }
            put(&mut out, Entry { member: old.member, sid: old.sid, device, ended: old.ended });
            for entry in &old.chain {
                put(&mut out, *entry);
            }
        }
        self.routes.insert(device, Route { member: me, sid, since: sid, ended: None, chain: out.clone() });
        Routed::Chain(out)
    }

    /// `ROUTE_END`: the route of `device`, if it names `me`'s `sid`, is marked ended.
    pub fn route_end(&mut self, me: Member, sid: Sid, device: Device, reason: Reason) {
        if let Some(route) = self.routes.get_mut(&device).filter(|r| (r.member, r.sid) == (me, sid)) {
            // Marked once: a retry's mark leaves the first.
            route.ended.get_or_insert(reason);
        }
    }

    /// `ROUTE_DEL`: the route of `device` goes, if it still names `me`'s `sid`.
    pub fn route_del(&mut self, me: Member, sid: Sid, device: Device) {
        if self.routes.get(&device).is_some_and(|r| (r.member, r.sid) == (me, sid)) {
            self.routes.remove(&device);
        }
    }

    /// `APPLY` of `me`'s changes numbered `first..=last`.
    pub fn apply(&mut self, me: Member, first: u32, last: u32, changes: &[Change], mutation: Mutation) -> Applied {
        if let Some(&applied) = self.reaped.get(&me) {
            if mutation != Mutation::NoFenceCheck {
                return Applied::Fenced { applied };
            }
            self.applied_fenced = true;
        }
        let applied = self.applied.get(&me).copied().unwrap_or(0);
        if last <= applied {
            return Applied::Already;
        }
        self.applied.insert(me, last);
        // A longer batch from the same first number ran after its sender gave up on it.
        let skip = if applied >= first { (applied - first + 1) as usize } else { 0 };
        // A user_offline owed by an ending that made room for a login (a plain `E`).
        let mut owed = false;
        for change in &changes[skip.min(changes.len())..] {
            match change {
                Change::Login { sid, device, routed } => owed = self.login(me, *sid, *device, routed.as_ref(), owed),
                &Change::End { sid, device, reason, last } => {
                    self.superseded_mark(me, device, sid);
                    if self.held(me, device) == Some(sid) {
                        let empty = self.end_held(me, device, sid, reason, false);
                        if empty && last {
                            owed = false;
                            self.stream.push(Event::UserOffline);
                        } else {
                            owed |= empty;
                        }
                    }
                }
            }
        }
        if owed && self.users.is_empty() {
            self.stream.push(Event::UserOffline);
        }
        Applied::Written
    }

    /// One `L` of `APPLY`; returns whether a `user_offline` is still owed.
    fn login(&mut self, me: Member, sid: Sid, device: Device, routed: Option<&Routed>, mut owed: bool) -> bool {
        let chain: &[Entry] = match routed {
            Some(Routed::Chain(chain)) => chain,
            _ => &[],
        };
        for entry in chain {
            let Entry { member: m, sid: ps, device: pd, ended } = *entry;
            let held = self.held(m, pd);
            if (m, ps) == (me, sid) {
                // The login itself (a retried batch's routes ran out of order).
            } else if m != me && held.is_some_and(|h| h < ps) {
                // Another member holds an older session of the device than the one named:
                // the named one ends it there, and this login ends it here, as kicked.
                let h = held.unwrap_or(ps);
                owed |= self.end_held(m, pd, h, Reason::Kicked, true);
                self.mark_superseded(m, pd, ps);
            } else if held == Some(ps) {
                owed |= self.end_held(m, pd, ps, ended.unwrap_or(Reason::Kicked), false);
            } else if m != me {
                // Not announced yet (its batch is on its way): its `online` will say it was
                // superseded.
                self.mark_superseded(m, pd, ps);
            }
            if ended.is_none() && (m, ps) != (me, sid) {
                self.kick(m, ps);
            }
        }
        if self.held(me, device) == Some(sid) {
            return owed;
        }
        if let Some(before) = self.held(me, device) {
            // An older session of this member on the device, overwritten without an event.
            self.users.retain(|h| (h.member, h.sid) != (me, before));
        }
        let held = self.sessions.entry(me).or_default();
        match held.iter_mut().find(|(d, _)| *d == device) {
            Some(field) => field.1 = sid,
            None => held.push((device, sid)),
        }
        let superseded = self.superseded_mark(me, device, sid) || routed == Some(&Routed::Superseded);
        if !superseded {
            // The bound in stream order: a login ends any session another member holds on
            // its device.
            let others: Vec<Held> =
                self.users.iter().copied().filter(|h| h.device == device && h.member != me).collect();
            for h in others {
                if self.held(h.member, h.device) == Some(h.sid) {
                    owed |= self.end_held(h.member, h.device, h.sid, Reason::Kicked, true);
                }
            }
        }
        self.users.push(Held { member: me, sid, device, superseded });
        self.stream.push(Event::Online { sid, device, member: me, superseded });
        if self.users.len() == 1 {
            if owed {
                owed = false;
            } else {
                self.stream.push(Event::UserOnline);
            }
        }
        owed
    }

    /// `CLAIM` then `REAP` of `member`, whose lease ran out: the fence falls, holding its
    /// applied marker, each session it held is logged `node_lost` (with the uid's
    /// `user_offline` when it leaves it none), and its route goes. Does nothing if it is
    /// reaped already or its lease lives.
    pub fn reap(&mut self, member: Member, mutation: Mutation) {
        if self.reaped.contains_key(&member) || self.leases.contains(&member) {
            return;
        }
        let applied = self.applied.get(&member).copied().unwrap_or(0);
        self.reaped.insert(member, applied);
        self.members.remove(&member);
        let held: Vec<(Device, Sid)> = self.sessions.get(&member).cloned().unwrap_or_default();
        for (device, sid) in held {
            if self.end_held(member, device, sid, Reason::NodeLost, false) {
                self.stream.push(Event::UserOffline);
            }
            if mutation == Mutation::ReapLogsTwice {
                self.stream.push(Event::Offline { sid, reason: Reason::NodeLost });
            }
            // The reaper's unroute: the session's route goes.
            self.route_del(member, sid, device);
        }
        // Its last step: the member's keys go (`membership.rs`, `reap`).
        self.inbox.remove(&member);
        self.applied.remove(&member);
        self.superseded.retain(|&(m, _), _| m != member);
    }

    /// The session member `m` holds on `device`.
    pub fn held(&self, m: Member, device: Device) -> Option<Sid> {
        self.sessions.get(&m).and_then(|s| s.iter().find(|(d, _)| *d == device)).map(|&(_, sid)| sid)
    }

    /// Marks `ps` of `m` on `device` as replaced before it was announced: the mark is the
    /// newest such login. Not for a reaped member: nothing would ever spend or delete it
    /// (the model's first counterexample, below).
    fn mark_superseded(&mut self, m: Member, device: Device, ps: Sid) {
        if self.reaped.contains_key(&m) {
            return;
        }
        let newest = self.superseded.entry((m, device)).or_insert(ps);
        *newest = (*newest).max(ps);
    }

    /// Tells `m`'s node to end its session `sid`, through its inbox. Not a reaped member's:
    /// nobody reads its inbox any more, and the reaper deleted it already, so a kick
    /// written after would stay in Redis for good (the model found it: a login routed after
    /// a fence named the session under its old member).
    fn kick(&mut self, m: Member, sid: Sid) {
        if !self.reaped.contains_key(&m) {
            self.inbox.entry(m).or_default().push(sid);
        }
    }

    /// Whether `me`'s `sid` on `device` was replaced before it was announced; a mark no
    /// newer than it is spent by it.
    fn superseded_mark(&mut self, me: Member, device: Device, sid: Sid) -> bool {
        let Some(&newest) = self.superseded.get(&(me, device)) else { return false };
        if sid >= newest {
            self.superseded.remove(&(me, device));
        }
        sid <= newest
    }

    /// Ends session `sid` that `m` holds on `device`: its `offline`, and with `kick` its
    /// node told through its inbox; true when it left the uid with no session (its
    /// `user_offline` is the caller's).
    fn end_held(&mut self, m: Member, device: Device, sid: Sid, reason: Reason, kick: bool) -> bool {
        if let Some(held) = self.sessions.get_mut(&m) {
            held.retain(|(d, _)| *d != device);
            if held.is_empty() {
                self.sessions.remove(&m);
            }
        }
        self.users.retain(|h| (h.member, h.sid) != (m, sid));
        self.stream.push(Event::Offline { sid, reason });
        if kick {
            self.kick(m, sid);
        }
        self.users.is_empty()
    }
}

/// Adds `entry` to a chain, unless it is full or names its member's device already (the
/// newest login of each member's device only).
fn put(out: &mut Vec<Entry>, entry: Entry) {
    if out.len() < MAX_CHAIN && !out.iter().any(|e| (e.member, e.device) == (entry.member, entry.device)) {
        out.push(entry);
    }
}

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
//! | `stream` | `{idlegate}:events` (an epoch's marker only when it renews one) |
//! | `epoch`, `n` | `{idlegate}:events:last` (`epoch`, `n`: the last event's number) |
//! | `verified` | `{idlegate}:applied:<member>:verified` |
//!
//! A failover (`failover`) puts back what a replica held: a copy of the whole store taken
//! earlier, so every write since is lost, acknowledged or not. What a consumer read is not
//! lost: `log` is the stream as a consumer reading it at once saw it, with a `Gap` where it
//! met a new epoch's marker or a number it had read already (`cluster/stream.rs`).
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
    /// The stream's marker of a new epoch (`renew`): Redis lost writes.
    Epoch,
    /// Only in a consumer's `log`: a `gap` with `earlier_stream`, where it met an epoch's
    /// marker or a number it had read already.
    Gap,
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
    /// `~`: a session of the login's own member whose end its node applied (`mark_ended`,
    /// `writer.rs`): forgotten, never kicked. Set by the node, not by `ROUTE_SET`.
    pub applied_end: bool,
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
    /// `R`: a login's route set again (a reconcile found Redis holding the session without
    /// its route): what it replaced ends as a login's would, and it is never announced
    /// again.
    Reroute { sid: Sid, device: Device, routed: Option<Routed> },
    /// `F`: a session this node ended, whose end Redis applied and then lost: removed
    /// without an event.
    Forget { sid: Sid, device: Device },
    /// `V`: the member's hash is current in this epoch (the end of a reconcile).
    Verified,
}

/// A member's verified marker: the epoch its hash is known current in, or `w<epoch>`, an
/// epoch it wrote in without its hash verified.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verified {
    Current(u8),
    Writing(u8),
}

/// What `APPLY` answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Applied {
    /// The member is fenced; `applied` is its applied marker as the fence fell.
    Fenced { applied: u32 },
    /// Every change of the batch was applied before (a retry after a lost reply).
    Already { epoch: u8, n: u32 },
    /// Applied; `lost`: the applied marker or the stream's number was behind what the
    /// member had applied or the node had seen (status 2: Redis lost writes).
    Written { lost: bool, epoch: u8, n: u32 },
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
    /// The epoch its `online` was logged in.
    pub epoch: u8,
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
    pub epoch: u8,
    pub n: u32,
    pub verified: BTreeMap<Member, Verified>,
    /// Not in Redis: the stream as a consumer reading every event at once saw it, lost
    /// writes and all, with its gaps.
    pub log: Vec<Event>,
    /// Not in Redis: the highest number that consumer read.
    pub read: u32,
    /// Not in Redis: the newest epoch ever begun. A new one is newer than any before, lost
    /// ones too, as Redis's clock makes it (`renew`).
    pub newest_epoch: u8,
    /// Not in Redis: members whose lease ever lapsed, for the promise that a session on a
    /// node that stays connected is never ended for it.
    pub lapsed: BTreeSet<Member>,
    /// Not in Redis: whether a script ever applied a change of a fenced member.
    pub applied_fenced: bool,
    /// Not in Redis: whether a reconcile's `V` ever took effect (a reachability check).
    pub reconciled: bool,
}

impl Store {
    /// `LEASE`: refreshes `member`'s lease and lists it, unless it is reaped (false); with
    /// the stream's epoch and last number either way, and whether Redis lost writes (then a
    /// new epoch first): the stream is behind what the node saw (`known`), or the member's
    /// applied marker behind what it applied (`prev`).
    pub fn lease(&mut self, member: Member, known: Option<(u8, u32)>, prev: u32) -> (bool, u8, u32, bool) {
        let fenced = self.reaped.contains_key(&member);
        let mut lost = self.behind(known);
        // The marker set back to what the member applied: the loss is told once.
        if !fenced && self.applied.get(&member).copied().unwrap_or(0) < prev {
            self.applied.insert(member, prev);
            lost = true;
        }
        if lost {
            self.renew();
        }
        if fenced {
            return (false, self.epoch, self.n, lost);
        }
        self.leases.insert(member);
        self.members.insert(member);
        (true, self.epoch, self.n, lost)
    }

    /// The lease of `member` runs out (its node cut off or dead).
    pub fn lapse(&mut self, member: Member) {
        self.leases.remove(&member);
        self.lapsed.insert(member);
    }

    /// A failover to a replica that held `replica` (a copy of this store taken earlier):
    /// every write since is lost. What consumers read, and the model's own bookkeeping, stay.
    pub fn failover(&mut self, replica: &Store) {
        let (log, lapsed) = (std::mem::take(&mut self.log), std::mem::take(&mut self.lapsed));
        let (read, newest_epoch) = (self.read, self.newest_epoch);
        let (applied_fenced, reconciled) = (self.applied_fenced, self.reconciled);
        *self = replica.clone();
        (self.log, self.lapsed) = (log, lapsed);
        (self.read, self.newest_epoch) = (read, newest_epoch);
        (self.applied_fenced, self.reconciled) = (applied_fenced, reconciled);
    }

    /// What a replica copies: everything in Redis (the bookkeeping is the failover's to keep).
    pub fn replica(&self) -> Store {
        let bookkeeping = Store::default();
        Store {
            log: bookkeeping.log,
            read: bookkeeping.read,
            newest_epoch: bookkeeping.newest_epoch,
            lapsed: bookkeeping.lapsed,
            applied_fenced: bookkeeping.applied_fenced,
            reconciled: bookkeeping.reconciled,
            ..self.clone()
        }
    }

    /// Logs `event` (`emitter`'s `add`): the next number, and the consumer reads it at once,
    /// reporting a gap first where the number is one it read already.
    fn emit(&mut self, event: Event) {
        self.n += 1;
        self.stream.push(event);
        if event == Event::Epoch || self.n <= self.read {
            self.log.push(Event::Gap);
        }
        if event != Event::Epoch {
            self.log.push(event);
        }
        self.read = self.read.max(self.n);
    }

    /// `emitter`'s `renew`: a new epoch, its marker logged.
    fn renew(&mut self) {
        self.newest_epoch += 1;
        self.epoch = self.newest_epoch;
        self.emit(Event::Epoch);
    }

    /// Whether the stream went back below what a node saw in this epoch: `known` is its
    /// high water (epoch, number).
    fn behind(&self, known: Option<(u8, u32)>) -> bool {
        known.is_some_and(|(epoch, n)| epoch == self.epoch && self.n < n)
    }

    /// `APPLY`'s `current(m)`: whether a kick may log the end of `m`'s session here (its
    /// hash is current: no verified marker, or this epoch's).
    fn current(&self, m: Member) -> bool {
        self.verified.get(&m).is_none_or(|v| *v == Verified::Current(self.epoch))
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
            let head = Entry { member: old.member, sid: old.sid, device, ended: old.ended, applied_end: false };
            put(&mut out, head);
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

    /// `APPLY` of `me`'s changes numbered `first..=last`; `prev` is the last number the
    /// member had applied (0 for none), `known` its node's high water.
    #[allow(clippy::too_many_arguments)]
    pub fn apply(
        &mut self,
        me: Member,
        first: u32,
        last: u32,
        prev: u32,
        known: Option<(u8, u32)>,
        changes: &[Change],
        mutation: Mutation,
    ) -> Applied {
        if let Some(&applied) = self.reaped.get(&me) {
            if mutation != Mutation::NoFenceCheck {
                return Applied::Fenced { applied };
            }
            self.applied_fenced = true;
        }
        let applied = self.applied.get(&me).copied().unwrap_or(0);
        if last <= applied {
            return Applied::Already { epoch: self.epoch, n: self.n };
        }
        self.applied.insert(me, last);
        // A longer batch from the same first number ran after its sender gave up on it.
        let skip = if applied >= first { (applied - first + 1) as usize } else { 0 };
        let lost = applied < prev || self.behind(known);
        if lost {
            self.renew();
        }
        // A member's first batch: its hash is all its own writes.
        if !lost && prev == 0 && applied == 0 {
            self.verified.insert(me, Verified::Current(self.epoch));
        }
        // Writing in an epoch its hash was not verified in.
        if self.verified.get(&me).is_some_and(|&v| v != Verified::Current(self.epoch)) {
            self.verified.insert(me, Verified::Writing(self.epoch));
        }
        // A user_offline owed by an ending that made room for a login (a plain `E`).
        let mut owed = false;
        for change in &changes[skip.min(changes.len())..] {
            match change {
                Change::Login { sid, device, routed } => {
                    owed = self.login(me, *sid, *device, routed.as_ref(), owed, true);
                }
                Change::Reroute { sid, device, routed } => {
                    owed = self.login(me, *sid, *device, routed.as_ref(), owed, false);
                }
                &Change::End { sid, device, reason, last } => {
                    self.superseded_mark(me, device, sid);
                    if self.held(me, device) == Some(sid) {
                        let empty = self.end_held(me, device, sid, reason, false);
                        if empty && last {
                            owed = false;
                            self.emit(Event::UserOffline);
                        } else {
                            owed |= empty;
                        }
                    }
                }
                &Change::Forget { sid, device } => self.forget(me, device, sid),
                Change::Verified => {
                    if !lost {
                        self.verified.insert(me, Verified::Current(self.epoch));
                        self.reconciled = true;
                    }
                }
            }
        }
        if owed && self.users.is_empty() {
            self.emit(Event::UserOffline);
        }
        Applied::Written { lost, epoch: self.epoch, n: self.n }
    }

    /// One `L` (`announce`) or `R` of `APPLY`; returns whether a `user_offline` is still
    /// owed.
    fn login(
        &mut self,
        me: Member,
        sid: Sid,
        device: Device,
        routed: Option<&Routed>,
        mut owed: bool,
        announce: bool,
    ) -> bool {
        let chain: &[Entry] = match routed {
            Some(Routed::Chain(chain)) => chain,
            _ => &[],
        };
        for entry in chain {
            let Entry { member: m, sid: ps, device: pd, ended, applied_end } = *entry;
            let held = self.held(m, pd);
            if (m, ps) == (me, sid) {
                // The login itself (a retried batch's routes ran out of order).
            } else if applied_end {
                if m == me {
                    self.forget(m, pd, ps);
                }
            } else if m != me && self.current(m) && held.is_some_and(|h| h < ps) {
                // Another member holds an older session of the device than the one named:
                // the named one ends it there, and this login ends it here, as kicked.
                let h = held.unwrap_or(ps);
                owed |= self.end_held(m, pd, h, Reason::Kicked, true);
                self.mark_superseded(m, pd, ps);
            } else if held == Some(ps) {
                if m == me || self.current(m) {
                    owed |= self.end_held(m, pd, ps, ended.unwrap_or(Reason::Kicked), false);
                }
            } else if m != me {
                // Not announced yet (its batch is on its way): its `online` will say it was
                // superseded.
                self.mark_superseded(m, pd, ps);
            }
            if !applied_end && ended.is_none() && (m, ps) != (me, sid) {
                self.kick(m, ps);
            }
        }
        if !announce || self.held(me, device) == Some(sid) {
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
            // `held`: the list without entries no hash holds any more, written back.
            let sessions = &self.sessions;
            self.users.retain(|h| sessions.get(&h.member).is_some_and(|s| s.contains(&(h.device, h.sid))));
            // The bound in stream order: a login ends any session another member holds on
            // its device, if that member's hash is current or the session was announced in
            // this epoch.
            let others: Vec<Held> = self
                .users
                .iter()
                .copied()
                .filter(|h| h.device == device && h.member != me)
                .filter(|h| self.current(h.member) || h.epoch == self.epoch)
                .collect();
            for h in others {
                owed |= self.end_held(h.member, h.device, h.sid, Reason::Kicked, true);
            }
        }
        self.users.push(Held { member: me, sid, device, superseded, epoch: self.epoch });
        self.emit(Event::Online { sid, device, member: me, superseded });
        if self.users.len() == 1 {
            if owed {
                owed = false;
            } else {
                self.emit(Event::UserOnline);
            }
        }
        owed
    }

    /// `F` (`forget`): `me`'s session `sid` on `device` goes without an event, if its hash
    /// still holds it.
    fn forget(&mut self, me: Member, device: Device, sid: Sid) {
        if self.held(me, device) == Some(sid) {
            self.remove_held(me, device);
            self.users.retain(|h| (h.member, h.sid) != (me, sid));
        }
    }

    /// `CLAIM` then `REAP` of `member`, whose lease ran out: the fence falls, holding its
    /// applied marker, each session it held is logged `node_lost` (with the uid's
    /// `user_offline` when it leaves it none) or, if its hash is stale (verified in an
    /// older epoch, and not written since), removed without an event; its route goes.
    /// Does nothing if it is reaped already or its lease lives. `known` is the reaping
    /// node's high water; returns the stream's epoch and last number, which the reaper
    /// learns, if it reaped.
    pub fn reap(&mut self, member: Member, known: Option<(u8, u32)>, mutation: Mutation) -> Option<(u8, u32)> {
        if self.reaped.contains_key(&member) || self.leases.contains(&member) {
            return None;
        }
        let applied = self.applied.get(&member).copied().unwrap_or(0);
        self.reaped.insert(member, applied);
        self.members.remove(&member);
        if self.behind(known) {
            self.renew();
        }
        let held: Vec<(Device, Sid)> = self.sessions.get(&member).cloned().unwrap_or_default();
        let stale = self
            .verified
            .get(&member)
            .is_some_and(|&v| v != Verified::Current(self.epoch) && v != Verified::Writing(self.epoch));
        for (device, sid) in held {
            if stale {
                self.forget(member, device, sid);
            } else {
                if self.end_held(member, device, sid, Reason::NodeLost, false) {
                    self.emit(Event::UserOffline);
                }
                if mutation == Mutation::ReapLogsTwice {
                    self.emit(Event::Offline { sid, reason: Reason::NodeLost });
                }
            }
            // The reaper's unroute: the session's route goes.
            self.route_del(member, sid, device);
        }
        // Its last step: the member's keys go (`membership.rs`, `reap`).
        self.inbox.remove(&member);
        self.applied.remove(&member);
        self.verified.remove(&member);
        self.superseded.retain(|&(m, _), _| m != member);
        Some((self.epoch, self.n))
    }

    /// The session member `m` holds on `device`.
    pub fn held(&self, m: Member, device: Device) -> Option<Sid> {
        self.sessions.get(&m).and_then(|s| s.iter().find(|(d, _)| *d == device)).map(|&(_, sid)| sid)
    }

    /// `HDEL` of `m`'s field for `device`.
    fn remove_held(&mut self, m: Member, device: Device) {
        if let Some(held) = self.sessions.get_mut(&m) {
            held.retain(|(d, _)| *d != device);
            if held.is_empty() {
                self.sessions.remove(&m);
            }
        }
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
        self.remove_held(m, device);
        self.users.retain(|h| (h.member, h.sid) != (m, sid));
        self.emit(Event::Offline { sid, reason });
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

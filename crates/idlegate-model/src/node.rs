//! A gateway as the protocol sees it: the sessions its registry holds, its numbered
//! changes waiting for Redis (`cluster/queue.rs`), the batch its writer has on its way
//! (`cluster/writer.rs`: first each login routed and each ending's route marked, then
//! `APPLY`, two steps between which any other may come), what it does when it finds
//! itself fenced (`Cluster::rejoin`), and what it does when Redis lost writes: the high
//! water of the stream it saw, the ends it knows applied (`cluster/ended.rs`), and the
//! reconcile (`writer.rs`, `reconcile`).

use std::collections::{BTreeMap, BTreeSet};

use crate::store::{Applied, Change, Device, Member, Mutation, Reason, Routed, Sid, Store};

/// Whether a node runs, and whether it reaches Redis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Up {
    /// Running and reaching Redis.
    Connected,
    /// Running, serving its clients, but cut off from Redis (a partition, or a pause as
    /// long: whether its clients do anything meanwhile is the checker's choice).
    CutOff,
    /// Dead: its connections dropped, its memory gone, until it starts again as a new
    /// member.
    Down,
}

/// A node; see the module documentation.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Node {
    pub id: u8,
    /// This run's number: the member is `(id, run)`.
    pub run: u8,
    pub up: Up,
    /// The registry: the session each device holds here.
    pub live: BTreeMap<Device, Sid>,
    /// Changes not yet known to be in Redis, each with its number (growing for the
    /// node's life, as the writer numbers them).
    pub queue: Vec<(u32, Change)>,
    /// The batch routed for this try (the numbers of its first and last change, and the
    /// changes, logins with `ROUTE_SET`'s answers), waiting for its `APPLY`; changes queued
    /// meanwhile wait for the next.
    pub routed: Option<(u32, u32, Vec<Change>)>,
    pub next: u32,
    /// Whether this member took its lease: its writer sends nothing before (`write_one`),
    /// or a node dying under a name it never leased would leave sessions no reaper finds.
    pub leased: bool,
    /// The last number this member had applied (`Progress::prev`; 0 for none).
    pub prev: u32,
    /// The highest event number seen, and its epoch (`Cluster::high_water`).
    pub known: Option<(u8, u32)>,
    /// The stream's epoch last seen (`Cluster::saw_epoch`): a change means lost writes.
    pub epoch: Option<u8>,
    /// Sessions whose end Redis applied (`Ended`).
    pub ended: BTreeSet<Sid>,
    /// A reconcile is due (`needs_reconcile`): the writer runs it before its next batch.
    pub reconcile: bool,
}

impl Node {
    pub fn new(id: u8) -> Node {
        Node {
            id,
            run: 0,
            up: Up::Connected,
            live: BTreeMap::new(),
            queue: Vec::new(),
            routed: None,
            next: 1,
            leased: true,
            prev: 0,
            known: None,
            epoch: None,
            ended: BTreeSet::new(),
            reconcile: false,
        }
    }

    pub fn member(&self) -> Member {
        Member { node: self.id, run: self.run }
    }

    fn push(&mut self, change: Change) {
        self.queue.push((self.next, change));
        self.next += 1;
    }

    /// A LOGIN on `device` welcomed as session `sid`: a session of the device here ends
    /// first (its `E`, then the login's `L`).
    pub fn login(&mut self, device: Device, sid: Sid) {
        if let Some(old) = self.live.remove(&device) {
            self.push(Change::End { sid: old, device, reason: Reason::Kicked, last: false });
        }
        self.live.insert(device, sid);
        self.push(Change::Login { sid, device, routed: None });
    }

    /// The session on `device` ends for `reason` (its client logged out, dropped or went
    /// silent).
    pub fn end(&mut self, device: Device, reason: Reason) {
        if let Some(sid) = self.live.remove(&device) {
            let last = self.live.is_empty();
            self.push(Change::End { sid, device, reason, last });
        }
    }

    /// A kick of session `sid` (from the inbox, or a login of its own the route said was
    /// superseded): ends it if it is still here.
    pub fn kick(&mut self, sid: Sid) {
        if let Some(device) = self.live.iter().find(|&(_, &s)| s == sid).map(|(&d, _)| d) {
            self.end(device, Reason::Kicked);
        }
    }

    /// The writer's first step for a batch of every change waiting: each login routed
    /// (`ROUTE_SET`, again on every try; an entry naming a session of this member whose end
    /// was applied marked `~`), each ending's route marked (`ROUTE_END`), but for an ending a
    /// later login of the batch replaces on its device (`routes_to_delete`), each forgotten
    /// session's route deleted.
    pub fn route(&mut self, store: &mut Store) {
        let (Some(&(first, _)), Some(&(last, _))) = (self.queue.first(), self.queue.last()) else { return };
        let me = self.member();
        let changes: Vec<Change> = self.queue.iter().map(|(_, change)| change.clone()).collect();
        let keep = keeps_route(&changes);
        let ended = &self.ended;
        let mark = |routed: Routed| match routed {
            Routed::Chain(chain) => Routed::Chain(
                chain
                    .into_iter()
                    .map(|mut e| {
                        e.applied_end = e.member == me && ended.contains(&e.sid);
                        e
                    })
                    .collect(),
            ),
            superseded => superseded,
        };
        let batch = changes
            .into_iter()
            .zip(keep)
            .map(|(change, keep)| match change {
                Change::Login { sid, device, .. } => {
                    Change::Login { sid, device, routed: Some(mark(store.route_set(me, sid, device))) }
                }
                Change::Reroute { sid, device, .. } => {
                    Change::Reroute { sid, device, routed: Some(mark(store.route_set(me, sid, device))) }
                }
                Change::End { sid, device, reason, .. } => {
                    if keep {
                        store.route_end(me, sid, device, reason);
                    }
                    change
                }
                Change::Forget { sid, device } => {
                    store.route_del(me, sid, device);
                    change
                }
                Change::Verified => change,
            })
            .collect();
        self.routed = Some((first, last, batch));
    }

    /// The writer's second step: `APPLY` of the routed batch. With `reply`, the answer
    /// arrives; without, it is lost (a timeout), and the batch goes again later, under the
    /// same numbers, routed again.
    pub fn apply(&mut self, store: &mut Store, reply: bool, mutation: Mutation) {
        let Some((first, last, batch)) = self.routed.take() else { return };
        // `LEASE` first, in the same pipeline (`membership::lease_cmd`): a replica holding
        // the batch holds the member's listing too.
        let (_, lease_epoch, lease_n, lost) = store.lease(self.member(), self.known, self.prev);
        let answer = store.apply(self.member(), first, last, self.prev, self.known, &batch, mutation);
        if !reply {
            return;
        }
        self.reconcile |= lost;
        self.saw(lease_epoch, lease_n);
        let (epoch, n) = match answer {
            Applied::Written { lost, epoch, n } => {
                self.reconcile |= lost;
                (epoch, n)
            }
            Applied::Already { epoch, n } => (epoch, n),
            Applied::Fenced { applied } => return self.rejoin(applied),
        };
        self.saw(epoch, n);
        self.prev = last;
        self.queue.retain(|&(n, _)| n > last);
        for (change, keep) in batch.iter().zip(keeps_route(&batch)) {
            match *change {
                // Its `offline` is logged: the route goes (`ROUTE_DEL`).
                Change::End { sid, device, .. } => {
                    self.ended.insert(sid);
                    if keep {
                        store.route_del(self.member(), sid, device);
                    }
                }
                // Announced as superseded: its node ends it.
                Change::Login { sid, routed: Some(Routed::Superseded), .. } => self.kick(sid),
                Change::Login { .. } | Change::Reroute { .. } | Change::Forget { .. } | Change::Verified => {}
            }
        }
    }

    /// What a script answered of the stream (`saw_epoch`, `saw_number`): a new epoch means
    /// lost writes, and a reconcile.
    pub fn saw(&mut self, epoch: u8, n: u32) {
        if self.epoch.is_some_and(|e| e != epoch) {
            self.reconcile = true;
        }
        self.epoch = Some(epoch);
        self.known = match self.known {
            Some((e, m)) if e == epoch => Some((e, m.max(n))),
            _ => Some((epoch, n)),
        };
    }

    /// `LEASE`: a node that finds itself fenced rejoins.
    pub fn renew(&mut self, store: &mut Store) {
        let (ok, epoch, n, lost) = store.lease(self.member(), self.known, self.prev);
        self.reconcile |= lost;
        self.saw(epoch, n);
        if ok {
            self.leased = true;
        } else {
            let applied = store.reaped.get(&self.member()).copied().unwrap_or(0);
            self.rejoin(applied);
        }
    }

    /// Brings Redis in line with this node after lost writes (`writer.rs`, `reconcile`), in
    /// one step here (the real one reads the hash, then the inbox, then the registry and the
    /// queue, then the routes): a live session Redis lacks is announced again, unless a kick
    /// waits for it (it ends here) or its login is still queued; one Redis holds without its
    /// route is routed again (`R`); one Redis holds that is not live here is forgotten if its
    /// end was applied, else ended (`disconnect`); last the verified mark (`V`). Nothing, if
    /// the member was reaped.
    pub fn reconcile(&mut self, store: &Store) {
        self.reconcile = false;
        let me = self.member();
        // A reaped member reconciles nothing: its sessions are gone from Redis because they
        // ended (`node_lost`), and its fence ends them here as it rejoins.
        if store.reaped.contains_key(&me) {
            return;
        }
        let held: Vec<(Device, Sid)> = store.sessions.get(&me).cloned().unwrap_or_default();
        let kicked: BTreeSet<Sid> = store.inbox.get(&me).into_iter().flatten().copied().collect();
        let queued: BTreeSet<Sid> = self
            .queue
            .iter()
            .filter_map(|(_, c)| match *c {
                Change::Login { sid, .. } => Some(sid),
                _ => None,
            })
            .collect();
        let live: Vec<(Device, Sid)> = self.live.iter().map(|(&d, &s)| (d, s)).collect();
        for &(device, sid) in &live {
            if held.contains(&(device, sid)) {
                if store.routes.get(&device).is_none_or(|r| r.ended.is_some()) {
                    self.push(Change::Reroute { sid, device, routed: None });
                }
            } else if kicked.contains(&sid) {
                self.kick(sid);
            } else if !queued.contains(&sid) {
                self.push(Change::Login { sid, device, routed: None });
            }
        }
        for (device, sid) in held {
            if live.contains(&(device, sid)) {
                continue;
            }
            if self.ended.contains(&sid) {
                self.push(Change::Forget { sid, device });
            } else {
                self.push(Change::End { sid, device, reason: Reason::Disconnect, last: true });
            }
        }
        self.push(Change::Verified);
    }

    /// The node was reaped: what an earlier try applied (through `applied`) counts as
    /// written, the rest goes again under a new member name, and every session here ends
    /// (`Shutdown`), queued behind it.
    fn rejoin(&mut self, applied: u32) {
        self.queue.retain(|&(n, _)| n > applied);
        self.routed = None;
        self.run += 1;
        self.leased = false;
        self.prev = 0;
        let ending: Vec<Device> = self.live.keys().copied().collect();
        for device in ending {
            self.end(device, Reason::Shutdown);
        }
    }

    /// The process dies: its connections drop and what waited in its memory is gone.
    pub fn crash(&mut self) {
        self.up = Up::Down;
        self.live.clear();
        self.queue.clear();
        self.routed = None;
        self.prev = 0;
        self.known = None;
        self.epoch = None;
        self.ended.clear();
        self.reconcile = false;
    }

    /// It starts again, as a new member.
    pub fn restart(&mut self) {
        self.up = Up::Connected;
        self.run += 1;
        self.leased = false;
        self.prev = 0;
    }
}

/// Per change, whether its route step runs (`writer.rs`, `routes_to_delete`): for all but
/// the ending of a session a later login of the batch replaces on the same device, whose
/// `ROUTE_SET` moves the route over it, so it never goes empty between the two.
pub fn keeps_route(changes: &[Change]) -> Vec<bool> {
    changes
        .iter()
        .enumerate()
        .map(|(i, change)| match *change {
            Change::End { device, last: false, .. } => !changes[i + 1..].iter().any(
                |c| matches!(*c, Change::Login { device: d, .. } | Change::Reroute { device: d, .. } if d == device),
            ),
            _ => true,
        })
        .collect()
}

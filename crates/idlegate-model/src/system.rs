//! The model: nodes, their clients, Redis and the faults, as a [`stateright::Model`].
//!
//! Every step is one action of one party, atomic as it is in the system: a client's LOGIN
//! or its end on a node, a node's writer sending its batch (with the reply arriving or
//! lost), its lease renewed, a kick read from its inbox, a reaper's `CLAIM` and `REAP`, a
//! lease running out, a node cut off from Redis and back, a crash and a restart, a
//! reconcile, and Redis failing over to a replica that lacks the writes since it copied
//! the primary (`Replicate` takes that copy at any step, `Failover` promotes it). The
//! checker tries every order of them within [`Bounds`].

use stateright::{Model, Property};

use crate::node::{Node, Up};
use crate::promises;
pub use crate::store::Mutation;
use crate::store::{Device, Member, Reason, Sid, Store};

/// How far the checker goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    pub nodes: u8,
    pub devices: Device,
    /// LOGINs in all.
    pub logins: u8,
    /// Faults in all: lost replies, cuts from Redis, crashes (a lease runs out by itself
    /// while its node is cut off or dead).
    pub faults: u8,
    /// Failovers that lose writes, beside the faults.
    pub failovers: u8,
}

impl Bounds {
    /// What CI checks exhaustively (issue 53): two nodes, one uid with two devices, two
    /// logins and two faults, no failover.
    pub const CI: Bounds = Bounds { nodes: 2, devices: 2, logins: 2, faults: 2, failovers: 0 };
    /// What CI checks exhaustively with Redis losing writes, in two parts that each exhaust
    /// within a minute: two logins and a failover (logins racing, kicks across nodes, the
    /// reconcile), and one login, two faults and a failover (a lease running out, a reaping
    /// and a fence, around a failover).
    pub const CI_FAILOVER: Bounds = Bounds { nodes: 2, devices: 2, logins: 2, faults: 0, failovers: 1 };
    pub const CI_FAILOVER_FAULTS: Bounds = Bounds { nodes: 2, devices: 2, logins: 1, faults: 2, failovers: 1 };
}

/// The system; see the module documentation.
#[derive(Clone, Debug)]
pub struct System {
    pub bounds: Bounds,
    pub mutation: Mutation,
}

/// The state of everything.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub nodes: Vec<Node>,
    pub store: Store,
    /// The next session's number.
    pub next_sid: Sid,
    pub faults: u8,
    pub failovers: u8,
    /// What a replica copied of Redis, which a failover promotes.
    pub replica: Option<Store>,
}

/// One step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Login {
        node: u8,
        device: Device,
    },
    /// A client's end: its LOGOUT (`Logout`), or its connection dropped or silent past its
    /// timeout (`Disconnect`).
    End {
        node: u8,
        device: Device,
        reason: Reason,
    },
    /// The writer's first step: the batch's routes (`ROUTE_SET`, `ROUTE_END`).
    Route {
        node: u8,
    },
    /// Its second: `APPLY`; `reply: false` loses the answer (a fault).
    Apply {
        node: u8,
        reply: bool,
    },
    Renew {
        node: u8,
    },
    Inbox {
        node: u8,
    },
    /// `node` reaps `member`, whose lease ran out.
    Reap {
        node: u8,
        member: Member,
    },
    /// Faults.
    CutOff {
        node: u8,
    },
    Reconnect {
        node: u8,
    },
    Lapse {
        member: Member,
    },
    Crash {
        node: u8,
    },
    Restart {
        node: u8,
    },
    /// The writer's reconcile after lost writes.
    Reconcile {
        node: u8,
    },
    /// A replica copies Redis as it stands (it lags from here on).
    Replicate,
    /// Redis fails over to that replica: the writes since are lost.
    Failover,
}

impl System {
    pub fn new(bounds: Bounds, mutation: Mutation) -> System {
        System { bounds, mutation }
    }
}

impl Model for System {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let mut store = Store::default();
        let nodes: Vec<Node> = (0..self.bounds.nodes).map(Node::new).collect();
        for node in &nodes {
            store.lease(node.member(), None, 0);
        }
        vec![State { nodes, store, next_sid: 0, faults: 0, failovers: 0, replica: None }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        let fault = state.faults < self.bounds.faults;
        for n in &state.nodes {
            let node = n.id;
            match n.up {
                Up::Down => {
                    actions.push(Action::Restart { node });
                    continue;
                }
                Up::Connected => {
                    if n.reconcile && n.routed.is_none() {
                        // The writer reconciles before its next batch.
                        actions.push(Action::Reconcile { node });
                    } else if n.routed.is_some() {
                        actions.push(Action::Apply { node, reply: true });
                        if fault {
                            actions.push(Action::Apply { node, reply: false });
                        }
                    } else if !n.queue.is_empty() && n.leased {
                        actions.push(Action::Route { node });
                    }
                    // Renewing a live lease changes nothing but what the node learns of
                    // the stream (which matters only where Redis may lose writes); one that
                    // ran out comes back, unless a reaper fenced the member first.
                    // A renewal also renews the stream's epoch where the node saw more of it
                    // than Redis holds.
                    let (epoch, number) = (state.store.epoch, state.store.n);
                    let applied = state.store.applied.get(&n.member()).copied().unwrap_or(0);
                    let learns = self.bounds.failovers > 0
                        && (n.epoch != Some(epoch)
                            || n.known.is_none_or(|(e, m)| e != epoch || m != number)
                            || (applied < n.prev && !state.store.reaped.contains_key(&n.member())));
                    if !state.store.leases.contains(&n.member()) || learns {
                        actions.push(Action::Renew { node });
                    }
                    if state.store.inbox.get(&n.member()).is_some_and(|kicks| !kicks.is_empty()) {
                        actions.push(Action::Inbox { node });
                    }
                    let others = state.store.members.iter().filter(|&&m| m != n.member());
                    for member in others.filter(|m| !state.store.leases.contains(m)) {
                        actions.push(Action::Reap { node, member: *member });
                    }
                    if fault {
                        actions.push(Action::CutOff { node });
                    }
                }
                Up::CutOff => actions.push(Action::Reconnect { node }),
            }
            if state.next_sid < self.bounds.logins {
                for device in 0..self.bounds.devices {
                    actions.push(Action::Login { node, device });
                }
            }
            for &device in n.live.keys() {
                actions.push(Action::End { node, device, reason: Reason::Logout });
                actions.push(Action::End { node, device, reason: Reason::Disconnect });
            }
            if fault {
                actions.push(Action::Crash { node });
            }
        }
        // A lease runs out when its node cannot renew it, cut off or dead: time passing,
        // not a fault of its own (the cut or the crash was).
        for n in state.nodes.iter().filter(|n| n.up != Up::Connected) {
            if state.store.leases.contains(&n.member()) {
                actions.push(Action::Lapse { member: n.member() });
            }
        }
        for member in state.store.leases.iter().filter(|m| state.nodes.iter().all(|n| n.member() != **m)) {
            actions.push(Action::Lapse { member: *member });
        }
        if state.failovers < self.bounds.failovers {
            match state.replica {
                None => actions.push(Action::Replicate),
                Some(_) => actions.push(Action::Failover),
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        match action {
            Action::Login { node: id, device } => {
                let sid = state.next_sid;
                state.next_sid += 1;
                let i = usize::from(id);
                state.nodes[i].login(device, sid);
            }
            Action::End { node: id, device, reason } => {
                let i = usize::from(id);
                state.nodes[i].end(device, reason);
            }
            Action::Route { node: id } => {
                let State { nodes, store, .. } = &mut state;
                nodes[usize::from(id)].route(store);
            }
            Action::Apply { node: id, reply } => {
                if !reply {
                    state.faults += 1;
                }
                let State { nodes, store, .. } = &mut state;
                nodes[usize::from(id)].apply(store, reply, self.mutation);
            }
            Action::Renew { node: id } => {
                let i = usize::from(id);
                let State { nodes, store, .. } = &mut state;
                nodes[i].renew(store);
            }
            Action::Inbox { node: id } => {
                let i = usize::from(id);
                let member = state.nodes[i].member();
                let kicks = state.store.inbox.remove(&member).unwrap_or_default();
                for sid in kicks {
                    state.nodes[i].kick(sid);
                }
            }
            Action::Reap { node: id, member } => {
                let i = usize::from(id);
                if let Some((epoch, n)) = state.store.reap(member, state.nodes[i].known, self.mutation) {
                    state.nodes[i].saw(epoch, n);
                }
            }
            Action::Reconcile { node: id } => {
                let State { nodes, store, .. } = &mut state;
                nodes[usize::from(id)].reconcile(store);
            }
            Action::Replicate => state.replica = Some(state.store.replica()),
            Action::Failover => {
                state.failovers += 1;
                if let Some(replica) = state.replica.take() {
                    state.store.failover(&replica);
                }
            }
            Action::CutOff { node: id } => {
                state.faults += 1;
                state.nodes[usize::from(id)].up = Up::CutOff;
            }
            Action::Reconnect { node: id } => state.nodes[usize::from(id)].up = Up::Connected,
            Action::Lapse { member } => state.store.lapse(member),
            Action::Crash { node: id } => {
                state.faults += 1;
                state.nodes[usize::from(id)].crash();
            }
            Action::Restart { node: id } => state.nodes[usize::from(id)].restart(),
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut all = promises::all();
        if self.bounds.failovers > 0 {
            all.extend(promises::failover());
        }
        all
    }
}

//! The model: nodes, their clients, Redis and the faults, as a [`stateright::Model`].
//!
//! Every step is one action of one party, atomic as it is in the system: a client's LOGIN
//! or its end on a node, a node's writer sending its batch (with the reply arriving or
//! lost), its lease renewed, a kick read from its inbox, a reaper's `CLAIM` and `REAP`, a
//! lease running out, a node cut off from Redis and back, a crash and a restart. The
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
}

impl Bounds {
    /// What CI checks exhaustively (issue 53): two nodes, one uid with two devices, two
    /// logins and two faults (about 4.5 million states, half a minute on two cores).
    pub const CI: Bounds = Bounds { nodes: 2, devices: 2, logins: 2, faults: 2 };
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
            store.lease(node.member());
        }
        vec![State { nodes, store, next_sid: 0, faults: 0 }]
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
                    if n.routed.is_some() {
                        actions.push(Action::Apply { node, reply: true });
                        if fault {
                            actions.push(Action::Apply { node, reply: false });
                        }
                    } else if !n.queue.is_empty() && n.leased {
                        actions.push(Action::Route { node });
                    }
                    // Renewing a live lease changes nothing; one that ran out comes back,
                    // unless a reaper fenced the member first.
                    if !state.store.leases.contains(&n.member()) {
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
            Action::Reap { member, .. } => state.store.reap(member, self.mutation),
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
        promises::all()
    }
}

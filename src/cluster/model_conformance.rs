//! The model of issue 53 (`crates/idlegate-model`) held to the real scripts: random walks
//! of the model, each step that touches Redis also run as the gateway runs it (the same
//! scripts, with the same arguments, on a real `redis-server`), and after every step what
//! Redis holds is read back in the model's terms and compared with the model's store:
//! sessions, the users list, applied markers, fences, superseded marks, routes, inboxes,
//! verified markers, the stream and its epoch and number. A failover is one too: the
//! replica's copy is every key copied aside (`COPY`), and the failover puts the copies back
//! in place of everything. A change to a script without the same change to the model, or
//! the other way round, fails here.

use std::collections::{BTreeMap, BTreeSet};

use idlegate_model::node::{keeps_route, Node};
use idlegate_model::store::{Change, Device, Entry, Event, Held, Member, Reason, Route, Sid, Store, Verified};
use idlegate_model::system::{Action, State};
use idlegate_model::{Bounds, Mutation, System};
use stateright::Model;

use crate::cluster::keys;
use crate::cluster::scripts::tests::Redis;
use crate::cluster::scripts::{APPLY, CLAIM, EMIT, LEASE, REAP, ROUTE_DEL, ROUTE_END, ROUTE_SET};

/// The model's one uid.
const UID: &str = "7";

/// Random walks CI runs, and the steps of each: long enough to reach fences, retries and
/// takeovers many times over.
const WALKS: u64 = 16;
const STEPS: usize = 300;

/// A deeper bound than CI's exhaustive one: random walks reach further than exhaustion.
const WALK_BOUNDS: Bounds = Bounds { nodes: 2, devices: 2, logins: 60, faults: 12, failovers: 4 };

fn member(m: Member) -> String {
    format!("n{}#{:08x}", m.node, m.run)
}

fn parse_member(s: &str) -> Member {
    let (node, run) = s.strip_prefix('n').and_then(|s| s.split_once('#')).expect("a member name the model made");
    Member { node: node.parse().expect("a node number"), run: u8::from_str_radix(run, 16).expect("a run") }
}

fn hex(sid: Sid) -> String {
    format!("{:016x}", u64::from(sid) + 1)
}

fn parse_hex(s: &str) -> Sid {
    Sid::try_from(u64::from_str_radix(s, 16).expect("a session") - 1).expect("a model session")
}

fn device_name(d: Device) -> String {
    if d == 0 {
        String::new()
    } else {
        format!("d{d}")
    }
}

fn parse_device(s: &str) -> Device {
    if s.is_empty() {
        0
    } else {
        s.strip_prefix('d').and_then(|d| d.parse().ok()).expect("a model device")
    }
}

fn reason(label: &str) -> Reason {
    match label {
        "logout" => Reason::Logout,
        "disconnect" => Reason::Disconnect,
        "kicked" => Reason::Kicked,
        "node_lost" => Reason::NodeLost,
        "shutdown" => Reason::Shutdown,
        other => panic!("a reason the model lacks: {other}"),
    }
}

fn label(r: Reason) -> &'static str {
    match r {
        Reason::Logout => "logout",
        Reason::Disconnect => "disconnect",
        Reason::Kicked => "kicked",
        Reason::NodeLost => "node_lost",
        Reason::Shutdown => "shutdown",
    }
}

/// A login's time: its number, as the model orders logins.
fn since(sid: Sid) -> String {
    (1_000 + u64::from(sid)).to_string()
}

/// Runs `script` (with `EMIT` before it when `emit`) on `keys` and `args`; its output.
fn eval(redis: &Redis, script: &str, emit: bool, keys: &[String], args: &[String]) -> String {
    let body = if emit { format!("{EMIT}\n{script}") } else { script.to_string() };
    let n = keys.len().to_string();
    let mut all: Vec<&str> = vec!["EVAL", &body, &n];
    all.extend(keys.iter().map(String::as_str));
    all.extend(args.iter().map(String::as_str));
    redis.cli(&all)
}

/// The driver: the real scripts for each step of the model, with what the writer carries
/// between them (each node's `ROUTE_SET` answers for the batch on its way).
struct Driver {
    routed: BTreeMap<u8, Vec<String>>,
    /// The real epoch of each of the model's, in order.
    epochs: Vec<String>,
}

/// Copies every key aside (a replica's copy), or puts the copies back in place of
/// everything (the failover): `COPY` keeps each key's type, contents, stream ids and
/// expiry.
const REPLICA: &str = r#"
local function all(prefix)
  local keys, cursor = {}, '0'
  repeat
    local r = redis.call('SCAN', cursor, 'COUNT', 1000)
    cursor = r[1]
    for _, k in ipairs(r[2]) do
      if (string.sub(k, 1, 8) == 'replica:') == (prefix ~= '') then keys[#keys + 1] = k end
    end
  until cursor == '0'
  return keys
end
if ARGV[1] == 'copy' then
  for _, k in ipairs(all('replica:')) do redis.call('DEL', k) end
  for _, k in ipairs(all('')) do redis.call('COPY', k, 'replica:' .. k) end
else
  for _, k in ipairs(all('')) do redis.call('DEL', k) end
  for _, k in ipairs(all('replica:')) do redis.call('RENAME', k, string.sub(k, 9)) end
end
return 1
"#;

impl Driver {
    /// The real epoch of the model's `epoch`, if it began yet.
    fn epoch(&self, epoch: u8) -> String {
        self.epochs.get(usize::from(epoch)).cloned().unwrap_or_default()
    }

    /// A node's high water as the scripts take it: the real epoch, and the number counting
    /// the stream's first epoch marker, which the model leaves out.
    fn known(&self, known: Option<(u8, u32)>) -> [String; 2] {
        match known {
            Some((epoch, n)) => [self.epoch(epoch), (n + 1).to_string()],
            None => [String::new(), "0".into()],
        }
    }

    /// `~` before each entry of a route's answer that names a session of `me` whose end
    /// `node` knows applied (`writer.rs`, `mark_ended`).
    fn mark_ended(answer: &str, me: &str, node: &Node) -> String {
        answer
            .split('\n')
            .map(|entry| {
                let owner = entry.strip_prefix('=').and_then(|e| e.splitn(4, '|').nth(3)).unwrap_or(entry);
                let mut parts = owner.splitn(3, '|');
                let (m, session) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
                let applied =
                    m == me && u64::from_str_radix(session, 16).is_ok_and(|_| node.ended.contains(&parse_hex(session)));
                if applied {
                    format!("~{entry}")
                } else {
                    entry.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// `LEASE` of member `m`, whose node knows `known` of the stream and `prev` applied.
    fn lease(&self, redis: &Redis, m: Member, known: Option<(u8, u32)>, prev: u32) {
        let [epoch, number] = self.known(known);
        lease_as(redis, &member(m), &epoch, &number, prev);
    }

    /// Runs `action`'s scripts, as the gateway would from `state` (the state before it).
    fn step(&mut self, redis: &Redis, state: &State, action: Action) {
        match action {
            Action::Route { node } => {
                let n = &state.nodes[usize::from(node)];
                let me = member(n.member());
                let changes: Vec<Change> = n.queue.iter().map(|(_, c)| c.clone()).collect();
                let keep = keeps_route(&changes);
                let mut answers = Vec::new();
                for (change, keep) in changes.iter().zip(keep) {
                    match *change {
                        Change::Login { sid, device, .. } | Change::Reroute { sid, device, .. } => {
                            let args =
                                [format!("{me}|{}", hex(sid)), since(sid), me.clone(), device_name(device), "2".into()];
                            let answer = eval(redis, ROUTE_SET, false, &[keys::route(7)], &args);
                            answers.push(Self::mark_ended(answer.trim_end_matches('\n'), &me, n));
                        }
                        Change::End { sid, reason, .. } if keep => {
                            let args =
                                [keys::owner_prefix(&me, &hex(sid)), label(reason).into(), "0".into(), "0".into()];
                            eval(redis, ROUTE_END, false, &[keys::route(7)], &args);
                        }
                        Change::End { .. } | Change::Verified => {}
                        Change::Forget { sid, .. } => {
                            eval(redis, ROUTE_DEL, false, &[keys::route(7)], &[keys::owner_prefix(&me, &hex(sid))]);
                        }
                    }
                }
                self.routed.insert(node, answers);
            }
            Action::Apply { node, reply } => {
                let n = &state.nodes[usize::from(node)];
                let Some((first, last, batch)) = &n.routed else { return };
                let me = member(n.member());
                let mut answers = self.routed.remove(&node).unwrap_or_default().into_iter();
                let keys = [
                    keys::sessions(&me),
                    keys::EVENTS.into(),
                    keys::EVENTS_LAST.into(),
                    keys::applied(&me),
                    keys::reaped(&me),
                    keys::USERS.into(),
                    keys::wills(&me),
                    keys::GRACE.into(),
                    keys::GRACE_WHY.into(),
                    keys::claims(&me),
                    keys::verified(&me),
                ];
                let node_name = format!("n{}", n.id);
                let [epoch, number] = self.known(n.known);
                let mut args: Vec<String> = [
                    me.as_str(),
                    node_name.as_str(),
                    &last.to_string(),
                    &n.prev.to_string(),
                    "100000",
                    "100000000",
                    "0",
                    "0",
                    "0",
                    &first.to_string(),
                    &epoch,
                    &number,
                    "2",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect();
                for change in batch {
                    match *change {
                        Change::Login { sid, device, .. } => {
                            let x = answers.next().unwrap_or_default();
                            args.extend(["L|30000||tcp 127.0.0.1:1".into(), UID.into(), hex(sid), x]);
                            args.extend([since(sid), device_name(device)]);
                        }
                        Change::Reroute { sid, device, .. } => {
                            let x = answers.next().unwrap_or_default();
                            args.extend(["R|30000||tcp 127.0.0.1:1".into(), UID.into(), hex(sid), x]);
                            args.extend([since(sid), device_name(device)]);
                        }
                        Change::End { sid, device, reason, last } => {
                            let kind = if last { "E1" } else { "E" };
                            args.extend([kind.into(), UID.into(), hex(sid), label(reason).into()]);
                            args.extend(["2000".into(), device_name(device)]);
                        }
                        Change::Forget { sid, device } => {
                            args.extend([
                                "F".into(),
                                UID.into(),
                                hex(sid),
                                String::new(),
                                "0".into(),
                                device_name(device),
                            ]);
                        }
                        Change::Verified => {
                            args.extend([
                                "V".into(),
                                String::new(),
                                String::new(),
                                String::new(),
                                "0".into(),
                                String::new(),
                            ]);
                        }
                    }
                }
                // The lease first, as the writer's pipeline sends it.
                self.lease(redis, n.member(), n.known, n.prev);
                let answer = eval(redis, APPLY, true, &keys, &args);
                let status = answer.lines().next().unwrap_or("").to_string();
                if reply && status != "-1" {
                    for (change, keep) in batch.iter().zip(keeps_route(batch)) {
                        if let (Change::End { sid, .. }, true) = (change, keep) {
                            eval(redis, ROUTE_DEL, false, &[keys::route(7)], &[keys::owner_prefix(&me, &hex(*sid))]);
                        }
                    }
                }
            }
            Action::Renew { node } => {
                let n = &state.nodes[usize::from(node)];
                self.lease(redis, n.member(), n.known, n.prev);
            }
            Action::Reap { node, member: m } => {
                let name = member(m);
                let claim_keys = [keys::lease(&name), keys::reaping(&name), keys::reaped(&name), keys::applied(&name)];
                let claimed =
                    eval(redis, CLAIM, false, &claim_keys, &["reaper".into(), "60000".into(), "86400".into()]);
                if claimed.trim() != "1" {
                    return;
                }
                let reap_keys = [
                    keys::sessions(&name),
                    keys::EVENTS.into(),
                    keys::EVENTS_LAST.into(),
                    keys::unroute(&name),
                    keys::USERS.into(),
                    keys::wills(&name),
                    keys::GRACE.into(),
                    keys::GRACE_WHY.into(),
                    keys::claims(&name),
                    keys::verified(&name),
                ];
                let [epoch, number] = self.known(state.nodes[usize::from(node)].known);
                let args: Vec<String> = ["0", "1000", "100000", "100000000", "3000", "0", "0", &epoch, &number]
                    .iter()
                    .map(|s| s.to_string())
                    .collect();
                eval(redis, REAP, true, &reap_keys, &args);
                // The reaper's last step: the routes of what it reaped (the unroute hash).
                let unroute = redis.cli(&["HGETALL", &keys::unroute(&name)]);
                let lines: Vec<&str> = unroute.lines().collect();
                for pair in lines.chunks(2) {
                    if let [_, session] = pair {
                        eval(redis, ROUTE_DEL, false, &[keys::route(7)], &[keys::owner_prefix(&name, session)]);
                    }
                }
                // Then the member's keys (`membership.rs`, `reap`).
                redis.cli(&["SREM", keys::MEMBERS, &name]);
                for key in [keys::inbox(&name), keys::applied(&name), keys::unroute(&name), keys::superseded(&name)] {
                    redis.cli(&["DEL", &key]);
                }
                for key in [keys::applied_dropped(&name), keys::verified(&name), keys::sessions(&name)] {
                    redis.cli(&["DEL", &key]);
                }
            }
            Action::Lapse { member: m } => {
                redis.cli(&["DEL", &keys::lease(&member(m))]);
            }
            Action::Inbox { node } => {
                redis.cli(&["DEL", &keys::inbox(&member(state.nodes[usize::from(node)].member()))]);
            }
            Action::Login { .. } | Action::End { .. } | Action::CutOff { .. } | Action::Reconnect { .. } => {}
            Action::Restart { .. } | Action::Reconcile { .. } => {}
            Action::Replicate => {
                eval(redis, REPLICA, false, &[], &["copy".into()]);
            }
            Action::Failover => {
                eval(redis, REPLICA, false, &[], &["promote".into()]);
            }
            Action::Crash { node } => {
                self.routed.remove(&node);
            }
        }
    }
}

/// Everything the model compares, read in one call (a walk reads it after every step):
/// one line a fact, for the members named in ARGV.
const DUMP: &str = r#"
local out = {}
local function add(...) out[#out + 1] = table.concat({...}, ' ') end
for _, m in ipairs(redis.call('SMEMBERS', '{idlegate}:members')) do add('member', m) end
for _, m in ipairs(ARGV) do
  if redis.call('EXISTS', '{idlegate}:lease:' .. m) == 1 then add('lease', m) end
  local h = redis.call('HGETALL', '{idlegate}:sessions:' .. m)
  for i = 1, #h, 2 do add('session', m, h[i], h[i + 1]) end
  local a = redis.call('GET', '{idlegate}:applied:' .. m)
  if a then add('applied', m, a) end
  local r = redis.call('GET', '{idlegate}:reaped:' .. m)
  if r then add('reaped', m, r) end
  local sp = redis.call('HGETALL', '{idlegate}:superseded:' .. m)
  for i = 1, #sp, 2 do add('mark', m, sp[i], sp[i + 1]) end
  for _, e in ipairs(redis.call('XRANGE', '{idlegate}:inbox:' .. m, '-', '+')) do
    for i = 1, #e[2], 2 do if e[2][i] == 's' then add('kick', m, e[2][i + 1]) end end
  end
  local v = redis.call('GET', '{idlegate}:applied:' .. m .. ':verified')
  if v then add('verified', m, v) end
end
local last = redis.call('HMGET', '{idlegate}:events:last', 'epoch', 'n')
add('last', last[1] or '-', last[2] or '0')
local users = redis.call('HGET', '{idlegate}:users', '7')
if users then for line in string.gmatch(users, '[^\n]+') do add('user', line) end end
local routes = redis.call('HGETALL', 'idlegate:route:7')
for i = 1, #routes, 2 do add('route', routes[i] .. '\t' .. string.gsub(routes[i + 1], '\n', '\r')) end
for _, e in ipairs(redis.call('XRANGE', '{idlegate}:events', '-', '+')) do
  local f = {}
  for i = 1, #e[2], 2 do f[e[2][i]] = e[2][i + 1] end
  add('event', f.t, f.s or '-', f.d or '-', f.node or '-', f.r or '-', f.sp or '-')
end
return out
"#;

/// What Redis holds, in the model's terms, for the members `known`; `epochs` are the real
/// epochs of the model's, in order (one the model never had reads as 255).
fn read_back(redis: &Redis, known: &BTreeSet<Member>, epochs: &[String]) -> Store {
    let epoch_of = |real: &str| epochs.iter().position(|e| e == real).map_or(u8::MAX, |i| i as u8);
    let names: Vec<String> = known.iter().map(|&m| member(m)).collect();
    let mut args: Vec<&str> = vec!["EVAL", DUMP, "0"];
    args.extend(names.iter().map(String::as_str));
    let mut store = Store::default();
    let field_device = |field: &str| field.split_once('/').map_or(0, |(_, d)| parse_device(d));
    for line in redis.cli(&args).lines().filter(|l| !l.is_empty()) {
        let (what, rest) = line.split_once(' ').unwrap_or((line, ""));
        let f: Vec<&str> = rest.split(' ').collect();
        match what {
            "member" => {
                store.members.insert(parse_member(f[0]));
            }
            "lease" => {
                store.leases.insert(parse_member(f[0]));
            }
            "session" => {
                store.sessions.entry(parse_member(f[0])).or_default().push((field_device(f[1]), parse_hex(f[2])));
            }
            "applied" => {
                store.applied.insert(parse_member(f[0]), f[1].parse().expect("a number"));
            }
            "reaped" => {
                store.reaped.insert(parse_member(f[0]), f[1].parse().expect("a number"));
            }
            "mark" => {
                store.superseded.insert((parse_member(f[0]), field_device(f[1])), parse_hex(f[2]));
            }
            "kick" => store.inbox.entry(parse_member(f[0])).or_default().push(parse_hex(f[1])),
            "user" => {
                let (superseded, line) = match rest.strip_prefix('!') {
                    Some(rest) => (true, rest),
                    None => (false, rest),
                };
                let parts: Vec<&str> = line.splitn(4, '|').collect();
                let [epoch, m, s, d] = parts[..] else { panic!("a users line: {line}") };
                store.users.push(Held {
                    member: parse_member(m),
                    sid: parse_hex(s),
                    device: parse_device(d),
                    superseded,
                    epoch: epoch_of(epoch),
                });
            }
            "route" => {
                let (field, value) = rest.split_once('\t').expect("field and value");
                let (device, route) = parse_route(field, value);
                store.routes.insert(device, route);
            }
            "event" => store.stream.push(parse_event(&f)),
            "verified" => {
                let verified = match f[1].strip_prefix('w') {
                    Some(epoch) => Verified::Writing(epoch_of(epoch)),
                    None => Verified::Current(epoch_of(f[1])),
                };
                store.verified.insert(parse_member(f[0]), verified);
            }
            "last" => {
                store.epoch = epoch_of(f[0]);
                // The model leaves out the stream's first epoch marker.
                store.n = f[1].parse::<u32>().expect("a number").saturating_sub(1);
            }
            other => panic!("a line DUMP does not write: {other}"),
        }
    }
    // The stream's first epoch marker, which the model leaves out (its history begins in
    // epoch 0 with no event).
    if store.stream.first() == Some(&Event::Epoch) {
        store.stream.remove(0);
    }
    store
}

/// A route's field and value, as `ROUTE_SET` writes it (the value's newlines as `\r`).
fn parse_route(field: &str, value: &str) -> (Device, Route) {
    let parts: Vec<&str> = value.splitn(4, '|').collect();
    let [m, s, since_ms, rest] = parts[..] else { panic!("a route: {value}") };
    let mut rest: Vec<&str> = rest.split('\r').filter(|e| !e.is_empty()).collect();
    let mut ended = None;
    if let Some(mark) = rest.first().and_then(|e| e.strip_prefix('#')) {
        ended = Some(reason(mark.split('|').next().unwrap_or("")));
        rest.remove(0);
    }
    let chain = rest.iter().map(|e| parse_entry(e)).collect();
    let sid = parse_hex(s);
    assert_eq!(since_ms, since(sid), "a route's login time is its session's");
    let device = if field.is_empty() { 0 } else { parse_device(field) };
    (device, Route { member: parse_member(m), sid, since: sid, ended, chain })
}

/// An event of the stream (`t s d node r sp`).
fn parse_event(f: &[&str]) -> Event {
    match f[0] {
        "epoch" => Event::Epoch,
        "online" => Event::Online {
            sid: parse_hex(f[1]),
            device: if f[2] == "-" { 0 } else { parse_device(f[2]) },
            // The event names the node (`n<id>`), not the member: compared by node.
            member: Member { node: f[3].trim_start_matches('n').parse().expect("a node"), run: 0 },
            superseded: f[5] == "1",
        },
        "offline" => Event::Offline { sid: parse_hex(f[1]), reason: reason(f[4]) },
        "user_online" => Event::UserOnline,
        "user_offline" => Event::UserOffline,
        other => panic!("an event the model lacks: {other}"),
    }
}

/// A chain entry: `[=<reason>|<at>|<will>|]<member>|<session>|<device>`.
fn parse_entry(e: &str) -> Entry {
    let (ended, owner) = match e.strip_prefix('=') {
        Some(rest) => {
            let parts: Vec<&str> = rest.splitn(4, '|').collect();
            (Some(reason(parts[0])), parts[3])
        }
        None => (None, e),
    };
    let parts: Vec<&str> = owner.splitn(3, '|').collect();
    let [m, s, d] = parts[..] else { panic!("a chain entry: {e}") };
    Entry { member: parse_member(m), sid: parse_hex(s), device: parse_device(d), ended, applied_end: false }
}

/// The model's store as Redis can show it: what the scripts keep apart from the model's own
/// bookkeeping, and the members an online names left out (an event names the node).
fn comparable(store: &Store) -> Store {
    let mut store = store.clone();
    store.lapsed.clear();
    store.applied_fenced = false;
    store.log.clear();
    store.read = 0;
    store.newest_epoch = 0;
    store.reconciled = false;
    for event in &mut store.stream {
        if let Event::Online { member, .. } = event {
            member.run = 0;
        }
    }
    store.inbox.retain(|_, kicks| !kicks.is_empty());
    store
}

/// What the walks reached, so a run that reaches none of the failover's steps fails.
#[derive(Debug, Default)]
struct Reached {
    failovers: usize,
    reconciles: usize,
    forgets: usize,
    reroutes: usize,
    verified: usize,
}

/// One walk of `seed`: panics with the steps so far at the first difference.
fn walk(seed: u64, reached: &mut Reached) {
    let Some(redis) = Redis::start() else { return };
    let system = System::new(WALK_BOUNDS, Mutation::None);
    let mut state = system.init_states().remove(0);
    // The stream's first epoch, as the first script to log would begin it: the model's
    // epoch 0.
    let begin = "local ev = emitter(KEYS[1], KEYS[2], '100000', '100000000') ev.save() return ev.epoch()";
    let first = eval(&redis, begin, true, &[keys::EVENTS.into(), keys::EVENTS_LAST.into()], &[]);
    let mut driver = Driver { routed: BTreeMap::new(), epochs: vec![first.trim().to_string()] };
    let mut known: BTreeSet<Member> = state.nodes.iter().map(Node::member).collect();
    for m in &known {
        driver.lease(&redis, *m, None, 0);
    }
    let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut steps = Vec::new();
    for _ in 0..STEPS {
        let mut actions = Vec::new();
        system.actions(&state, &mut actions);
        if actions.is_empty() {
            break;
        }
        // xorshift64: the walk is the seed's, whatever the platform.
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        // A fault one step in eight at most: chosen as often as any step, faults crowd a
        // walk's start and leave its nodes cut off or down for the rest.
        let fault = |a: &Action| {
            matches!(
                a,
                Action::CutOff { .. } | Action::Crash { .. } | Action::Apply { reply: false, .. } | Action::Failover
            )
        };
        let (faults, steady): (Vec<Action>, Vec<Action>) = actions.into_iter().partition(fault);
        let pool = if steady.is_empty() || (!faults.is_empty() && rng.is_multiple_of(8)) { &faults } else { &steady };
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let action = pool[(rng % pool.len() as u64) as usize];
        if let Action::Apply { node, .. } = action {
            for change in state.nodes[usize::from(node)].routed.iter().flat_map(|(_, _, batch)| batch) {
                match change {
                    Change::Forget { .. } => reached.forgets += 1,
                    Change::Reroute { .. } => reached.reroutes += 1,
                    Change::Verified => reached.verified += 1,
                    _ => {}
                }
            }
        }
        reached.failovers += usize::from(action == Action::Failover);
        reached.reconciles += usize::from(matches!(action, Action::Reconcile { .. }));
        driver.step(&redis, &state, action);
        state = system.next_state(&state, action).expect("every action steps");
        steps.push(action);
        known.extend(state.nodes.iter().map(Node::member));
        // A renewal in the model names the epoch Redis began at the same step (each newer
        // than any before).
        if usize::from(state.store.newest_epoch) == driver.epochs.len() {
            let real = redis.cli(&["HGET", keys::EVENTS_LAST, "epoch"]);
            driver.epochs.push(real.trim().to_string());
        }
        let got = read_back(&redis, &known, &driver.epochs);
        let want = comparable(&state.store);
        if got != want {
            let fields = [
                ("members", format!("{:?}", got.members), format!("{:?}", want.members)),
                ("leases", format!("{:?}", got.leases), format!("{:?}", want.leases)),
                ("sessions", format!("{:?}", got.sessions), format!("{:?}", want.sessions)),
                ("users", format!("{:?}", got.users), format!("{:?}", want.users)),
                ("applied", format!("{:?}", got.applied), format!("{:?}", want.applied)),
                ("reaped", format!("{:?}", got.reaped), format!("{:?}", want.reaped)),
                ("superseded", format!("{:?}", got.superseded), format!("{:?}", want.superseded)),
                ("routes", format!("{:?}", got.routes), format!("{:?}", want.routes)),
                ("inbox", format!("{:?}", got.inbox), format!("{:?}", want.inbox)),
                ("stream", format!("{:?}", got.stream), format!("{:?}", want.stream)),
                ("verified", format!("{:?}", got.verified), format!("{:?}", want.verified)),
                ("epoch, n", format!("{} {}", got.epoch, got.n), format!("{} {}", want.epoch, want.n)),
            ];
            let differ: Vec<String> = fields
                .iter()
                .filter(|(_, g, w)| g != w)
                .map(|(name, g, w)| format!("{name}:\n  Redis: {g}\n  model: {w}"))
                .collect();
            panic!(
                "seed {seed}: Redis and the model differ after {} steps {steps:?}:\n{}",
                steps.len(),
                differ.join("\n")
            );
        }
    }
}

#[test]
fn random_walks_of_the_model_leave_redis_as_the_model_says() {
    // `IDLEGATE_MODEL_WALKS=18` (or `1-200`) walks other seeds, for a longer run.
    let seeds = match std::env::var("IDLEGATE_MODEL_WALKS") {
        Ok(spec) => match spec.split_once('-') {
            Some((a, b)) => a.parse().expect("a seed")..=b.parse().expect("a seed"),
            None => spec.parse().expect("a seed")..=spec.parse().expect("a seed"),
        },
        Err(_) => 1..=WALKS,
    };
    let mut reached = Reached::default();
    for seed in seeds {
        walk(seed, &mut reached);
    }
    eprintln!("the walks reached {reached:?}");
    // Without redis-server the walks skip; with it, CI's walks reach the steps a failover
    // brings: reconciles, forgotten ends, verified marks. A reroute (`R`) needs Redis to
    // keep a session and lose its route, which one server failing over as a whole does
    // rarely (it was found on a Redis Cluster, whose shards lose writes apart): counted,
    // not required.
    if Redis::start().is_some() {
        assert!(
            reached.failovers > 0 && reached.reconciles > 0 && reached.forgets > 0 && reached.verified > 0,
            "the walks never reached some of a failover's steps: {reached:?}"
        );
    }
}

/// `LEASE` for member `m` on a real Redis, with the node's high water (`epoch`, `n`, as the
/// script takes them) and what it applied (`prev`); its answer's lines.
fn lease_as(redis: &Redis, m: &str, epoch: &str, n: &str, prev: u32) -> Vec<String> {
    let keys = [
        keys::lease(m),
        keys::MEMBERS.into(),
        keys::reaped(m),
        keys::EVENTS_LAST.into(),
        keys::EVENTS.into(),
        keys::applied(m),
    ];
    let args = [m, "0 0", "60000", epoch, n, "100000", "100000000", &prev.to_string()].map(String::from);
    eval(redis, LEASE, true, &keys, &args).lines().map(String::from).collect()
}

/// Logs `count` events (whatever they are: only their numbers matter here); the stream's
/// epoch and last number after.
fn log_events(redis: &Redis, count: usize) -> (String, u32) {
    let body = "local ev = emitter(KEYS[1], KEYS[2], '100000', '100000000') \
                for i = 1, tonumber(ARGV[1]) do ev.emit('t', 'data', 'uid', '7', 'p', 'x', 'at', '1') end \
                ev.save() return {ev.epoch(), ev.n()}";
    let out = eval(redis, body, true, &[keys::EVENTS.into(), keys::EVENTS_LAST.into()], &[count.to_string()]);
    let mut lines = out.lines();
    let epoch = lines.next().unwrap_or_default().to_string();
    (epoch, lines.next().and_then(|n| n.parse().ok()).unwrap_or(0))
}

/// The model's counterexample, on the real scripts: Redis failed over to a replica that
/// lacked events a consumer had read, and the cluster logged nothing more. The consumer
/// was never told. A node's next `LEASE`, knowing a higher number than the stream's, now
/// begins a new epoch, which the consumer meets as a gap.
#[test]
fn model_a_failover_that_loses_what_a_consumer_read_is_told_by_the_next_lease() {
    let Some(redis) = Redis::start() else { return };
    log_events(&redis, 1);
    eval(&redis, REPLICA, false, &[], &["copy".into()]);
    let (epoch, n) = log_events(&redis, 3);
    eval(&redis, REPLICA, false, &[], &["promote".into()]);
    let answer = lease_as(&redis, "a", &epoch, &n.to_string(), 0);
    assert_eq!(answer[3], "1", "the lease tells of lost writes: {answer:?}");
    assert_ne!(answer[1], epoch, "a new epoch");
    let kinds = redis.cli(&[
        "EVAL",
        "local o = {} for _, e in ipairs(redis.call('XRANGE', KEYS[1], '-', '+')) do o[#o + 1] = e[2][2] end return o",
        "1",
        keys::EVENTS,
    ]);
    assert_eq!(kinds.lines().collect::<Vec<_>>(), ["epoch", "data", "epoch"]);
}

/// The model's counterexample, on the real scripts: a failover lost a member's `offline`
/// (its applied marker went back), and other nodes logged as many events meanwhile, so the
/// stream's number caught up with what the member's node had seen. The node, with nothing
/// to write, never reconciled, and the ended session stayed in Redis, online in presence.
/// Its `LEASE` now compares the applied marker with what the node applied: the loss is
/// told (a new epoch, a reconcile), once, and the marker set back to it.
#[test]
fn model_a_member_whose_applied_marker_went_back_is_told_by_its_lease_once() {
    let Some(redis) = Redis::start() else { return };
    let (epoch, n) = log_events(&redis, 2);
    redis.cli(&["SET", &keys::applied("a"), "5"]);
    let answer = lease_as(&redis, "a", &epoch, &n.to_string(), 7);
    assert_eq!((answer[0].as_str(), answer[3].as_str()), ("1", "1"), "{answer:?}");
    assert_eq!(redis.cli(&["GET", &keys::applied("a")]).trim(), "7");
    let (epoch, n) = (answer[1].clone(), answer[2].clone());
    assert_eq!(lease_as(&redis, "a", &epoch, &n, 7)[3], "0", "told once");
    // A reaped member's marker went with its reaping: no loss to tell.
    redis.cli(&["SET", &keys::reaped("b"), "3"]);
    assert_eq!(lease_as(&redis, "b", &epoch, &n, 7)[..4], ["0".to_string(), epoch, n, "0".into()]);
}

//! The backend's side of a run: pushes through the gateway's API at a steady rate, and one
//! consumer of the event stream whose every event is checked against what the clients did.
//!
//! Each push carries its own id and send time, so the client that receives it knows the
//! latency and which push it was; a push the API answered `sent` that no client ever
//! received is lost. The event consumer keeps, per uid, the online, offline and data events
//! it saw; at the end they are compared with each client's own record (logged in or not,
//! DATA frames sent, the reason of its close).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use futures_util::StreamExt;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::fleet::Fleet;
use crate::payload::push_payload;

/// Push requests in flight at once: enough for thousands a second over loopback, and well
/// inside the 256 connections the gateway's API serves at once.
const PUSHES_IN_FLIGHT: usize = 32;

/// How often the pusher wakes to send what is due.
const PUSH_STEP: Duration = Duration::from_millis(5);

/// Tries to find an online client for one push before skipping it.
const PICK_TRIES: usize = 16;

/// Longest one API request may take before it counts as an error.
const API_TIMEOUT: Duration = Duration::from_secs(5);

/// Mismatches described in the report; the rest are only counted.
const DESCRIBED: usize = 5;

/// The gateway's backend API.
#[derive(Debug, Clone)]
pub struct Api {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

// === impl Api ===

impl Api {
    /// `base` is `host:port` or a full `http://host:port` URL.
    pub fn new(base: &str, token: Option<String>) -> Api {
        let base = if base.starts_with("http://") { base.to_string() } else { format!("http://{base}") };
        let http = reqwest::Client::builder().build().expect("a plain HTTP client builds");
        Api { http, base: base.trim_end_matches('/').to_string(), token }
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let request = self.http.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    /// Checks the API answers (and accepts the token), before the run starts.
    pub async fn probe(&self) -> Result<(), String> {
        let answer = self.request(reqwest::Method::GET, "/v1/online").timeout(API_TIMEOUT).send().await;
        match answer {
            Ok(r) if r.status().is_success() => Ok(()),
            Ok(r) if r.status() == reqwest::StatusCode::UNAUTHORIZED => {
                Err(format!("{}: 401, the API wants a token: pass --api-token", self.base))
            }
            Ok(r) => Err(format!("{}/v1/online answered {}", self.base, r.status())),
            Err(e) => Err(format!("{}: {e}", self.base)),
        }
    }
}

/// One push on its way: to which uid, how many of its devices have reported it, and how
/// many the API said it reached (once its answer is in).
/// Which API a push to client `index` goes through, when client i is connected to node
/// i mod `nodes`: with one API per node, the next node's, so every push crosses nodes;
/// otherwise the APIs in turn.
fn api_for(apis: &[Api], nodes: usize, index: usize, turn: u64) -> &Api {
    if apis.len() == nodes && nodes > 1 {
        &apis[(index % nodes + 1) % nodes]
    } else {
        &apis[(turn % apis.len() as u64) as usize]
    }
}

/// Pushes `rate` times a second to random clients the harness sees online, until `stop`;
/// then waits for the requests in flight. `nodes` is how many gateways the clients are
/// spread over (see [`api_for`]).
pub async fn push_loop(apis: Vec<Api>, nodes: usize, rate: f64, fleet: Arc<Fleet>, seed: u64, stop: CancellationToken) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let start = Instant::now();
    let mut done = 0u64;
    let mut in_flight = JoinSet::new();
    let mut step = tokio::time::interval(PUSH_STEP);
    step.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = step.tick() => {}
            _ = stop.cancelled() => break,
        }
        let due = (start.elapsed().as_secs_f64() * rate) as u64;
        while done < due {
            while in_flight.len() >= PUSHES_IN_FLIGHT {
                in_flight.join_next().await;
            }
            done += 1;
            let Some(index) = (0..PICK_TRIES)
                .map(|_| rng.gen_range(0..fleet.cells.len()))
                .find(|&i| fleet.cells[i].online.load(Ordering::Relaxed))
            else {
                continue;
            };
            let uid = fleet.uid_of(index as u64);
            in_flight.spawn(push_one(api_for(&apis, nodes, index, done).clone(), fleet.clone(), uid));
        }
    }
    while in_flight.join_next().await.is_some() {}
}

async fn push_one(api: Api, fleet: Arc<Fleet>, uid: u64) {
    let pushes = &fleet.pushes;
    let id = pushes.begin(uid);
    let nanos = fleet.epoch.elapsed().as_nanos() as u64;
    let body = serde_json::json!({ "uids": [uid], "payload": BASE64.encode(push_payload(id, nanos)) });
    let answer = async {
        let response = api.request(reqwest::Method::POST, "/v1/push").json(&body).timeout(API_TIMEOUT).send().await?;
        response.error_for_status()?.json::<Value>().await
    }
    .await;
    match answer {
        Ok(v) if v["sent"].as_array().is_some_and(|s| s.len() == 1) => {
            pushes.sent.fetch_add(1, Ordering::Relaxed);
            // Every device of the uid online (one session without devices, or from a
            // gateway that does not say).
            pushes.answered(id, v["sessions"].as_u64().unwrap_or(1));
        }
        Ok(v) if v["offline"].as_array().is_some_and(|s| s.len() == 1) => {
            pushes.offline.fetch_add(1, Ordering::Relaxed);
            if !pushes.withdraw(id) {
                // Received although the gateway said the uid was offline.
                pushes.unexpected.fetch_add(1, Ordering::Relaxed);
            }
        }
        _ => {
            pushes.errors.fetch_add(1, Ordering::Relaxed);
            pushes.withdraw(id);
        }
    }
}

/// Which clients a run has, to place each event: client i is device `d<i mod devices>` (or
/// the default device, without devices) of uid `uid_base + i / devices`.
#[derive(Debug, Clone, Copy)]
pub struct Clients {
    pub uid_base: u64,
    pub devices: u64,
    pub count: u64,
}

impl Clients {
    /// The client a session event names.
    fn index(&self, uid: u64, device: &str) -> Option<u64> {
        let k = if self.devices == 1 {
            device.is_empty().then_some(0)?
        } else {
            device.strip_prefix('d')?.parse::<u64>().ok().filter(|&k| k < self.devices)?
        };
        let i = uid.checked_sub(self.uid_base)?.checked_mul(self.devices)? + k;
        (i < self.count).then_some(i)
    }

    /// The client a DATA payload's key names.
    fn by_key(&self, key: u64) -> Option<u64> {
        key.checked_sub(self.uid_base).filter(|&i| i < self.count)
    }

    /// Whether `uid` is one of the run's.
    fn has_uid(&self, uid: u64) -> bool {
        uid.checked_sub(self.uid_base).and_then(|u| u.checked_mul(self.devices)).is_some_and(|i| i < self.count)
    }
}

/// What the event consumer saw of one client.
#[derive(Debug, Default, Clone)]
struct Seen {
    onlines: Vec<String>,
    offlines: Vec<(String, String)>,
    data: u64,
    /// DATA events out of order or with bytes the client did not send.
    bad_data: u64,
}

/// What the user-level events of one uid must be next, from its session events so far.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Awaiting {
    /// No user event: the next event of the uid is not one.
    #[default]
    Nothing,
    /// An online found the uid offline: `user_online` comes next.
    UserOnline,
    /// An offline left the uid without sessions: `user_offline` comes next, or the online of
    /// the login that replaced it (no user event then).
    UserOfflineOrReplacement,
}

/// The user-level view of one uid, as its events tell it.
#[derive(Debug, Default, Clone, Copy)]
struct User {
    sessions: i64,
    online: bool,
    awaiting: Awaiting,
}

/// The event consumer's record.
#[derive(Debug, Default)]
pub struct Ledger {
    seen: Mutex<HashMap<u64, Seen>>,
    users: Mutex<HashMap<u64, User>>,
    pub events: AtomicU64,
    pub offlines: AtomicU64,
    /// `user_online` and `user_offline` events.
    pub user_events: AtomicU64,
    /// User events missing, doubled or out of order.
    pub user_mismatches: AtomicU64,
    /// Events the stream said this consumer missed.
    pub missed: AtomicU64,
    pub malformed: AtomicU64,
    /// Offline events with reason `node_lost`: sessions of a gateway that died.
    pub node_lost: AtomicU64,
    /// A few user-event mismatches described.
    user_problems: Mutex<Vec<String>>,
}

// === impl Ledger ===

impl Ledger {
    fn seen(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Seen>> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn record(&self, event: &str, data: &Value, clients: Clients) {
        self.events.fetch_add(1, Ordering::Relaxed);
        if event == "gap" {
            self.missed.fetch_add(data["missed"].as_u64().unwrap_or(1).max(1), Ordering::Relaxed);
            return;
        }
        let Some(uid) = data["uid"].as_u64() else {
            self.malformed.fetch_add(1, Ordering::Relaxed);
            return;
        };
        if !clients.has_uid(uid) {
            return;
        }
        let text = |k: &str| data[k].as_str().unwrap_or("").to_string();
        self.follow_user(uid, event);
        let index = match event {
            "online" | "offline" => clients.index(uid, &text("device")),
            "data" => {
                let payload = BASE64.decode(text("payload")).unwrap_or_default();
                let key = payload.get(..8).map(|k| u64::from_be_bytes(k.try_into().unwrap_or_default()));
                key.and_then(|k| clients.by_key(k))
            }
            "user_online" | "user_offline" => return,
            _ => None,
        };
        let Some(index) = index else {
            self.malformed.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let mut seen = self.seen();
        let seen = seen.entry(index).or_default();
        match event {
            "online" => seen.onlines.push(text("session")),
            "offline" => {
                seen.offlines.push((text("session"), text("reason")));
                self.offlines.fetch_add(1, Ordering::Relaxed);
                if data["reason"] == "node_lost" {
                    self.node_lost.fetch_add(1, Ordering::Relaxed);
                }
            }
            _ => {
                let want = crate::payload::data_payload(clients.uid_base + index, seen.data);
                if BASE64.decode(text("payload")).ok().as_deref() != Some(&want[..]) {
                    seen.bad_data += 1;
                }
                seen.data += 1;
            }
        }
    }

    /// Checks `uid`'s user-level events against its session events, as they come: a
    /// `user_online` right after the online that found it offline, a `user_offline` right
    /// after the offline of its last session unless a login replaced that session (its
    /// online comes next), and no other.
    fn follow_user(&self, uid: u64, event: &str) {
        let mut users = self.users.lock().unwrap_or_else(PoisonError::into_inner);
        let user = users.entry(uid).or_default();
        let mut problem = None;
        let is_user_event = matches!(event, "user_online" | "user_offline");
        if is_user_event {
            self.user_events.fetch_add(1, Ordering::Relaxed);
        }
        match (user.awaiting, event) {
            (Awaiting::UserOnline, "user_online") => user.online = true,
            (Awaiting::UserOfflineOrReplacement, "user_offline") => user.online = false,
            (Awaiting::UserOfflineOrReplacement, "online") => {}
            (Awaiting::Nothing, e) if !matches!(e, "user_online" | "user_offline") => {}
            (awaiting, e) => problem = Some(format!("uid {uid}: {e} where {awaiting:?} was due")),
        }
        user.awaiting = Awaiting::Nothing;
        match event {
            "online" => {
                user.sessions += 1;
                if !user.online {
                    user.awaiting = Awaiting::UserOnline;
                }
            }
            "offline" => {
                user.sessions -= 1;
                if user.sessions == 0 {
                    user.awaiting = Awaiting::UserOfflineOrReplacement;
                }
            }
            _ => {}
        }
        if user.sessions < 0 {
            problem = Some(format!("uid {uid}: more offline events than online"));
        }
        drop(users);
        if let Some(problem) = problem {
            self.user_problem(problem);
        }
    }

    fn user_problem(&self, problem: String) {
        self.user_mismatches.fetch_add(1, Ordering::Relaxed);
        let mut problems = self.user_problems.lock().unwrap_or_else(PoisonError::into_inner);
        if problems.len() < DESCRIBED {
            problems.push(problem);
        }
    }

    /// Compares what the stream said with each client's record; returns the number of
    /// mismatches and a few of them described.
    pub fn judge(&self, fleet: &Fleet) -> (u64, Vec<String>) {
        let seen = self.seen();
        let empty = Seen::default();
        let mut count = 0;
        let mut described = Vec::new();
        let mut report = |problem: String| {
            count += 1;
            if described.len() < DESCRIBED {
                described.push(problem);
            }
        };
        for (i, cell) in fleet.cells.iter().enumerate() {
            let uid = fleet.uid_of(i as u64);
            let who = if fleet.devices > 1 {
                format!("uid {uid} device d{}", i as u64 % fleet.devices)
            } else {
                format!("uid {uid}")
            };
            let s = seen.get(&(i as u64)).unwrap_or(&empty);
            let logged_in = cell.logged_in.load(Ordering::Relaxed);
            let want_onlines = usize::from(logged_in);
            if s.onlines.len() != want_onlines || s.offlines.len() != want_onlines {
                report(format!(
                    "{who}: {} online and {} offline events, expected {want_onlines} of each",
                    s.onlines.len(),
                    s.offlines.len()
                ));
                continue;
            }
            if let (Some(session), Some((ended, reason))) = (s.onlines.first(), s.offlines.first()) {
                let closed = cell.close_reason().map_or("?", |r| r.label());
                // A client of a gateway that died saw its connection drop; the reaper says why.
                let lost = fleet.node_loss && closed == "disconnect" && reason == "node_lost";
                if session != ended || (reason != closed && !lost) {
                    report(format!(
                        "{who}: offline ({reason}) of session {ended}, but the client saw {closed} on session {session}"
                    ));
                    continue;
                }
            }
            let sent = cell.data_sent.load(Ordering::Relaxed);
            if s.data != sent || s.bad_data > 0 {
                report(format!("{who}: sent {sent} DATA frames, saw {} data events ({} wrong)", s.data, s.bad_data));
            }
        }
        // Every session ended: every uid went offline as a user after its last one.
        let users = self.users.lock().unwrap_or_else(PoisonError::into_inner);
        for (uid, user) in users.iter() {
            if user.online || user.awaiting != Awaiting::Nothing {
                report(format!("uid {uid}: ended as {user:?}, not offline as a user"));
            }
        }
        let problems = self.user_problems.lock().unwrap_or_else(PoisonError::into_inner);
        for problem in problems.iter() {
            report(problem.clone());
        }
        // The user-event mismatches past the few described.
        count += self.user_mismatches.load(Ordering::Relaxed) - problems.len() as u64;
        (count, described)
    }
}

/// Follows `/v1/events` from now, recording every event for uids in `uids`, until `stop`,
/// and writing each to `record` (one JSON object a line: `id`, `type` and its fields) when
/// given. Resolves `ready` once the stream is open, so no login of the run precedes it.
pub async fn follow(
    api: Api,
    ledger: Arc<Ledger>,
    clients: Clients,
    record: Option<std::fs::File>,
    ready: tokio::sync::oneshot::Sender<Result<(), String>>,
    stop: CancellationToken,
) {
    use std::io::Write;
    let mut record = record.map(std::io::BufWriter::new);
    let response = match api.request(reqwest::Method::GET, "/v1/events").send().await {
        Ok(r) if r.status().is_success() => r,
        Ok(r) => {
            let _ = ready.send(Err(format!("/v1/events answered {}", r.status())));
            return;
        }
        Err(e) => {
            let _ = ready.send(Err(format!("/v1/events: {e}")));
            return;
        }
    };
    let _ = ready.send(Ok(()));
    let mut body = response.bytes_stream();
    let mut text = String::new();
    loop {
        let chunk = tokio::select! {
            c = body.next() => c,
            _ = stop.cancelled() => None,
        };
        let Some(Ok(chunk)) = chunk else {
            if let Some(record) = &mut record {
                let _ = record.flush();
            }
            return;
        };
        text.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = text.find("\n\n") {
            let block: String = text.drain(..end + 2).collect();
            if let Some(line) = crate::nemesis::observe::event_line(&block) {
                let event = line["type"].as_str().unwrap_or_default();
                ledger.record(event, &line, clients);
                if let Some(record) = &mut record {
                    let _ = writeln!(record, "{line}");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use idlegate_proto::CloseReason;

    use super::*;

    #[test]
    fn pushes_cross_nodes_when_there_is_an_api_per_node() {
        let apis: Vec<Api> = ["a:1", "b:1", "c:1"].iter().map(|a| Api::new(a, None)).collect();
        // Client 4 sits on node 1 (4 mod 3): its pushes go through node 2, whatever the turn.
        assert_eq!(api_for(&apis, 3, 4, 0).base, "http://c:1");
        assert_eq!(api_for(&apis, 3, 2, 9).base, "http://a:1");
        // One gateway, or APIs that do not match the targets: the APIs in turn.
        assert_eq!(api_for(&apis, 1, 4, 4).base, "http://b:1");
        assert_eq!(api_for(&apis[..1], 3, 4, 4).base, "http://a:1");
    }

    #[test]
    fn the_ledger_catches_missing_duplicate_and_wrong_events() {
        let uids = Clients { uid_base: 10, devices: 1, count: 3 };
        let ledger = Ledger::default();
        let online = |session: &str| serde_json::json!({"uid": 10, "session": session});
        // uid 10: online, data 0, offline kicked, but the client saw logout.
        ledger.record("online", &online("a"), uids);
        let data = |uid: u64, seq: u64| serde_json::json!({"uid": uid, "payload": BASE64.encode(crate::payload::data_payload(uid, seq))});
        ledger.record("data", &data(10, 0), uids);
        ledger.record("offline", &serde_json::json!({"uid": 10, "session": "a", "reason": "kicked"}), uids);
        // uid 11: two onlines. uid 12: data out of order, and no offline.
        ledger.record("online", &serde_json::json!({"uid": 11, "session": "b"}), uids);
        ledger.record("online", &serde_json::json!({"uid": 11, "session": "c"}), uids);
        ledger.record("online", &serde_json::json!({"uid": 12, "session": "d"}), uids);
        ledger.record("data", &data(12, 1), uids);
        // Outside the run's uids: ignored.
        ledger.record("online", &serde_json::json!({"uid": 99, "session": "e"}), uids);
        ledger.record("gap", &serde_json::json!({"missed": 3}), uids);
        assert_eq!(ledger.missed.load(Ordering::Relaxed), 3);

        let fleet = Fleet::new(10, 1, 3, false);
        for (i, reason) in [(0, CloseReason::Logout), (1, CloseReason::Disconnect), (2, CloseReason::Disconnect)] {
            fleet.cells[i].logged_in.store(true, Ordering::Relaxed);
            fleet.cells[i].set_close(reason);
        }
        fleet.cells[0].data_sent.store(1, Ordering::Relaxed);
        fleet.cells[2].data_sent.store(1, Ordering::Relaxed);
        let (mismatches, examples) = ledger.judge(&fleet);
        // Three clients wrong, and the user events their uids lacked (no user_online after
        // an online, none before the next event, and none offline as a user at the end).
        assert_eq!(mismatches, 8, "{examples:?}");
        assert!(examples[0].contains("kicked") && examples[0].contains("logout"), "{examples:?}");

        // The same events for clients that did just that: no mismatch.
        fleet.cells[0].close.store(0, Ordering::Relaxed);
        fleet.cells[0].set_close(CloseReason::Kicked);
        let clean = Ledger::default();
        clean.record("online", &online("a"), uids);
        clean.record("user_online", &serde_json::json!({"uid": 10}), uids);
        clean.record("data", &data(10, 0), uids);
        clean.record("offline", &serde_json::json!({"uid": 10, "session": "a", "reason": "kicked"}), uids);
        clean.record("user_offline", &serde_json::json!({"uid": 10, "reason": "kicked"}), uids);
        for i in [1, 2] {
            fleet.cells[i].logged_in.store(false, Ordering::Relaxed);
            fleet.cells[i].data_sent.store(0, Ordering::Relaxed);
        }
        assert_eq!(clean.judge(&fleet).0, 0);
    }

    #[test]
    fn user_events_are_checked_per_uid_across_its_devices() {
        let clients = Clients { uid_base: 1, devices: 2, count: 4 };
        let ev = |ledger: &Ledger, event: &str, uid: u64, device: &str| {
            ledger.record(
                event,
                &serde_json::json!({"uid": uid, "session": format!("{uid}{device}"), "device": device}),
                clients,
            )
        };
        let play = |events: &[(&str, u64, &str)]| {
            let ledger = Ledger::default();
            for &(event, uid, device) in events {
                ev(&ledger, event, uid, device);
            }
            ledger
        };
        // A relogin of d1 replaces it (offline then online): no user events between.
        let good = play(&[
            ("online", 1, "d0"),
            ("user_online", 1, ""),
            ("online", 1, "d1"),
            ("offline", 1, "d0"),
            ("offline", 1, "d1"),
            ("online", 1, "d1"),
            ("offline", 1, "d1"),
            ("user_offline", 1, ""),
        ]);
        assert_eq!((good.user_mismatches.load(Ordering::Relaxed), good.user_events.load(Ordering::Relaxed)), (0, 2));
        let bad = play(&[
            ("online", 2, "d0"),
            ("user_online", 2, ""),
            ("online", 2, "d1"),
            ("user_online", 2, ""),
            ("offline", 2, "d0"),
            ("user_offline", 2, ""),
        ]);
        assert_eq!(bad.user_mismatches.load(Ordering::Relaxed), 2, "a second user_online, a user_offline too early");
        // Devices place their events on their own clients: uid 2's d1 is client 3.
        assert_eq!(clients.index(2, "d1"), Some(3));
        assert_eq!(clients.index(2, "d2"), None);
        assert_eq!(clients.index(3, "d0"), None);
    }
}

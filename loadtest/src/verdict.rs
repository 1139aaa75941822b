//! `loadtest verdict`: an independent checker of idlegate's event promises, reading only what
//! a backend sees. It knows nothing of the gateway's internals: its input is the event
//! stream as a consumer received it (`events.jsonl`, one event a line: `id`, `type` and the
//! fields `/v1/events` carries), and optionally presence answers sampled while the stream
//! was read (`presence.jsonl`). The nemesis (issue 38) is to feed it what its consumer and
//! samplers recorded under faults; today it judges any recorded stream.
//!
//! The promises checked:
//! - every `online` has exactly one `offline` with the same session id, after it (once the
//!   run has quiesced: `--running` leaves sessions still open alone);
//! - no session id is used twice, and a session's events name one uid;
//! - user events alternate per uid, `user_online` first, and agree with the session events:
//!   a `user_online` comes while the uid has a session, a `user_offline` when it has none;
//! - no presence answer lists a session whose `offline` the consumer had already received
//!   before asking;
//! - a loss is a reported `gap`, never a silent hole: an event whose partner is missing is
//!   accepted only when a gap lies between where the partner should be and the stream's end
//!   (or start). After a gap, a uid's user-event order starts afresh.
//!
//! The stream must be read from its start (the nemesis's consumer connects before any
//! client), so a uid's first user event is a `user_online`.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

/// What `loadtest verdict` reads and writes.
#[derive(Debug, Clone, clap::Args)]
pub struct VerdictArgs {
    /// The event stream as received: one JSON object a line, with `id` and `type`.
    #[arg(long)]
    pub events: PathBuf,
    /// Presence answers sampled while reading it: one JSON object a line,
    /// `{"uid": n, "seen": "<id of the last event received before asking>", "sessions":
    /// ["<session id>", ...]}`.
    #[arg(long)]
    pub presence: Option<PathBuf>,
    /// The same events as the webhook receiver got them (one JSON object a line, each
    /// once): judged as the stream is, without the presence samples (which name the
    /// stream's ids).
    #[arg(long)]
    pub webhooks: Option<PathBuf>,
    /// The sessions as the clients saw them (the nemesis's `clients.jsonl`): `{"uid",
    /// "node", "session", "from_ms", "to_ms", "pinging", "end"}`. A client that kept pinging
    /// on a healthy node must never have lost its session, and every session a client was
    /// welcomed into must be in the stream (or a gap).
    #[arg(long)]
    pub clients: Option<PathBuf>,
    /// The nemesis's `schedule.json`: the faults (counted in the verdict) that make a node
    /// unhealthy for the clients check, and the gateways' settings.
    #[arg(long)]
    pub schedule: Option<PathBuf>,
    /// The gateways' `--max-devices`: no uid may hold more sessions at once in stream order,
    /// nor one device twice, leaving out the sessions whose `online` says `superseded`.
    /// Taken from the schedule's settings when not given; unchecked without either.
    #[arg(long)]
    pub max_devices: Option<usize>,
    /// The stream was cut before everything ended: an `online` without its `offline` is
    /// not a violation.
    #[arg(long)]
    pub running: bool,
    /// Where to write the verdict (JSON); it is printed either way.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// One broken promise: what, where in the stream (0-based line), and the event's id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub kind: &'static str,
    /// The file `line` is in: events.jsonl, or clients.jsonl for the clients' checks.
    pub file: &'static str,
    pub line: usize,
    pub detail: String,
}

/// The files a violation's line can be in.
const EVENTS: &str = "events.jsonl";
const CLIENTS: &str = "clients.jsonl";
const WEBHOOKS: &str = "webhooks.jsonl";
const REQUESTS: &str = "webhook-requests.jsonl";

/// What the checker found.
#[derive(Debug, Default)]
pub struct Verdict {
    pub violations: Vec<Violation>,
    pub sessions: usize,
    pub gaps: usize,
    /// Faults injected, by kind (from the schedule).
    pub faults: BTreeMap<String, u64>,
    /// Client sessions judged by the healthy-node check.
    pub kept: usize,
    /// Sessions missing from the stream whose node was killed (SIGKILL) within
    /// [`KILLED_BEFORE_ITS_BATCH_MS`] of their WELCOME: welcomed from the node's memory, gone
    /// with it before its next batch could leave.
    pub killed_before_batch: usize,
    /// Sessions the webhooks named, when they were judged.
    pub webhook_sessions: Option<usize>,
    /// Sessions whose `online` said `superseded`: left out of the device bound.
    pub superseded: usize,
}

impl Verdict {
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }

    pub fn to_json(&self) -> Value {
        let violations: Vec<Value> = self
            .violations
            .iter()
            .map(|v| json!({"kind": v.kind, "file": v.file, "line": v.line + 1, "detail": v.detail}))
            .collect();
        json!({
            "ok": self.ok(),
            "violations": violations,
            "faults": self.faults,
            "sessions": self.sessions,
            "gaps": self.gaps,
            "kept_sessions_checked": self.kept,
            "killed_before_batch": self.killed_before_batch,
            "webhook_sessions": self.webhook_sessions,
            "superseded": self.superseded,
        })
    }
}

/// A session as its events showed it.
#[derive(Debug, Default)]
struct Seen {
    uid: u64,
    online: Option<usize>,
    offline: Option<usize>,
}

/// Judges `events` (in the order received) and `presence` samples.
pub fn check(events: &[Value], presence: &[Value], running: bool) -> Verdict {
    let mut verdict = Verdict::default();
    let mut say = |kind: &'static str, line: usize, detail: String| {
        verdict.violations.push(Violation { kind, file: EVENTS, line, detail });
    };
    let mut sessions: BTreeMap<String, Seen> = BTreeMap::new();
    let mut live: HashMap<u64, usize> = HashMap::new();
    // Per uid: whether its last user event was user_online, since the last gap.
    let mut user_online: HashMap<u64, bool> = HashMap::new();
    let mut gaps: Vec<usize> = Vec::new();
    // The gaps that begin a new history (`earlier_stream`: Redis lost writes).
    let mut histories: Vec<usize> = Vec::new();
    // Per uid: the `at_ms` of its last user event, which the next may not go below, gaps or
    // not (issue 49, promise 3: time never goes back per uid).
    let mut user_at: HashMap<u64, u64> = HashMap::new();
    // The same, for the uid's session events, which may not be stamped below it (promise 3);
    // what Redis lost in a gap may hold the floor, so it starts afresh after one.
    let mut floor: HashMap<u64, u64> = HashMap::new();
    let mut line_of: HashMap<String, usize> = HashMap::new();
    for (line, event) in events.iter().enumerate() {
        if let Some(id) = event["id"].as_str() {
            line_of.insert(id.to_string(), line);
        }
        let kind = event["type"].as_str().unwrap_or("");
        let uid = event["uid"].as_u64();
        let session = event["session"].as_str().map(str::to_string);
        if let (Some(uid), Some(at), "user_online" | "user_offline") = (uid, event["at_ms"].as_u64(), kind) {
            floor.insert(uid, at);
            if let Some(before) = user_at.insert(uid, at).filter(|&before| at < before) {
                say(
                    "user_event_back_in_time",
                    line,
                    format!("uid {uid}: {kind} at {at} ms, after a user event at {before} ms"),
                );
            }
        }
        if let (Some(uid), Some(at), "online" | "offline") = (uid, event["at_ms"].as_u64(), kind) {
            if let Some(&before) = floor.get(&uid).filter(|&&before| at < before) {
                say(
                    "session_event_back_in_time",
                    line,
                    format!("uid {uid}: {kind} at {at} ms, after a user event at {before} ms"),
                );
            }
        }
        match (kind, uid, session) {
            ("online", Some(uid), Some(session)) => {
                let seen = sessions.entry(session.clone()).or_default();
                // Announced again after a gap, still open and of the same uid: Redis lost it
                // and its node says it again (docs/CLUSTER.md, When Redis loses writes).
                if let (Some(first), None) = (seen.online, seen.offline) {
                    if seen.uid == uid && gaps.iter().any(|&gap| gap > first) {
                        seen.online = Some(line);
                        *live.entry(uid).or_default() += 1;
                        continue;
                    }
                }
                // Ended before an `earlier_stream` gap, announced in the new history: its end
                // was lost with the old one (a kick that never reached its node, nemesis
                // seed 5 at --max-devices 1). Exactly once holds within each history.
                if let (Some(ended), true) = (seen.offline, seen.uid == uid) {
                    if histories.iter().any(|&gap| gap > ended) {
                        *seen = Seen { uid, online: Some(line), offline: None };
                        *live.entry(uid).or_default() += 1;
                        continue;
                    }
                }
                if seen.online.is_some() || seen.offline.is_some() {
                    say("session_reused", line, format!("session {session} of uid {uid} seen before"));
                    continue;
                }
                *seen = Seen { uid, online: Some(line), offline: None };
                *live.entry(uid).or_default() += 1;
            }
            ("offline", Some(uid), Some(session)) => {
                let seen = sessions.entry(session.clone()).or_default();
                if seen.offline.is_some() {
                    say("offline_twice", line, format!("session {session} of uid {uid} ended twice"));
                    continue;
                }
                match seen.online {
                    Some(_) if seen.uid != uid => {
                        say(
                            "session_uid_mismatch",
                            line,
                            format!("session {session}: online uid {}, offline uid {uid}", seen.uid),
                        );
                    }
                    Some(_) => {
                        let n = live.entry(uid).or_default();
                        *n = n.saturating_sub(1);
                    }
                    // Its online is lost: only a gap before it may explain that.
                    None if gaps.is_empty() => {
                        say(
                            "offline_without_online",
                            line,
                            format!("session {session} of uid {uid}, and no gap before it"),
                        );
                    }
                    None => {}
                }
                seen.uid = uid;
                seen.offline = Some(line);
            }
            ("user_online", Some(uid), _) => {
                if user_online.get(&uid) == Some(&true) {
                    say("user_events_out_of_order", line, format!("uid {uid}: user_online twice in a row"));
                }
                user_online.insert(uid, true);
                if live.get(&uid).copied().unwrap_or(0) == 0 && gaps.is_empty() {
                    say("user_online_without_session", line, format!("uid {uid} has no session online"));
                }
            }
            ("user_offline", Some(uid), _) => {
                // Unknown after a gap (its user_online may be what was lost); before any,
                // a uid starts offline: the consumer reads the stream from its start.
                let known_offline =
                    user_online.get(&uid) == Some(&false) || (gaps.is_empty() && !user_online.contains_key(&uid));
                if known_offline {
                    say(
                        "user_events_out_of_order",
                        line,
                        format!("uid {uid}: user_offline without a user_online before it"),
                    );
                }
                user_online.insert(uid, false);
                let n = live.get(&uid).copied().unwrap_or(0);
                if n > 0 {
                    say("user_offline_with_live_session", line, format!("uid {uid} still has {n} session(s) online"));
                }
            }
            ("gap", _, _) => {
                gaps.push(line);
                if event["earlier_stream"] == true {
                    histories.push(line);
                }
                floor.clear();
                // What was lost may have held any uid's events: its user-event order starts
                // afresh, and only sessions whose online comes after the gap count as live.
                user_online.clear();
                live.clear();
            }
            ("online" | "offline" | "user_online" | "user_offline", _, _) => {
                say("malformed_event", line, format!("{kind} without its uid or session: {event}"));
            }
            _ => {}
        }
    }
    verdict.sessions = sessions.len();
    verdict.gaps = gaps.len();
    if !running {
        for (session, seen) in &sessions {
            if let (Some(online), None) = (seen.online, seen.offline) {
                // The offline may have been lost only in a gap after the online.
                if !gaps.iter().any(|&gap| gap > online) {
                    say(
                        "online_without_offline",
                        online,
                        format!("session {session} of uid {} never ended, and no gap after it", seen.uid),
                    );
                }
            }
        }
    }
    for (n, sample) in presence.iter().enumerate() {
        let Some(seen) = sample["seen"].as_str().and_then(|id| line_of.get(id)) else { continue };
        for session in sample["sessions"].as_array().into_iter().flatten().filter_map(Value::as_str) {
            if let Some(offline) = sessions.get(session).and_then(|s| s.offline) {
                if offline <= *seen {
                    say(
                        "presence_after_offline",
                        offline,
                        format!(
                            "presence sample {n} listed session {session}, whose offline was received before asking"
                        ),
                    );
                }
            }
        }
    }
    verdict.violations.sort_by_key(|v| v.line);
    verdict
}

/// Issue 49, promise 2: the device bound in stream order. A consumer reading `events` in
/// order never sees a uid with more than `max_devices` sessions online, nor one device of
/// it twice; a session whose `online` says `superseded` (a login on another node had taken
/// its place before it was logged) is left out, and counted. After a gap, only sessions
/// announced after it count.
pub fn check_bound(verdict: &mut Verdict, file: &'static str, events: &[Value], max_devices: usize) {
    let mut live: HashMap<u64, Vec<(String, String)>> = HashMap::new();
    for (line, event) in events.iter().enumerate() {
        let (uid, session) = (event["uid"].as_u64(), event["session"].as_str());
        match (event["type"].as_str(), uid, session) {
            (Some("online"), Some(uid), Some(session)) => {
                if event["superseded"] == true {
                    verdict.superseded += 1;
                    continue;
                }
                let device = event["device"].as_str().unwrap_or("").to_string();
                let held = live.entry(uid).or_default();
                // Announced again after a gap: the same session.
                held.retain(|(s, _)| s != session);
                if let Some((other, _)) = held.iter().find(|(_, d)| *d == device) {
                    let detail = format!("uid {uid}: session {session} online on device {device:?} while {other} is");
                    verdict.violations.push(Violation { kind: "device_online_twice", file, line, detail });
                }
                held.push((session.to_string(), device));
                if held.len() > max_devices {
                    let detail = format!("uid {uid}: {} sessions online, over --max-devices {max_devices}", held.len());
                    verdict.violations.push(Violation { kind: "over_max_devices", file, line, detail });
                }
            }
            (Some("offline"), Some(uid), Some(session)) => {
                if let Some(held) = live.get_mut(&uid) {
                    held.retain(|(s, _)| s != session);
                }
            }
            (Some("gap"), _, _) => live.clear(),
            _ => {}
        }
    }
    verdict.violations.sort_by_key(|v| v.line);
}

/// Fault kinds during which promise 4 asks for no progress: the receiver is not healthy, or
/// no relay can reach Redis. Every other kind touches one node, and the turn must pass to
/// another within a turn.
const WEBHOOK_UNHEALTHY: [&str; 4] = ["slow_receiver", "redis_restart", "redis_failover", "slow_redis"];

/// Issue 49, promise 4: webhooks make progress. Whenever the receiver is healthy and Redis
/// answers, and an event waits that the receiver has not taken, the receiver's position
/// (the furthest event it took) advances within two turns of the later of the event's
/// logging and the last advance, or the spell's start (`webhook_stalled`, once for each
/// healthy spell). A backlog may take longer to drain: progress is what is promised. A turn is
/// the longer of the relay turn's lease (three quarters of `--node-lease`) and the relay's
/// longest wait between tries (`--webhook-max-backoff`). `events` is the stream as the
/// consumer read it (its ids are Redis's unix ms), `requests` the receiver's log, whose
/// `done_unix_ms` places its run times on the same clock. A `slow_receiver` spell lasts
/// until the last request it received has ended; a Redis fault until the stream takes its
/// first event after it. Runs recorded before these settings and
/// fields existed are not judged.
pub fn check_webhook_progress(verdict: &mut Verdict, events: &[Value], requests: &[Value], schedule: &Value) {
    let settings = &schedule["settings"];
    let (Some(lease), Some(backoff), Some(duration)) = (
        settings["node_lease_ms"].as_u64(),
        settings["webhook_max_backoff_ms"].as_u64(),
        settings["duration_ms"].as_u64(),
    ) else {
        return;
    };
    let Some(offset) =
        requests.iter().find_map(|r| Some(r["done_unix_ms"].as_u64()? as i64 - r["done_ms"].as_u64()? as i64))
    else {
        return;
    };
    let bound = 2 * (lease * 3 / 4).max(backoff);
    // The stream's events in order, each with when it was logged in run ms.
    let logged: Vec<(usize, (u64, u64), u64)> = events
        .iter()
        .enumerate()
        .filter(|(_, e)| !e["uid"].is_null())
        .filter_map(|(line, e)| {
            let key = id_key(e["id"].as_str()?)?;
            Some((line, key, (key.0 as i64 - offset).max(0) as u64))
        })
        .collect();
    // The spells without health, in run ms, merged.
    let mut sick: Vec<(u64, u64)> = schedule["faults"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter(|f| f["kind"].as_str().is_some_and(|k| WEBHOOK_UNHEALTHY.contains(&k)))
        .filter_map(|f| {
            let (at, end) = (f["at_ms"].as_u64()?, f["at_ms"].as_u64()? + f["for_ms"].as_u64()?);
            let carried = if f["kind"] == "slow_receiver" {
                let during = requests.iter().filter(|r| r["at_ms"].as_u64().is_some_and(|a| (at..end).contains(&a)));
                during.filter_map(|r| r["done_ms"].as_u64()).max().unwrap_or(end)
            } else {
                // Redis answers again when the stream takes its first event after the
                // fault: a restarted server rejoins its cluster, and the nodes' clients
                // reopen, before anything can be relayed (nemesis seed 6 on a Redis Cluster:
                // 2.4 s after the restart's end).
                logged.iter().map(|&(_, _, when)| when).find(|&when| when >= end).unwrap_or(end)
            };
            Some((at, end.max(carried)))
        })
        .collect();
    sick.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (a, b) in sick {
        match merged.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    // The healthy spells between them, up to the run's end.
    let mut healthy = Vec::new();
    let mut from = 0;
    for &(a, b) in &merged {
        if a > from {
            healthy.push((from, a));
        }
        from = from.max(b);
    }
    if duration > from {
        healthy.push((from, duration));
    }
    // When the receiver's position advanced, in order, and to where.
    let mut taken: Vec<(u64, (u64, u64))> = requests
        .iter()
        .filter(|r| r["answer"] == "taken")
        .filter_map(|r| Some((r["done_ms"].as_u64()?, id_key(r["last"].as_str()?)?)))
        .collect();
    taken.sort_unstable();
    let mut advances: Vec<(u64, (u64, u64))> = Vec::with_capacity(taken.len());
    for (done, last) in taken {
        if advances.last().is_none_or(|&(_, through)| last > through) {
            advances.push((done, last));
        }
    }
    for &(start, end) in &healthy {
        // The position at each advance in the spell, from the one it began with.
        let before = advances.partition_point(|&(done, _)| done <= start);
        let mut at = start;
        let mut through = before.checked_sub(1).map(|i| advances[i].1);
        let within = advances[before..].iter().take_while(|&&(done, _)| done <= end);
        for &(next, reached) in within.chain(std::iter::once(&(end, (u64::MAX, u64::MAX)))) {
            // The first event the receiver had not taken by `at`, pending from when it was
            // logged (or from `at`): the position must move within two turns of that.
            let first = logged.partition_point(|&(_, key, _)| through.is_some_and(|t| key <= t));
            if let Some(&(line, _, when)) = logged.get(first) {
                let pending = when.max(at);
                if pending + bound < next {
                    let moved =
                        if next == end { "not again in the spell".to_string() } else { format!("at {next} ms") };
                    let detail = format!(
                        "the receiver's position stayed at {} from {at} ms with event {} pending from {pending} ms; it moved {moved}, more than two turns ({bound} ms) later",
                        through.map_or("the start".to_string(), |(ms, n)| format!("{ms}-{n}")),
                        events[line]["id"],
                    );
                    verdict.violations.push(Violation { kind: "webhook_stalled", file: EVENTS, line, detail });
                    break;
                }
            }
            at = next;
            through = Some(through.map_or(reached, |t| t.max(reached)));
        }
    }
}

/// An event id `<ms>-<n>` as numbers (ids of `start` and `gap` entries are not: `None`).
fn id_key(id: &str) -> Option<(u64, u64)> {
    let (ms, n) = id.split_once('-')?;
    Some((ms.parse().ok()?, n.parse().ok()?))
}

/// Issue 49, promise 4: the webhook receiver's timeline. `events` are the events as the
/// receiver took them (`webhooks.jsonl`, each once, in the order taken) and `requests` its
/// request log (`webhook-requests.jsonl`). Every event is taken in stream order
/// (`webhook_out_of_order`); an event taken twice came again only as a retry of the same
/// batch, under the same `webhook-id` (`webhook_duplicate_under_new_id`); and no two
/// requests that were answered were open at once (`webhook_in_flight_twice`: one relay
/// sends one batch at a time, and a turn passes only once its holder's request ended).
/// Requests never answered, or given up on by their relay, are left out of the last check:
/// the receiver cannot tell when their relay let go.
pub fn check_webhook_timeline(verdict: &mut Verdict, events: &[Value], requests: &[Value]) {
    let mut last: Option<(u64, u64)> = None;
    for (line, event) in events.iter().enumerate() {
        let Some(key) = event["id"].as_str().and_then(id_key) else { continue };
        if let Some(before) = last.filter(|&before| key <= before) {
            let detail = format!("event {} taken after {}-{}", event["id"], before.0, before.1);
            verdict.violations.push(Violation { kind: "webhook_out_of_order", file: WEBHOOKS, line, detail });
        }
        last = Some(key);
    }
    let range = |r: &Value| Some((id_key(r["first"].as_str()?)?, id_key(r["last"].as_str()?)?));
    let taken: Vec<(usize, &Value)> = requests.iter().enumerate().filter(|(_, r)| r["answer"] == "taken").collect();
    for (i, &(line, a)) in taken.iter().enumerate() {
        let Some((a0, a1)) = range(a) else { continue };
        for &(_, b) in &taken[..i] {
            let Some((b0, b1)) = range(b) else { continue };
            if a0 <= b1 && b0 <= a1 && a["webhook_id"] != b["webhook_id"] {
                let detail = format!(
                    "batch {} took events batch {} had taken ({}..{})",
                    a["webhook_id"], b["webhook_id"], b["first"], b["last"]
                );
                let violation = Violation { kind: "webhook_duplicate_under_new_id", file: REQUESTS, line, detail };
                verdict.violations.push(violation);
                break;
            }
        }
    }
    let answered: Vec<(usize, u64, u64, &Value)> = requests
        .iter()
        .enumerate()
        .filter(|(_, r)| matches!(r["answer"].as_str(), Some("taken" | "error")))
        .filter_map(|(line, r)| Some((line, r["at_ms"].as_u64()?, r["done_ms"].as_u64()?, r)))
        .collect();
    for (i, &(line, at, done, r)) in answered.iter().enumerate() {
        if let Some(&(_, _, _, other)) = answered[..i].iter().find(|&&(_, o_at, o_done, _)| at < o_done && o_at < done)
        {
            let detail = format!("batch {} open at once with batch {}", r["webhook_id"], other["webhook_id"]);
            verdict.violations.push(Violation { kind: "webhook_in_flight_twice", file: REQUESTS, line, detail });
        }
    }
}

/// How soon after a WELCOME a SIGKILL of its node may take the login with it: the writer's
/// linger (2 ms) and a Redis round trip, with room for a batch already on its way.
pub const KILLED_BEFORE_ITS_BATCH_MS: u64 = 50;

/// How late after its scheduled moment (`at_ms`) a kill may land: the nemesis's timer, then
/// kill(2), on a machine the run keeps busy. A WELCOME read that late, on a connection that
/// then died without a BYE, was sent before the SIGKILL (nemesis seed 1 on a Redis Cluster
/// at `--max-devices 2`: read 1 ms after the kill's scheduled moment, its connection gone
/// 3 ms later with every other of that node's).
pub const KILL_LANDS_WITHIN_MS: u64 = 20;

/// The lines of `clients` whose sessions a kill may have taken before any batch carried
/// their login, each with the kill's moment: for each kill of a node, the sessions it
/// welcomed since its previous kill (its process's life) and before the kill landed, in the
/// order they were welcomed, from the last one back while the stream names none of them.
/// The writer sends its queue in order, so what a kill loses is such a suffix.
fn killed_backlogs(
    faults: &[Value],
    clients: &[Value],
    named: &std::collections::HashSet<&str>,
) -> std::collections::HashMap<usize, u64> {
    let mut lost = std::collections::HashMap::new();
    for kill in faults.iter().filter(|f| f["kind"] == "kill") {
        let (node, at) = (kill["target"].as_str().unwrap_or(""), kill["at_ms"].as_u64().unwrap_or(0));
        let since = faults
            .iter()
            .filter(|f| f["kind"] == "kill" && f["target"] == node)
            .filter_map(|f| f["at_ms"].as_u64())
            .filter(|&t| t < at)
            .max();
        let mut life: Vec<(u64, usize, &str)> = clients
            .iter()
            .enumerate()
            .filter(|(_, c)| c["node"] == node)
            .filter_map(|(line, c)| Some((c["from_ms"].as_u64()?, line, c["session"].as_str()?)))
            .filter(|&(from, _, _)| since.is_none_or(|t| from > t) && from <= at + KILL_LANDS_WITHIN_MS)
            .collect();
        life.sort_unstable();
        for &(_, line, session) in life.iter().rev() {
            if named.contains(session) {
                break;
            }
            lost.insert(line, at);
        }
    }
    lost
}

/// Whether something slowed `node`'s writes between a login at `from` and the kill at
/// `killed`: a fault on the node or on Redis (not the kill, not a clock step), or its
/// aftermath. Only then may a backlog outlast the moment after a WELCOME.
fn slowed(faults: &[Value], node: &str, from: u64, killed: u64, aftermath: u64) -> bool {
    faults.iter().any(|f| {
        let target = f["target"].as_str().unwrap_or("");
        let (at, lasts) = (f["at_ms"].as_u64().unwrap_or(0), f["for_ms"].as_u64().unwrap_or(0));
        let delay = f["delay_ms"].as_u64().unwrap_or(0);
        (target == node || target == "redis")
            && f["kind"] != "kill"
            && f["kind"] != "clock"
            && at <= killed
            && from <= at + lasts + delay + aftermath
    })
}

/// After a fault ends, how long its effects may still reach a node's sessions: a fenced node
/// logging back in, a lease running out, a last sweep.
fn aftermath_ms(settings: &Value) -> u64 {
    let timeout = settings["timeout_ms"].as_u64().unwrap_or(30_000);
    let lease = settings["node_lease_ms"].as_u64().unwrap_or(7_500);
    timeout + 2 * lease
}

/// The client-side checks: `clients` are `clients.jsonl`'s lines, `schedule` is
/// `schedule.json`. A pinging client's session lost (`"end": "lost"`) on a node that no fault
/// touched from its login to its end (a fault on the node itself or on Redis, and what
/// follows it for [`aftermath_ms`]; a wall-clock jump is not ill health: expiry never reads
/// the wall clock) is `session_lost_on_healthy_node`. A session a client was welcomed into
/// and the stream never named is `session_missing_from_events`, unless the stream reported a
/// gap.
pub fn check_clients(verdict: &mut Verdict, events: &[Value], clients: &[Value], schedule: &Value) {
    let faults = schedule["faults"].as_array().cloned().unwrap_or_default();
    for fault in &faults {
        if let Some(kind) = fault["kind"].as_str() {
            *verdict.faults.entry(kind.to_string()).or_default() += 1;
        }
    }
    let aftermath = aftermath_ms(&schedule["settings"]);
    let named: std::collections::HashSet<&str> = events.iter().filter_map(|e| e["session"].as_str()).collect();
    let gaps = events.iter().any(|e| e["type"] == "gap");
    let backlog = killed_backlogs(&faults, clients, &named);
    for (line, client) in clients.iter().enumerate() {
        let (Some(node), Some(session), Some(from), Some(to)) =
            (client["node"].as_str(), client["session"].as_str(), client["from_ms"].as_u64(), client["to_ms"].as_u64())
        else {
            verdict.violations.push(Violation {
                kind: "malformed_client_record",
                file: CLIENTS,
                line,
                detail: client.to_string(),
            });
            continue;
        };
        let touched = faults.iter().any(|f| {
            let target = f["target"].as_str().unwrap_or("");
            let (at, lasts) = (f["at_ms"].as_u64().unwrap_or(0), f["for_ms"].as_u64().unwrap_or(0));
            (target == node || target == "redis") && f["kind"] != "clock" && at <= to && from <= at + lasts + aftermath
        });
        // Every welcomed session, on any node under any fault, is in the stream unless a gap
        // was reported (issue 49: a fenced node's last logins were once exempt), or its node
        // was killed before the login's batch reached Redis: WELCOME does not wait for Redis
        // (docs/RELIABILITY.md says what that costs), so a SIGKILL takes the writer's backlog
        // with it. That is the node's last logins before the kill and nothing else: right
        // after their WELCOME, or (nemesis seed 11 on a Redis Cluster: killed 0.7 s after a
        // slow Redis let its writer fall 1.2 s behind) every login since the last batch that
        // landed, a suffix of what it welcomed. A login missing while a later one of its
        // node made it is a hole, whatever the fault. Counted, never silent.
        let lost = client["end"] == "lost";
        let killed_at_once = faults.iter().any(|f| {
            let at = f["at_ms"].as_u64().unwrap_or(0);
            let landed_by = if lost { at + KILL_LANDS_WITHIN_MS } else { at };
            f["kind"] == "kill" && f["target"] == node && from <= landed_by && at <= from + KILLED_BEFORE_ITS_BATCH_MS
        }) || backlog
            .get(&line)
            .is_some_and(|&killed| slowed(&faults, node, from, killed, aftermath));
        if !gaps && !named.contains(session) && killed_at_once {
            verdict.killed_before_batch += 1;
        } else if !gaps && !named.contains(session) {
            let under = if touched { ", a node a fault touched" } else { "" };
            verdict.violations.push(Violation {
                kind: "session_missing_from_events",
                file: CLIENTS,
                line,
                detail: format!(
                    "clients.jsonl line {}: session {session} on {node}{under} never in the stream",
                    line + 1
                ),
            });
        }
        if touched || client["pinging"] != true {
            continue;
        }
        verdict.kept += 1;
        if client["end"] == "lost" {
            verdict.violations.push(Violation {
                kind: "session_lost_on_healthy_node",
                file: CLIENTS,
                line,
                detail: format!(
                    "clients.jsonl line {}: uid {} lost session {session} on {node} ({}), no fault near it from {from} to {to} ms",
                    line + 1,
                    client["uid"],
                    client["detail"].as_str().unwrap_or("")
                ),
            });
        }
    }
}

/// Reads a JSON-lines file; a line that is not JSON is an error naming it.
fn read_lines(path: &Path) -> Result<Vec<Value>, String> {
    let text = fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| serde_json::from_str(l).map_err(|e| format!("{} line {}: {e}", path.display(), i + 1)))
        .collect()
}

/// `loadtest verdict`: judges the files, prints the verdict and the first violation with the
/// events around it; true when nothing was found.
pub fn run(args: &VerdictArgs) -> Result<bool, String> {
    let events = read_lines(&args.events)?;
    let presence = match &args.presence {
        Some(path) => read_lines(path)?,
        None => Vec::new(),
    };
    let mut verdict = check(&events, &presence, args.running);
    let schedule = match &args.schedule {
        Some(path) => {
            let text = fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?
        }
        None => Value::Null,
    };
    if let Some(path) = &args.clients {
        check_clients(&mut verdict, &events, &read_lines(path)?, &schedule);
    } else if let Some(faults) = schedule["faults"].as_array() {
        check_clients(&mut verdict, &events, &[], &json!({"faults": faults}));
    }
    let max_devices = args.max_devices.or(schedule["settings"]["max_devices"].as_u64().map(|n| n as usize));
    if let Some(max) = max_devices {
        check_bound(&mut verdict, EVENTS, &events, max);
    }
    if let Some(path) = &args.webhooks {
        let hooked_events = read_lines(path)?;
        let mut hooked = check(&hooked_events, &[], args.running);
        if let Some(max) = max_devices {
            check_bound(&mut hooked, WEBHOOKS, &hooked_events, max);
            verdict.superseded = verdict.superseded.max(hooked.superseded);
        }
        verdict.webhook_sessions = Some(hooked.sessions);
        verdict.violations.extend(hooked.violations.into_iter().map(|v| Violation { file: WEBHOOKS, ..v }));
        // The receiver's request log, beside its events.
        let log = path.with_file_name(REQUESTS);
        if log.exists() {
            let requests = read_lines(&log)?;
            check_webhook_timeline(&mut verdict, &hooked_events, &requests);
            if !args.running {
                check_webhook_progress(&mut verdict, &events, &requests, &schedule);
            }
        }
        verdict.violations.sort_by_key(|v| v.line);
    }
    let json = verdict.to_json();
    if let Some(out) = &args.out {
        fs::write(out, format!("{json:#}\n")).map_err(|e| format!("{}: {e}", out.display()))?;
    }
    println!("{json}");
    if let Some(first) = verdict.violations.first() {
        if let Some(seed) = schedule["seed"].as_u64() {
            eprintln!("seed {seed}");
        }
        eprintln!("first violation: {} at {} line {}: {}", first.kind, first.file, first.line + 1, first.detail);
        let shown = if first.file == EVENTS { 7 } else { 0 };
        if first.file == WEBHOOKS {
            eprintln!("(in the webhooks' events)");
        }
        let from = first.line.saturating_sub(3);
        for (i, event) in events.iter().enumerate().skip(from).take(shown) {
            eprintln!("{}{:>6}  {event}", if i == first.line { ">" } else { " " }, i + 1);
        }
    }
    Ok(verdict.ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(lines: &[&str]) -> Vec<Value> {
        lines
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let mut v: Value = serde_json::from_str(l).unwrap();
                v["id"] = format!("1-{i}").into();
                v
            })
            .collect()
    }

    fn kinds(verdict: &Verdict) -> Vec<&'static str> {
        verdict.violations.iter().map(|v| v.kind).collect()
    }

    #[test]
    fn a_kept_stream_is_ok() {
        let events = stream(&[
            r#"{"type":"online","uid":1,"session":"a"}"#,
            r#"{"type":"user_online","uid":1}"#,
            r#"{"type":"online","uid":1,"session":"b"}"#,
            r#"{"type":"offline","uid":1,"session":"a","reason":"kicked"}"#,
            r#"{"type":"offline","uid":1,"session":"b","reason":"idle_timeout"}"#,
            r#"{"type":"user_offline","uid":1,"reason":"idle_timeout"}"#,
        ]);
        let verdict = check(&events, &[], false);
        assert!(verdict.ok(), "{:?}", verdict.violations);
        assert_eq!((verdict.sessions, verdict.gaps), (2, 0));
    }

    #[test]
    fn each_broken_promise_is_named() {
        let events = stream(&[
            r#"{"type":"online","uid":1,"session":"a"}"#,
            r#"{"type":"user_online","uid":1}"#,
            r#"{"type":"user_offline","uid":1,"reason":"logout"}"#,
            r#"{"type":"offline","uid":1,"session":"a","reason":"logout"}"#,
            r#"{"type":"offline","uid":1,"session":"a","reason":"logout"}"#,
            r#"{"type":"online","uid":2,"session":"a"}"#,
            r#"{"type":"offline","uid":3,"session":"z","reason":"logout"}"#,
            r#"{"type":"user_offline","uid":4,"reason":"logout"}"#,
            r#"{"type":"online","uid":5,"session":"c"}"#,
        ]);
        let verdict = check(&events, &[], false);
        assert_eq!(
            kinds(&verdict),
            [
                "user_offline_with_live_session",
                "offline_twice",
                "session_reused",
                "offline_without_online",
                "user_events_out_of_order",
                "online_without_offline"
            ]
        );
        // A stream cut while running leaves open sessions alone.
        assert!(!kinds(&check(&events, &[], true)).contains(&"online_without_offline"));
    }

    #[test]
    fn a_loss_is_accepted_only_inside_a_reported_gap() {
        let events = stream(&[
            r#"{"type":"online","uid":1,"session":"a"}"#,
            r#"{"type":"gap","missed":3}"#,
            r#"{"type":"offline","uid":2,"session":"b","reason":"node_lost"}"#,
            r#"{"type":"user_offline","uid":2,"reason":"node_lost"}"#,
        ]);
        let verdict = check(&events, &[], false);
        assert!(verdict.ok(), "{:?}", verdict.violations);
        assert_eq!(verdict.gaps, 1);
        // A session announced again after a gap (Redis lost it) is the same session, still
        // owed one offline; announced again after its offline, it is not.
        let again = stream(&[
            r#"{"type":"online","uid":1,"session":"a"}"#,
            r#"{"type":"gap","missed":null,"earlier_stream":true}"#,
            r#"{"type":"online","uid":1,"session":"a"}"#,
            r#"{"type":"offline","uid":1,"session":"a","reason":"logout"}"#,
            r#"{"type":"online","uid":1,"session":"a"}"#,
            r#"{"type":"offline","uid":1,"session":"a","reason":"kicked"}"#,
        ]);
        assert_eq!(kinds(&check(&again[..4], &[], false)), Vec::<&str>::new());
        assert_eq!(kinds(&check(&again, &[], false)), ["session_reused", "offline_twice"]);
        // Ended, then a new history (`earlier_stream`) that announces it again: its end was
        // lost with the old history, and the new one owes its own. After a gap that only
        // counts missed events, it is reused.
        let history = |gap: &str| {
            stream(&[
                r#"{"type":"online","uid":1,"session":"a"}"#,
                r#"{"type":"offline","uid":1,"session":"a","reason":"kicked"}"#,
                gap,
                r#"{"type":"online","uid":1,"session":"a"}"#,
                r#"{"type":"offline","uid":1,"session":"a","reason":"kicked"}"#,
            ])
        };
        let new_history = history(r#"{"type":"gap","missed":null,"earlier_stream":true}"#);
        assert_eq!(kinds(&check(&new_history, &[], false)), Vec::<&str>::new());
        let trimmed = history(r#"{"type":"gap","missed":2}"#);
        assert_eq!(kinds(&check(&trimmed, &[], false)), ["session_reused", "offline_twice"]);
        // Without the gap, both holes are violations.
        let mut holes = events.clone();
        holes.remove(1);
        assert_eq!(
            kinds(&check(&holes, &[], false)),
            ["online_without_offline", "offline_without_online", "user_events_out_of_order"]
        );
    }

    #[test]
    fn a_uids_user_events_never_go_back_in_time() {
        let events = stream(&[
            r#"{"type":"online","uid":1,"session":"a","at_ms":100}"#,
            r#"{"type":"user_online","uid":1,"at_ms":100}"#,
            r#"{"type":"offline","uid":1,"session":"a","at_ms":200}"#,
            r#"{"type":"user_offline","uid":1,"at_ms":2200}"#,
            r#"{"type":"online","uid":1,"session":"b","at_ms":600}"#,
            r#"{"type":"user_online","uid":1,"at_ms":600}"#,
            r#"{"type":"offline","uid":1,"session":"b","at_ms":700}"#,
            r#"{"type":"user_offline","uid":1,"at_ms":2700}"#,
        ]);
        // The online at 600 came after a user event at 2200: stamped before it, too.
        assert_eq!(kinds(&check(&events, &[], false)), ["session_event_back_in_time", "user_event_back_in_time"]);
    }

    #[test]
    fn webhooks_are_held_to_progress_within_two_turns_while_healthy() {
        // The run's clock starts at unix ms 1,000,000; a turn is 1 s (the backoff), two are 2 s.
        let schedule = serde_json::json!({
            "settings": {"node_lease_ms": 1000, "webhook_max_backoff_ms": 1000, "duration_ms": 60_000},
            "faults": [
                {"kind": "slow_receiver", "at_ms": 10_000, "for_ms": 5_000},
                {"kind": "kill", "target": "n1", "at_ms": 30_000, "for_ms": 2_000},
            ]
        });
        let event = |ms: u64, n: u64| serde_json::json!({"id": format!("{}-{n}", 1_000_000 + ms), "type": "online", "uid": 1, "session": "a"});
        let taken = |at: u64, done: u64, last: &serde_json::Value| {
            let last = last["id"].as_str().unwrap();
            serde_json::json!({"at_ms": at, "done_ms": done, "done_unix_ms": 1_000_000 + done, "webhook_id": last, "first": last, "last": last, "answer": "taken"})
        };
        let judge = |events: &[Value], requests: &[Value]| {
            let mut verdict = Verdict::default();
            check_webhook_progress(&mut verdict, events, requests, &schedule);
            kinds(&verdict)
        };
        let (a, b, c, d) = (event(1_000, 1), event(9_000, 2), event(20_000, 3), event(31_000, 4));
        // Each taken in time; b, logged as the receiver fell ill, taken 2 s after it healed,
        // the request it was held in having ended at 16 s; d taken across a node's kill.
        let on_time = [
            taken(1_000, 2_900, &a),
            serde_json::json!({"at_ms": 14_000, "done_ms": 16_000, "done_unix_ms": 1_016_000, "answer": "never"}),
            taken(17_000, 17_900, &b),
            taken(20_000, 21_000, &c),
            taken(32_000, 32_900, &d),
        ];
        let all = [a.clone(), b.clone(), c.clone(), d.clone()];
        assert!(judge(&all, &on_time).is_empty(), "{:?}", judge(&all, &on_time));
        // c taken 2.5 s after it was logged, the receiver healthy: stalled (once a spell).
        let late = [taken(1_000, 2_900, &a), taken(17_000, 17_900, &b), taken(22_000, 22_500, &c)];
        assert_eq!(judge(&all, &late), ["webhook_stalled"]);
        // d never taken.
        let never = [taken(1_000, 2_900, &a), taken(17_000, 17_900, &b), taken(20_000, 21_000, &c)];
        assert_eq!(judge(&all, &never), ["webhook_stalled"]);
        // Redis restarted at 40 s for 1 s; the stream took nothing until 44 s: the relay is
        // held to two turns from then, not from the restart's end.
        let redis_schedule = serde_json::json!({
            "settings": {"node_lease_ms": 1000, "webhook_max_backoff_ms": 1000, "duration_ms": 60_000},
            "faults": [{"kind": "redis_restart", "target": "redis", "at_ms": 40_000, "for_ms": 1_000}],
        });
        let (e, f) = (event(39_900, 5), event(44_000, 6));
        let slow_back = [taken(1_000, 2_900, &a), taken(44_500, 45_500, &e), taken(44_600, 45_600, &f)];
        let mut verdict = Verdict::default();
        check_webhook_progress(&mut verdict, &[a.clone(), e.clone(), f.clone()], &slow_back, &redis_schedule);
        assert!(verdict.ok(), "{:?}", verdict.violations);
        // b taken 2 s after the receiver healed, as the request the spell had received ended.
        let slow =
            [taken(1_000, 2_900, &a), taken(17_000, 18_100, &b), taken(20_000, 21_000, &c), taken(31_000, 32_000, &d)];
        assert_eq!(judge(&all, &slow), ["webhook_stalled"]);
    }

    #[test]
    fn the_webhook_timeline_is_judged() {
        let events = stream(&[r#"{"type":"online","uid":1,"session":"a"}"#]);
        let mut events = events;
        events.push(serde_json::json!({"id": "5-1", "type": "user_online", "uid": 1}));
        events.push(serde_json::json!({"id": "4-9", "type": "offline", "uid": 1, "session": "a"}));
        let request = |at: u64, done: u64, id: &str, first: &str, last: &str, answer: &str| serde_json::json!({"at_ms": at, "done_ms": done, "webhook_id": id, "first": first, "last": last, "answer": answer});
        let requests = [
            request(0, 10, "1-0", "1-0", "1-0", "taken"),
            // A retry of the same batch: fine.
            request(20, 30, "1-0", "1-0", "1-0", "taken"),
            // Its events again under another id, and open while another was answered.
            request(40, 60, "5-1", "1-0", "5-1", "taken"),
            request(50, 70, "6-1", "6-1", "6-1", "error"),
            // Given up on by its relay: its end says nothing.
            request(55, 900, "7-1", "7-1", "7-1", "dropped"),
        ];
        let mut verdict = Verdict::default();
        check_webhook_timeline(&mut verdict, &events, &requests);
        assert_eq!(
            kinds(&verdict),
            ["webhook_out_of_order", "webhook_duplicate_under_new_id", "webhook_in_flight_twice"]
        );
    }

    #[test]
    fn the_device_bound_holds_in_stream_order_but_for_superseded_logins() {
        let events = stream(&[
            r#"{"type":"online","uid":1,"session":"a","device":"phone"}"#,
            r#"{"type":"online","uid":1,"session":"b","device":"desk"}"#,
            // A login of the phone elsewhere, logged before the first phone's offline.
            r#"{"type":"online","uid":1,"session":"c","device":"phone"}"#,
            r#"{"type":"offline","uid":1,"session":"a","reason":"idle_timeout"}"#,
            // Logged after the login that replaced it, and saying so: left out.
            r#"{"type":"online","uid":1,"session":"d","device":"desk","superseded":true}"#,
            r#"{"type":"offline","uid":1,"session":"d","reason":"kicked"}"#,
            r#"{"type":"online","uid":1,"session":"e","device":"tablet"}"#,
        ]);
        let mut verdict = Verdict::default();
        check_bound(&mut verdict, EVENTS, &events, 2);
        assert_eq!(kinds(&verdict), ["device_online_twice", "over_max_devices", "over_max_devices"]);
        assert_eq!(verdict.superseded, 1);
        let mut roomy = Verdict::default();
        check_bound(&mut roomy, EVENTS, &events, 3);
        assert_eq!(kinds(&roomy), ["device_online_twice"]);
    }

    #[test]
    fn presence_after_the_offline_is_a_violation() {
        let events = stream(&[
            r#"{"type":"online","uid":1,"session":"a"}"#,
            r#"{"type":"offline","uid":1,"session":"a","reason":"logout"}"#,
        ]);
        let before = json!({"uid": 1, "seen": "1-0", "sessions": ["a"]});
        assert!(check(&events, &[before], false).ok());
        let after = json!({"uid": 1, "seen": "1-1", "sessions": ["a"]});
        assert_eq!(kinds(&check(&events, &[after], false)), ["presence_after_offline"]);
    }

    #[test]
    fn the_clients_checks_hold_pinging_clients_on_untouched_nodes() {
        let events = stream(&[
            r#"{"type":"online","uid":1,"session":"a"}"#,
            r#"{"type":"offline","uid":1,"session":"a","reason":"shutdown"}"#,
        ]);
        let schedule = json!({
            "faults": [{"kind": "stall", "target": "n2", "at_ms": 1_000, "for_ms": 500}],
            "settings": {"timeout_ms": 3_000, "node_lease_ms": 1_000},
        });
        let client = |node: &str, session: &str, end: &str| {
            json!({"uid": 1, "node": node, "session": session, "from_ms": 2_000, "to_ms": 3_000,
                   "pinging": true, "end": end, "detail": "BYE(shutdown)"})
        };
        let judged = |clients: &[Value]| {
            let mut verdict = check(&events, &[], false);
            check_clients(&mut verdict, &events, clients, &schedule);
            verdict
        };
        // Lost on n1, which no fault touched: a violation; on n2, within the stall's
        // aftermath: not judged.
        assert_eq!(kinds(&judged(&[client("n1", "a", "lost")])), ["session_lost_on_healthy_node"]);
        let touched = judged(&[client("n2", "a", "lost")]);
        assert!(touched.ok() && touched.kept == 0, "{:?}", touched.violations);
        assert_eq!(touched.faults.get("stall"), Some(&1));
        // A welcomed session the stream never named: a violation on n1, and on n2 under its
        // fault too.
        assert_eq!(kinds(&judged(&[client("n1", "x", "logout")])), ["session_missing_from_events"]);
        assert_eq!(kinds(&judged(&[client("n2", "x", "logout")])), ["session_missing_from_events"]);
        // Unless its node was killed right after its WELCOME: counted, not a violation; a
        // kill later than that is no excuse.
        let killed = |at_ms: u64| {
            let schedule = json!({
                "faults": [{"kind": "kill", "target": "n2", "at_ms": at_ms, "for_ms": 500}],
                "settings": {"timeout_ms": 3_000, "node_lease_ms": 1_000},
            });
            let mut verdict = check(&events, &[], false);
            check_clients(&mut verdict, &events, &[client("n2", "x", "lost")], &schedule);
            verdict
        };
        let at_once = killed(2_002);
        assert!(at_once.ok() && at_once.killed_before_batch == 1, "{:?}", at_once.violations);
        assert_eq!(kinds(&killed(2_000 + KILLED_BEFORE_ITS_BATCH_MS + 1)), ["session_missing_from_events"]);
        // Welcomed just after the kill's scheduled moment, before it landed, the connection
        // then lost: the same; welcomed later than a kill can take to land is no excuse.
        let landing = killed(1_999);
        assert!(landing.ok() && landing.killed_before_batch == 1, "{:?}", landing.violations);
        assert_eq!(kinds(&killed(2_000 - KILL_LANDS_WITHIN_MS - 1)), ["session_missing_from_events"]);
    }

    /// Nemesis seed 11 on a Redis Cluster at `--max-devices 2`: a slow Redis (1.2 s a
    /// call) let n2's writer fall behind, and n2 was killed 0.7 s after it recovered; the
    /// 35 logins it had welcomed in the 1.2 s since its last batch landed never reached the
    /// stream. Those, a suffix of what n2 welcomed, are what the kill took; a login missing
    /// before one that made it is still a hole.
    #[test]
    fn nemesis_cluster_seed_11_a_kill_takes_the_writer_s_backlog_and_nothing_before_it() {
        let events = stream(&[
            r#"{"type":"online","uid":1,"session":"early"}"#,
            r#"{"type":"online","uid":2,"session":"landed"}"#,
            r#"{"type":"offline","uid":1,"session":"early","reason":"node_lost"}"#,
            r#"{"type":"offline","uid":2,"session":"landed","reason":"node_lost"}"#,
        ]);
        let schedule = json!({
            "faults": [
                {"kind": "slow_redis", "target": "redis", "at_ms": 94_597, "for_ms": 4_963, "delay_ms": 1_211},
                {"kind": "kill", "target": "n2", "at_ms": 100_270, "for_ms": 1_756},
            ],
            "settings": {"timeout_ms": 3_000, "node_lease_ms": 1_000},
        });
        let client = |session: &str, from_ms: u64| {
            json!({"uid": 3, "node": "n2", "session": session, "from_ms": from_ms, "to_ms": 100_274,
                   "pinging": true, "end": "lost", "detail": "the connection closed without a BYE"})
        };
        let judged = |clients: &[Value]| {
            let mut verdict = check(&events, &[], false);
            check_clients(&mut verdict, &events, clients, &schedule);
            verdict
        };
        // Welcomed 1.2 s and 0.6 s before the kill, after the last login that landed.
        let backlog =
            judged(&[client("early", 90_000), client("landed", 99_029), client("a", 99_221), client("b", 99_700)]);
        assert!(backlog.ok() && backlog.killed_before_batch == 2, "{:?}", backlog.violations);
        // Missing before one that landed: a hole, not the backlog.
        let hole = judged(&[client("a", 98_000), client("landed", 99_029), client("b", 99_700)]);
        assert_eq!(kinds(&hole), ["session_missing_from_events"]);
        assert_eq!(hole.killed_before_batch, 1);
        // With nothing slowing n2's writes, a backlog is no longer than the moment after a
        // WELCOME: a login 0.5 s before the kill that never landed is a hole.
        let healthy = json!({
            "faults": [{"kind": "kill", "target": "n2", "at_ms": 100_270, "for_ms": 1_756}],
            "settings": {"timeout_ms": 3_000, "node_lease_ms": 1_000},
        });
        let mut verdict = check(&events, &[], false);
        check_clients(&mut verdict, &events, &[client("landed", 99_029), client("b", 99_700)], &healthy);
        assert_eq!(kinds(&verdict), ["session_missing_from_events"]);
        // Welcomed by a process before an earlier kill: that kill's, judged by it alone.
        let restarted = json!({
            "faults": [
                {"kind": "slow_redis", "target": "redis", "at_ms": 38_000, "for_ms": 1_000, "delay_ms": 1_000},
                {"kind": "kill", "target": "n2", "at_ms": 50_000, "for_ms": 1_000},
                {"kind": "kill", "target": "n2", "at_ms": 100_270, "for_ms": 1_756},
            ],
            "settings": {"timeout_ms": 3_000, "node_lease_ms": 1_000},
        });
        let mut verdict = check(&events, &[], false);
        check_clients(&mut verdict, &events, &[client("old", 40_000), client("landed", 99_029)], &restarted);
        assert!(verdict.ok() && verdict.killed_before_batch == 1, "{:?}", verdict.violations);
    }
}

//! A checker of the event stream's promises that knows nothing of the gateway: it reads the
//! events as a backend sees them (kind, uid, session, reason or node) and replays them
//! against a model of what README.md and docs/RELIABILITY.md promise.
//!
//! - every `online` has exactly one `offline` of the same session after it, and no
//!   `offline` ends a session that was never online;
//! - a uid never has more sessions online than `--max-devices`, leaving out the sessions
//!   whose `online` says it was superseded (a login elsewhere had taken its place before it
//!   reached the stream, docs/API.md): named [`OVERLAP`];
//! - user events alternate per uid, `user_online` first, and agree with the session
//!   events: `user_online` follows the `online` that took the uid from no session to one,
//!   `user_offline` follows the `offline` that left it none, and a takeover (an `offline`
//!   followed at once by the `online` of the uid's next session) is neither. With an
//!   offline grace ([`violations_with_grace`]) the `user_offline` comes later, or never when
//!   the uid logs in again within it: only the alternation and "no `user_offline` while a
//!   session is online" are checked then.
//!
//! Each violation names the events of its uid around it.

use std::collections::{HashMap, HashSet};

use super::redis::StreamEvent;

/// How a violation of the device bound starts.
pub const OVERLAP: &str = "over --max-devices";

/// Events of the uid shown on either side of a violation.
const CONTEXT: usize = 6;

/// Every violation of the promises above in `events`, each with the uid's events around it.
/// `quiesced`: every client has gone and every ending was logged, so every session must
/// have ended and every uid must be offline as a user.
pub fn violations(events: &[StreamEvent], max_devices: usize, quiesced: bool) -> Vec<String> {
    check(events, max_devices, quiesced, false)
}

/// The same under `--offline-grace`: a uid's `user_offline` need not follow its last
/// `offline` at once.
pub fn violations_with_grace(events: &[StreamEvent], max_devices: usize, quiesced: bool) -> Vec<String> {
    check(events, max_devices, quiesced, true)
}

fn check(events: &[StreamEvent], max_devices: usize, quiesced: bool, grace: bool) -> Vec<String> {
    let mut by_uid: HashMap<u64, Vec<&StreamEvent>> = HashMap::new();
    for e in events {
        if ["online", "offline", "user_online", "user_offline"].contains(&e.kind.as_str()) {
            by_uid.entry(e.uid).or_default().push(e);
        }
    }
    let mut found = Vec::new();
    let mut uids: Vec<_> = by_uid.keys().copied().collect();
    uids.sort_unstable();
    for uid in uids {
        let history = &by_uid[&uid];
        for (at, what) in check_uid(history, max_devices, quiesced, grace) {
            let from = at.saturating_sub(CONTEXT);
            let to = (at + CONTEXT + 1).min(history.len());
            let around: Vec<String> = (from..to)
                .map(|i| {
                    let e = history[i];
                    let mark = if i == at { ">>" } else { "  " };
                    format!("{mark} {} {} s={} {}", e.id, e.kind, e.session, e.detail)
                })
                .collect();
            found.push(format!("uid {uid}: {what}\n{}", around.join("\n")));
        }
    }
    found
}

/// The violations in one uid's history, by the index of the event that shows each.
fn check_uid(history: &[&StreamEvent], max_devices: usize, quiesced: bool, grace: bool) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    let mut online: HashSet<&str> = HashSet::new();
    let mut superseded: HashSet<&str> = HashSet::new();
    let mut ended: HashSet<&str> = HashSet::new();
    let mut user_online = false;
    for (i, e) in history.iter().enumerate() {
        let next = history.get(i + 1).map(|n| n.kind.as_str());
        match e.kind.as_str() {
            "online" => {
                if ended.contains(e.session.as_str()) || !online.insert(&e.session) {
                    found.push((i, format!("session {} online twice", e.session)));
                }
                if e.superseded {
                    superseded.insert(&e.session);
                }
                let bounded = online.iter().filter(|s| !superseded.contains(*s)).count();
                if bounded > max_devices {
                    found.push((i, format!("{OVERLAP}: {bounded} sessions online at once")));
                }
                // The uid's first session: its user_online must follow, unless the uid is
                // still online as a user (a takeover: checked at the offline before it).
                if online.len() == 1 && !user_online && next != Some("user_online") {
                    found.push((i, "the uid's first session, and no user_online follows".into()));
                }
            }
            "offline" => {
                if !online.remove(e.session.as_str()) {
                    found.push((i, format!("offline of session {} that is not online", e.session)));
                }
                ended.insert(&e.session);
                // The uid's last session: user_offline follows, unless the next session of
                // the uid comes online at once (a takeover).
                if !grace && online.is_empty() && user_online && !matches!(next, Some("user_offline") | Some("online"))
                {
                    found.push((i, "the uid's last session ended, and no user_offline follows".into()));
                }
            }
            "user_online" => {
                if user_online {
                    found.push((i, "user_online while online as a user".into()));
                }
                if online.is_empty() {
                    found.push((i, "user_online with no session online".into()));
                }
                user_online = true;
            }
            "user_offline" => {
                if !user_online {
                    found.push((i, "user_offline while offline as a user".into()));
                }
                if !online.is_empty() {
                    found.push((i, format!("user_offline with {} sessions online", online.len())));
                }
                user_online = false;
            }
            _ => {}
        }
    }
    if quiesced {
        if !online.is_empty() {
            let at = history.len().saturating_sub(1);
            found.push((at, format!("sessions {online:?} never ended")));
        }
        if user_online {
            found.push((history.len().saturating_sub(1), "online as a user at the end".into()));
        }
    }
    found
}

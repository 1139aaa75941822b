//! What the cluster keeps in Redis, and how its keys and values are spelled.
//!
//! Two kinds of keys:
//! - a route per uid, `idlegate:route:<uid>`, spread over a Redis Cluster's slots: the
//!   per-uid part, read by every presence question;
//! - the control keys, all under the hash tag `{idlegate}` so they share one slot and one
//!   script can change several of them atomically: the members set, a lease, a session
//!   hash and an inbox per member, and the event stream; among them `{idlegate}:user_at`,
//!   each uid's last user-event stamp, the floor of its session events' (kept and pruned by
//!   the scripts alone).
//!
//! A member is one run of one node, `<node>#<incarnation>`: a node restarted under the same
//! `--node-id` is a new member, so routes its previous run left behind never look online.
//! A route is a hash per uid, one field per device (empty for the default device), each
//! `<member>|<session>|<since_ms>|<replaced>`, where `replaced` is
//! `<member>|<session>|<device>` of the session this login took the place of (or empty),
//! kept so a retried login still knows whom it kicked. A member's session hash names a
//! session by [`session_field`]: the uid, then `/device` for a named device.

/// The event stream every node appends to and every `/v1/events` reads.
pub(crate) const EVENTS: &str = "{idlegate}:events";

/// Hash holding the last event id's parts (`ms`, `n`): ids are `<ms>-<n>` with `n` counting
/// every event the cluster ever logged, so a consumer's gap is exact.
pub(crate) const EVENTS_LAST: &str = "{idlegate}:events:last";

/// Hash uid -> sessions it holds across every member: what decides its `user_online` and
/// `user_offline`, in the same script as the session events.
pub(crate) const USERS: &str = "{idlegate}:users";

/// Hash uid -> its status (issue 52) while it is online as a user (`APPLY`, `PRESENCE_OF`).
pub(crate) const STATUS: &str = "{idlegate}:status";

/// Sorted set uid -> the stamp of its last user event, kept an hour: the floor of its
/// session events' stamps, and a snapshot's `at_ms` (`PRESENCE_OF`).
pub(crate) const USER_AT: &str = "{idlegate}:user_at";

/// Sorted set uid -> when its offline grace ends (Redis's unix ms): uids with no session
/// whose `user_offline` waits (`--offline-grace`).
pub(crate) const GRACE: &str = "{idlegate}:grace";

/// When a uid was last online (the end of its last session, unix ms), a key per uid with
/// `--last-seen-ttl`: written by the node whose script took the uid offline (`user_gone`
/// lists it), outside the control slot, so a service's monthly users spread over every
/// shard instead of filling the one that carries every script.
pub(crate) fn last_seen(uid: u64) -> String {
    format!("idlegate:seen:{uid}")
}

/// The uids a user's sessions may watch under `--watch-policy listed`, as its backend put
/// them (a set), under a key per user: spread over a Redis Cluster's shards, off the
/// control slot, which carries every login.
pub(crate) fn watch_list(uid: u64) -> String {
    format!("idlegate:watchlist:{uid}")
}

/// Hash uid -> `<reason>|<ended_ms>` of each uid in [`GRACE`]: what its `user_offline` says.
pub(crate) const GRACE_WHY: &str = "{idlegate}:grace:why";

/// The member whose turn it is to relay the shared stream to the webhook, with a TTL.
pub(crate) const RELAY_TURN: &str = "{idlegate}:webhook:turn";

/// The id of the last event the webhook's receiver acknowledged.
pub(crate) const RELAY_ACKED: &str = "{idlegate}:webhook:acked";

/// The last event id of the batch the relay has in flight past the acknowledged position:
/// the next relay sends that batch first, whole and under the same `webhook-id`.
pub(crate) const RELAY_SENDING: &str = "{idlegate}:webhook:sending";

/// Set of members that have announced themselves and not yet left or been reaped.
pub(crate) const MEMBERS: &str = "{idlegate}:members";

/// Hash `url`, `document`, `fetched_ms`: the JWKS document a node fetched last by URL
/// (`--jwt-jwks-url`), which every node may take instead of fetching it again. Outside the
/// control slot: up to 1 MiB that no login's script needs.
pub(crate) const JWKS: &str = "idlegate:jwks";

/// Present while an unknown `kid`'s refetch of the JWKS document was taken by a node, for
/// `--jwt-jwks-min-interval`: one such fetch per interval, cluster-wide.
pub(crate) const JWKS_REFETCH: &str = "idlegate:jwks:refetch";

/// The route of `uid`.
pub(crate) fn route(uid: u64) -> String {
    format!("idlegate:route:{uid}")
}

/// The lease of `member`: present while the member lives.
pub(crate) fn lease(member: &str) -> String {
    format!("{{idlegate}}:lease:{member}")
}

/// Hash [`session_field`] -> session id (hex) of the sessions `member` holds: the truth a
/// reaper reads, and the guard that makes every session event exactly-once.
pub(crate) fn sessions(member: &str) -> String {
    format!("{{idlegate}}:sessions:{member}")
}

/// The last batch of `member` applied, so a retried batch is not applied twice.
pub(crate) fn applied(member: &str) -> String {
    format!("{{idlegate}}:applied:{member}")
}

/// What the member's last applied batch dropped (`APPLY` keeps it for a retry's answer).
pub(crate) fn applied_dropped(member: &str) -> String {
    format!("{}:dropped", applied(member))
}

/// The stream epoch in which `member`'s session hash was last known current (its first
/// batch, or its reconcile after Redis lost writes). `APPLY` lets another member's login log
/// the end of one of its sessions only while it names the stream's epoch.
pub(crate) fn verified(member: &str) -> String {
    format!("{}:verified", applied(member))
}

/// The stream other nodes send `member` requests and replies on.
pub(crate) fn inbox(member: &str) -> String {
    format!("{{idlegate}}:inbox:{member}")
}

/// Held by the one node reaping `member`.
pub(crate) fn reaping(member: &str) -> String {
    format!("{{idlegate}}:reaping:{member}")
}

/// Set once `member` was reaped, so a member that was only cut off learns it on return.
pub(crate) fn reaped(member: &str) -> String {
    format!("{{idlegate}}:reaped:{member}")
}

/// Hash of `member`'s sessions the reaper has logged `node_lost` but whose routes it has
/// not yet deleted: a reaper that dies half way leaves them here for the next one.
/// The claims of a member's sessions (`--jwt-claims-to-events`), by session field
/// (`scripts.rs`, `take_claims`).
pub(crate) fn claims(member: &str) -> String {
    format!("{{idlegate}}:claims:{member}")
}

/// The wills of a member's MQTT sessions, by session field (`scripts.rs`, `take_will`).
pub(crate) fn wills(member: &str) -> String {
    format!("{{idlegate}}:wills:{member}")
}

pub(crate) fn unroute(member: &str) -> String {
    format!("{{idlegate}}:unroute:{member}")
}

/// Hash session field -> the newest of `member`'s sessions there that a login elsewhere
/// replaced before it was announced: the `online` of each login up to it says so
/// (`superseded`), as it comes after the replacing login's (`scripts.rs`, `APPLY`).
pub(crate) fn superseded(member: &str) -> String {
    format!("{{idlegate}}:superseded:{member}")
}

/// A stream epoch as the scripts answer it (a decimal string, empty before the first
/// event); 0 for none.
pub(crate) fn epoch_of(value: &redis::Value) -> u64 {
    match value {
        redis::Value::BulkString(b) => std::str::from_utf8(b).ok().and_then(|t| t.parse().ok()).unwrap_or(0),
        redis::Value::Int(n) => (*n).max(0) as u64,
        _ => 0,
    }
}

/// A member name for a new run of `node`.
pub(crate) fn new_member(node: &str) -> String {
    format!("{node}#{:08x}", rand_u32())
}

/// The node a member runs as.
pub(crate) fn node_of(member: &str) -> &str {
    member.rsplit_once('#').map_or(member, |(node, _)| node)
}

/// A session's field in its member's session hash: the uid, then `/device` for a named
/// device, so a uid's devices on one member are fields of their own and a uid with the
/// default device costs what it did before devices.
pub(crate) fn session_field(uid: u64, device: &crate::proto::Device) -> String {
    if device.is_default() {
        uid.to_string()
    } else {
        format!("{uid}/{device}")
    }
}

/// The uid and device a session field names.
pub(crate) fn parse_field(field: &str) -> Option<(u64, crate::proto::Device)> {
    let (uid, device) = field.split_once('/').unwrap_or((field, ""));
    Some((uid.parse().ok()?, device.parse().ok()?))
}

/// A session id as the control keys spell it: as the events and WELCOME do.
pub(crate) use crate::presence::session_hex;

/// The owner part of a route value, `<member>|<session>|`: what a compare-and-delete
/// matches.
pub(crate) fn owner_prefix(member: &str, session: &str) -> String {
    format!("{member}|{session}|")
}

/// How an ended route's last part begins (`scripts.rs`, `ROUTE_END`).
const ENDED_MARK: char = '#';

/// A route read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Route {
    pub member: String,
    pub session: String,
    pub since_ms: u64,
    /// Its session ended and the `offline` is on its way (`ROUTE_END`'s mark): the uid is
    /// not online there, but a login replacing it logs that end first.
    pub ended: bool,
}

// === impl Route ===

impl Route {
    /// Parses `<member>|<session>|<since_ms>|<replaced>`; `None` for anything else.
    pub(crate) fn parse(value: &str) -> Option<Route> {
        let mut parts = value.splitn(4, '|');
        let member = parts.next()?.to_string();
        let session = parts.next()?.to_string();
        let since_ms = parts.next()?.parse().ok()?;
        if member.is_empty() || session.is_empty() {
            return None;
        }
        let ended = parts.next().is_some_and(|replaced| replaced.starts_with(ENDED_MARK));
        Some(Route { member, session, since_ms, ended })
    }
}

/// Random bits for incarnations and request ids: distinct per run, not secret.
pub(crate) fn rand_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::hash::RandomState::new().build_hasher();
    h.write_u64(crate::presence::unix_ms_now());
    h.finish() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_parse_and_control_keys_share_one_slot() {
        let r = Route::parse("a#1|00ff|17|b#2|0001").unwrap();
        assert_eq!(r, Route { member: "a#1".into(), session: "00ff".into(), since_ms: 17, ended: false });
        assert!(Route::parse("a#1|00ff|17|#timeout|20|0\nb#2|0001").unwrap().ended);
        assert!(Route::parse("a#1|00ff").is_none() && Route::parse("||1|").is_none());
        assert_eq!(node_of(&new_member("gw-1")), "gw-1");
        let tab: crate::proto::Device = "tab/2".parse().unwrap();
        assert_eq!(session_field(7, &tab), "7/tab/2");
        assert_eq!(parse_field("7/tab/2"), Some((7, tab)));
        assert_eq!(parse_field("7"), Some((7, crate::proto::Device::DEFAULT)));
        assert_eq!(parse_field("x/y"), None);
        for key in [
            EVENTS.to_string(),
            GRACE.to_string(),
            GRACE_WHY.to_string(),
            MEMBERS.to_string(),
            lease("m"),
            sessions("m"),
            inbox("m"),
            reaped("m"),
        ] {
            assert!(key.starts_with("{idlegate}:"), "{key}");
        }
        // Per-uid keys spread over the slots.
        for key in [route(7), last_seen(7)] {
            assert!(!key.contains('{'), "{key}");
        }
    }
}

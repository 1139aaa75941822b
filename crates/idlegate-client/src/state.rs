//! What the client tells its application: where its connection stands, and what arrived.

use std::time::Duration;

use bytes::Bytes;
use idlegate_proto::{CloseReason, PresenceEntry, PresenceKind};

/// Where the client's connection stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// Opening a connection and logging in; `attempt` counts failures since the last
    /// session (0 for the first try).
    Connecting { attempt: u32 },
    /// Logged in. `session` is the id the gateway's events give this session; `timeout` and
    /// `tick` come from WELCOME, and the client pings after `keepalive` without sending.
    Online { session: String, timeout: Duration, tick: Duration, keepalive: Duration },
    /// Not connected. `reason` is the BYE's (or `Disconnect` when the connection dropped or
    /// never opened, with `text` saying why); `retry_in` is when the client tries again, or
    /// `None` when it will not until [`crate::Client::reconnect`] (after a logout, a kick,
    /// or [`crate::Client::close`]).
    Offline { reason: CloseReason, text: String, retry_in: Option<Duration> },
}

/// Something the client has to say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The connection changed state.
    State(State),
    /// Bytes a backend pushed to this client (`POST /v1/push`).
    Push(Bytes),
    /// The gateway took a refreshed token (REFRESHED): the session goes on, now until
    /// `expires` (unix seconds; 0 when the gateway holds no expiry for it).
    Refreshed { expires: u64 },
    /// Watched uids' presence (PRESENCE): a snapshot answering a watch (after every
    /// reconnect too, for the whole list), each change in the order of the gateway's event
    /// stream, or a resync of the whole list after the client fell behind. Applying the
    /// entries in order, each replacing what was known of its uid, gives the current view.
    Presence { kind: PresenceKind, entries: Vec<PresenceEntry> },
}

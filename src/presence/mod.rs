//! The presence core: who is online, when they go offline, and what happened to them.
//!
//! `ring` is the pure slot ring (ticks in, expired uids out); `clock` is the one place time
//! becomes ticks; `registry` maps uids to sessions and keeps them consistent with the ring;
//! `ticker` moves the ring; `session` is what a logged-in client shares with the rest of the
//! gateway, `outbox` holds pushes until its connection takes them and `subscriptions` says
//! which pushes an MQTT session takes; `events` is the ordering lock every online, offline
//! and data event goes through, into this process's `local_log` or a cluster's store;
//! `event_json` writes an event's data as the event stream and webhooks carry it;
//! `grace` holds a uid's `user_offline` for the offline grace; `last_seen` when each uid
//! that went offline was last online; `expiries` the tick each
//! session's token expires on, when that is enforced; `shards` places a uid on a lock;
//! `directory` answers presence questions for the backend API, whether from this process or
//! a cluster; `backplane` is what a cluster's shared store is to the composition root.
//! Watch lists: `watch` is the pure index of who watches whom here, `owed` the PRESENCE
//! entries waiting for each watcher, `fanout` the task that feeds the index the stream and
//! the sessions' requests, and `watch_lists` whom each user may watch.

mod backplane;
mod class_rings;
mod clock;
mod directory;
mod event_json;
mod events;
mod expiries;
mod fanout;
mod grace;
mod last_seen;
mod local_log;
mod outbox;
mod owed;
mod registry;
mod ring;
mod session;
mod shards;
mod subscriptions;
mod ticker;
mod watch;
mod watch_lists;

pub(crate) use backplane::{Acknowledged, Backplane, RelayTurn, SharedKeys, StoreTrouble};
pub use class_rings::ClassRings;
pub(crate) use clock::unix_ms as unix_ms_now;
pub use clock::Clock;
pub(crate) use directory::{decode_cursor, encode_cursor};
pub use directory::{Directory, DirectoryError, Local, Located, NodeCount, OnlineCount, UidPage};
pub use event_json::write_data as write_event_data;
pub use events::{within_batch_budget, Batch, Event, EventId, EventLog, Replicate, What, Will, READ_BATCH};
pub use fanout::{FanOut, WatchRefused, Watches};
pub use last_seen::LastSeen;
#[cfg(test)]
pub(crate) use local_log::kept_online_event_bytes;
pub use outbox::{Outboxes, Push, Pushed, Reach};
pub use registry::{Registry, Touched};
pub use ring::{Handle, Ring, Touch};
pub(crate) use session::data_bucket;
pub(crate) use session::Traits;
pub use session::{session_hex, Claims, Origin, Session};
pub use subscriptions::Subscriptions;
pub use ticker::Ticker;
pub(crate) use watch::distinct;
pub use watch::UserState;
pub use watch_lists::{ListError, ListStore, LocalLists, WatchLists};

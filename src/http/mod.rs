//! The backend side: what servers and operators talk to, each on its own HTTP listener so
//! neither competes with client traffic.
//!
//! `api` is the backend API (presence, push, kicks, the event stream); `admin` serves
//! liveness, readiness, `/metrics` and the status page (`status`). What is measured lives
//! in [`crate::metrics`], below every side that counts something. `state` is all they
//! reach of the gateway.

mod admin;
mod api;
mod listener;
mod state;
mod status;

pub(crate) use admin::serve as serve_admin;
pub(crate) use api::serve as serve_api;
pub(crate) use state::{Health, Settings, State, EVENT_STREAMS_BYTES};

//! The backend side: what servers and operators talk to, each on its own HTTP listener so
//! neither competes with client traffic.
//!
//! `api` is the backend API (presence, push, kicks, the event stream); `admin` serves
//! liveness, readiness, `/metrics` and the status page (`status`); `metrics` defines what is measured; `process` adds the
//! process's own CPU, memory and descriptors.

mod admin;
mod api;
mod listener;
mod metrics;
#[cfg(target_os = "linux")]
mod process;
mod status;

pub(crate) use admin::serve as serve_admin;
pub(crate) use api::serve as serve_api;
pub use metrics::Metrics;

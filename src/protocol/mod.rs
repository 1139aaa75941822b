//! The protocol, with no IO: what every door decodes a client's bytes into (`command`),
//! the state machine that applies the rules to it (`machine`), and what the machine may
//! reach of the gateway (`context`).

mod command;
mod context;
#[cfg(test)]
mod expiry_tests;
mod machine;

pub(crate) use command::{Asked, Command};
pub(crate) use context::{Context, Rules};
pub(crate) use machine::{Arriving, Close, Machine, Out, System, Wake, SHED};

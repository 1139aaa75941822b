//! The protocol, with no IO: the state machine every transport drives (`machine`), and the
//! bound on connections waiting to log in (`pending`).

mod machine;
mod pending;

pub(crate) use machine::{Close, Machine, Wake};
pub(crate) use pending::{Pending, Refused};

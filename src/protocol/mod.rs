//! The protocol, with no IO: the state machine every transport drives.

mod machine;

pub(crate) use machine::{Close, Machine, Out, Wake};

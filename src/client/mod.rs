//! The client side of the gateway: one connection's protocol (`handler`) over its socket
//! (`connection`), and the bound on connections waiting to log in (`pending`).

mod connection;
pub(crate) mod handler;
pub(crate) mod pending;

pub(crate) use pending::Pending;

//! The doors clients come in by, each driving the protocol machine over its own bytes:
//! plain TCP (`tcp`, over the buffered socket of `connection`).

mod connection;
mod framed;
pub(crate) mod tcp;

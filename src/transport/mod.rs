//! The doors clients come in by. `door` declares them (name, TLS or not, what each
//! speaks); `accept` takes their connections, admitting them (`admission`: the bound on
//! connections waiting to log in) and accounting for each (`guard`), or refusing them in
//! their door's words (`refusal`); `drive` runs one connection through the protocol
//! machine over a [`connection::Connection`], generic over a layer (`tcp`'s plain socket,
//! `tls` with its `records`) and a framing (`tcp`'s frames, `ws`, `mqtt`).

mod accept;
mod admission;
mod connection;
mod door;
mod drive;
mod guard;
mod mqtt;
mod proxy_header;
mod records;
mod refusal;
mod refusal_log;
mod tcp;
pub(crate) mod tls;
pub(crate) mod ws;

pub(crate) use accept::Doors;

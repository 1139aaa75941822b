//! Connections waiting to log in: bounded in all and per source address, so one source
//! cannot lock others out.
//!
//! A connection is pending from its accept until its LOGIN succeeds or it closes. Two
//! bounds: `--max-pending-logins-per-ip` refuses a source's next connection while that many
//! of its own wait (a flood from one address costs only that address); and when
//! `--max-pending-logins` are waiting in all, the *oldest* pending connection is shed with
//! BYE(server_full) and a retry hint to make room, never the newcomer, so sockets that
//! never log in cannot keep the door shut however fast they are renewed.
//!
//! The state is touched at accept and at login, never on the per-frame path; a logged-in
//! connection holds nothing of it. A connection's [`Ticket`] waits here under the
//! connection's descriptor number from its accept until its login phase takes it
//! ([`Pending::claim`]), so the connection's task (whose size every open connection pays
//! for its whole life) carries no extra argument.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

/// Why a connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Its source address already has this many connections waiting to log in.
    Source(usize),
}

/// The pending connections; see the module documentation.
#[derive(Debug)]
pub(crate) struct Pending {
    max: usize,
    per_source: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Tickets of accepted connections whose login phase has not taken them yet.
    unclaimed: HashMap<i32, Ticket>,
    next: u64,
    /// By accept order, oldest first: what to shed when full.
    order: BTreeMap<u64, CancellationToken>,
    by_source: HashMap<IpAddr, usize>,
}

/// One connection's place among the pending; gives it back when dropped (at login, or at
/// close before one). One pointer wide: the connection's task carries it into the login.
#[derive(Debug)]
pub(crate) struct Ticket(Box<Place>);

#[derive(Debug)]
struct Place {
    pending: Arc<Pending>,
    id: u64,
    source: IpAddr,
    shed: CancellationToken,
}

// === impl Pending ===

impl Pending {
    /// At most `max` pending in all and `per_source` from one address.
    pub(crate) fn new(max: usize, per_source: usize) -> Pending {
        debug_assert!(max > 0 && per_source > 0, "max={max}; per_source={per_source}");
        Pending { max, per_source, inner: Mutex::default() }
    }

    /// Admits the connection on descriptor `fd` from `source` (see [`Pending::admit`]); its
    /// login phase takes the ticket with [`Pending::claim`].
    pub(crate) fn admit_fd(self: &Arc<Self>, source: IpAddr, fd: i32) -> Result<(), Refused> {
        let ticket = self.admit(source)?;
        // A ticket left by an earlier connection on the same descriptor number (its task
        // never began) is dropped after the lock is released: dropping takes the lock.
        let stale = self.lock().unclaimed.insert(fd, ticket);
        drop(stale);
        Ok(())
    }

    /// The ticket of the connection on descriptor `fd`, admitted with [`Pending::admit_fd`].
    pub(crate) fn claim(&self, fd: i32) -> Option<Ticket> {
        let ticket = self.lock().unclaimed.remove(&fd);
        ticket
    }

    /// Admits a connection from `source`, shedding the oldest pending one if all places are
    /// taken; refused if its source has too many waiting already.
    pub(crate) fn admit(self: &Arc<Self>, source: IpAddr) -> Result<Ticket, Refused> {
        let mut inner = self.lock();
        let waiting = inner.by_source.get(&source).copied().unwrap_or(0);
        if waiting >= self.per_source {
            return Err(Refused::Source(self.per_source));
        }
        if inner.order.len() >= self.max {
            if let Some((_, oldest)) = inner.order.pop_first() {
                // Its ticket still counts against its source until its connection closes.
                oldest.cancel();
            }
        }
        let id = inner.next;
        inner.next += 1;
        let shed = CancellationToken::new();
        inner.order.insert(id, shed.clone());
        *inner.by_source.entry(source).or_default() += 1;
        Ok(Ticket(Box::new(Place { pending: self.clone(), id, source, shed })))
    }

    /// Connections waiting now (shed ones that have not closed yet included).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().by_source.values().sum()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

// === impl Ticket ===

impl Ticket {
    /// Resolves if this connection was shed to make room for a newer one.
    pub(crate) fn shed(&self) -> WaitForCancellationFuture<'_> {
        self.0.shed.cancelled()
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut inner = self.pending.lock();
        inner.order.remove(&self.id);
        if let Some(n) = inner.by_source.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                inner.by_source.remove(&self.source);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[test]
    fn one_source_is_bounded_and_others_still_get_in() {
        let pending = Arc::new(Pending::new(100, 2));
        let a = [pending.admit(ip(2)).unwrap(), pending.admit(ip(2)).unwrap()];
        assert_eq!(pending.admit(ip(2)).unwrap_err(), Refused::Source(2));
        let b = pending.admit(ip(3)).unwrap();
        drop(a);
        assert!(pending.admit(ip(2)).is_ok(), "a source's places come back as its connections log in or close");
        assert_eq!(pending.len(), 1 + 1 - 1);
        drop(b);
    }

    #[test]
    fn tickets_wait_under_their_descriptor_until_claimed() {
        let pending = Arc::new(Pending::new(10, 10));
        pending.admit_fd(ip(2), 7).unwrap();
        assert_eq!(pending.len(), 1);
        let ticket = pending.claim(7).expect("admitted");
        assert!(pending.claim(7).is_none());
        drop(ticket);
        assert_eq!(pending.len(), 0);
        // A descriptor number reused before its ticket was claimed replaces it.
        pending.admit_fd(ip(2), 8).unwrap();
        pending.admit_fd(ip(3), 8).unwrap();
        assert_eq!(pending.len(), 1);
    }

    #[test]
    fn when_full_the_oldest_is_shed_not_the_newcomer() {
        let pending = Arc::new(Pending::new(2, 10));
        let first = pending.admit(ip(2)).unwrap();
        let second = pending.admit(ip(2)).unwrap();
        let third = pending.admit(ip(3)).unwrap();
        assert!(first.0.shed.is_cancelled(), "the oldest makes room");
        assert!(!second.0.shed.is_cancelled() && !third.0.shed.is_cancelled());
        // A shed connection counts against its source until it has closed.
        assert_eq!(pending.len(), 3);
        drop(first);
        assert_eq!(pending.len(), 2);
    }
}

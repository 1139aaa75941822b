//! Connections waiting to log in: bounded in all and per source address, so one source
//! cannot lock others out.
//!
//! A connection waits from its accept until its LOGIN succeeds or it closes. Two
//! bounds: `--max-pending-logins-per-ip` refuses a source's next connection while that many
//! of its own wait (a flood from one address costs only that address); and when
//! `--max-pending-logins` are waiting in all, the *oldest* waiting connection is shed with
//! BYE(server_full) and a retry hint to make room, never the newcomer, so sockets that
//! never log in cannot keep the door shut however fast they are renewed.
//!
//! The state is touched at accept and at login, never on the per-frame path; a logged-in
//! connection holds nothing of it. The accept loop hands a connection's [`Ticket`] to its
//! task, which keeps it in the boxed login phase only: the task itself (whose size every
//! open connection pays for its whole life) does not grow by it.
//!
//! Places live in a slab whose slots are reused, not in an allocation each: what a
//! connection allocates at its accept and frees at its login sits between what logged-in
//! connections keep, and the allocator cannot hand those holes back (docs/BENCHMARKS.md
//! has what stayed behind per connection before the slab).

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Poll, Waker};

/// Slots kept for reuse when no connection waits any more; past it the slab and its
/// indexes are freed then, so a ramp's or a stall's peak of waiting connections is not kept
/// for the gateway's life.
const KEEP_SLOTS: usize = 1024;

/// Stale entries the admission order may hold beyond the live ones before it is compacted:
/// a place that logs in leaves its entry behind, skipped when it reaches the front.
const ORDER_SLACK: usize = 64;

/// Why a connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Its source address already has this many connections waiting to log in.
    Source(usize),
}

/// The connections waiting to log in; see the module documentation.
#[derive(Debug)]
pub(crate) struct Admission {
    max: usize,
    per_source: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Every place, by slot; a slot whose ticket is gone is in `free`.
    slots: Vec<Slot>,
    free: Vec<u32>,
    next: u64,
    /// By accept order, oldest first: what to shed when full. An entry whose slot no
    /// longer holds its id (the place logged in or closed) is stale and skipped.
    order: VecDeque<(u64, u32)>,
    /// Places in `order` that are neither shed nor gone: what `max` bounds.
    live: usize,
    by_source: HashMap<IpAddr, usize>,
}

/// One waiting connection's place.
#[derive(Debug)]
struct Slot {
    /// Which admission holds the slot (ids are never reused).
    id: u64,
    /// The source it counts against; `None` while a trusted balancer's PROXY header, which
    /// names it, is awaited ([`Admission::admit_unattributed`]).
    source: Option<IpAddr>,
    /// Shed to make room for a newer connection.
    shed: bool,
    /// The login phase waiting to hear it was shed.
    waker: Option<Waker>,
}

/// One connection's place among the waiting; gives it back when dropped (at login, or at
/// close before one).
#[derive(Debug)]
pub(crate) struct Ticket {
    admission: Arc<Admission>,
    slot: u32,
    id: u64,
}

// === impl Admission ===

impl Admission {
    /// At most `max` waiting in all and `per_source` from one address.
    pub(crate) fn new(max: usize, per_source: usize) -> Admission {
        debug_assert!(max > 0 && per_source > 0, "max={max}; per_source={per_source}");
        Admission { max, per_source, inner: Mutex::default() }
    }

    /// Admits a connection from `source`, shedding the oldest waiting one if all places are
    /// taken; refused if its source has too many waiting already. The ticket holds the
    /// place until it is dropped (at login, or at a close before one).
    pub(crate) fn admit(self: &Arc<Self>, source: IpAddr) -> Result<Ticket, Refused> {
        let mut inner = self.lock();
        let slot = inner.admit(Some(source), self.max, self.per_source)?;
        let id = inner.slots[slot as usize].id;
        Ok(Ticket { admission: self.clone(), slot, id })
    }

    /// Admits a connection whose source is not known yet (a trusted balancer's, until its
    /// PROXY header names the client): it counts against `--max-pending-logins`, and may
    /// shed the oldest, from now; against its source once [`Ticket::attribute`] names it.
    pub(crate) fn admit_unattributed(self: &Arc<Self>) -> Ticket {
        let mut inner = self.lock();
        let slot = match inner.admit(None, self.max, self.per_source) {
            Ok(slot) => slot,
            Err(_) => unreachable!("no per-source bound without a source"),
        };
        let id = inner.slots[slot as usize].id;
        Ticket { admission: self.clone(), slot, id }
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

/// What the per-source bound counts a connection from `ip` under: an IPv4 address (also
/// one mapped into IPv6) as itself; an IPv6 address by its /64, the smallest block a site is
/// given, whose 2^64 addresses one host can use at will to look like many.
fn source_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(std::net::Ipv6Addr::from(u128::from(v6) & !u128::from(u64::MAX))),
        },
    }
}

// === impl Inner ===

impl Inner {
    fn admit(&mut self, source: Option<IpAddr>, max: usize, per_source: usize) -> Result<u32, Refused> {
        let source = source.map(source_key);
        if let Some(source) = source {
            self.check_source(source, per_source)?;
        }
        if self.live >= max {
            self.shed_oldest();
        }
        let id = self.next;
        self.next += 1;
        let place = Slot { id, source, shed: false, waker: None };
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot as usize] = place;
                slot
            }
            None => {
                self.slots.push(place);
                u32::try_from(self.slots.len() - 1).expect("fewer waiting connections than descriptors")
            }
        };
        self.order.push_back((id, slot));
        self.live += 1;
        if let Some(source) = source {
            *self.by_source.entry(source).or_default() += 1;
        }
        Ok(slot)
    }

    /// Refused if `source` (a [`source_key`]) has `per_source` waiting already.
    fn check_source(&self, source: IpAddr, per_source: usize) -> Result<(), Refused> {
        let waiting = self.by_source.get(&source).copied().unwrap_or(0);
        if waiting >= per_source {
            return Err(Refused::Source(per_source));
        }
        Ok(())
    }

    /// Sheds the oldest live place: its login phase hears it and ends the connection. Its
    /// place still counts against its source until its connection closes.
    fn shed_oldest(&mut self) {
        while let Some(entry) = self.order.pop_front() {
            if is_live(&self.slots, entry) {
                let place = &mut self.slots[entry.1 as usize];
                place.shed = true;
                if let Some(waker) = place.waker.take() {
                    waker.wake();
                }
                self.live -= 1;
                return;
            }
        }
        debug_assert_eq!(self.live, 0, "every live place has its entry in the order");
    }

    /// Gives `slot` back: its connection logged in or closed.
    fn release(&mut self, slot: u32) {
        let place = &mut self.slots[slot as usize];
        debug_assert!(place.id != u64::MAX, "a slot is released once");
        if !place.shed {
            self.live -= 1;
        }
        place.id = u64::MAX;
        place.waker = None;
        if let Some(source) = place.source.take() {
            if let Some(n) = self.by_source.get_mut(&source) {
                *n -= 1;
                if *n == 0 {
                    self.by_source.remove(&source);
                }
            }
        }
        self.free.push(slot);
        // Every slot free: no place is in use (one awaiting its PROXY header counts against
        // no source, so an empty `by_source` does not tell).
        if self.free.len() == self.slots.len() && self.slots.len() > KEEP_SLOTS {
            debug_assert!(self.live == 0, "no place is in use");
            *self = Inner { next: self.next, ..Inner::default() };
            return;
        }
        // Entries of places that logged in stay until they reach the front; past the
        // slack they are dropped in one pass, so the order holds about the live ones.
        if self.order.len() > 2 * self.live + ORDER_SLACK {
            let slots = &self.slots;
            self.order.retain(|&entry| is_live(slots, entry));
        }
    }
}

/// Whether `slot` holds admission `id` and it is still waiting unshed.
fn is_live(slots: &[Slot], (id, slot): (u64, u32)) -> bool {
    slots.get(slot as usize).is_some_and(|s| s.id == id && !s.shed)
}

// === impl Ticket ===

impl Ticket {
    /// Resolves if this connection was shed to make room for a newer one.
    pub(crate) fn shed(&self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(move |cx| {
            let mut inner = self.admission.lock();
            let place = &mut inner.slots[self.slot as usize];
            debug_assert_eq!(place.id, self.id, "a ticket's slot is its own until it is dropped");
            if place.shed {
                return Poll::Ready(());
            }
            if !place.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                place.waker = Some(cx.waker().clone());
            }
            Poll::Pending
        })
    }

    /// Counts this place against `source` from now (a client a PROXY header named);
    /// refused if that source has too many waiting already.
    pub(crate) fn attribute(&self, source: IpAddr) -> Result<(), Refused> {
        let mut inner = self.admission.lock();
        let source = source_key(source);
        inner.check_source(source, self.admission.per_source)?;
        let place = &mut inner.slots[self.slot as usize];
        debug_assert!(place.id == self.id && place.source.is_none(), "attributed once, while held");
        place.source = Some(source);
        *inner.by_source.entry(source).or_default() += 1;
        Ok(())
    }

    #[cfg(test)]
    fn is_shed(&self) -> bool {
        self.admission.lock().slots[self.slot as usize].shed
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.admission.lock().release(self.slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_sources_count_by_their_64_and_mapped_ipv4_as_ipv4() {
        let admission = Arc::new(Admission::new(100, 2));
        let v6 = |s: &str| s.parse::<IpAddr>().unwrap();
        let _a = admission.admit(v6("2001:db8:1:2::1")).unwrap();
        let _b = admission.admit(v6("2001:db8:1:2:ffff::9")).unwrap();
        assert_eq!(admission.admit(v6("2001:db8:1:2:abcd::1")).err(), Some(Refused::Source(2)), "the same /64");
        let _c = admission.admit(v6("2001:db8:1:3::1")).expect("the next /64 is another source");
        let _d = admission.admit(v6("192.0.2.7")).unwrap();
        let _e = admission.admit(v6("::ffff:192.0.2.7")).unwrap();
        assert_eq!(admission.admit(v6("192.0.2.7")).err(), Some(Refused::Source(2)), "mapped IPv4 is IPv4");
        drop(_a);
        assert!(admission.admit(v6("2001:db8:1:2::77")).is_ok(), "a place of the /64 came back");
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[test]
    fn one_source_is_bounded_and_others_still_get_in() {
        let admission = Arc::new(Admission::new(100, 2));
        let a = [admission.admit(ip(2)).unwrap(), admission.admit(ip(2)).unwrap()];
        assert_eq!(admission.admit(ip(2)).unwrap_err(), Refused::Source(2));
        let b = admission.admit(ip(3)).unwrap();
        drop(a);
        assert!(admission.admit(ip(2)).is_ok(), "a source's places come back as its connections log in or close");
        assert_eq!(admission.len(), 1 + 1 - 1);
        drop(b);
    }

    #[test]
    fn when_full_the_oldest_is_shed_not_the_newcomer() {
        let admission = Arc::new(Admission::new(2, 10));
        let first = admission.admit(ip(2)).unwrap();
        let second = admission.admit(ip(2)).unwrap();
        let third = admission.admit(ip(3)).unwrap();
        assert!(first.is_shed(), "the oldest makes room");
        assert!(!second.is_shed() && !third.is_shed());
        // A shed connection counts against its source until it has closed.
        assert_eq!(admission.len(), 3);
        drop(first);
        assert_eq!(admission.len(), 2);
    }

    #[test]
    fn places_are_reused_and_the_order_stays_about_the_live_ones() {
        let admission = Arc::new(Admission::new(100, 100_000));
        // Waits through every round: the order's front stays live, so only compaction can
        // drop the stale entries behind it.
        let long = admission.admit(ip(9)).unwrap();
        let mut waiting = std::collections::VecDeque::new();
        for _ in 0..10_000 {
            waiting.push_back(admission.admit(ip(2)).unwrap());
            if waiting.len() > 20 {
                // The newest and the oldest log in.
                waiting.pop_back();
                waiting.pop_front();
            }
        }
        let inner = admission.lock();
        assert_eq!(inner.live, 1 + waiting.len());
        assert!(inner.slots.len() <= inner.live + 2, "{} slots for {} places", inner.slots.len(), inner.live);
        assert!(inner.order.len() <= 2 * inner.live + ORDER_SLACK + 1, "{} entries", inner.order.len());
        drop(inner);
        drop(waiting);
        drop(long);
        assert_eq!(admission.len(), 0);
        assert_eq!(admission.lock().live, 0);
    }

    #[test]
    fn a_peak_of_waiting_connections_is_not_kept_once_none_waits() {
        let admission = Arc::new(Admission::new(100_000, 100_000));
        let peak: Vec<Ticket> = (0..5_000).map(|_| admission.admit(ip(2)).unwrap()).collect();
        assert_eq!(admission.lock().slots.len(), 5_000);
        drop(peak);
        let inner = admission.lock();
        assert_eq!(inner.slots.capacity() + inner.free.capacity() + inner.order.capacity(), 0);
        assert_eq!(inner.next, 5_000, "ids are never reused");
    }

    #[tokio::test]
    async fn a_shed_place_wakes_its_login_phase() {
        let admission = Arc::new(Admission::new(1, 10));
        let first = admission.admit(ip(2)).unwrap();
        let waiting = tokio::spawn(async move {
            first.shed().await;
            first
        });
        tokio::task::yield_now().await;
        let _second = admission.admit(ip(3)).unwrap();
        let first = tokio::time::timeout(std::time::Duration::from_secs(10), waiting).await.unwrap().unwrap();
        assert!(first.is_shed());
    }
}

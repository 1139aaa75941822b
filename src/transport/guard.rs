//! One connection's accounting, in one place: its slot under `--max-connections`, its count
//! on its door, and its count among the connections waiting to log in. The accept loop
//! takes a [`Guard`], the connection's task owns it, and its `Drop` gives everything back
//! once, however the task ends (a close, a refusal before the task began, a runtime shutting
//! down).

use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::metrics::Metrics;
use crate::proto::Transport;

/// The slots of every open connection: the bound on connections, the count of open ones,
/// and (all slots back) the end of the drain.
#[derive(Debug)]
pub(crate) struct Slots {
    free: Semaphore,
    max: usize,
    metrics: Arc<Metrics>,
}

/// One open connection's share of [`Slots`]; see the module documentation. Two words, as
/// the semaphore permit it replaces: it lives in every open connection's task.
#[derive(Debug)]
pub(crate) struct Guard {
    slots: Arc<Slots>,
    transport: Transport,
    /// Still counted among the connections waiting to log in.
    waiting: bool,
}

// === impl Slots ===

impl Slots {
    pub(crate) fn new(max: usize, metrics: Arc<Metrics>) -> Slots {
        Slots { free: Semaphore::new(max), max, metrics }
    }

    /// A slot for a connection accepted on `transport`, counted as open and waiting to log
    /// in; `None` when all `--max-connections` are taken.
    pub(crate) fn take(self: &Arc<Self>, transport: Transport) -> Option<Guard> {
        self.free.try_acquire().ok()?.forget();
        self.metrics.opened_on(transport);
        self.metrics.pending_logins.inc();
        Some(Guard { slots: self.clone(), transport, waiting: true })
    }

    /// Connections open now.
    pub(crate) fn open(&self) -> usize {
        self.max - self.free.available_permits()
    }

    /// The most connections open at once.
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// Resolves once every connection has closed and given its slot back.
    pub(crate) async fn all_closed(&self) {
        let all = u32::try_from(self.max).unwrap_or(u32::MAX);
        // The semaphore is never closed, so acquiring only waits.
        let _all = self.free.acquire_many(all).await;
    }
}

// === impl Guard ===

impl Guard {
    /// The login phase is over (logged in, or about to close): no longer waiting.
    pub(crate) fn done_waiting(&mut self) {
        if std::mem::replace(&mut self.waiting, false) {
            self.slots.metrics.pending_logins.dec();
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.done_waiting();
        self.slots.metrics.closed_on(self.transport);
        self.slots.free.add_permits(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn a_guard_counts_its_connection_once_whenever_it_ends() {
        let metrics = Arc::new(Metrics::new(&Config::default()));
        let slots = Arc::new(Slots::new(2, metrics.clone()));
        let mut logged_in = slots.take(Transport::Tcp).unwrap();
        let refused_early = slots.take(Transport::Ws).unwrap();
        assert!(slots.take(Transport::Tcp).is_none(), "two slots");
        assert_eq!((slots.open(), metrics.pending_logins.get()), (2, 2));
        logged_in.done_waiting();
        logged_in.done_waiting();
        assert_eq!(metrics.pending_logins.get(), 1, "counted down once");
        drop(refused_early);
        drop(logged_in);
        assert_eq!((slots.open(), metrics.pending_logins.get()), (0, 0));
        assert_eq!(metrics.connections_open.get(), 0);
    }

    #[test]
    fn a_guard_is_two_words() {
        assert_eq!(std::mem::size_of::<Guard>(), 16);
    }
}

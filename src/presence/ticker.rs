//! The ticker: the one task that moves the ring, on the ticks the [`Clock`] names.
//!
//! Each tick it advances every ring shard to the tick the clock names, lets connections read
//! what they were sent if the tick ran late, expires what fell due in chunks, and refreshes
//! the ring's gauges.
//!
//! ```text
//! tick:        0    1    2   ...  29   30
//!              |----|----|-- ... --|----|
//! login at 0.4 ^                        ^ swept on tick 30: 29.6 s of silence
//! ```
//!
//! A late tick (the process stalled) sweeps every slot it missed, none skipped, but only
//! after a short grace in which connections read what arrived during the stall: a client
//! that kept sending while the gateway was frozen keeps its session.

use std::sync::Arc;

use tokio::time::{sleep, sleep_until, Instant};
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::presence::clock::Clock;
use crate::presence::registry::Registry;
use crate::presence::Session;

/// uids expired per chunk before the ticker yields to the runtime. One chunk holds a ring
/// shard's lock and the worker for well under a millisecond, so even a mass expiry of
/// millions never pauses other connections for long.
const SWEEP_CHUNK: usize = 4096;

/// Connections a sweep wakes before it lets live clients run. Each woken connection writes
/// its BYE and closes, and the live clients' frames wait for the batch: the smaller the
/// batch, the shorter their wait in a mass expiry, down to 2; 1 doubles the socket polls
/// for no better round trips (`loadtest/mass-expiry.sh`; the trials are in
/// docs/BENCHMARKS.md, "Figures behind the code").
const WAKE_BATCH: usize = 2;

/// A tick later than `tick / LATE_FRACTION` counts as late: the process stalled long enough
/// that clients' frames may be waiting unread in socket buffers.
const LATE_FRACTION: u32 = 10;

/// Longest grace a late tick gives connections to read before it sweeps, as a fraction of
/// the tick (`tick / MAX_GRACE_FRACTION`); the grace is also never longer than the lag.
const MAX_GRACE_FRACTION: u32 = 2;

/// Drives the ring; see the module documentation.
#[derive(Debug)]
pub struct Ticker {
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    clock: Clock,
    /// The last tick this ticker advanced the rings to.
    elapsed: u64,
    /// Scratch buffers reused every tick, so a steady ticker does not allocate.
    expired: Vec<u64>,
    /// Sessions by ticks of silence, up to the default class's window (longer in the last).
    by_silence: Vec<u64>,
    /// Sessions of each timeout class.
    by_class: Vec<u64>,
    by_age: Vec<i64>,
}

// === impl Ticker ===

impl Ticker {
    /// A ticker for rings whose default class is `window` ticks (the silence picture's
    /// reach), keeping time with `clock`.
    pub fn new(registry: Arc<Registry>, metrics: Arc<Metrics>, clock: Clock, window: u64) -> Ticker {
        let series = metrics.silence_series();
        let classes = registry.classes().len();
        Ticker {
            registry,
            metrics,
            clock,
            elapsed: 0,
            expired: Vec::with_capacity(SWEEP_CHUNK),
            by_silence: vec![0; window as usize + 1],
            by_class: vec![0; classes],
            by_age: vec![0; series],
        }
    }

    /// Ticks until `shutdown` is cancelled.
    pub async fn run(mut self, shutdown: CancellationToken) {
        loop {
            let scheduled = self.clock.instant_of(self.elapsed + 1);
            tokio::select! {
                _ = sleep_until(scheduled) => {}
                _ = shutdown.cancelled() => return,
            }
            self.tick(scheduled).await;
        }
    }

    /// One tick that was due at `scheduled`.
    async fn tick(&mut self, scheduled: Instant) {
        let woke = Instant::now();
        let lag = woke.saturating_duration_since(scheduled);
        self.metrics.tick_lag.observe(lag.as_secs_f64());

        let to = self.clock.tick_at(woke).max(self.elapsed + 1);
        self.registry.advance(to);
        self.elapsed = to;
        if lag > self.clock.tick() / LATE_FRACTION {
            // Frames that arrived during the stall sit unread in socket buffers; a touch
            // rescues an overdue uid until it is expired below, so read them first.
            let grace = lag.min(self.clock.tick() / MAX_GRACE_FRACTION);
            tracing::warn!(?lag, ?grace, tick = to, "tick ran late; reading clients before sweeping");
            sleep(grace).await;
        }

        let started = Instant::now();
        let expired = self.sweep().await;
        // Silent for more than a third of its timeout: a WebSocket session is pinged.
        self.registry.nudge_silent_third();
        self.metrics.sweep_duration.observe(started.elapsed().as_secs_f64());
        self.metrics.expired_per_sweep.observe(expired as f64);
        if expired > 0 {
            tracing::debug!(tick = to, expired, "swept");
        }
        self.refresh_picture();
    }

    /// Expires every overdue uid, a chunk at a time, yielding between chunks.
    /// The sessions it ends are logged offline in one batch at the end of the sweep; their
    /// connections are then woken in paced batches by a task of their own, so the next tick
    /// never waits for them.
    async fn sweep(&mut self) -> usize {
        let mut total = 0;
        let mut since_yield = 0;
        let mut ended = Vec::new();
        for shard in 0..self.registry.shard_count() {
            loop {
                let taken = self.registry.expire_chunk(shard, SWEEP_CHUNK - since_yield, &mut self.expired);
                self.registry.end_expired(&self.expired, &mut ended);
                self.expired.clear();
                self.metrics.ring_expired.inc_by(taken as u64);
                total += taken;
                since_yield += taken;
                if since_yield < SWEEP_CHUNK {
                    break;
                }
                since_yield = 0;
                tokio::task::yield_now().await;
            }
        }
        self.registry.report_and_forget(&ended);
        if !ended.is_empty() {
            tokio::spawn(wake_paced(ended));
        }
        // Then the sessions whose token expired (`--enforce-token-expiry`): each ends now,
        // within a tick of its expiry, unless a refresh moved it.
        let to = self.elapsed;
        let mut ending = Vec::new();
        loop {
            let taken = self.registry.end_expired_tokens(to, SWEEP_CHUNK - since_yield, &mut ending);
            since_yield += taken;
            if since_yield < SWEEP_CHUNK {
                break;
            }
            since_yield = 0;
            tokio::task::yield_now().await;
        }
        // Then the offline graces that ran out: each a `user_offline` after the offline
        // event of its uid's last session, logged above or on an earlier tick.
        for shard in 0..self.registry.grace_shard_count() {
            loop {
                let taken = self.registry.expire_graces(shard, SWEEP_CHUNK - since_yield, &mut self.expired);
                self.registry.finish_graces(&self.expired);
                self.expired.clear();
                since_yield += taken;
                if since_yield < SWEEP_CHUNK {
                    break;
                }
                since_yield = 0;
                tokio::task::yield_now().await;
            }
        }
        total
    }

    /// Refreshes the tracked-uids gauge and the silence picture from the slot sizes.
    fn refresh_picture(&mut self) {
        let tracked = self.registry.ring_picture(&mut self.by_silence);
        self.registry.sessions_by_class(&mut self.by_class);
        self.metrics.set_sessions_by_class(&self.by_class);
        self.metrics.ring_tracked.set(tracked as i64);
        self.metrics.grace_users.set(self.registry.in_grace() as i64);
        self.metrics.token_expiries.set(self.registry.token_expiries() as i64);
        self.by_age.fill(0);
        let last = self.by_age.len().saturating_sub(1);
        for (silent_ticks, &n) in self.by_silence.iter().enumerate() {
            let age = (self.clock.whole_seconds(silent_ticks as u64) as usize).min(last);
            if let Some(slot) = self.by_age.get_mut(age) {
                *slot += n as i64;
            }
        }
        self.metrics.set_silence(&self.by_age);
    }
}

/// Wakes the connections of sessions a sweep ended, [`WAKE_BATCH`] at a time. Between
/// batches it yields, and a yielded task runs again only after the worker has polled its
/// sockets, so the live clients' frames that arrived meanwhile are served in between.
async fn wake_paced(ended: Vec<Arc<Session>>) {
    for batch in ended.chunks(WAKE_BATCH) {
        for session in batch {
            session.wake();
        }
        tokio::task::yield_now().await;
    }
}

#[cfg(test)]
mod grace_tests;

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::Config;
    use crate::presence::events::EventLog;
    use crate::presence::registry::Touched;
    use crate::proto::CloseReason;

    const TICK: Duration = Duration::from_secs(1);
    const TIMEOUT: Duration = Duration::from_secs(30);
    const WINDOW: u64 = 30;

    struct Harness {
        registry: Arc<Registry>,
        metrics: Arc<Metrics>,
        clock: Clock,
        start: Instant,
        stop: CancellationToken,
    }

    impl Harness {
        fn now(&self) -> u64 {
            self.clock.tick_at(Instant::now())
        }
    }

    fn start() -> Harness {
        let metrics = Arc::new(Metrics::new(&Config { timeout: TIMEOUT, tick: TICK, ..Config::default() }));
        let events = Arc::new(EventLog::new(1 << 20, 1 << 30, metrics.clone()));
        let registry = Arc::new(Registry::new(WINDOW, events, metrics.clone()));
        let start = Instant::now();
        let clock = Clock::new(start, TICK);
        let ticker = Ticker::new(registry.clone(), metrics.clone(), clock, WINDOW);
        let stop = CancellationToken::new();
        tokio::spawn(ticker.run(stop.clone()));
        Harness { registry, metrics, clock, start, stop }
    }

    #[tokio::test(start_paused = true)]
    async fn silent_uid_goes_offline_on_exactly_the_tick_the_guarantee_names() {
        let h = start();
        // Log in at several offsets inside tick 0, the last just before tick 1 begins: all
        // are swept on tick 30, the tick that makes their silence longest but <= timeout.
        let mut watchers = Vec::new();
        for (uid, offset_ms) in [(1u64, 0u64), (2, 250), (3, 999)] {
            let login_at = h.start + Duration::from_millis(offset_ms);
            tokio::time::sleep_until(login_at).await;
            let session = h.registry.login(uid, crate::proto::Device::DEFAULT, h.now());
            watchers.push(tokio::spawn(async move {
                assert_eq!(session.ended().await, CloseReason::IdleTimeout);
                (uid, login_at, Instant::now())
            }));
        }
        for watcher in watchers {
            let (uid, login_at, offline_at) = watcher.await.unwrap();
            assert_eq!(offline_at, h.start + TIMEOUT, "uid {uid}");
            let silence = offline_at - login_at;
            assert!(silence > TIMEOUT - TICK && silence <= TIMEOUT, "uid {uid}: silence {silence:?}");
        }
        assert_eq!(h.registry.online(), 0);
        assert_eq!(h.metrics.ring_expired.get(), 3);
        assert_eq!(h.metrics.online_users.get(), 0);
        h.stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn uid_pinging_every_timeout_minus_two_ticks_stays_online_for_many_cycles() {
        let h = start();
        let session = h.registry.login(1, crate::proto::Device::DEFAULT, h.now());
        let mut last_touch = 0;
        for _ in 0..20 {
            tokio::time::sleep(TIMEOUT - 2 * TICK).await;
            let now = h.now();
            assert_ne!(now, last_touch, "each ping lands on a new tick");
            assert_eq!(h.registry.touch(&session, now), Touched::Alive);
            last_touch = now;
        }
        assert_eq!(session.end_reason(), None);
        // Then it falls silent and goes offline within the window.
        let silent_from = Instant::now();
        assert_eq!(session.ended().await, CloseReason::IdleTimeout);
        let silence = silent_from.elapsed();
        assert!(silence > TIMEOUT - TICK && silence <= TIMEOUT, "silence {silence:?}");
        h.stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn relogin_after_logout_gets_the_full_window_from_its_login() {
        let h = start();
        let first = h.registry.login(4, crate::proto::Device::DEFAULT, h.now());
        tokio::time::sleep(Duration::from_millis(29_500)).await;
        h.registry.leave(&first, CloseReason::Logout);
        let again_at = Instant::now();
        let second = h.registry.login(4, crate::proto::Device::DEFAULT, h.now());
        assert_eq!(second.ended().await, CloseReason::IdleTimeout);
        let silence = again_at.elapsed();
        assert!(silence > TIMEOUT - TICK && silence <= TIMEOUT, "silence {silence:?}");
        assert_eq!(h.metrics.online_users.get(), 0);
        h.stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn late_tick_reads_clients_before_it_sweeps() {
        let h = start();
        let active = h.registry.login(1, crate::proto::Device::DEFAULT, h.now());
        let silent = h.registry.login(2, crate::proto::Device::DEFAULT, h.now());
        tokio::time::sleep(Duration::from_millis(500)).await;
        // The process stalls for longer than the timeout: the clock jumps, the ticker wakes
        // 40 s late, and runs before this task reads anything.
        tokio::time::advance(Duration::from_secs(40)).await;
        for _ in 0..100 {
            if h.metrics.tick_lag.get_sample_count() > 0 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(h.metrics.tick_lag.get_sample_count(), 1, "the ticker ran once, late");
        // A frame that arrived during the stall is read now, before the sweep.
        assert_eq!(h.registry.touch(&active, h.now()), Touched::Alive);
        assert_eq!(silent.ended().await, CloseReason::IdleTimeout);
        assert_eq!(active.end_reason(), None);
        assert_eq!(h.metrics.ring_expired.get(), 1);
        h.stop.cancel();
    }

    #[tokio::test]
    async fn a_mass_expiry_wakes_its_connections_a_batch_at_a_time_letting_others_run_between() {
        const ENDED: usize = 10 * WAKE_BATCH;
        let woken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut sessions = Vec::new();
        for uid in 0..ENDED as u64 {
            let session = Arc::new(Session::new(uid, uid, 0, crate::presence::Handle::NONE));
            assert!(session.end_unwoken(CloseReason::IdleTimeout));
            let (s, w) = (session.clone(), woken.clone());
            tokio::spawn(async move {
                s.woken().await;
                w.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            });
            sessions.push(session);
        }
        tokio::task::yield_now().await;
        assert_eq!(woken.load(std::sync::atomic::Ordering::SeqCst), 0, "ended unwoken: nobody wakes yet");
        let pacer = tokio::spawn(wake_paced(sessions));
        // A live client's task, yielding as a busy connection would: it must run while the
        // pacer is still part-way through, not only after every connection was woken.
        let mut seen_between = 0;
        while !pacer.is_finished() {
            let n = woken.load(std::sync::atomic::Ordering::SeqCst);
            if n > 0 && n < ENDED {
                seen_between += 1;
            }
            tokio::task::yield_now().await;
        }
        pacer.await.unwrap();
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(woken.load(std::sync::atomic::Ordering::SeqCst), ENDED, "every connection woken");
        assert!(seen_between > 0, "other tasks ran between the batches");
    }

    #[tokio::test(start_paused = true)]
    async fn silence_picture_follows_the_slots() {
        let h = start();
        h.registry.login(1, crate::proto::Device::DEFAULT, h.now());
        tokio::time::sleep(Duration::from_millis(5_500)).await;
        h.registry.login(2, crate::proto::Device::DEFAULT, h.now());
        // Let the tick at 6 s refresh the picture.
        tokio::time::sleep(Duration::from_millis(600)).await;
        let text = h.metrics.render();
        assert!(text.contains("idlegate_ring_silence_uids{age_seconds=\"6\"} 1"), "{text}");
        assert!(text.contains("idlegate_ring_silence_uids{age_seconds=\"1\"} 1"), "{text}");
        assert!(text.contains("idlegate_ring_tracked_uids 2"), "{text}");
        h.stop.cancel();
    }
}

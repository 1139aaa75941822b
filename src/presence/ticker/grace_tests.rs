//! The offline grace as the ticker runs it, under paused time: which user events a
//! reconnect within the grace, one after it, an expiry and a shutdown log, and when.

use std::time::Duration;

use super::*;
use crate::config::Config;
use crate::presence::events::{EventId, EventLog, What};
use crate::proto::{CloseReason, Device};

const TICK: Duration = Duration::from_secs(1);
const WINDOW: u64 = 30;
const GRACE_TICKS: u64 = 5;
const GRACE: Duration = Duration::from_secs(GRACE_TICKS);

struct Harness {
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    clock: Clock,
    start: Instant,
    from: EventId,
    stop: CancellationToken,
}

impl Harness {
    fn now(&self) -> u64 {
        self.clock.tick_at(Instant::now())
    }

    fn login(&self, uid: u64, device: &str) -> Arc<Session> {
        self.registry.login(uid, device.parse().unwrap_or(Device::DEFAULT), self.now())
    }

    /// Every event logged since the start, as `(name, uid)`.
    fn events(&self) -> Vec<(&'static str, u64)> {
        self.all().iter().map(|e| (e.what.name(), e.uid)).collect()
    }

    fn all(&self) -> Vec<crate::presence::Event> {
        self.registry.events().read(self.from).events
    }

    async fn at(&self, ms: u64) {
        tokio::time::sleep_until(self.start + Duration::from_millis(ms)).await;
    }
}

fn start(max_devices: usize) -> Harness {
    let config = Config { tick: TICK, offline_grace: GRACE, ..Config::default() };
    let metrics = Arc::new(Metrics::new(&config));
    let events = Arc::new(EventLog::new(1 << 20, 1 << 30, metrics.clone()));
    let from = events.last_id();
    let start = Instant::now();
    let clock = Clock::new(start, TICK);
    let registry = Registry::with_devices(WINDOW, max_devices, events, metrics.clone());
    let registry = Arc::new(registry.with_offline_grace(GRACE_TICKS, clock));
    let ticker = Ticker::new(registry.clone(), metrics.clone(), clock, WINDOW);
    let stop = CancellationToken::new();
    tokio::spawn(ticker.run(stop.clone()));
    Harness { registry, metrics, clock, start, from, stop }
}

#[tokio::test(start_paused = true)]
async fn a_reconnect_within_the_grace_logs_no_user_event() {
    let h = start(1);
    let first = h.login(1, "");
    h.at(500).await;
    h.registry.leave(&first, CloseReason::Disconnect);
    assert!(h.registry.grace_until_ms(1).is_some(), "held: user-level presence still counts it");
    assert_eq!(h.registry.in_grace(), 1);
    h.at(4_900).await;
    let again = h.login(1, "");
    assert_eq!(h.registry.grace_until_ms(1), None);
    assert_eq!(h.registry.in_grace(), 0);
    h.at(20_000).await;
    assert_eq!(h.events(), [("online", 1), ("user_online", 1), ("offline", 1), ("online", 1)]);
    h.registry.leave(&again, CloseReason::Logout);
    h.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_grace_that_runs_out_is_one_user_offline_with_the_last_sessions_reason() {
    let h = start(1);
    let session = h.login(7, "");
    h.at(300).await;
    h.registry.leave(&session, CloseReason::Disconnect);
    assert_eq!(session.end_reason(), Some(CloseReason::Disconnect));
    // Held through the whole grace: nothing at 5.2 s (4.9 s after the ending) ...
    h.at(5_200).await;
    assert_eq!(h.events(), [("online", 7), ("user_online", 7), ("offline", 7)]);
    assert_eq!(h.metrics.grace_users.get(), 1);
    // ... and out on tick 6, 5.7 s after it: more than the grace, within one tick more.
    h.at(6_000).await;
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let all = h.all();
    assert_eq!(all.len(), 4, "{all:?}");
    let What::UserOffline { reason, ended_ms } = all[3].what else { panic!("{:?}", all[3]) };
    assert_eq!(reason, CloseReason::Disconnect, "the last session's reason");
    assert_eq!(ended_ms, all[2].at_ms, "when that session ended");
    assert!(all[3].at_ms >= ended_ms);
    assert_eq!((h.registry.in_grace(), h.registry.grace_until_ms(7)), (0, None));
    // A login after it is a user_online again.
    h.at(7_000).await;
    h.login(7, "");
    let names: Vec<_> = h.events().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["online", "user_online", "offline", "user_offline", "online", "user_online"]);
    h.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn an_idle_timeout_is_graced_too() {
    let h = start(1);
    h.login(3, "");
    // Swept on tick 30: offline (idle_timeout), user_offline held.
    h.at(30_100).await;
    assert_eq!(h.events(), [("online", 3), ("user_online", 3), ("offline", 3)]);
    assert!(h.registry.grace_until_ms(3).is_some());
    h.at(33_000).await;
    let back = h.login(3, "");
    // Silent again: its second expiry's grace runs out on tick 63 + 6.
    tokio::time::sleep_until(h.clock.instant_of(63 + GRACE_TICKS + 1) + Duration::from_millis(1)).await;
    assert_eq!(back.end_reason(), Some(CloseReason::IdleTimeout));
    let names: Vec<_> = h.events().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["online", "user_online", "offline", "online", "offline", "user_offline"]);
    h.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn only_the_last_device_begins_a_grace() {
    let h = start(2);
    let phone = h.login(9, "phone");
    let laptop = h.login(9, "laptop");
    h.registry.leave(&phone, CloseReason::Disconnect);
    assert_eq!(h.registry.grace_until_ms(9), None, "a session is left");
    h.registry.leave(&laptop, CloseReason::Disconnect);
    assert!(h.registry.grace_until_ms(9).is_some());
    h.at(2_000).await;
    h.login(9, "tablet");
    let names: Vec<_> = h.events().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["online", "user_online", "online", "offline", "offline", "online"]);
    h.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn shutdown_ends_every_grace_at_once_after_the_sessions() {
    let h = start(1);
    let gone = h.login(1, "");
    let staying = h.login(2, "");
    h.at(1_000).await;
    h.registry.leave(&gone, CloseReason::Disconnect);
    h.registry.end_all(CloseReason::Shutdown);
    assert_eq!(staying.end_reason(), Some(CloseReason::Shutdown));
    assert_eq!(h.registry.in_grace(), 0);
    let all = h.all();
    let user_offline: Vec<_> = all
        .iter()
        .filter_map(|e| match e.what {
            What::UserOffline { reason, .. } => Some((e.uid, reason)),
            _ => None,
        })
        .collect();
    // The session a shutdown ends is no grace; the uid in one ends it, with its reason.
    assert_eq!(user_offline, [(2, CloseReason::Shutdown), (1, CloseReason::Disconnect)]);
    h.stop.cancel();
}

/// Issue 48: a kicked uid stayed online for the whole grace. Endings someone chose (a
/// logout, a kick, an expired token) log `user_offline` at once, with their reason.
#[tokio::test(start_paused = true)]
async fn an_ending_someone_chose_is_not_graced() {
    let h = start(1);
    let out = h.login(1, "");
    h.login(2, "");
    let expiring = h.login(3, "");
    h.at(500).await;
    h.registry.leave(&out, CloseReason::Logout);
    h.registry.kick(2, None);
    h.registry.leave(&expiring, CloseReason::TokenExpired);
    assert_eq!(h.registry.in_grace(), 0);
    let user_offline: Vec<_> = h
        .all()
        .iter()
        .filter_map(|e| match e.what {
            What::UserOffline { reason, ended_ms } => Some((e.uid, reason, ended_ms == e.at_ms)),
            _ => None,
        })
        .collect();
    assert_eq!(
        user_offline,
        [(1, CloseReason::Logout, true), (2, CloseReason::Kicked, true), (3, CloseReason::TokenExpired, true)]
    );
    h.stop.cancel();
}

/// One tick as the ticker makes it, driven by hand: advance, expire sessions, then graces.
fn tick(reg: &Registry, to: u64) {
    reg.advance(to);
    let mut out = Vec::new();
    for shard in 0..reg.shard_count() {
        reg.expire_chunk(shard, usize::MAX, &mut out);
    }
    reg.finish_expired(&out);
    out.clear();
    for shard in 0..reg.grace_shard_count() {
        reg.expire_graces(shard, usize::MAX, &mut out);
    }
    reg.finish_graces(&out);
}

#[derive(Debug, Clone)]
enum Op {
    Login {
        uid: u8,
        device: u8,
    },
    /// The picked session ends: chosen (a logout, never graced) or abrupt (a disconnect).
    Leave(u8, bool),
    Kick(u8),
    Tick,
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        3 => (0..3u8, 0..3u8).prop_map(|(uid, device)| Op::Login { uid, device }),
        2 => (any::<u8>(), any::<bool>()).prop_map(|(pick, chosen)| Op::Leave(pick, chosen)),
        1 => (0..3u8).prop_map(Op::Kick),
        4 => Just(Op::Tick),
    ]
}

proptest::proptest! {
    /// The registry with a grace against a plain model: a uid is in its grace exactly from
    /// the ending that left it no session until a login or `grace + 1` ticks later; and the
    /// log's user events alternate per uid, `user_online` first, never a `user_offline`
    /// while the uid holds a session, and end as the model does.
    #[test]
    fn graces_match_a_plain_model(
        grace in 1..4u64,
        max in 1..3usize,
        ops in proptest::collection::vec(op(), 1..150),
    ) {
        const WINDOW: u64 = 3;
        let config = Config::default();
        let metrics = Arc::new(Metrics::new(&config));
        let events = Arc::new(EventLog::new(1 << 20, 1 << 30, metrics.clone()));
        let from = events.last_id();
        // A clock the test never moves: the graces count on the ring's cursor.
        let clock = Clock::new(Instant::now(), Duration::from_secs(3600));
        let reg = Registry::with_devices(WINDOW, max, events, metrics).with_offline_grace(grace, clock);
        let mut live: Vec<(Arc<Session>, u64)> = Vec::new();
        let mut graced: std::collections::HashMap<u64, u64> = Default::default();
        let mut now = 0;
        let device = |d: u8| -> Device { if d == 0 { Device::DEFAULT } else { format!("d{d}").parse().unwrap() } };
        for op in ops {
            let before: Vec<u64> = live.iter().map(|(s, _)| s.uid()).collect();
            match op {
                Op::Login { uid, device: d } => {
                    let s = reg.login(u64::from(uid), device(d), now);
                    graced.remove(&u64::from(uid));
                    live.push((s, now));
                }
                Op::Leave(pick, chosen) if !live.is_empty() => {
                    let (s, _) = live[usize::from(pick) % live.len()].clone();
                    reg.leave(&s, if chosen { CloseReason::Logout } else { CloseReason::Disconnect });
                }
                Op::Kick(uid) => {
                    reg.kick(u64::from(uid), None);
                }
                Op::Tick => {
                    now += 1;
                    tick(&reg, now);
                    graced.retain(|_, &mut until| until > now);
                }
                _ => {}
            }
            live.retain(|(s, _)| s.is_live());
            // A logout or a kick ends a uid's presence at once: no grace.
            let chosen = matches!(op, Op::Leave(_, true) | Op::Kick(_));
            for uid in before {
                if !chosen && !live.iter().any(|(s, _)| s.uid() == uid) && !graced.contains_key(&uid) {
                    // Its last session just ended (an expiry's ending is on this tick's cursor).
                    graced.insert(uid, now + grace + 1);
                }
            }
            for uid in 0..3u64 {
                let held = live.iter().any(|(s, _)| s.uid() == uid);
                let want = !held && graced.contains_key(&uid);
                proptest::prop_assert_eq!(reg.grace_until_ms(uid).is_some(), want, "uid {} after {:?} at {}", uid, op, now);
            }
            proptest::prop_assert_eq!(reg.in_grace(), graced.len());
        }
        let mut user = std::collections::HashMap::<u64, bool>::new();
        let mut sessions = std::collections::HashMap::<u64, i64>::new();
        for e in reg.events().read(from).events {
            let on = user.entry(e.uid).or_default();
            let n = sessions.entry(e.uid).or_default();
            match e.what {
                What::Online { .. } => *n += 1,
                What::Offline { .. } => *n -= 1,
                What::UserOnline => {
                    proptest::prop_assert!(!*on, "user_online twice: {:?}", e);
                    *on = true;
                }
                What::UserOffline { .. } => {
                    proptest::prop_assert!(*on, "user_offline without user_online: {:?}", e);
                    proptest::prop_assert_eq!(*n, 0, "user_offline with a session: {:?}", e);
                    *on = false;
                }
                What::Data { .. } | What::Status { .. } => {}
            }
        }
        for uid in 0..3u64 {
            let want = live.iter().any(|(s, _)| s.uid() == uid) || graced.contains_key(&uid);
            proptest::prop_assert_eq!(user.get(&uid).copied().unwrap_or(false), want, "uid {} at the end", uid);
        }
    }
}

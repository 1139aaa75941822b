//! The ring against the usual ways to run idle timeouts, on identical workloads.
//!
//! Every structure sits behind [`Tracker`]: touch a uid at a tick (insert or move it), remove
//! it, sweep up to a tick. Workloads, at 100 k, 1 M and 10 M tracked uids:
//! - `login`: a new uid arrives;
//! - `touch_moves`: a uid touched on an earlier tick is touched again (it changes slot);
//! - `touch_same_tick`: a uid is touched again on the tick of its last touch;
//! - `tick_sweep`: one tick's sweep when 10 % of uids were touched and 1/30 fall due;
//! - `mass_sweep`: one sweep that expires a third of all uids.
//!
//! Besides criterion's timings, the bench prints bytes per tracked uid (a counting global
//! allocator) and, for the ring, the longest single chunk of a chunked mass sweep: the pause
//! the gateway's runtime sees. `IDLEGATE_BENCH_SIZES=100000,1000000` picks the sizes.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap};
use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use idlegate::bench::{Handle, Ring, Touch};
use tokio_util::time::{delay_queue, DelayQueue};

/// Timeout in ticks, as with the defaults (30 s / 1 s).
const WINDOW: u64 = 30;

/// Operations per timed batch of the per-uid workloads.
const BATCH: u64 = 10_000;

/// Chunk the gateway's ticker expires at a time (see `src/presence/ticker.rs`).
const SWEEP_CHUNK: usize = 4096;

// === counting allocator ===

#[path = "../examples/support/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::Counting;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

// === the interface ===

/// Idle tracking as the gateway needs it; `now` only moves forward.
trait Tracker {
    const NAME: &'static str;
    fn new() -> Self;
    /// Marks `uid` active on tick `now`: inserts it, or moves its deadline to `now + WINDOW`.
    fn touch(&mut self, uid: u64, now: u64);
    fn remove(&mut self, uid: u64);
    /// Expires every uid whose deadline is at or before `now` into `out`.
    fn sweep(&mut self, now: u64, out: &mut Vec<u64>);
    /// Bytes the structure needs kept *outside* it, per uid, which the gateway already has a
    /// place for: the ring's handles live in the sessions.
    fn outside_bytes(&self) -> usize {
        0
    }
}

/// The database-polling way: last activity per uid, everything scanned every tick.
struct FullScan {
    last: HashMap<u64, u64>,
}

impl Tracker for FullScan {
    const NAME: &'static str = "full_scan";
    fn new() -> Self {
        FullScan { last: HashMap::new() }
    }
    fn touch(&mut self, uid: u64, now: u64) {
        self.last.insert(uid, now);
    }
    fn remove(&mut self, uid: u64) {
        self.last.remove(&uid);
    }
    fn sweep(&mut self, now: u64, out: &mut Vec<u64>) {
        self.last.retain(|&uid, &mut t| {
            let due = t + WINDOW <= now;
            if due {
                out.push(uid);
            }
            !due
        });
    }
}

/// The Redis ZSET way: a sorted set of (deadline, uid) and a map to find a uid's entry.
struct SortedSet {
    by_deadline: BTreeSet<(u64, u64)>,
    deadline: HashMap<u64, u64>,
}

impl Tracker for SortedSet {
    const NAME: &'static str = "sorted_set";
    fn new() -> Self {
        SortedSet { by_deadline: BTreeSet::new(), deadline: HashMap::new() }
    }
    fn touch(&mut self, uid: u64, now: u64) {
        let deadline = now + WINDOW;
        if let Some(old) = self.deadline.insert(uid, deadline) {
            if old == deadline {
                return;
            }
            self.by_deadline.remove(&(old, uid));
        }
        self.by_deadline.insert((deadline, uid));
    }
    fn remove(&mut self, uid: u64) {
        if let Some(old) = self.deadline.remove(&uid) {
            self.by_deadline.remove(&(old, uid));
        }
    }
    fn sweep(&mut self, now: u64, out: &mut Vec<u64>) {
        while let Some(&(deadline, uid)) = self.by_deadline.first() {
            if deadline > now {
                break;
            }
            self.by_deadline.pop_first();
            self.deadline.remove(&uid);
            out.push(uid);
        }
    }
}

/// The DelayQueue / ScheduledExecutor way: a min-heap with lazy deletion (a touch pushes a
/// new entry; stale ones are skipped when they surface) and a map of current deadlines.
struct MinHeap {
    heap: BinaryHeap<Reverse<(u64, u64)>>,
    deadline: HashMap<u64, u64>,
}

impl Tracker for MinHeap {
    const NAME: &'static str = "min_heap";
    fn new() -> Self {
        MinHeap { heap: BinaryHeap::new(), deadline: HashMap::new() }
    }
    fn touch(&mut self, uid: u64, now: u64) {
        let deadline = now + WINDOW;
        if self.deadline.insert(uid, deadline) != Some(deadline) {
            self.heap.push(Reverse((deadline, uid)));
        }
    }
    fn remove(&mut self, uid: u64) {
        self.deadline.remove(&uid);
    }
    fn sweep(&mut self, now: u64, out: &mut Vec<u64>) {
        while let Some(&Reverse((deadline, uid))) = self.heap.peek() {
            if deadline > now {
                break;
            }
            self.heap.pop();
            if self.deadline.get(&uid) == Some(&deadline) {
                self.deadline.remove(&uid);
                out.push(uid);
            }
        }
    }
}

/// The hierarchical timing wheel: tokio-util's `DelayQueue` (tokio's own timer wheel inside),
/// `reset` on touch, driven with paused tokio time, one tick = one second.
struct Wheel {
    runtime: tokio::runtime::Runtime,
    queue: DelayQueue<u64>,
    keys: HashMap<u64, delay_queue::Key>,
    now: u64,
}

impl Tracker for Wheel {
    const NAME: &'static str = "timing_wheel";
    fn new() -> Self {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
        let queue = {
            let _rt = runtime.enter();
            DelayQueue::new()
        };
        Wheel { runtime, queue, keys: HashMap::new(), now: 0 }
    }
    fn touch(&mut self, uid: u64, now: u64) {
        self.advance_to(now);
        let _rt = self.runtime.enter();
        let timeout = Duration::from_secs(WINDOW);
        match self.keys.get(&uid) {
            Some(key) => self.queue.reset(key, timeout),
            None => {
                let key = self.queue.insert(uid, timeout);
                self.keys.insert(uid, key);
            }
        }
    }
    fn remove(&mut self, uid: u64) {
        if let Some(key) = self.keys.remove(&uid) {
            let _rt = self.runtime.enter();
            self.queue.remove(&key);
        }
    }
    fn sweep(&mut self, now: u64, out: &mut Vec<u64>) {
        self.advance_to(now);
        let (queue, keys) = (&mut self.queue, &mut self.keys);
        self.runtime.block_on(async {
            // As a server task would: take what is ready, let the timer driver fire the next
            // deadline (a yield, so paused time does not jump ahead), until a round finds
            // nothing more.
            loop {
                tokio::task::yield_now().await;
                let before = out.len();
                std::future::poll_fn(|cx| {
                    while let std::task::Poll::Ready(Some(expired)) = queue.poll_expired(cx) {
                        let uid = expired.into_inner();
                        keys.remove(&uid);
                        out.push(uid);
                    }
                    std::task::Poll::Ready(())
                })
                .await;
                if out.len() == before {
                    break;
                }
            }
        });
    }
}

impl Wheel {
    fn advance_to(&mut self, now: u64) {
        if now > self.now {
            let by = Duration::from_secs(now - self.now);
            self.runtime.block_on(tokio::time::advance(by));
            self.now = now;
        }
    }
}

/// idlegate's ring, as the ticker drives it: advance, then expire everything overdue.
///
/// The gateway finds a uid's handle in its session, which the connection holds; here client
/// `i`'s handle is `handles[i]`, and a uid leads back to its client by [`index_of`]: one
/// multiplication, no lookup.
struct SlotRing {
    ring: Ring,
    handles: Vec<Handle>,
}

impl SlotRing {
    fn handle(&mut self, uid: u64) -> &mut Handle {
        let i = index_of(uid) as usize;
        if i >= self.handles.len() {
            self.handles.resize(i + 1, Handle::NONE);
        }
        &mut self.handles[i]
    }
}

impl Tracker for SlotRing {
    const NAME: &'static str = "ring";
    fn new() -> Self {
        SlotRing { ring: Ring::new(WINDOW), handles: Vec::new() }
    }
    fn touch(&mut self, uid: u64, now: u64) {
        if now > self.ring.elapsed() {
            self.ring.advance(now);
        }
        let handle = *self.handle(uid);
        if self.ring.touch(handle, uid, now) == Touch::NotTracked {
            let fresh = self.ring.insert(uid, now);
            *self.handle(uid) = fresh;
        }
    }
    fn remove(&mut self, uid: u64) {
        let handle = std::mem::replace(self.handle(uid), Handle::NONE);
        self.ring.remove(handle, uid);
    }
    fn sweep(&mut self, now: u64, out: &mut Vec<u64>) {
        if now > self.ring.elapsed() {
            self.ring.advance(now);
        }
        self.ring.expire(usize::MAX, out);
    }
    fn outside_bytes(&self) -> usize {
        self.handles.capacity() * std::mem::size_of::<Handle>()
    }
}

// === workloads ===

/// A structure with `n` uids, and the tick it is at.
struct Loaded<T> {
    tracker: T,
    n: u64,
    now: u64,
    /// The order clients are touched in: shuffled, and not the order they logged in in
    /// (which `load` shuffles differently), as frames arrive in no order related to where a
    /// structure keeps its uids. Touched in login order, the ring's entries (allocated in
    /// login order) were walked in a few sequential streams the CPU prefetches, which
    /// flattered it 5 to 7 times in a first run.
    order: Vec<u64>,
}

/// 0..n in a fixed pseudo-random order picked by `seed` (Fisher-Yates over xorshift64*).
fn shuffled(n: u64, seed: u64) -> Vec<u64> {
    let mut order: Vec<u64> = (0..n).collect();
    let mut state = seed | 1;
    for k in (1..order.len()).rev() {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        let r = state.wrapping_mul(0x2545_F491_4F6C_DD1D);
        order.swap(k, (r % (k as u64 + 1)) as usize);
    }
    order
}

/// Spreads client numbers over the uid space: 2^64 / golden ratio, odd.
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// `GOLDEN`'s inverse modulo 2^64, so a uid leads back to its client number.
const GOLDEN_INVERSE: u64 = inverse(GOLDEN);

/// The inverse of an odd `a` modulo 2^64 by Newton's iteration: `a` is its own inverse to 3
/// bits, and each step doubles the correct bits (3, 6, 12, 24, 48, 96).
const fn inverse(a: u64) -> u64 {
    let mut x = a;
    let mut step = 0;
    while step < 5 {
        x = x.wrapping_mul(2u64.wrapping_sub(a.wrapping_mul(x)));
        step += 1;
    }
    x
}

/// Uids are spread so consecutive ones do not share cache lines in the maps.
fn uid(i: u64) -> u64 {
    i.wrapping_mul(GOLDEN)
}

/// The client number of a uid: `uid`'s inverse.
fn index_of(uid: u64) -> u64 {
    uid.wrapping_mul(GOLDEN_INVERSE)
}

/// Wall-clock time for the measurements: benchmarks measure real time, never paused time,
/// which is why the crate-wide ban on `std::time::Instant` does not apply here.
#[allow(clippy::disallowed_types, clippy::disallowed_methods)]
fn stopwatch() -> impl FnOnce() -> Duration {
    let start = std::time::Instant::now();
    move || start.elapsed()
}

/// Fills a tracker with `n` uids spread evenly over the window's deadlines, as a population
/// logging in over time would be; prints its bytes per uid.
fn load<T: Tracker>(n: u64) -> Loaded<T> {
    let logins = shuffled(n, 0x2545_F491_4F6C_DD1D);
    let order = shuffled(n, 0x9E37_79B9_7F4A_7C15);
    let before = Counting::live_bytes();
    let mut tracker = T::new();
    // (`logins` and `order` are the bench's, allocated before `before` is read.)
    for t in 0..WINDOW {
        for k in (t..n).step_by(WINDOW as usize) {
            tracker.touch(uid(logins[k as usize]), t);
        }
    }
    let outside = tracker.outside_bytes() as isize;
    let bytes = Counting::live_bytes() - before - outside;
    println!(
        "footprint {:<13} {:>9} uids: {:>6.1} bytes/uid (+{:.1} kept outside it)",
        T::NAME,
        n,
        bytes as f64 / n as f64,
        outside as f64 / n as f64
    );
    Loaded { tracker, n, now: WINDOW - 1, order }
}

/// One tick of the `tick_sweep` population: a tenth of the uids (the first tenth of the
/// order) is active and touched every tick; the rest is silent, expires a window after its last touch and logs in
/// again at once. In steady state 10 % are touched and 9/10 x 1/30 (1/33) expire per tick.
/// Returns the sweep's time and how many it expired.
fn active_tick<T: Tracker>(l: &mut Loaded<T>, out: &mut Vec<u64>) -> (Duration, usize) {
    l.now += 1;
    for &i in &l.order[..(l.n / 10) as usize] {
        l.tracker.touch(uid(i), l.now);
    }
    out.clear();
    let lap = stopwatch();
    l.tracker.sweep(l.now, out);
    let took = lap();
    for &u in out.iter() {
        l.tracker.touch(u, l.now);
    }
    (took, out.len())
}

/// Touches every uid on a new tick, so all deadlines are a full window out.
fn refresh_all<T: Tracker>(l: &mut Loaded<T>) {
    l.now += 1;
    for &i in &l.order {
        l.tracker.touch(uid(i), l.now);
    }
}

fn bench_all<T: Tracker>(c: &mut Criterion, n: u64) {
    let mut l = load::<T>(n);
    let id = BenchmarkId::new(T::NAME, n);
    let mut out = Vec::new();

    // Reach the steady state (stale heap entries included) before measuring.
    for _ in 0..WINDOW {
        active_tick(&mut l, &mut out);
    }
    c.benchmark_group("tick_sweep").sample_size(10).bench_function(id.clone(), |b| {
        b.iter_custom(|iters| {
            let mut took = Duration::ZERO;
            for _ in 0..iters {
                let (t, expired) = active_tick(&mut l, &mut out);
                assert!(expired as u64 >= n / 40, "{}: a tick expired only {expired}", T::NAME);
                took += t;
            }
            took
        })
    });

    c.benchmark_group("mass_sweep").sample_size(10).bench_function(id.clone(), |b| {
        b.iter_custom(|iters| {
            let mut took = Duration::ZERO;
            for _ in 0..iters {
                // A third touched on tick t, the rest WINDOW - 1 ticks later: on t + WINDOW
                // that third, and only it, falls due in a single sweep.
                l.now += 1;
                let t = l.now;
                for &i in l.order.iter().filter(|&&i| i % 3 == 0) {
                    l.tracker.touch(uid(i), t);
                }
                l.now = t + WINDOW - 1;
                for &i in l.order.iter().filter(|&&i| i % 3 != 0) {
                    l.tracker.touch(uid(i), l.now);
                }
                l.now = t + WINDOW;
                out.clear();
                let lap = stopwatch();
                l.tracker.sweep(l.now, &mut out);
                took += lap();
                assert_eq!(out.len() as u64, n.div_ceil(3), "{}: mass sweep", T::NAME);
                for &u in &out {
                    l.tracker.touch(u, l.now);
                }
            }
            took
        })
    });

    c.benchmark_group("login").bench_function(id.clone(), |b| {
        b.iter_custom(|iters| {
            let fresh = (0..iters).map(|i| uid(n + i)).collect::<Vec<_>>();
            let lap = stopwatch();
            for &u in &fresh {
                l.tracker.touch(black_box(u), l.now);
            }
            let took = lap();
            for &u in &fresh {
                l.tracker.remove(u);
            }
            took
        })
    });

    // Round robin over all uids, one tick per full pass: every touch finds its uid filed one
    // tick earlier, so it changes slot, and nothing ever falls due.
    refresh_all(&mut l);
    let mut cursor = 0;
    c.benchmark_group("touch_moves").bench_function(id.clone(), |b| {
        b.iter_custom(|iters| {
            let lap = stopwatch();
            for _ in 0..iters {
                if cursor == 0 {
                    l.now += 1;
                }
                l.tracker.touch(black_box(uid(l.order[cursor as usize])), l.now);
                cursor = (cursor + 1) % n;
            }
            lap()
        })
    });

    refresh_all(&mut l);
    let batch = BATCH.min(n);
    c.benchmark_group("touch_same_tick").bench_function(id, |b| {
        b.iter_custom(|iters| {
            let lap = stopwatch();
            for k in 0..iters {
                l.tracker.touch(black_box(uid(k % batch)), l.now);
            }
            lap()
        })
    });
}

/// The pause a mass sweep costs the gateway's runtime: the ring expires in chunks of
/// [`SWEEP_CHUNK`] and yields between them; prints the longest chunk.
fn ring_chunk_pause(n: u64) {
    assert_eq!(index_of(uid(12_345)), 12_345, "GOLDEN_INVERSE inverts GOLDEN");
    // Logged in in one order, then touched in another, so the expiring third's entries lie
    // scattered, as they do after a while in a gateway: all touched on tick 1, and all but
    // that third again on tick 2; on tick 1 + WINDOW the third falls due.
    let mut ring = Ring::new(WINDOW);
    let mut handles = vec![Handle::NONE; n as usize];
    for i in shuffled(n, 1) {
        handles[i as usize] = ring.insert(uid(i), 0);
    }
    let order = shuffled(n, 2);
    ring.advance(1);
    for &i in &order {
        ring.touch(handles[i as usize], uid(i), 1);
    }
    ring.advance(2);
    for &i in order.iter().filter(|&&i| i % 3 != 0) {
        ring.touch(handles[i as usize], uid(i), 2);
    }
    ring.advance(1 + WINDOW);
    let mut out = Vec::with_capacity(SWEEP_CHUNK);
    let (mut longest, mut total, mut chunks) = (Duration::ZERO, Duration::ZERO, 0);
    loop {
        out.clear();
        let lap = stopwatch();
        let taken = ring.expire(SWEEP_CHUNK, &mut out);
        let took = lap();
        if taken == 0 {
            break;
        }
        longest = longest.max(took);
        total += took;
        chunks += 1;
    }
    println!(
        "mass sweep of {} uids in {chunks} chunks of {SWEEP_CHUNK}: total {total:?}, longest chunk {longest:?} ({:.1} ns/uid)",
        n.div_ceil(3),
        total.as_nanos() as f64 / n.div_ceil(3) as f64
    );
}

fn sizes() -> Vec<u64> {
    std::env::var("IDLEGATE_BENCH_SIZES")
        .ok()
        .map(|s| s.split(',').filter_map(|v| v.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![100_000, 1_000_000, 10_000_000])
}

/// Which structures to run: `IDLEGATE_BENCH_TRACKERS=ring,full_scan` picks some (all by
/// default).
fn wanted(name: &str) -> bool {
    std::env::var("IDLEGATE_BENCH_TRACKERS").map_or(true, |list| list.split(',').any(|w| w.trim() == name))
}

fn benches(c: &mut Criterion) {
    for n in sizes() {
        if wanted(SlotRing::NAME) {
            bench_all::<SlotRing>(c, n);
            ring_chunk_pause(n);
        }
        if wanted(MinHeap::NAME) {
            bench_all::<MinHeap>(c, n);
        }
        if wanted(SortedSet::NAME) {
            bench_all::<SortedSet>(c, n);
        }
        if wanted(Wheel::NAME) {
            bench_all::<Wheel>(c, n);
        }
        if wanted(FullScan::NAME) {
            bench_all::<FullScan>(c, n);
        }
    }
}

criterion_group! {
    name = ring;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    targets = benches
}
criterion_main!(ring);

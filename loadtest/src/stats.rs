//! What the clients observe, shared by all of them: atomic counters for the hot events and
//! HDR histograms behind one lock for latencies (a few thousand records a second at most).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use hdrhistogram::serialization::{Deserializer, Serializer, V2DeflateSerializer};
use hdrhistogram::Histogram;
use idlegate_proto::CloseReason;
use serde::{Deserialize, Serialize};

/// Highest latency the histograms record, in microseconds: ten minutes; anything longer is
/// clamped, and a run that sees it has bigger problems.
const MAX_RECORDED_US: u64 = 600_000_000;

/// Close kinds the harness counts: the gateway's reasons plus a refused or failed connect.
pub const CLOSE_KINDS: usize = CloseReason::ALL.len();

/// Counters and histograms of one run.
#[derive(Debug)]
pub struct Stats {
    pub connected: AtomicU64,
    pub connect_errors: AtomicU64,
    pub logged_in: AtomicU64,
    /// When the latest login completed, in nanoseconds since the run began.
    pub last_login_nanos: AtomicU64,
    /// Logged in and not yet closed, by the harness's own count.
    pub online: AtomicI64,
    pub pings_sent: AtomicU64,
    pub pongs_received: AtomicU64,
    pub data_sent: AtomicU64,
    /// Active clients that got BYE(idle_timeout).
    pub false_offline: AtomicU64,
    /// Silent clients not expired within `timeout + tick + --missed-grace` of their last frame.
    pub missed_offline: AtomicU64,
    /// Silent clients expired after `timeout - tick` or less of silence.
    pub early_offline: AtomicU64,
    /// Silent clients expired after more than `timeout` + tolerance of silence.
    pub late_offline: AtomicU64,
    /// Silent clients expired inside the window.
    pub expired_in_window: AtomicU64,
    /// Sessions ended by a second login of their uid (`--churn`).
    pub kicks: AtomicU64,
    /// Reconnects after being sent away or cut off (`--reconnect`).
    pub reconnects: AtomicU64,
    /// Connects refused while reconnecting (the gateway restarting).
    pub connect_retries: AtomicU64,
    /// When the latest re-login completed, and when the first session was cut off, in
    /// nanoseconds since the run began.
    pub last_relogin_nanos: AtomicU64,
    pub first_cutoff_nanos: AtomicU64,
    /// BYE(shutdown)s received, and the first and last of them, in nanoseconds since the
    /// run began (`u64::MAX` and 0 before any).
    pub shutdown_byes: AtomicU64,
    pub first_shutdown_nanos: AtomicU64,
    pub last_shutdown_nanos: AtomicU64,
    /// Silent clients not resolved yet (no BYE, not missed, not failed).
    pub silent_pending: AtomicI64,
    /// Closes nobody asked for, by reason index (`CloseReason::index`).
    pub unexpected: [AtomicU64; CLOSE_KINDS],
    /// Every close by reason, expected or not.
    pub closes: [AtomicU64; CLOSE_KINDS],
    hists: Mutex<Hists>,
    /// Per timeout granted (ms): its class's counts. Touched once per login and expiry.
    classes: Mutex<BTreeMap<u64, ClassReport>>,
    /// When each reconnect attempt began, in milliseconds since the run began.
    reconnect_attempts_ms: Mutex<Vec<u64>>,
    /// The first error that makes the run meaningless (auth refused, protocol broken).
    pub fatal: Mutex<Option<String>>,
}

#[derive(Debug)]
struct Hists {
    login_us: Histogram<u64>,
    rtt_us: Histogram<u64>,
    rtt_window_us: Histogram<u64>,
    silence_us: Histogram<u64>,
    push_us: Histogram<u64>,
    relogin_us: Histogram<u64>,
}

/// Percentiles of a histogram, in milliseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct Percentiles {
    pub count: u64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub min: f64,
}

impl Percentiles {
    pub fn of(h: &Histogram<u64>) -> Percentiles {
        let ms = |us: u64| us as f64 / 1000.0;
        if h.is_empty() {
            return Percentiles::default();
        }
        Percentiles {
            count: h.len(),
            p50: ms(h.value_at_quantile(0.5)),
            p90: ms(h.value_at_quantile(0.9)),
            p99: ms(h.value_at_quantile(0.99)),
            p999: ms(h.value_at_quantile(0.999)),
            max: ms(h.max()),
            min: ms(h.min()),
        }
    }
}

/// One timeout class of a run with `--timeouts`: the timeout WELCOME granted, its window,
/// and how its silent clients were expired.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ClassReport {
    pub timeout_ms: f64,
    pub tick_ms: f64,
    /// Offline after more than the first and at most the second (the late tolerance on top).
    pub window_ms: (f64, f64),
    pub logins: u64,
    pub expired_in_window: u64,
    pub early: u64,
    pub late: u64,
    pub missed: u64,
    /// The shortest and longest silence before an expiry, over the class's silent clients.
    pub silence_min_ms: Option<f64>,
    pub silence_max_ms: Option<f64>,
}

impl ClassReport {
    /// Adds `other`'s counts (the same class, from another process of a shared run).
    pub fn add(&mut self, other: &ClassReport) {
        self.logins += other.logins;
        self.expired_in_window += other.expired_in_window;
        self.early += other.early;
        self.late += other.late;
        self.missed += other.missed;
        let pick = |a: Option<f64>, b: Option<f64>, f: fn(f64, f64) -> f64| match (a, b) {
            (Some(a), Some(b)) => Some(f(a, b)),
            (a, b) => a.or(b),
        };
        self.silence_min_ms = pick(self.silence_min_ms, other.silence_min_ms, f64::min);
        self.silence_max_ms = pick(self.silence_max_ms, other.silence_max_ms, f64::max);
    }
}

/// Significant figures the histograms keep: 4 resolves a 30 s silence to about 2 ms, fine
/// enough to see an expiry 50 ms late.
const SIGNIFICANT_FIGURES: u8 = 4;

/// The latency histograms themselves (HdrHistogram's V2 format, deflated, in base64), so the
/// reports of processes that shared one run merge into exact percentiles, not averages of
/// percentiles.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Histograms {
    pub login: String,
    pub rtt: String,
    pub silence: String,
    pub push: String,
    pub relogin: String,
}

// === impl Histograms ===

impl Histograms {
    fn encode(h: &Histogram<u64>) -> String {
        let mut bytes = Vec::new();
        V2DeflateSerializer::new().serialize(h, &mut bytes).expect("a histogram serializes into memory");
        BASE64.encode(bytes)
    }

    /// Decodes one histogram of a report; an empty string (a report without it) is empty.
    pub fn decode(text: &str) -> Result<Histogram<u64>, String> {
        if text.is_empty() {
            return Ok(histogram());
        }
        let bytes = BASE64.decode(text).map_err(|e| format!("not base64: {e}"))?;
        Deserializer::new().deserialize(&mut bytes.as_slice()).map_err(|e| format!("not a histogram: {e:?}"))
    }
}

/// An empty histogram with the harness's bounds.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_RECORDED_US, SIGNIFICANT_FIGURES).expect("valid histogram bounds")
}

fn micros(d: Duration) -> u64 {
    (d.as_micros() as u64).clamp(1, MAX_RECORDED_US)
}

// === impl Stats ===

impl Stats {
    pub fn new(silent: u64) -> Stats {
        Stats {
            connected: AtomicU64::new(0),
            connect_errors: AtomicU64::new(0),
            logged_in: AtomicU64::new(0),
            last_login_nanos: AtomicU64::new(0),
            online: AtomicI64::new(0),
            pings_sent: AtomicU64::new(0),
            pongs_received: AtomicU64::new(0),
            data_sent: AtomicU64::new(0),
            false_offline: AtomicU64::new(0),
            missed_offline: AtomicU64::new(0),
            early_offline: AtomicU64::new(0),
            late_offline: AtomicU64::new(0),
            expired_in_window: AtomicU64::new(0),
            kicks: AtomicU64::new(0),
            reconnects: AtomicU64::new(0),
            connect_retries: AtomicU64::new(0),
            last_relogin_nanos: AtomicU64::new(0),
            first_cutoff_nanos: AtomicU64::new(u64::MAX),
            shutdown_byes: AtomicU64::new(0),
            first_shutdown_nanos: AtomicU64::new(u64::MAX),
            last_shutdown_nanos: AtomicU64::new(0),
            silent_pending: AtomicI64::new(silent as i64),
            unexpected: Default::default(),
            closes: Default::default(),
            hists: Mutex::new(Hists {
                login_us: histogram(),
                rtt_us: histogram(),
                rtt_window_us: histogram(),
                silence_us: histogram(),
                push_us: histogram(),
                relogin_us: histogram(),
            }),
            classes: Mutex::new(BTreeMap::new()),
            reconnect_attempts_ms: Mutex::new(Vec::new()),
            fatal: Mutex::new(None),
        }
    }

    /// A reconnect attempt (a connect after a session was cut off) began `at` into the run.
    pub fn record_reconnect_attempt(&self, at: Duration) {
        let mut attempts = self.reconnect_attempts_ms.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        attempts.push(at.as_millis() as u64);
    }

    /// Reconnect attempts per `bucket` from `start` on (nanoseconds since the run began),
    /// up to the last bucket with one.
    pub fn reconnect_histogram(&self, start_nanos: u64, bucket: Duration) -> Vec<u64> {
        let attempts = self.reconnect_attempts_ms.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (start_ms, bucket_ms) = (start_nanos / 1_000_000, bucket.as_millis().max(1) as u64);
        let mut counts = Vec::new();
        for &at in attempts.iter() {
            let i = (at.saturating_sub(start_ms) / bucket_ms) as usize;
            if counts.len() <= i {
                counts.resize(i + 1, 0);
            }
            counts[i] += 1;
        }
        counts
    }

    fn hists(&self) -> std::sync::MutexGuard<'_, Hists> {
        self.hists.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn record_login(&self, took: Duration) {
        self.hists().login_us.saturating_record(micros(took));
    }

    pub fn record_rtt(&self, took: Duration) {
        let mut h = self.hists();
        h.rtt_us.saturating_record(micros(took));
        h.rtt_window_us.saturating_record(micros(took));
    }

    /// Cut off (BYE or dropped) to logged in again, with the retry wait in between.
    pub fn record_relogin(&self, took: Duration) {
        self.hists().relogin_us.saturating_record(micros(took));
    }

    pub fn relogin(&self) -> Percentiles {
        Percentiles::of(&self.hists().relogin_us)
    }

    /// A BYE(shutdown) received `at` into the run.
    pub fn record_shutdown_bye(&self, at: Duration) {
        let nanos = at.as_nanos() as u64;
        self.shutdown_byes.fetch_add(1, Ordering::Relaxed);
        self.first_shutdown_nanos.fetch_min(nanos, Ordering::Relaxed);
        self.last_shutdown_nanos.fetch_max(nanos, Ordering::Relaxed);
    }

    /// API call to client receipt of one push.
    pub fn record_push(&self, took: Duration) {
        self.hists().push_us.saturating_record(micros(took));
    }

    pub fn push(&self) -> Percentiles {
        Percentiles::of(&self.hists().push_us)
    }

    /// A WELCOME granted `timeout` in steps of `tick`: one more login of that class, whose
    /// expiries count as late past `timeout + late`.
    pub fn record_granted(&self, timeout: Duration, tick: Duration, late: Duration) {
        let mut classes = self.classes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let class = classes.entry(timeout.as_millis() as u64).or_insert_with(|| ClassReport {
            timeout_ms: timeout.as_secs_f64() * 1e3,
            tick_ms: tick.as_secs_f64() * 1e3,
            window_ms: (timeout.saturating_sub(tick).as_secs_f64() * 1e3, (timeout + late).as_secs_f64() * 1e3),
            ..ClassReport::default()
        });
        class.logins += 1;
    }

    /// Updates the class of `timeout` (granted before, so it is there).
    pub fn record_class(&self, timeout: Duration, update: impl FnOnce(&mut ClassReport)) {
        let mut classes = self.classes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(class) = classes.get_mut(&(timeout.as_millis() as u64)) {
            update(class);
        }
    }

    /// The longest timeout any WELCOME granted, and its tick.
    pub fn longest_granted(&self) -> Option<(Duration, Duration)> {
        let classes = self.classes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        classes.last_key_value().map(|(&ms, c)| (Duration::from_millis(ms), Duration::from_secs_f64(c.tick_ms / 1e3)))
    }

    /// Every class granted, shortest timeout first.
    pub fn classes(&self) -> Vec<ClassReport> {
        self.classes.lock().unwrap_or_else(std::sync::PoisonError::into_inner).values().cloned().collect()
    }

    pub fn record_silence(&self, silence: Duration) {
        self.hists().silence_us.saturating_record(micros(silence));
    }

    /// Counts a close; `expected` says whether the client's role called for it.
    pub fn record_close(&self, reason: CloseReason, expected: bool) {
        self.closes[reason.index()].fetch_add(1, Ordering::Relaxed);
        if !expected {
            self.unexpected[reason.index()].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Remembers the first fatal error; later ones are consequences.
    pub fn set_fatal(&self, message: String) {
        let mut fatal = self.fatal.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        fatal.get_or_insert(message);
    }

    pub fn fatal(&self) -> Option<String> {
        self.fatal.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    pub fn login(&self) -> Percentiles {
        Percentiles::of(&self.hists().login_us)
    }

    pub fn rtt(&self) -> Percentiles {
        Percentiles::of(&self.hists().rtt_us)
    }

    pub fn silence(&self) -> Percentiles {
        Percentiles::of(&self.hists().silence_us)
    }

    /// Round-trip percentiles since the last call, for the per-second progress line.
    pub fn take_rtt_window(&self) -> Percentiles {
        let mut h = self.hists();
        let p = Percentiles::of(&h.rtt_window_us);
        h.rtt_window_us.reset();
        p
    }

    /// Silence histogram as (lower bound ms, count) buckets of `width_ms`, for the plot.
    pub fn silence_buckets(&self, width_ms: u64) -> Vec<(u64, u64)> {
        buckets(&self.hists().silence_us, width_ms)
    }

    /// Every latency histogram, for the report.
    pub fn histograms(&self) -> Histograms {
        let h = self.hists();
        Histograms {
            login: Histograms::encode(&h.login_us),
            rtt: Histograms::encode(&h.rtt_us),
            silence: Histograms::encode(&h.silence_us),
            push: Histograms::encode(&h.push_us),
            relogin: Histograms::encode(&h.relogin_us),
        }
    }

    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    /// Unexpected closes by reason label, only the reasons that happened.
    pub fn unexpected_by_reason(&self) -> std::collections::BTreeMap<String, u64> {
        by_reason(&self.unexpected)
    }

    /// All closes by reason label, only the reasons that happened.
    pub fn closes_by_reason(&self) -> std::collections::BTreeMap<String, u64> {
        by_reason(&self.closes)
    }
}

/// A histogram of microseconds as (lower bound ms, count) buckets of `width_ms`.
pub fn buckets(h: &Histogram<u64>, width_ms: u64) -> Vec<(u64, u64)> {
    let mut buckets = std::collections::BTreeMap::new();
    for v in h.iter_recorded() {
        let ms = v.value_iterated_to() / 1000;
        *buckets.entry(ms / width_ms * width_ms).or_insert(0) += v.count_at_value();
    }
    buckets.into_iter().collect()
}

/// Non-zero per-reason counters, keyed by the reason's label.
fn by_reason(counters: &[AtomicU64; CLOSE_KINDS]) -> std::collections::BTreeMap<String, u64> {
    CloseReason::ALL
        .iter()
        .map(|r| (r.label().to_string(), Stats::get(&counters[r.index()])))
        .filter(|(_, n)| *n > 0)
        .collect()
}

//! The run's results: the JSON report, the summary table, and the verdict of `--check`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::args::Protocol;
use crate::stats::{ClassReport, Histograms, Percentiles};

/// Serde's default for a report from before `--devices`.
fn one() -> u64 {
    1
}

/// One point of the online-users timeline.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Sample {
    /// Seconds since the run started.
    pub t: f64,
    /// Wall-clock time of the sample, in milliseconds since the Unix epoch: the clock that
    /// lines up the timelines of processes that shared a run.
    #[serde(default)]
    pub unix_ms: u64,
    /// Logged in and not closed, by the harness's count.
    pub harness_online: i64,
    /// The gateway's `idlegate_online_users`, when it could be read.
    pub gateway_online: Option<f64>,
    /// Round-trip p99 of the PONGs received in the second before this sample.
    pub rtt_p99_ms: f64,
    /// The gateway's resident memory and open descriptors, when they could be read.
    pub gateway_rss_bytes: Option<f64>,
    pub gateway_open_fds: Option<f64>,
}

/// Everything a run measured; written by `--report`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub protocol: Protocol,
    pub connections: u64,
    pub silent_clients: u64,
    pub logins_ok: u64,
    pub connect_errors: u64,
    pub connect_rate_per_s: f64,
    pub duration_s: f64,
    /// Timeout and tick the server announced, and the window they promise.
    pub timeout_ms: Option<f64>,
    pub tick_ms: Option<f64>,
    pub window_ms: Option<(f64, f64)>,
    pub login_ms: Percentiles,
    pub rtt_ms: Percentiles,
    pub silence_ms: Percentiles,
    /// Per timeout granted, with `--timeouts` (by timeout, shortest first).
    #[serde(default)]
    pub classes: Vec<ClassReport>,
    /// Silence histogram: (bucket start ms, clients), buckets `silence_bucket_ms` wide.
    pub silence_histogram: Vec<(u64, u64)>,
    pub silence_bucket_ms: u64,
    pub pings_sent: u64,
    pub pongs_received: u64,
    pub data_sent: u64,
    pub false_offline: u64,
    pub missed_offline: u64,
    pub early_offline: u64,
    pub late_offline: u64,
    pub expired_in_window: u64,
    pub unexpected_closes: BTreeMap<String, u64>,
    pub closes: BTreeMap<String, u64>,
    pub harness_online_at_end: i64,
    /// The gateways' summed online gauge, read at the end while every client of the run
    /// was still connected.
    pub gateway_online_at_end: Option<f64>,
    /// `--shared-dir`: processes in the run, and their clients online at the end, summed
    /// (what the gateways' count is checked against).
    #[serde(default)]
    pub shared_processes: Option<u32>,
    #[serde(default)]
    pub run_online_at_end: Option<i64>,
    pub gateway_rss_bytes_at_start: Option<f64>,
    pub gateway_rss_bytes: Option<f64>,
    /// (resident memory at steady state - at start) / connections.
    pub gateway_rss_bytes_per_connection: Option<f64>,
    /// CPU the gateway used from the run's start to its end.
    pub gateway_cpu_seconds: Option<f64>,
    /// API call to client receipt of each push.
    pub push_ms: Percentiles,
    /// Pushes the API answered `sent`, `offline`, or failed; pushes clients received.
    pub pushes_sent: u64,
    pub pushes_offline: u64,
    pub push_errors: u64,
    pub pushes_received: u64,
    /// Sessions the API said the sent pushes reached: with `--devices`, every online device
    /// of the uid; each must receive it.
    #[serde(default)]
    pub push_deliveries: u64,
    /// Answered `sent` but never received by the client (which stayed connected until it
    /// got its BYE or the run ended: the gateway writes queued pushes before any BYE).
    pub pushes_lost: u64,
    /// Pushes received that were not sent to that client, or answered `offline`.
    pub pushes_unexpected: u64,
    /// Events the consumer read (with `--follow-events`), events the stream said it missed,
    /// and clients whose events did not match what they did.
    pub events_seen: Option<u64>,
    pub events_missed: u64,
    pub event_mismatches: u64,
    /// Offline events with reason `node_lost` (with `--node-loss`).
    pub events_node_lost: u64,
    /// `user_online` and `user_offline` events read (each checked; a wrong one is a
    /// mismatch).
    #[serde(default)]
    pub user_events: u64,
    /// Clients per uid (`--devices`).
    #[serde(default = "one")]
    pub devices: u64,
    /// A few of the mismatches, described.
    pub event_mismatch_examples: Vec<String>,
    /// With `--reconnect`: reconnects, refused connects while reconnecting, re-login latency
    /// (cut off to logged in again, the retry wait included), BYE(shutdown)s received and the
    /// time from the first to the last of them, and from the first to the last re-login.
    pub reconnects: u64,
    /// `--churn`: clients come and go on purpose, so not everyone is online at the end.
    pub churn: bool,
    pub connect_retries: u64,
    pub relogin_ms: Percentiles,
    pub shutdown_byes: u64,
    pub shutdown_spread_ms: Option<f64>,
    pub all_back_after_ms: Option<f64>,
    /// With `--reconnect`: the policy the clients followed, and their reconnect attempts per
    /// 100 ms from the first cut-off on (each process from its own).
    #[serde(default)]
    pub reconnect_policy: String,
    #[serde(default)]
    pub reconnect_attempts_per_100ms: Vec<u64>,
    /// Clients whose login the gateway shed (BYE(server_full)) more than once.
    #[serde(default)]
    pub clients_shed_twice: u64,
    /// Seconds in which the gateway's online gauge equalled the harness's count, of the
    /// seconds both were read, and the largest difference seen.
    pub online_equal_seconds: u64,
    pub online_compared_seconds: u64,
    pub online_max_difference: f64,
    /// Slope of the gateway's resident memory over the second half of the run (after the
    /// warm-up, in which the event log fills to its capacity), by least squares, in bytes
    /// per minute.
    pub rss_slope_bytes_per_min: Option<f64>,
    /// The gateway's open descriptors before the run and after its clients closed.
    pub gateway_fds_at_start: Option<f64>,
    pub gateway_fds_at_end: Option<f64>,
    /// `--check-fds`: descriptors back to the start are part of a clean run.
    pub check_fds: bool,
    /// A reason the run could not be meaningful (login refused, server unreachable).
    pub fatal: Option<String>,
    pub interrupted: bool,
    pub timeline: Vec<Sample>,
    /// What `--check` found wrong; empty on a clean run.
    pub failures: Vec<String>,
    /// The latency histograms, for merging the reports of a shared run.
    #[serde(default)]
    pub histograms: Histograms,
}

/// Descriptors the gateway may hold after a run beyond what it held before: the harness's
/// own pooled HTTP connections to the admin endpoint and the API.
const FD_TOLERANCE: f64 = 8.0;

/// Silence-histogram bars across the guarantee's window.
const BARS_PER_WINDOW: f64 = 50.0;

// === impl Report ===

impl Report {
    /// A report with nothing measured yet.
    pub fn new(protocol: Protocol, connections: u64, silent_clients: u64) -> Report {
        Report {
            protocol,
            connections,
            silent_clients,
            logins_ok: 0,
            connect_errors: 0,
            connect_rate_per_s: 0.0,
            duration_s: 0.0,
            timeout_ms: None,
            tick_ms: None,
            window_ms: None,
            login_ms: Default::default(),
            rtt_ms: Default::default(),
            silence_ms: Default::default(),
            classes: Vec::new(),
            silence_histogram: Vec::new(),
            silence_bucket_ms: 0,
            pings_sent: 0,
            pongs_received: 0,
            data_sent: 0,
            false_offline: 0,
            missed_offline: 0,
            early_offline: 0,
            late_offline: 0,
            expired_in_window: 0,
            unexpected_closes: Default::default(),
            closes: Default::default(),
            harness_online_at_end: 0,
            gateway_online_at_end: None,
            gateway_rss_bytes_at_start: None,
            gateway_rss_bytes: None,
            gateway_rss_bytes_per_connection: None,
            gateway_cpu_seconds: None,
            push_ms: Default::default(),
            pushes_sent: 0,
            pushes_offline: 0,
            push_errors: 0,
            pushes_received: 0,
            pushes_lost: 0,
            push_deliveries: 0,
            user_events: 0,
            devices: 1,
            pushes_unexpected: 0,
            events_seen: None,
            events_missed: 0,
            event_mismatches: 0,
            events_node_lost: 0,
            event_mismatch_examples: Vec::new(),
            online_equal_seconds: 0,
            online_compared_seconds: 0,
            online_max_difference: 0.0,
            rss_slope_bytes_per_min: None,
            gateway_fds_at_start: None,
            gateway_fds_at_end: None,
            check_fds: false,
            reconnects: 0,
            churn: false,
            connect_retries: 0,
            relogin_ms: Default::default(),
            shutdown_byes: 0,
            shutdown_spread_ms: None,
            all_back_after_ms: None,
            reconnect_policy: String::new(),
            reconnect_attempts_per_100ms: Vec::new(),
            clients_shed_twice: 0,
            fatal: None,
            interrupted: false,
            timeline: Vec::new(),
            failures: Vec::new(),
            shared_processes: None,
            run_online_at_end: None,
            histograms: Default::default(),
        }
    }

    /// The silence bucket width that gives about [`BARS_PER_WINDOW`] bars across the window.
    pub fn bucket_width_ms(window_ms: Option<(f64, f64)>) -> u64 {
        window_ms.map_or(100, |(lo, hi)| (((hi - lo) / BARS_PER_WINDOW) as u64).max(1))
    }

    /// Derives the online comparison and the memory slope from the timeline. `compare_online`
    /// is false for one process of a shared run: the gateways also count the other
    /// processes' clients, so only the merged timeline can be compared.
    pub fn summarize_timeline(&mut self, compare_online: bool) {
        let compared: Vec<f64> = self
            .timeline
            .iter()
            .filter(|_| compare_online)
            .filter_map(|s| s.gateway_online.map(|g| (g - s.harness_online as f64).abs()))
            .collect();
        self.online_compared_seconds = compared.len() as u64;
        self.online_equal_seconds = compared.iter().filter(|&&d| d == 0.0).count() as u64;
        self.online_max_difference = compared.iter().copied().fold(0.0, f64::max);
        let warm = self.duration_s / 2.0;
        let points: Vec<(f64, f64)> =
            self.timeline.iter().filter(|s| s.t >= warm).filter_map(|s| Some((s.t, s.gateway_rss_bytes?))).collect();
        if points.len() >= 10 {
            let n = points.len() as f64;
            let (mt, mr) = (points.iter().map(|p| p.0).sum::<f64>() / n, points.iter().map(|p| p.1).sum::<f64>() / n);
            let cov: f64 = points.iter().map(|p| (p.0 - mt) * (p.1 - mr)).sum();
            let var: f64 = points.iter().map(|p| (p.0 - mt).powi(2)).sum();
            if var > 0.0 {
                self.rss_slope_bytes_per_min = Some(cov / var * 60.0);
            }
        }
    }

    /// Fills `failures` with every way the run was not clean.
    pub fn judge(&mut self) {
        let mut f = Vec::new();
        if let Some(fatal) = &self.fatal {
            f.push(format!("fatal: {fatal}"));
        }
        if self.interrupted {
            f.push("the run was interrupted".into());
        }
        if self.logins_ok < self.connections {
            f.push(format!("{} of {} clients never logged in", self.connections - self.logins_ok, self.connections));
        }
        for (name, n) in [
            ("false_offline", self.false_offline),
            ("missed_offline", self.missed_offline),
            ("early_offline", self.early_offline),
            ("late_offline", self.late_offline),
        ] {
            if n > 0 {
                f.push(format!("{name} = {n}"));
            }
        }
        for (name, n) in [
            ("pushes_lost", self.pushes_lost),
            ("pushes_unexpected", self.pushes_unexpected),
            ("push_errors", self.push_errors),
            ("events_missed", self.events_missed),
            ("event_mismatches", self.event_mismatches),
            ("clients_shed_twice", self.clients_shed_twice),
        ] {
            if n > 0 {
                f.push(format!("{name} = {n}"));
            }
        }
        if let (true, Some(start), Some(end)) = (self.check_fds, self.gateway_fds_at_start, self.gateway_fds_at_end) {
            if end > start + FD_TOLERANCE {
                f.push(format!("the gateway holds {end} descriptors after the run, {start} before it"));
            }
        }
        let should_be_back = self.connections - self.silent_clients;
        if self.reconnects > 0
            && !self.churn
            && !self.interrupted
            && (self.harness_online_at_end as u64) < should_be_back
        {
            f.push(format!(
                "{} of {should_be_back} clients that should be online were not back at the end",
                should_be_back - self.harness_online_at_end.max(0) as u64
            ));
        }
        for example in &self.event_mismatch_examples {
            f.push(format!("event mismatch: {example}"));
        }
        for (reason, n) in &self.unexpected_closes {
            f.push(format!("{n} unexpected close(s) with reason {reason}"));
        }
        let harness = self.run_online_at_end.unwrap_or(self.harness_online_at_end);
        match self.gateway_online_at_end {
            Some(g) if g != harness as f64 => {
                f.push(format!("the gateways report {g} online at the end, the harness counts {harness}"))
            }
            _ => {}
        }
        self.failures = f;
    }

    /// The human summary printed at the end of a run.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let opt = |v: Option<f64>, unit: &str| v.map_or("-".to_string(), |v| format!("{v:.0}{unit}"));
        let _ = writeln!(s, "\n== loadtest summary ({:?}, {:.1} s)", self.protocol, self.duration_s);
        let _ = writeln!(
            s,
            "clients      {} ({} silent), logged in {}, connect errors {}, {:.0} logins/s",
            self.connections, self.silent_clients, self.logins_ok, self.connect_errors, self.connect_rate_per_s
        );
        if self.classes.len() > 1 {
            let _ = writeln!(s, "guarantee    per timeout class granted, in the class rows below");
        } else if let (Some(t), Some(k), Some((lo, hi))) = (self.timeout_ms, self.tick_ms, self.window_ms) {
            let _ = writeln!(s, "guarantee    timeout {t:.0} ms, tick {k:.0} ms: offline after ({lo:.0}, {hi:.0}] ms");
        }
        let _ = writeln!(
            s,
            "{:<12} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "ms", "count", "p50", "p90", "p99", "p99.9", "max"
        );
        for (name, p) in [
            ("login", &self.login_ms),
            ("rtt", &self.rtt_ms),
            ("silence", &self.silence_ms),
            ("push", &self.push_ms),
            ("relogin", &self.relogin_ms),
        ] {
            if p.count == 0 && (name == "push" || name == "relogin") {
                continue;
            }
            let _ = writeln!(
                s,
                "{:<12} {:>8} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
                name, p.count, p.p50, p.p90, p.p99, p.p999, p.max
            );
        }
        let _ =
            writeln!(s, "frames       pings {} pongs {} data {}", self.pings_sent, self.pongs_received, self.data_sent);
        let _ = writeln!(
            s,
            "expiry       in window {}, false {}, missed {}, early {}, late {}",
            self.expired_in_window, self.false_offline, self.missed_offline, self.early_offline, self.late_offline
        );
        if self.classes.len() > 1 {
            for c in &self.classes {
                let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}"));
                let _ = writeln!(
                    s,
                    "class {:>7.0} ms  window ({:.0}, {:.0}] ms: logins {}, in window {}, missed {}, early {}, late {}, silence {}..{} ms",
                    c.timeout_ms,
                    c.window_ms.0,
                    c.window_ms.1,
                    c.logins,
                    c.expired_in_window,
                    c.missed,
                    c.early,
                    c.late,
                    ms(c.silence_min_ms),
                    ms(c.silence_max_ms)
                );
            }
        }
        if self.pushes_sent + self.pushes_offline + self.push_errors > 0 {
            let _ = writeln!(
                s,
                "pushes       sent {} (to {} sessions) received {} lost {} offline {} unexpected {} errors {}",
                self.pushes_sent,
                self.push_deliveries,
                self.pushes_received,
                self.pushes_lost,
                self.pushes_offline,
                self.pushes_unexpected,
                self.push_errors
            );
        }
        if self.reconnects > 0 || self.shutdown_byes > 0 {
            let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0} ms"));
            let _ = writeln!(
                s,
                "reconnect    {} reconnects, {} refused or reset connects; BYE(shutdown) {} over {}; all back {} after the first cut",
                self.reconnects,
                self.connect_retries,
                self.shutdown_byes,
                ms(self.shutdown_spread_ms),
                ms(self.all_back_after_ms)
            );
            let attempts = &self.reconnect_attempts_per_100ms;
            if let Some((peak_at, peak)) = attempts.iter().enumerate().max_by_key(|(_, n)| **n) {
                let _ = writeln!(
                    s,
                    "reconnect    policy {}: {} attempts over {:.1} s, at most {peak} in one 100 ms (at {:.1} s)",
                    self.reconnect_policy,
                    attempts.iter().sum::<u64>(),
                    attempts.len() as f64 / 10.0,
                    peak_at as f64 / 10.0
                );
            }
        }
        if self.online_compared_seconds > 0 {
            let _ = writeln!(
                s,
                "online       gateway gauge equal to the harness's count in {} of {} seconds, largest difference {:.0}",
                self.online_equal_seconds, self.online_compared_seconds, self.online_max_difference
            );
        }
        if let (true, Some(slope)) = (self.churn || self.check_fds, self.rss_slope_bytes_per_min) {
            let _ = writeln!(
                s,
                "soak         rss slope over the second half {slope:.0} B/min; open fds {} at start, {} at the end",
                opt(self.gateway_fds_at_start, ""),
                opt(self.gateway_fds_at_end, "")
            );
        }
        if let Some(seen) = self.events_seen {
            let _ = writeln!(
                s,
                "events       seen {seen} ({} user events), missed {}, mismatches {}, node_lost {}",
                self.user_events, self.events_missed, self.event_mismatches, self.events_node_lost
            );
        }
        let _ = writeln!(s, "closes       {:?}; unexpected {:?}", self.closes, self.unexpected_closes);
        let harness = match (self.run_online_at_end, self.shared_processes) {
            (Some(all), Some(n)) => format!("harness {} here, {all} in all {n} processes", self.harness_online_at_end),
            _ => format!("harness {}", self.harness_online_at_end),
        };
        let _ = writeln!(
            s,
            "gateway      online at end {} ({harness}), rss {} ({} per connection), cpu {}",
            opt(self.gateway_online_at_end, ""),
            opt(self.gateway_rss_bytes, " B"),
            opt(self.gateway_rss_bytes_per_connection, " B"),
            self.gateway_cpu_seconds.map_or("-".into(), |c| format!("{c:.2} s")),
        );
        if self.failures.is_empty() {
            let _ = writeln!(s, "result       clean");
        } else {
            let _ = writeln!(s, "result       NOT clean:");
            for f in &self.failures {
                let _ = writeln!(s, "  - {f}");
            }
        }
        s
    }
}

//! `loadtest --merge`: the reports of processes that shared one run (`--shared-dir`) become
//! one report, as if one process had run every client.
//!
//! Counters add up; latency percentiles come from the merged histograms the reports carry,
//! never from averaging percentiles; the timelines line up on the wall clock, second by
//! second, and only seconds every process sampled are kept, so the summed online count is
//! compared with the gateways' at the same moments. Gateway figures were read by every
//! process from the same gateways: memory takes the lowest start and the highest steady
//! reading, CPU the longest window.

use std::collections::BTreeMap;
use std::path::PathBuf;

use hdrhistogram::Histogram;

use crate::report::{Report, Sample};
use crate::stats::{self, ClassReport, Histograms, Percentiles};

/// Reads the reports and merges them; the error names the file.
pub fn merge(paths: &[PathBuf]) -> Result<Report, String> {
    let reports = paths
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).map_err(|e| format!("--merge {}: {e}", p.display()))?;
            serde_json::from_str::<Report>(&text)
                .map_err(|e| format!("--merge {}: not a loadtest report: {e}", p.display()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    combine(reports)
}

/// Merges reports already read.
pub fn combine(reports: Vec<Report>) -> Result<Report, String> {
    let Some(first) = reports.first() else {
        return Err("--merge: no reports".into());
    };
    // With timeout classes, each process names the timeout of its own first WELCOME.
    let differ =
        |r: &Report| r.protocol != first.protocol || (r.classes.is_empty() && r.timeout_ms != first.timeout_ms);
    if let Some(other) = reports.iter().find(|r| differ(r)) {
        return Err(format!(
            "--merge: the reports are of different runs ({:?} timeout {:?} ms beside {:?} timeout {:?} ms)",
            first.protocol, first.timeout_ms, other.protocol, other.timeout_ms
        ));
    }
    let mut merged = first.clone();
    let sum = |f: fn(&Report) -> u64| reports.iter().map(f).sum::<u64>();
    merged.connections = sum(|r| r.connections);
    merged.silent_clients = sum(|r| r.silent_clients);
    merged.logins_ok = sum(|r| r.logins_ok);
    merged.connect_errors = sum(|r| r.connect_errors);
    merged.pings_sent = sum(|r| r.pings_sent);
    merged.pongs_received = sum(|r| r.pongs_received);
    merged.data_sent = sum(|r| r.data_sent);
    merged.false_offline = sum(|r| r.false_offline);
    merged.missed_offline = sum(|r| r.missed_offline);
    merged.early_offline = sum(|r| r.early_offline);
    merged.late_offline = sum(|r| r.late_offline);
    merged.expired_in_window = sum(|r| r.expired_in_window);
    merged.pushes_sent = sum(|r| r.pushes_sent);
    merged.pushes_offline = sum(|r| r.pushes_offline);
    merged.push_errors = sum(|r| r.push_errors);
    merged.pushes_received = sum(|r| r.pushes_received);
    merged.push_deliveries = sum(|r| r.push_deliveries);
    merged.user_events = sum(|r| r.user_events);
    merged.pushes_lost = sum(|r| r.pushes_lost);
    merged.pushes_unexpected = sum(|r| r.pushes_unexpected);
    merged.events_missed = sum(|r| r.events_missed);
    merged.event_mismatches = sum(|r| r.event_mismatches);
    merged.events_node_lost = sum(|r| r.events_node_lost);
    merged.reconnects = sum(|r| r.reconnects);
    merged.connect_retries = sum(|r| r.connect_retries);
    merged.clients_shed_twice = sum(|r| r.clients_shed_twice);
    let buckets = reports.iter().map(|r| r.reconnect_attempts_per_100ms.len()).max().unwrap_or(0);
    merged.reconnect_attempts_per_100ms =
        (0..buckets).map(|i| reports.iter().filter_map(|r| r.reconnect_attempts_per_100ms.get(i)).sum()).collect();
    merged.shutdown_byes = sum(|r| r.shutdown_byes);
    let mut classes: BTreeMap<u64, ClassReport> = BTreeMap::new();
    for c in reports.iter().flat_map(|r| &r.classes) {
        classes.entry(c.timeout_ms as u64).and_modify(|m| m.add(c)).or_insert_with(|| c.clone());
    }
    merged.classes = classes.into_values().collect();
    merged.harness_online_at_end = reports.iter().map(|r| r.harness_online_at_end).sum();
    // Processes run side by side: their rates add up, the run lasts as long as the longest.
    merged.connect_rate_per_s = reports.iter().map(|r| r.connect_rate_per_s).sum();
    merged.duration_s = reports.iter().map(|r| r.duration_s).fold(0.0, f64::max);
    merged.unexpected_closes = add_maps(reports.iter().map(|r| &r.unexpected_closes));
    merged.closes = add_maps(reports.iter().map(|r| &r.closes));
    merged.event_mismatch_examples = reports.iter().flat_map(|r| r.event_mismatch_examples.clone()).collect();
    // Every process follows the whole event stream; each checks its own uids.
    merged.events_seen = reports.iter().filter_map(|r| r.events_seen).max();
    merged.fatal = reports.iter().find_map(|r| r.fatal.clone());
    merged.interrupted = reports.iter().any(|r| r.interrupted);
    merged.check_fds = false;

    merged.gateway_rss_bytes_at_start = reports.iter().filter_map(|r| r.gateway_rss_bytes_at_start).reduce(f64::min);
    merged.gateway_rss_bytes = reports.iter().filter_map(|r| r.gateway_rss_bytes).reduce(f64::max);
    merged.gateway_rss_bytes_per_connection = match (merged.gateway_rss_bytes_at_start, merged.gateway_rss_bytes) {
        (Some(start), Some(steady)) => Some((steady - start) / merged.logins_ok.max(1) as f64),
        _ => None,
    };
    merged.gateway_cpu_seconds = reports.iter().filter_map(|r| r.gateway_cpu_seconds).reduce(f64::max);
    merged.gateway_fds_at_start = reports.iter().filter_map(|r| r.gateway_fds_at_start).reduce(f64::min);
    merged.gateway_fds_at_end = reports.iter().filter_map(|r| r.gateway_fds_at_end).reduce(f64::max);
    // Read by each process at the barrier, while every client was connected: all the same.
    merged.gateway_online_at_end = reports.iter().find_map(|r| r.gateway_online_at_end);
    merged.shared_processes = Some(reports.len() as u32);
    merged.run_online_at_end = Some(merged.harness_online_at_end);

    let hist = |pick: fn(&Histograms) -> &String| -> Result<Histogram<u64>, String> {
        let mut all = stats::histogram();
        for r in &reports {
            all.add(Histograms::decode(pick(&r.histograms))?).map_err(|e| format!("--merge: {e:?}"))?;
        }
        Ok(all)
    };
    let silence = hist(|h| &h.silence)?;
    merged.login_ms = Percentiles::of(&hist(|h| &h.login)?);
    merged.rtt_ms = Percentiles::of(&hist(|h| &h.rtt)?);
    merged.push_ms = Percentiles::of(&hist(|h| &h.push)?);
    merged.relogin_ms = Percentiles::of(&hist(|h| &h.relogin)?);
    merged.silence_ms = Percentiles::of(&silence);
    merged.silence_bucket_ms = Report::bucket_width_ms(merged.window_ms);
    merged.silence_histogram = stats::buckets(&silence, merged.silence_bucket_ms);
    merged.histograms = Histograms::default();

    merged.timeline = timeline(&reports);
    merged.summarize_timeline(true);
    merged.judge();
    Ok(merged)
}

/// Per-reason counts added up.
fn add_maps<'a>(maps: impl Iterator<Item = &'a BTreeMap<String, u64>>) -> BTreeMap<String, u64> {
    let mut total = BTreeMap::new();
    for map in maps {
        for (reason, n) in map {
            *total.entry(reason.clone()).or_insert(0) += n;
        }
    }
    total
}

/// The timelines on the wall clock, one sample per second that every process sampled: the
/// clients online summed, the gateways' figures as the first process read them (every
/// process reads the same gateways), the worst round-trip p99.
fn timeline(reports: &[Report]) -> Vec<Sample> {
    let mut seconds: BTreeMap<u64, Vec<Sample>> = BTreeMap::new();
    for r in reports {
        // One sample per process per second: a process's second sample in it is dropped.
        let mut seen = std::collections::HashSet::new();
        for s in r.timeline.iter().filter(|s| s.unix_ms > 0) {
            if seen.insert(s.unix_ms / 1000) {
                seconds.entry(s.unix_ms / 1000).or_default().push(*s);
            }
        }
    }
    let start = seconds.keys().next().copied().unwrap_or(0);
    seconds
        .into_iter()
        .filter(|(_, samples)| samples.len() == reports.len())
        .map(|(second, samples)| Sample {
            t: (second - start) as f64,
            unix_ms: second * 1000,
            harness_online: samples.iter().map(|s| s.harness_online).sum(),
            gateway_online: samples[0].gateway_online,
            rtt_p99_ms: samples.iter().map(|s| s.rtt_p99_ms).fold(0.0, f64::max),
            gateway_rss_bytes: samples[0].gateway_rss_bytes,
            gateway_open_fds: samples[0].gateway_open_fds,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::args::Protocol;
    use crate::stats::Stats;

    /// One process's report: `rtts` recorded, `online` clients at the end, sampled at the
    /// given wall-clock milliseconds.
    fn part(rtts: &[u64], online: i64, at: &[u64], gateway: f64) -> Report {
        let stats = Stats::new(0);
        for &ms in rtts {
            stats.record_rtt(Duration::from_millis(ms));
        }
        let mut r = Report::new(Protocol::Idlegate, online as u64, 0);
        r.logins_ok = online as u64;
        r.pings_sent = rtts.len() as u64;
        r.harness_online_at_end = online;
        r.gateway_online_at_end = Some(gateway);
        r.rtt_ms = stats.rtt();
        r.histograms = stats.histograms();
        r.timeline = at
            .iter()
            .map(|&unix_ms| Sample {
                t: 0.0,
                unix_ms,
                harness_online: online,
                gateway_online: Some(gateway),
                rtt_p99_ms: 0.0,
                gateway_rss_bytes: None,
                gateway_open_fds: None,
            })
            .collect();
        // Through JSON, as --merge reads it.
        serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap()
    }

    #[test]
    fn percentiles_come_from_the_merged_histograms() {
        // Alone, each process's p50 is 1 ms and 100 ms; together, 1 ms is 3 of 4 samples.
        let a = part(&[1, 1, 1], 3, &[], 7.0);
        let b = part(&[100], 4, &[], 7.0);
        assert_eq!(a.rtt_ms.p50, 1.0);
        assert!((b.rtt_ms.p50 - 100.0).abs() < 0.1, "{:?}", b.rtt_ms);
        let m = combine(vec![a, b]).unwrap();
        assert_eq!(m.rtt_ms.count, 4);
        assert_eq!(m.rtt_ms.p50, 1.0);
        assert!((m.rtt_ms.max - 100.0).abs() < 0.1, "{:?}", m.rtt_ms);
        assert_eq!(m.pings_sent, 4);
        assert_eq!((m.connections, m.logins_ok, m.harness_online_at_end), (7, 7, 7));
        assert!(m.failures.is_empty(), "the gateways' 7 is the sum of 3 and 4: {:?}", m.failures);
    }

    #[test]
    fn the_gateways_count_is_checked_against_the_sum() {
        let m = combine(vec![part(&[1], 3, &[], 8.0), part(&[1], 4, &[], 8.0)]).unwrap();
        assert!(m.failures.iter().any(|f| f.contains("8 online") && f.contains("counts 7")), "{:?}", m.failures);
    }

    #[test]
    fn timelines_line_up_on_the_wall_clock() {
        // Process a samples seconds 100-102, b seconds 101-103: two seconds in common.
        let a = part(&[1], 3, &[100_100, 101_100, 102_100], 7.0);
        let b = part(&[1], 4, &[101_900, 102_900, 103_900], 7.0);
        let m = combine(vec![a, b]).unwrap();
        let online: Vec<(f64, i64)> = m.timeline.iter().map(|s| (s.t, s.harness_online)).collect();
        assert_eq!(online, [(1.0, 7), (2.0, 7)]);
        assert_eq!((m.online_compared_seconds, m.online_equal_seconds), (2, 2));
    }

    #[test]
    fn no_reports_is_an_error_and_unreadable_files_are_named() {
        assert!(combine(Vec::new()).is_err());
        let err = merge(&[PathBuf::from("/nonexistent/part-1.json")]).unwrap_err();
        assert!(err.contains("part-1.json"), "{err}");
    }
}

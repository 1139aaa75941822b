#!/usr/bin/env python3
"""Summarizes loadtest/mass-expiry.sh's raw files: mass-expiry-summary.py <out dir>.

Per run: the active clients' round-trip p99 in each second from 2 s before the sweep to the
end (the sweep's second found where the silent clients' online count drops), the expired
clients' window checks, and the gateway's idlegate_expiry_bye_delay_seconds histogram (from
the tick that expired a session to its BYE written). Then the medians over runs. Writes
<out dir>/summary.json.
"""
import json
import os
import re
import statistics
import sys


def bye_delays(path):
    """Cumulative bucket counts of idlegate_expiry_bye_delay_seconds: [(le, count)]."""
    buckets = []
    for line in open(path):
        m = re.match(r'idlegate_expiry_bye_delay_seconds_bucket\{le="([^"]+)"\} (\d+)', line)
        if m:
            buckets.append((float(m.group(1)), int(m.group(2))))
    return buckets


def within(buckets, seconds):
    """BYEs written within `seconds` of their tick (a bucket bound); None for a gateway
    without the histogram (an older build, run for comparison)."""
    return next((count for le, count in buckets if le == seconds), None)


def run_summary(dir):
    active = json.load(open(os.path.join(dir, "active.json")))
    silent = json.load(open(os.path.join(dir, "silent.json")))
    # The sweep's second: the first sample of the silent process with fewer clients online
    # than it had at its peak, after that peak.
    timeline = silent["timeline"]
    peak = max(range(len(timeline)), key=lambda i: timeline[i]["harness_online"])
    sweep_ms = next(s["unix_ms"] for s in timeline[peak:] if s["harness_online"] < timeline[peak]["harness_online"])
    around = [s for s in active["timeline"] if s["unix_ms"] >= sweep_ms - 2000]
    worst = max(around, key=lambda s: s["rtt_p99_ms"])
    buckets = bye_delays(os.path.join(dir, "metrics.txt"))
    total = buckets[-1][1] if buckets else 0
    slowest = next((le for le, count in buckets if count == total), None)
    return {
        "active_rtt_ms_p99_per_second": [round(s["rtt_p99_ms"], 2) for s in around],
        "active_rtt_ms_p99_worst_second": worst["rtt_p99_ms"],
        "active_false_offline": active["false_offline"],
        "silent": silent["silent_clients"],
        "expired_in_window": silent["expired_in_window"],
        "early": silent["early_offline"], "late": silent["late_offline"],
        "missed": silent["missed_offline"], "false": silent["false_offline"],
        "byes_counted": total,
        "byes_within_5ms": within(buckets, 0.005),
        "byes_within_50ms": within(buckets, 0.05),
        "byes_within_100ms": within(buckets, 0.1),
        "byes_within_250ms": within(buckets, 0.25),
        "slowest_bye_at_most_s": slowest,
        "silence_spread_ms": silent["silence_ms"]["max"] - silent["silence_ms"]["min"],
    }


def main(out):
    runs = sorted((d for d in os.listdir(out) if d.isdigit()), key=int)
    rows = {r: run_summary(os.path.join(out, r)) for r in runs}
    for r, s in rows.items():
        print(f"run {r}: active rtt p99 per second from 2 s before the sweep: {s['active_rtt_ms_p99_per_second']} ms")
        print(f"  expired {s['expired_in_window']} of {s['silent']} in the window (early {s['early']}, late "
              f"{s['late']}, missed {s['missed']}, false {s['false']}; active clients false offline "
              f"{s['active_false_offline']})")
        if s["byes_within_50ms"] is None:
            print(f"  (no idlegate_expiry_bye_delay_seconds: the silences of the expired spread over "
                  f"{s['silence_spread_ms']:.1f} ms)")
            continue
        print(f"  BYEs written after their tick: {s['byes_within_5ms']} within 5 ms, {s['byes_within_50ms']} within "
              f"50 ms, {s['byes_within_100ms']} within 100 ms, {s['byes_within_250ms']} within 250 ms, of "
              f"{s['byes_counted']}; the slowest within {s['slowest_bye_at_most_s']} s")
    values = lambda k: [s[k] for s in rows.values() if s[k] is not None]
    med = lambda k: statistics.median(values(k)) if values(k) else None
    rng = lambda k: (min(values(k)), max(values(k))) if values(k) else None
    keys = ["active_rtt_ms_p99_worst_second", "byes_within_50ms", "byes_within_100ms", "byes_within_250ms",
            "silence_spread_ms", "late"]
    summary = {"runs": rows, "median": {k: med(k) for k in keys}, "range": {k: rng(k) for k in keys}}
    print(f"\nmedian of {len(rows)} runs: active rtt p99 in the worst second around the sweep "
          f"{med(keys[0]):.2f} ms (range {rng(keys[0])[0]:.2f}-{rng(keys[0])[1]:.2f}); silences of the expired "
          f"spread over {med('silence_spread_ms'):.1f} ms")
    if med(keys[1]) is not None:
        print(f"BYEs written within 50 ms of their tick: {med(keys[1]):.0f} (range {rng(keys[1])[0]}-{rng(keys[1])[1]}), "
              f"within 100 ms {med(keys[2]):.0f}, within 250 ms {med(keys[3]):.0f}, of {rows[runs[0]]['silent']}")
    json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=2)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])

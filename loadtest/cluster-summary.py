#!/usr/bin/env python3
"""Summarizes a loadtest/cluster.sh run from the raw files it wrote.

    python3 loadtest/cluster-summary.py <out dir>

Reads run.txt, merged.json, samples.csv, pause.txt and after.txt; prints the figures
docs/BENCHMARKS.md quotes. Redis's commands are as Redis counts them
(total_commands_processed: the commands scripts run are counted too). The samples are split
into intervals (one per 250 ms sample): login intervals (the gateways' login count rose),
expiry intervals (their expiry count rose), quiet ones (neither). The quiet rate is what
Redis does with nobody arriving or leaving (node leases, blocking reads, pushes if any);
the cost of a login or an expiry is what its intervals took above the quiet rate, divided
by the logins or expiries in them. Intervals with both are left out of both.
"""
import csv
import json
import os
import statistics
import sys


def read_samples(path):
    rows = []
    with open(path) as f:
        for row in csv.DictReader(f):
            def num(key):
                v = row.get(key) or ""
                try:
                    return float(v)
                except ValueError:
                    return None
            rows.append({k: num(k) for k in row})
    return rows


def intervals(rows):
    """Consecutive samples where Redis and the gateways were both read."""
    good = [r for r in rows if all(r[k] is not None for k in
                                   ("redis_commands", "logins", "expired", "gw_round_trips", "frames"))]
    out = []
    for a, b in zip(good, good[1:]):
        out.append({
            "t": a["unix_s"], "dt": b["unix_s"] - a["unix_s"],
            "redis": b["redis_commands"] - a["redis_commands"],
            "logins": b["logins"] - a["logins"],
            "expired": b["expired"] - a["expired"],
            "trips": b["gw_round_trips"] - a["gw_round_trips"],
            "frames": b["frames"] - a["frames"],
        })
    return out


def per_unit(ivs, key, quiet_rate):
    chosen = [i for i in ivs if i[key] > 0 and all(i[k] == 0 for k in ("logins", "expired") if k != key)]
    units = sum(i[key] for i in chosen)
    if units == 0:
        return None, 0
    extra = sum(i["redis"] for i in chosen) - quiet_rate * sum(i["dt"] for i in chosen)
    return extra / units, units


def rate(ivs, key):
    dt = sum(i["dt"] for i in ivs)
    return sum(i[key] for i in ivs) / dt if dt else 0.0


def main(out):
    run = open(os.path.join(out, "run.txt")).read().split("\n")
    report = json.load(open(os.path.join(out, "merged.json")))
    rows = read_samples(os.path.join(out, "samples.csv"))
    ivs = intervals(rows)
    start = float(run[0].split()[1])
    end = float(next(l for l in run if l.startswith("end")).split()[1])
    print("== cluster run:", run[0].split(" ", 2)[2])
    print(f"clients      {report['connections']} ({report['silent_clients']} silent), logged in "
          f"{report['logins_ok']}, {report['connect_rate_per_s']:.0f} logins/s; "
          f"result {'clean' if not report['failures'] else 'NOT clean: ' + '; '.join(report['failures'])}")
    lo, hi = report["window_ms"] or (0, 0)
    s = report["silence_ms"]
    print(f"guarantee    offline after ({lo:.0f}, {hi:.0f}] ms of silence: {report['expired_in_window']} "
          f"in window, false {report['false_offline']}, missed {report['missed_offline']}, early "
          f"{report['early_offline']}, late {report['late_offline']}; silence min {s['min']:.1f} "
          f"p50 {s['p50']:.1f} max {s['max']:.1f} ms")
    r = report["rtt_ms"]
    print(f"rtt          {r['count']} pongs: p50 {r['p50']:.2f} p99 {r['p99']:.2f} p99.9 {r['p999']:.2f} "
          f"max {r['max']:.2f} ms")
    p = report["push_ms"]
    if p["count"]:
        print(f"push         {report['pushes_sent']} sent across nodes, {report['pushes_received']} received, "
              f"lost {report['pushes_lost']}, errors {report['push_errors']}: p50 {p['p50']:.2f} "
              f"p99 {p['p99']:.2f} max {p['max']:.2f} ms")
    if report.get("events_seen") is not None:
        print(f"events       seen {report['events_seen']}, missed {report['events_missed']}, "
              f"mismatches {report['event_mismatches']}")
    print(f"online       gateways' gauge at the end {report['gateway_online_at_end']}, clients "
          f"{report['harness_online_at_end']}; equal in {report['online_equal_seconds']} of "
          f"{report['online_compared_seconds']} seconds sampled")

    run_ivs = [i for i in ivs if start <= i["t"] <= end]
    quiet = [i["redis"] / i["dt"] for i in run_ivs if i["logins"] == 0 and i["expired"] == 0 and i["dt"] > 0]
    quiet_rate = statistics.median(quiet) if quiet else 0.0
    total = sum(i["redis"] for i in run_ivs)
    span = sum(i["dt"] for i in run_ivs) or 1.0
    peak = max((i["redis"] / i["dt"] for i in run_ivs if i["dt"] > 0), default=0.0)
    print(f"redis        {total:.0f} commands in {span:.0f} s: {total / span:.0f}/s on average, "
          f"peak {peak:.0f}/s (250 ms samples), quiet {quiet_rate:.0f}/s")
    per_login, logins = per_unit(run_ivs, "logins", quiet_rate)
    per_expiry, expiries = per_unit(run_ivs, "expired", quiet_rate)
    if per_login is not None:
        print(f"             {per_login:.3f} commands per login above quiet ({logins:.0f} logins)")
    if per_expiry is not None:
        print(f"             {per_expiry:.3f} commands per expired uid above quiet ({expiries:.0f} expiries)")
    phases = [
        ("quiet", [i for i in run_ivs if i["logins"] == 0 and i["expired"] == 0]),
        ("logging in", [i for i in run_ivs if i["logins"] > 0]),
        ("expiring", [i for i in run_ivs if i["expired"] > 0 and i["logins"] == 0]),
        ("whole run", run_ivs),
    ]
    print("gateways     Redis round trips/s against client frames/s, by phase:")
    for name, chosen in phases:
        if chosen:
            trips, frames = rate(chosen, "trips"), rate(chosen, "frames")
            ratio = f"{frames / trips:.0f} frames per round trip" if trips else "no round trips"
            print(f"             {name:<11} {sum(i['dt'] for i in chosen):5.0f} s: {trips:6.0f} round trips/s, "
                  f"{frames:7.0f} frames/s ({ratio})")
    pause = os.path.join(out, "pause.txt")
    if os.path.exists(pause):
        marks = dict(l.split() for l in open(pause) if l.strip())
        stop, cont = float(marks["stop"]), float(marks["cont"])
        nodes = int(run[0].split("nodes ")[1].split()[0])
        down = [x["unix_s"] for x in rows if x["redis_up"] is not None and x["redis_up"] < nodes]
        print(f"pause        Redis stopped {stop - start:.1f} s into the run for {cont - stop:.1f} s; "
              f"a gateway reported Redis down from {min(down) - stop:+.1f} s to {max(down) - stop:+.1f} s "
              f"after the stop" if down else
              f"pause        Redis stopped {stop - start:.1f} s into the run for {cont - stop:.1f} s; "
              f"no gateway reported it down")
    after = os.path.join(out, "after.txt")
    if os.path.exists(after):
        print("after        " + ", ".join(l.strip() for l in open(after) if l.strip()))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])

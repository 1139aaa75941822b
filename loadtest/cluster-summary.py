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
import collections
import csv
import json
import os
import re
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
            "cpu": None if a.get("redis_cpu_s") is None or b.get("redis_cpu_s") is None
            else b["redis_cpu_s"] - a["redis_cpu_s"],
            "online": a["online"],
        })
    return out


def is_quiet(i):
    return i["logins"] == 0 and i["expired"] == 0


def quiet_rate(ivs, what="redis"):
    """The median rate of `what` (Redis's commands or CPU seconds) over the quiet intervals."""
    rates = [i[what] / i["dt"] for i in ivs if is_quiet(i) and i["dt"] > 0 and i[what] is not None]
    return statistics.median(rates) if rates else 0.0


def per_unit(ivs, key, quiet_rate, what="redis"):
    """What the intervals with `key` (logins or expiries) took of `what` (Redis's commands or
    CPU seconds) above the quiet rate, per unit of `key`."""
    chosen = [i for i in ivs if i[key] > 0 and i[what] is not None
              and all(i[k] == 0 for k in ("logins", "expired") if k != key)]
    units = sum(i[key] for i in chosen)
    if units == 0:
        return None, 0
    extra = sum(i[what] for i in chosen) - quiet_rate * sum(i["dt"] for i in chosen)
    return extra / units, units


def rate(ivs, key):
    dt = sum(i["dt"] for i in ivs)
    return sum(i[key] for i in ivs) / dt if dt else 0.0


def main(out):
    run = open(os.path.join(out, "run.txt")).read().split("\n")
    rows = read_samples(os.path.join(out, "samples.csv"))
    ivs = intervals(rows)
    start = float(run[0].split()[1])
    end = float(next(l for l in run if l.startswith("end")).split()[1])
    print("== cluster run:", run[0].split(" ", 2)[2])
    merged = os.path.join(out, "merged.json")
    if os.path.exists(merged):
        clients(json.load(open(merged)))
    else:
        # multi.sh merges only when every load generator wrote its report.
        print("clients      no merged.json: a load generator wrote no report (part-N.txt says why); "
              "each one that ran has its part-N.json")

    run_ivs = [i for i in ivs if start <= i["t"] <= end]
    quiet = quiet_rate(run_ivs)
    total = sum(i["redis"] for i in run_ivs)
    span = sum(i["dt"] for i in run_ivs) or 1.0
    peak = max((i["redis"] / i["dt"] for i in run_ivs if i["dt"] > 0), default=0.0)
    print(f"redis        {total:.0f} commands in {span:.0f} s: {total / span:.0f}/s on average, "
          f"peak {peak:.0f}/s (250 ms samples), quiet {quiet:.0f}/s")
    per_login, logins = per_unit(run_ivs, "logins", quiet)
    per_expiry, expiries = per_unit(run_ivs, "expired", quiet)
    if per_login is not None:
        print(f"             {per_login:.3f} commands per login above quiet ({logins:.0f} logins)")
    if per_expiry is not None:
        print(f"             {per_expiry:.3f} commands per expired uid above quiet ({expiries:.0f} expiries)")
    redis_cpu(run_ivs)
    phases = [
        ("quiet", [i for i in run_ivs if is_quiet(i)]),
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
    if os.path.exists(os.path.join(out, "full-load.txt")):
        memory(out)
    logins_rate(rows)
    if os.path.exists(os.path.join(out, "events.jsonl")):
        events(out, run, start)
    after = os.path.join(out, "after.txt")
    if os.path.exists(after):
        print("after        " + ", ".join(l.strip() for l in open(after) if l.strip()))


def clients(report):
    """What the load generators saw, from their merged report."""
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


def redis_cpu(ivs):
    """Redis's CPU (its own used_cpu_sys + used_cpu_user) per login, per expiry and per 1,000
    idle sessions, when the samples carry it."""
    with_cpu = [i for i in ivs if i["cpu"] is not None and i["dt"] > 0]
    if not with_cpu:
        return
    quiet_cpu = quiet_rate(with_cpu, "cpu")
    per_login, logins = per_unit(with_cpu, "logins", quiet_cpu, "cpu")
    per_expiry, expiries = per_unit(with_cpu, "expired", quiet_cpu, "cpu")
    if per_login is not None:
        print(f"redis cpu    {per_login * 1e6:.1f} us per login above quiet ({logins:.0f} logins)")
    if per_expiry is not None:
        print(f"             {per_expiry * 1e6:.1f} us per expired uid above quiet ({expiries:.0f} expiries)")
    # Idle: quiet intervals with at least 90 % of the run's most sessions online.
    most = max((i["online"] or 0) for i in with_cpu)
    idle = [i for i in with_cpu if is_quiet(i) and most and (i["online"] or 0) >= 0.9 * most]
    if idle:
        dt = sum(i["dt"] for i in idle)
        thousands = statistics.mean(i["online"] for i in idle) / 1000
        print(f"             idle, {thousands * 1000:.0f} sessions for {dt:.0f} s: "
              f"{sum(i['redis'] for i in idle) / dt / thousands:.3f} commands/s and "
              f"{sum(i['cpu'] for i in idle) / dt / thousands * 1e6:.1f} us of CPU a second "
              f"per 1,000 sessions")


def sections(path):
    """A snapshot file of cluster.sh: its `== name` sections' lines."""
    out, name = {}, None
    for line in open(path):
        line = line.rstrip("\n")
        if line.startswith("== "):
            name = line[3:]
            out[name] = []
        elif name:
            out[name].append(line)
    return out


def machine(snap):
    info = {l.split(":")[0]: int(l.split()[1]) for l in snap["/proc/meminfo"] if len(l.split()) >= 2}
    slabs = {}
    for l in snap["/proc/slabinfo"][2:]:
        f = l.split()
        slabs[f[0]] = int(f[1]) * int(f[3])  # active objects * object size, bytes
    procs = {l.split()[0]: (int(l.split()[1]), int(l.split()[2])) for l in snap["processes, count, rss_kb"] if l.strip()}
    return {"used_kb": info["MemTotal"] - info["MemAvailable"], "slab_kb": info["Slab"],
            "sunreclaim_kb": info["SUnreclaim"], "slabs": slabs, "procs": procs,
            "sockstat": " / ".join(l for l in snap["/proc/net/sockstat"] if l.startswith(("TCP:", "sockets:")))}


def memory(out):
    """Memory per session: the full-load snapshot less the baseline, over the sessions then."""
    base = machine(sections(os.path.join(out, "baseline.txt")))
    full_snap = sections(os.path.join(out, "full-load.txt"))
    full = machine(full_snap)
    sessions = sum(int(x) for x in full_snap["gateways' online sessions"][0].split(",")[1:] if x)
    kib = lambda kb: kb * 1024 / sessions
    print(f"memory       at full load, {sessions} sessions: machine {kib(full['used_kb'] - base['used_kb']):.0f} B "
          f"per session (MemTotal - MemAvailable, less the baseline), of it kernel slab "
          f"{kib(full['slab_kb'] - base['slab_kb']):.0f} B (unreclaimable {kib(full['sunreclaim_kb'] - base['sunreclaim_kb']):.0f} B)")
    grown = sorted(((full["slabs"].get(k, 0) - base["slabs"].get(k, 0), k) for k in full["slabs"]), reverse=True)[:8]
    print("             slab caches grown most, bytes per session: "
          + ", ".join(f"{k} {v / sessions:.0f}" for v, k in grown))
    for name, label in (("idlegate", "gateways"), ("loadtest", "load generator"), ("redis-server", "Redis")):
        n, rss = full["procs"].get(name, (0, 0))
        print(f"             {label:<15} {n:3d} processes, RSS {rss / 1024 / 1024:.2f} GiB, "
              f"{rss * 1024 / sessions:.0f} B per session")
    print(f"             sockets at full load: {full['sockstat']}")


def logins_rate(rows):
    """Login throughput across the cluster, from the gateways' summed login counter."""
    pts = [(r["unix_s"], r["logins"]) for r in rows if r["logins"] is not None]
    if len(pts) < 2 or pts[-1][1] < 1000:
        return
    first = next(t for t, n in pts if n > 0)
    top = max(n for _, n in pts)
    done = next(t for t, n in pts if n >= 0.99 * top)
    best = 0.0
    for (t0, n0) in pts:
        later = [(t, n) for t, n in pts if t0 + 10 <= t <= t0 + 15]
        if later:
            best = max(best, (later[0][1] - n0) / (later[0][0] - t0))
    print(f"logins       {top:.0f} across the cluster; 99 % of them in {done - first:.0f} s "
          f"({0.99 * top / max(done - first, 1):.0f}/s on average), best 10 s {best:.0f}/s")


def events(out, run, start):
    """The stream as the backend saw it, and what the killed node's sessions became."""
    online, offline, kinds, per_second = {}, {}, collections.Counter(), collections.Counter()
    size = 0
    with open(os.path.join(out, "events.jsonl")) as f:
        for line in f:
            size += len(line)
            e = json.loads(line)
            kinds[e["type"]] += 1
            if "at_ms" in e:
                per_second[int(e["at_ms"] // 1000)] += 1
            if e["type"] == "online":
                online[e["session"]] = (e["node"], e["at_ms"])
            elif e["type"] == "offline":
                offline[e["session"]] = (e["reason"], e["at_ms"])
    busiest = max(per_second.values(), default=0)
    print(f"events       {sum(kinds.values())} ({size / 2**20:.0f} MiB as JSON lines): "
          + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))
          + f"; busiest second {busiest}")
    kill = os.path.join(out, "kill.txt")
    if not os.path.exists(kill):
        return
    words = open(kill).read().split()
    victim, kill_ms = words[1], float(words[-1]) * 1000
    held = {s for s, (node, at) in online.items()
            if node == victim and at <= kill_ms and not (s in offline and offline[s][1] <= kill_ms)}
    lost = {s for s, (reason, _) in offline.items() if reason == "node_lost"}
    delays = sorted(offline[s][1] - kill_ms for s in lost)
    print(f"kill         {victim} killed {(kill_ms / 1000 - start):.0f} s into the run holding {len(held)} sessions; "
          f"node_lost offlines {len(lost)}, exactly its sessions: {lost == held} "
          f"(lost but not held {len(lost - held)}, held but not lost {len(held - lost)})")
    if delays:
        print(f"             node_lost logged {delays[0] / 1000:.1f} to {delays[-1] / 1000:.1f} s after the kill")
    m = re.search(r"--duration (\d+)s", run[0])
    end_ms = (start + int(m.group(1))) * 1000 if m else float("inf")
    others = collections.Counter(reason for s, (reason, at) in offline.items()
                                 if s not in held and at < end_ms)
    print(f"             other sessions' offlines before the clients' end, by reason: "
          + (", ".join(f"{k} {n}" for k, n in sorted(others.items())) or "none"))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])

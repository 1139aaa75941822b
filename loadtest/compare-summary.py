#!/usr/bin/env python3
"""The tables of loadtest/compare.sh, from the raw files it wrote.

    python3 loadtest/compare-summary.py <out dir>

Reads <server>-<load>-<run>.json (one per measured run) and <server>-expiry.json; prints, per load and server, the median of each figure with its range
over the runs, then idlegate's ratio to each other server: computed run by run (run N of
idlegate against run N of the other, which ran right after it) and given as the median with
its range. Writes <out dir>/summary.json with the same numbers.
"""
import glob
import json
import os
import re
import statistics
import sys

SERVERS = ["idlegate", "per_connection_timer", "echo_floor", "mosquitto"]
FIGURES = [("cpu_us_per_frame", "cpu us/frame", 3), ("rss_bytes_per_connection", "rss B/conn", 0),
           ("rtt_ms_p99", "rtt p99 ms", 3)]


def spread(values, digits):
    """`median (min-max)` of values."""
    if not values:
        return "-"
    fmt = f"{{:.{digits}f}}"
    med = statistics.median(values)
    return f"{fmt.format(med)} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def main(out):
    runs = {}
    for path in glob.glob(os.path.join(out, "*-*-*.json")):
        m = re.match(r"(.+)-(ping|data)-(\d+)\.json$", os.path.basename(path))
        if m:
            runs.setdefault(m.group(2), {}).setdefault(m.group(1), {})[int(m.group(3))] = json.load(open(path))
    summary = {"loads": {}, "expiry": {}}
    for load in ["ping", "data"]:
        servers = runs.get(load, {})
        if not servers:
            continue
        n = max(len(v) for v in servers.values())
        print(f"\n{load} load, {n} runs each, interleaved; median (range)")
        print(f"{'server':<22} {'logins':>8} " + " ".join(f"{label:>24}" for _, label, _ in FIGURES))
        table = summary["loads"].setdefault(load, {"servers": {}, "ratios": {}})
        for server in SERVERS:
            by_run = servers.get(server)
            if not by_run:
                continue
            logins = min(r["logins_ok"] for r in by_run.values())
            cells = []
            row = {"runs": len(by_run), "logins_min": logins}
            for key, _, digits in FIGURES:
                values = [r[key] for r in by_run.values()]
                row[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
                cells.append(spread(values, digits))
            table["servers"][server] = row
            print(f"{server:<22} {logins:>8} " + " ".join(f"{c:>24}" for c in cells))
        ig = servers.get("idlegate", {})
        print("idlegate / other, run by run: median (range)")
        for other in SERVERS[1:]:
            theirs = servers.get(other)
            if not theirs:
                continue
            ratios = {}
            cells = []
            for key, label, _ in FIGURES:
                values = [ig[k][key] / theirs[k][key] for k in ig if k in theirs and theirs[k][key]]
                ratios[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)} if values else None
                cells.append(f"{label} {spread(values, 3)}")
            table["ratios"][other] = ratios
            print(f"  vs {other:<20} " + "   ".join(cells))
    floor = summary["loads"].get("ping", {}).get("ratios", {}).get("echo_floor")
    if floor and floor["cpu_us_per_frame"]:
        r = floor["cpu_us_per_frame"]
        verdict = "met" if r["max"] <= 1.05 else ("met at the median" if r["median"] <= 1.05 else "not met")
        print(f"\nCPU per frame against the no-tracking floor (ping load): median {r['median']:.3f}, "
              f"range {r['min']:.3f}-{r['max']:.3f}; the 5 % goal is {verdict}")
        summary["floor_goal"] = verdict

    print(f"\n{'expiry':<10} {'timeout ms':>10} {'silent':>7} {'min ms':>9} {'p50 ms':>9} {'max ms':>9} {'early':>6} "
          f"{'late':>6} {'missed':>7} {'false':>6}")
    for server in ["idlegate", "mosquitto"]:
        path = os.path.join(out, f"{server}-expiry.json")
        if not os.path.exists(path):
            continue
        r = json.load(open(path))
        s = r["silence_ms"]
        row = {"timeout_ms": r["timeout_ms"], "silent": r["silent_clients"], "min": s["min"], "p50": s["p50"],
               "max": s["max"], "early": r["early_offline"], "late": r["late_offline"],
               "missed": r["missed_offline"], "false": r["false_offline"]}
        summary["expiry"][server] = row
        print(f"{server:<10} {row['timeout_ms'] or 0:>10.0f} {row['silent']:>7} {row['min']:>9.1f} {row['p50']:>9.1f} "
              f"{row['max']:>9.1f} {row['early']:>6} {row['late']:>6} {row['missed']:>7} {row['false']:>6}")

    json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=2)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])

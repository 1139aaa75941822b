#!/usr/bin/env python3
"""The tables of loadtest/compare.sh, from the raw files it wrote.

    python3 loadtest/compare-summary.py <out dir>

Reads <server>-<load>-<run>.json (one per measured run) and <server>-expiry.json; prints, per load and server, the median of each figure with its range
over the runs, then idlegate's ratio to each other server: computed run by run (run N of
idlegate against run N of the other, which ran right after it) and given as the median with
its range. With the doors' servers (idlegate_tls, idlegate_ws, idlegate_wss,
mosquitto_tls, node_ws) it also gives each door's cost over its plain counterpart, run by
run: the resident bytes per connection it adds and its CPU per frame as a ratio. Writes
<out dir>/summary.json with the same numbers.
"""
import glob
import json
import os
import re
import statistics
import sys

SERVERS = ["idlegate", "per_connection_timer", "echo_floor", "mosquitto",
           "idlegate_ws", "idlegate_tls", "idlegate_wss", "mosquitto_tls", "node_ws", "idlegate_mqtt"]

# Servers held to each other under one load, run by run: (server, against, goal on the
# ratios of CPU per PING and of bytes per connection: below 1.0 is below the other's).
PAIRS = [("idlegate_mqtt", "mosquitto", 1.0)]

# (door, its plain counterpart, the goal on added bytes per connection, on the CPU ratio).
DOORS = [("idlegate_ws", "idlegate", 256, 1.10), ("idlegate_tls", "idlegate", 2048, 1.20),
         ("idlegate_wss", "idlegate", 2048, None), ("mosquitto_tls", "mosquitto", None, None),
         ("node_ws", "idlegate", None, None)]
FIGURES = [("cpu_us_per_frame", "cpu us/frame", 3), ("rss_bytes_per_connection", "rss B/conn", 0),
           ("rtt_ms_p99", "rtt p99 ms", 3)]

# CPU per PING in steady state (every client in, one PING a second each): compare.sh's CPU
# between its two memory samples over connections x seconds. Older raw files lack it.
STEADY = "cpu_us_per_connection_second_steady"


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
        if ig:
            print("idlegate / other, run by run: median (range)")
        for other in SERVERS[1:]:
            theirs = servers.get(other)
            if not theirs or not ig:
                continue
            ratios = {}
            cells = []
            for key, label, _ in FIGURES:
                values = [ig[k][key] / theirs[k][key] for k in ig if k in theirs and theirs[k][key]]
                ratios[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)} if values else None
                cells.append(f"{label} {spread(values, 3)}")
            table["ratios"][other] = ratios
            print(f"  vs {other:<20} " + "   ".join(cells))
    ping = runs.get("ping", {})
    if any(door in ping for door, *_ in DOORS):
        print("\ndoors, ping load, run by run against the plain door: median (range)")
        summary["doors"] = {}
        for door, plain, bytes_goal, cpu_goal in DOORS:
            mine, base = ping.get(door), ping.get(plain)
            if not mine or not base:
                continue
            both = [k for k in mine if k in base]
            added = [mine[k]["rss_bytes_per_connection"] - base[k]["rss_bytes_per_connection"] for k in both]
            cpu = [mine[k][STEADY] / base[k][STEADY] for k in both if base[k].get(STEADY) and mine[k].get(STEADY)]
            ramp = [mine[k]["cpu_us_per_frame"] / base[k]["cpu_us_per_frame"] for k in both]
            row = {"against": plain, "added_bytes_per_connection": {"median": statistics.median(added), "min": min(added),
                                                                    "max": max(added)},
                   "cpu_ratio": {"median": statistics.median(cpu), "min": min(cpu), "max": max(cpu)} if cpu else None,
                   "cpu_ratio_with_ramp": {"median": statistics.median(ramp), "min": min(ramp), "max": max(ramp)}}
            goals = []
            if bytes_goal is not None:
                row["bytes_goal"] = bytes_goal
                goals.append(f"+{bytes_goal} B goal {'met' if max(added) <= bytes_goal else 'not met'}")
            if cpu_goal is not None and cpu:
                row["cpu_goal"] = cpu_goal
                goals.append(f"{cpu_goal:.2f}x goal {'met' if max(cpu) <= cpu_goal else 'not met'}")
            summary["doors"][door] = row
            print(f"  {door:<14} vs {plain:<10} +{spread(added, 0)} B/conn   cpu per PING x{spread(cpu, 3)}   "
                  f"cpu per frame with the ramp's handshakes x{spread(ramp, 3)}   " + "; ".join(goals))

    pairs = [(a, b, goal) for a, b, goal in PAIRS if a in ping and b in ping]
    if pairs:
        print("\nside by side, ping load, run by run: median (range)")
        summary["pairs"] = {}
        for mine_name, other_name, goal in pairs:
            mine, other = ping[mine_name], ping[other_name]
            both = [k for k in mine if k in other]
            steady = [mine[k][STEADY] / other[k][STEADY] for k in both if other[k].get(STEADY) and mine[k].get(STEADY)]
            frame = [mine[k]["cpu_us_per_frame"] / other[k]["cpu_us_per_frame"] for k in both]
            rss = [mine[k]["rss_bytes_per_connection"] / other[k]["rss_bytes_per_connection"] for k in both]
            row = {name: {"median": statistics.median(v), "min": min(v), "max": max(v)} if v else None
                   for name, v in [("cpu_per_ping_ratio", steady), ("cpu_per_frame_ratio", frame),
                                   ("rss_per_connection_ratio", rss)]}
            verdict = lambda v: "-" if not v else ("met" if max(v) < goal else
                                                   ("met at the median" if statistics.median(v) < goal else "not met"))
            row["goal"] = goal
            summary["pairs"][f"{mine_name}/{other_name}"] = row
            print(f"  {mine_name} / {other_name}: cpu per PING x{spread(steady, 3)} ({verdict(steady)}), "
                  f"cpu per frame with the ramp x{spread(frame, 3)}, "
                  f"rss per connection x{spread(rss, 3)} ({verdict(rss)}); goal below {goal:.2f}")

    floor = summary["loads"].get("ping", {}).get("ratios", {}).get("echo_floor")
    if floor and floor["cpu_us_per_frame"]:
        r = floor["cpu_us_per_frame"]
        verdict = "met" if r["max"] <= 1.05 else ("met at the median" if r["median"] <= 1.05 else "not met")
        print(f"\nCPU per frame against the no-tracking floor (ping load): median {r['median']:.3f}, "
              f"range {r['min']:.3f}-{r['max']:.3f}; the 5 % goal is {verdict}")
        summary["floor_goal"] = verdict

    print(f"\n{'expiry':<10} {'timeout ms':>10} {'silent':>7} {'min ms':>9} {'p50 ms':>9} {'max ms':>9} {'early':>6} "
          f"{'late':>6} {'missed':>7} {'false':>6}")
    for server in ["idlegate", "idlegate_mqtt", "mosquitto"]:
        path = os.path.join(out, f"{server}-expiry.json")
        if not os.path.exists(path):
            continue
        r = json.load(open(path))
        s = r["silence_ms"]
        row = {"timeout_ms": r["timeout_ms"], "silent": r["silent_clients"], "min": s["min"], "p50": s["p50"],
               "max": s["max"], "early": r["early_offline"], "late": r["late_offline"],
               "missed": r["missed_offline"], "false": r["false_offline"]}
        summary["expiry"][server] = row
        print(f"{server:<13} {row['timeout_ms'] or 0:>7.0f} {row['silent']:>7} {row['min']:>9.1f} {row['p50']:>9.1f} "
              f"{row['max']:>9.1f} {row['early']:>6} {row['late']:>6} {row['missed']:>7} {row['false']:>6}")

    json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=2)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])

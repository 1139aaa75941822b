#!/usr/bin/env python3
"""What Redis ran over each of several cluster runs, side by side: calls and CPU by command,
from the `INFO commandstats` snapshots `loadtest/cluster.sh` takes at the start and the end
of a run (commandstats-start.txt, commandstats-end.txt), per session logged in.

    python3 loadtest/redis-commands.py docs/results/million-first docs/results/million

Commands are listed by CPU in the last run given; `all` sums every command. Runs that
logged in different numbers of clients compare per login (`logins_ok` of each run's
merged.json, or summed over its part-N.json when the merge was refused)."""

import json
import os
import sys

# Commands listed one by one; the rest are summed as `other`.
SHOWN = 6


def commandstats(path):
    """command -> (calls, usec) from one INFO commandstats snapshot."""
    out = {}
    for line in open(path):
        if not line.startswith("cmdstat_"):
            continue
        name, fields = line[len("cmdstat_"):].strip().split(":", 1)
        values = dict(f.split("=", 1) for f in fields.split(","))
        out[name] = (int(values["calls"]), int(values["usec"]))
    return out


def run(directory):
    """command -> (calls, usec) over the run, and the logins the run made."""
    start = commandstats(os.path.join(directory, "commandstats-start.txt"))
    end = commandstats(os.path.join(directory, "commandstats-end.txt"))
    delta = {}
    for name, (calls, usec) in end.items():
        c0, u0 = start.get(name, (0, 0))
        delta[name] = (calls - c0, usec - u0)
    merged = os.path.join(directory, "merged.json")
    if os.path.exists(merged):
        logins = json.load(open(merged)).get("logins_ok", 0)
    else:
        # A run whose merge was refused (a load generator missing): its processes' reports.
        parts = [f for f in os.listdir(directory) if f.startswith("part-") and f.endswith(".json")]
        logins = sum(json.load(open(os.path.join(directory, f))).get("logins_ok", 0) for f in parts)
    return delta, logins


def total(cells):
    """(calls, usec) summed over `cells`."""
    calls, usec = 0, 0
    for c, u in cells:
        calls, usec = calls + c, usec + u
    return calls, usec


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    runs = [(os.path.basename(d.rstrip("/")), *run(d)) for d in sys.argv[1:]]
    last = runs[-1][1]
    names = sorted(last, key=lambda n: -last[n][1])[:SHOWN]
    width = max(len(n) for n, _, _ in runs)
    print(f"{'run':<{width}}  {'logins':>8}  " + "  ".join(f"{n + ' calls':>14} {'cpu s':>7}" for n in names + ["other", "all"]))
    for label, delta, logins in runs:
        cells = [delta.get(n, (0, 0)) for n in names]
        cells.append(total(v for k, v in delta.items() if k not in names))
        cells.append(total(delta.values()))
        print(f"{label:<{width}}  {logins:>8}  " + "  ".join(f"{c:>14} {u / 1e6:>7.1f}" for c, u in cells))
    print("per login (calls, us of Redis CPU):")
    for label, delta, logins in runs:
        if not logins:
            continue
        calls, usec = total(delta.values())
        parts = [f"{n} {delta.get(n, (0, 0))[0] / logins:.2f} {delta.get(n, (0, 0))[1] / logins:.1f}" for n in names]
        print(f"  {label:<{width}}  all {calls / logins:.2f} {usec / logins:.1f}   " + "   ".join(parts))


if __name__ == "__main__":
    main()

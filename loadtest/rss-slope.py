#!/usr/bin/env python3
"""Least-squares slope of the gateway's resident memory in a loadtest report's timeline.

    python3 loadtest/rss-slope.py REPORT.json [FROM_SECONDS [TO_SECONDS]]

Prints bytes per minute over the samples in [FROM, TO] (default: the second half of the run).
"""
import json
import sys

report = json.load(open(sys.argv[1]))
timeline = report["timeline"]
end = timeline[-1]["t"]
start = float(sys.argv[2]) if len(sys.argv) > 2 else end / 2
stop = float(sys.argv[3]) if len(sys.argv) > 3 else end
points = [(s["t"], s["gateway_rss_bytes"]) for s in timeline if s.get("gateway_rss_bytes") and start <= s["t"] <= stop]
n = len(points)
mt = sum(t for t, _ in points) / n
mr = sum(r for _, r in points) / n
slope = sum((t - mt) * (r - mr) for t, r in points) / sum((t - mt) ** 2 for t, _ in points)
first, last = points[0][1], points[-1][1]
print(f"{n} samples from {start:.0f} s to {stop:.0f} s: rss {first / 2**20:.1f} MiB -> {last / 2**20:.1f} MiB, "
      f"slope {slope * 60 / 1024:.1f} KiB/min")

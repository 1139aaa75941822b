#!/usr/bin/env python3
"""Sums the per-second lines of the loadtest processes that shared one run.

    python3 loadtest/progress-sum.py <out dir> [every, default 10]

Reads <out dir>/part-*.txt (each process's `[  12.0s] connected ... logged_in N online N ...
rtt_p99 Xms ... closes {...}` lines) and prints, every `every` seconds of the run, the
processes' logged-in and online clients and idle_timeout closes summed, and the worst
process's round-trip p99, each process as its latest line at that second said: what a run
stopped before its merged report still shows (`processes` says how many had printed one).
"""
import glob
import json
import os
import re
import sys

LINE = re.compile(r"\[\s*([\d.]+)s\] connected \d+/\d+ logged_in (\d+) online (\d+) .* rtt_p99 ([\d.]+)ms .*closes (\{.*\})")


def main(out, every):
    processes = []
    for path in glob.glob(os.path.join(out, "part-*.txt")):
        lines = []
        for line in open(path):
            m = LINE.match(line)
            if m:
                lines.append((float(m.group(1)), int(m.group(2)), int(m.group(3)),
                              json.loads(m.group(5)).get("idle_timeout", 0), float(m.group(4))))
        processes.append(lines)
    end = max((lines[-1][0] for lines in processes if lines), default=0)
    print("s,processes,logged_in,online,idle_timeout_closes,worst_rtt_p99_ms")
    for t in range(every, int(end) + 1, every):
        # Each process's latest line at or before t: a starved process prints late, not never.
        latest = [max((l for l in lines if l[0] <= t), default=None) for lines in processes]
        latest = [l for l in latest if l]
        print(f"{t},{len(latest)},{sum(l[1] for l in latest)},{sum(l[2] for l in latest)},"
              f"{sum(l[3] for l in latest)},{max((l[4] for l in latest), default=0):.0f}")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) == 3 else 10)

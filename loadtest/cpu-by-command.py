#!/usr/bin/env python3
"""CPU by command over a few seconds: each process's utime + stime from /proc/<pid>/stat,
summed by its command name, in cores; then the machine's split from /proc/stat, in percent
of one core (so 200 % on two).

    python3 loadtest/cpu-by-command.py [seconds, default 10]

Run beside a loadtest/cluster.sh run to see who has the cores
(docs/results/million-first/cpu-by-command.txt).
"""
import collections
import os
import sys
import time

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
STAT_FIELDS = "user nice system idle iowait irq softirq steal".split()


def by_command():
    out = collections.Counter()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            continue  # gone meanwhile
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        out[comm] += int(fields[11]) + int(fields[12])  # utime, stime
    return out


def machine():
    return [int(x) for x in open("/proc/stat").readline().split()[1:1 + len(STAT_FIELDS)]]


def main(seconds):
    a, ma, t0 = by_command(), machine(), time.time()
    time.sleep(seconds)
    b, mb, t1 = by_command(), machine(), time.time()
    dt = t1 - t0
    for comm in sorted(b, key=lambda c: a.get(c, 0) - b[c])[:8]:
        print(f"{comm:20s} {(b[comm] - a.get(comm, 0)) / CLOCK_TICKS / dt:.3f} cores")
    d = [y - x for x, y in zip(ma, mb)]
    total = sum(d) or 1
    print(" ".join(f"{name} {d[i] / total * 100 * os.cpu_count():.0f}%" for i, name in enumerate(STAT_FIELDS)))


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 10)

#!/usr/bin/env python3
"""Turns a `cargo bench --bench ring` run into the markdown tables of docs/BENCHMARKS.md.

Usage: cargo bench --bench ring | tee target/ring-bench.log
       python3 benches/summarize.py target/ring-bench.log

Reads only the log: criterion's `time: [low estimate high]` line of each benchmark (the
middle figure), and the footprint and chunked-sweep lines the bench prints. So every table
comes from the committed log it names, not from criterion's files under target/, which are
not committed and which a later run overwrites. Structures a run left out show as "-".
"""
import re
import sys

STRUCTURES = ["ring", "full_scan", "sorted_set", "min_heap", "timing_wheel"]
UNITS = {"ps": 1e-3, "ns": 1.0, "µs": 1e3, "us": 1e3, "ms": 1e6, "s": 1e9}
TIMES = {}


def read_times(log):
    """{(workload, structure, uids): nanoseconds} from criterion's report lines. A long id
    gets its `time:` on the next line."""
    current = None
    for line in log.splitlines():
        if line.startswith("Benchmarking"):
            continue
        m = re.match(r"^(\w+)/(\w+)/(\d+)", line)
        if m:
            current = (m.group(1), m.group(2), int(m.group(3)))
        t = re.search(r"time:\s+\[\S+ \S+ ([\d.]+) (\S+) \S+ \S+\]", line)
        if t and current:
            TIMES[current] = float(t.group(1)) * UNITS[t.group(2)]
            current = None


def estimate(workload, structure, n):
    return TIMES.get((workload, structure, n))


def fmt_ns(ns):
    if ns is None:
        return "-"
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.1f} µs"
    return f"{ns:.1f} ns"


def main(log_path):
    log = open(log_path).read()
    read_times(log)
    footprint = {(m[0], int(m[1])): float(m[2]) for m in re.findall(r"footprint (\w+)\s+(\d+) uids:\s+([\d.]+) bytes/uid", log)}
    chunks = re.findall(r"mass sweep of (\d+) uids in (\d+) chunks of \d+: total ([\d.]+\w+), longest chunk ([\d.]+\w+) \(([\d.]+) ns/uid\)", log)
    sizes = sorted({n for (_, n) in footprint})

    def per_op(workload):
        print(f"\n**{workload}** (time per operation; ratio = other / ring)\n")
        print("| uids | " + " | ".join(STRUCTURES) + " |")
        print("|---|" + "---|" * len(STRUCTURES))
        for n in sizes:
            ring = estimate(workload, "ring", n)
            cells = []
            for s in STRUCTURES:
                v = estimate(workload, s, n)
                ratio = f" ({v / ring:.1f}x)" if v and ring and s != "ring" else ""
                cells.append(fmt_ns(v) + ratio)
            print(f"| {n:,} | " + " | ".join(cells) + " |")

    for w in ["login", "touch_moves", "touch_same_tick", "tick_sweep", "mass_sweep"]:
        per_op(w)

    print("\n**bytes per tracked uid** (counting allocator)\n")
    print("| uids | " + " | ".join(STRUCTURES) + " |")
    print("|---|" + "---|" * len(STRUCTURES))
    for n in sizes:
        print(f"| {n:,} | " + " | ".join(f"{footprint.get((s, n), float('nan')):.1f}" for s in STRUCTURES) + " |")

    print("\n**ring, chunked mass sweep** (the pause the gateway's runtime sees)\n")
    print("| expired | chunks | total | longest chunk | ns per expired uid |")
    print("|---|---|---|---|---|")
    for expired, n_chunks, total, longest, per_uid in chunks:
        print(f"| {int(expired):,} | {n_chunks} | {total} | {longest} | {per_uid} |")

    print("\n**sweep cost per expired uid** (tick_sweep and mass_sweep time / uids expired)\n")
    print("| uids | tick sweep, ring | mass sweep, ring |")
    print("|---|---|---|")
    for n in sizes:
        tick = estimate("tick_sweep", "ring", n)
        mass = estimate("mass_sweep", "ring", n)
        per_tick = (n - n // 10) / 30  # silent 90 %, one thirtieth due per tick
        print(f"| {n:,} | {tick / per_tick:.1f} ns | {mass / -(-n // 3):.1f} ns |" if tick and mass else f"| {n:,} | - | - |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "target/ring-bench.log")

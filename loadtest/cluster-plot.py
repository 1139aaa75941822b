#!/usr/bin/env python3
"""Draws a loadtest/cluster.sh run over time as one SVG, from the raw files it wrote.

    python3 loadtest/cluster-plot.py <out dir> <svg>

Four panels sharing the time axis (seconds since the run began): sessions in all, sessions
per gateway (nodes.csv), memory (the machine's used memory and slab, the gateways', the load
generator's and Redis's), and events per second (events.jsonl's at_ms, when recorded) with
Redis's commands per second. A kill (kill.txt) is a red line across all of them.
Plain SVG written here: the machines this runs on have no plotting library for Python, and
the figures are lines and axes only.
"""
import collections
import csv
import json
import math
import os
import sys

WIDTH, PANEL, LEFT, RIGHT, TOP, GAP = 1000, 190, 80, 200, 30, 50
COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2"]


def floats(row, key):
    try:
        return float(row[key])
    except (KeyError, TypeError, ValueError):
        return None


def nice_max(v):
    """The axis's top: v rounded up at its leading digit."""
    if v <= 0:
        return 1.0
    step = 10 ** math.floor(math.log10(v))
    return (math.floor(v / step) + 1) * step


class Svg:
    def __init__(self, t_end, panels):
        self.t_end, self.parts = t_end, []
        self.height = TOP + panels * (PANEL + GAP)

    def panel(self, index, title, series, unit, kill=None):
        """series: [(label, color, [(t, v), ...], width)]"""
        y0 = TOP + index * (PANEL + GAP)
        top = nice_max(max((v for _, _, pts, _ in series for _, v in pts), default=0))
        x = lambda t: LEFT + (WIDTH - LEFT - RIGHT) * t / self.t_end
        y = lambda v: y0 + PANEL - PANEL * v / top
        p = self.parts
        p.append(f'<text x="{LEFT}" y="{y0 - 8}" font-size="14" font-weight="bold">{title}</text>')
        p.append(f'<rect x="{LEFT}" y="{y0}" width="{WIDTH - LEFT - RIGHT}" height="{PANEL}" fill="none" stroke="#999"/>')
        for k in range(5):
            v = top * k / 4
            digits = 0 if top >= 10 else 2
            p.append(f'<text x="{LEFT - 6}" y="{y(v) + 4:.1f}" font-size="11" text-anchor="end">{v:,.{digits}f}</text>')
            p.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#eee"/>')
        p.append(f'<text x="12" y="{y0 + PANEL / 2}" font-size="11" transform="rotate(-90 12 {y0 + PANEL / 2})" '
                 f'text-anchor="middle">{unit}</text>')
        for k in range(6):
            t = self.t_end * k / 5
            p.append(f'<text x="{x(t):.1f}" y="{y0 + PANEL + 14}" font-size="11" text-anchor="middle">{t:.0f} s</text>')
        legend = 0
        for label, color, pts, width in series:
            if not pts:
                continue
            path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in pts)
            p.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="{width}"/>')
            if label:
                ly = y0 + 12 + 16 * legend
                p.append(f'<line x1="{WIDTH - RIGHT + 10}" x2="{WIDTH - RIGHT + 30}" y1="{ly - 4}" y2="{ly - 4}" '
                         f'stroke="{color}" stroke-width="2"/>')
                p.append(f'<text x="{WIDTH - RIGHT + 35}" y="{ly}" font-size="11">{label}</text>')
                legend += 1
        if kill is not None:
            p.append(f'<line x1="{x(kill):.1f}" x2="{x(kill):.1f}" y1="{y0}" y2="{y0 + PANEL}" stroke="red" '
                     f'stroke-dasharray="4 3"/>')
            p.append(f'<text x="{x(kill) + 4:.1f}" y="{y0 + 12}" font-size="11" fill="red">kill -9</text>')

    def write(self, path):
        with open(path, "w") as f:
            f.write(f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{self.height}" '
                    f'font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>\n')
            f.write("\n".join(self.parts))
            f.write("\n</svg>\n")


def main(out, svg_path):
    start = float(open(os.path.join(out, "run.txt")).read().split()[1])
    rows = list(csv.DictReader(open(os.path.join(out, "samples.csv"))))
    nodes = list(csv.DictReader(open(os.path.join(out, "nodes.csv"))))
    t = lambda row: float(row["unix_s"]) - start
    kill = None
    if os.path.exists(os.path.join(out, "kill.txt")):
        kill = float(open(os.path.join(out, "kill.txt")).read().split()[-1]) - start
    t_end = max(t(r) for r in rows)
    svg = Svg(t_end, 4)

    names = [k for k in nodes[0] if k != "unix_s"] if nodes else []
    per_node = {n: [(t(r), float(r[n])) for r in nodes if r[n]] for n in names}
    total = [(t(r), sum(float(r[n]) for n in names if r[n])) for r in nodes]
    svg.panel(0, "Sessions online, all gateways", [("sessions", COLORS[0], total, 2)], "sessions", kill)
    svg.panel(1, f"Sessions per gateway ({len(names)} gateways)",
              [("", COLORS[i % len(COLORS)], per_node[n], 0.7) for i, n in enumerate(names)], "sessions", kill)

    gib = 1 / 2**30
    mem = []
    for label, key, scale in (("machine used", "mem_used_kb", 1024 * gib), ("kernel slab", "slab_kb", 1024 * gib),
                              ("gateways' RSS", "gw_rss_bytes", gib), ("load generator RSS", "loadtest_rss_kb", 1024 * gib),
                              ("Redis used", "redis_memory_bytes", gib)):
        pts = [(t(r), floats(r, key) * scale) for r in rows if floats(r, key) is not None]
        mem.append((label, COLORS[len(mem)], pts, 1.5))
    svg.panel(2, "Memory", mem, "GiB", kill)

    rates = []
    pairs = [(t(r), floats(r, "redis_commands")) for r in rows if floats(r, "redis_commands") is not None]
    redis = [((a + c) / 2, (d - b) / (c - a)) for (a, b), (c, d) in zip(pairs, pairs[1:]) if c > a]
    events_path = os.path.join(out, "events.jsonl")
    if os.path.exists(events_path):
        bins = collections.Counter()
        with open(events_path) as f:
            for line in f:
                at = json.loads(line).get("at_ms")
                if at is not None:
                    bins[int((at / 1000 - start) // 5)] += 1
        rates.append(("events/s (5 s bins)", COLORS[0],
                      [(b * 5 + 2.5, bins[b] / 5) for b in range(min(bins), max(bins) + 1)], 1.5))
    rates.append(("Redis commands/s", COLORS[1], redis, 1.5))
    svg.panel(3, "Events and Redis commands per second", rates, "per second", kill)
    svg.write(svg_path)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])

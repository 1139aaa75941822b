#!/usr/bin/env python3
"""Reconnect attempts per 100 ms after a restart, for two storm runs side by side.

    storm-histogram.py LIBRARY.json FIXED.json OUT_PREFIX

Reads each loadtest report's `reconnect_attempts_per_100ms` and writes OUT_PREFIX.txt (a
summary, then every bucket of both) and OUT_PREFIX.svg (both as bars on one time axis).
"""
import json
import sys


def load(path):
    with open(path) as f:
        report = json.load(f)
    return report.get("reconnect_policy", path), report.get("reconnect_attempts_per_100ms", []), report


def summary(name, buckets, report):
    total = sum(buckets)
    peak = max(buckets, default=0)
    at = buckets.index(peak) / 10 if buckets else 0
    per_s = [sum(buckets[i:i + 10]) for i in range(0, len(buckets), 10)]
    busy = sum(1 for b in buckets if b > 0)
    return (
        f"{name}\n"
        f"  attempts {total}, over {len(buckets) / 10:.1f} s, in {busy} of {len(buckets)} 100 ms buckets\n"
        f"  busiest 100 ms: {peak} attempts ({100 * peak / max(total, 1):.1f} % of all) at {at:.1f} s;"
        f" busiest second: {max(per_s, default=0)}\n"
        f"  re-login p50 {report['relogin_ms']['p50']:.0f} ms, p99 {report['relogin_ms']['p99']:.0f} ms;"
        f" all back after {report.get('all_back_after_ms') or 0:.0f} ms;"
        f" refused connects {report.get('connect_retries', 0)};"
        f" clients shed twice {report.get('clients_shed_twice', 0)};"
        f" failures {len(report.get('failures', []))}\n"
    )


def svg(series, path):
    width, height, left, bottom, top = 1000, 420, 60, 40, 30
    n = max(len(b) for _, b, _ in series) or 1
    peak = max(max(b, default=0) for _, b, _ in series) or 1
    bar = (width - left - 20) / n
    colours = ["#1f77b4", "#d62728"]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="18" font-size="15">Reconnect attempts per 100 ms after a restart (peak {peak})</text>']
    plot_h = height - bottom - top
    for k, (name, buckets, _) in enumerate(series):
        for i, count in enumerate(buckets):
            if count:
                h = plot_h * count / peak
                x = left + i * bar + (bar / 2 if k else 0)
                out.append(f'<rect x="{x:.2f}" y="{top + plot_h - h:.2f}" width="{max(bar / 2, 0.5):.2f}" height="{h:.2f}" fill="{colours[k]}"/>')
        out.append(f'<rect x="{width - 330}" y="{top + 6 + 18 * k}" width="12" height="12" fill="{colours[k]}"/>')
        out.append(f'<text x="{width - 312}" y="{top + 16 + 18 * k}">{name}</text>')
    out.append(f'<line x1="{left}" y1="{top + plot_h}" x2="{width - 20}" y2="{top + plot_h}" stroke="black"/>')
    for s in range(0, n // 10 + 1, max(1, n // 100)):
        x = left + s * 10 * bar
        out.append(f'<text x="{x:.1f}" y="{top + plot_h + 16}" text-anchor="middle">{s}s</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    library, fixed, prefix = sys.argv[1:4]
    series = [load(library), load(fixed)]
    with open(prefix + ".txt", "w") as f:
        f.write("Reconnect attempts per 100 ms from the first cut-off (loadtest/storm-compare.sh)\n\n")
        for name, buckets, report in series:
            f.write(summary(name, buckets, report) + "\n")
        f.write("bucket_s\t" + "\t".join(name for name, _, _ in series) + "\n")
        for i in range(max(len(b) for _, b, _ in series)):
            row = [str(b[i]) if i < len(b) else "0" for _, b, _ in series]
            f.write(f"{i / 10:.1f}\t" + "\t".join(row) + "\n")
    svg(series, prefix + ".svg")
    with open(prefix + ".txt") as f:
        print("".join(f.readlines()[:12]))


if __name__ == "__main__":
    main()

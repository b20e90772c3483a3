#!/usr/bin/env python3
"""Draws the two plots of BENCHMARKS.md from `homing bench --json` output (no dependencies).

usage: scripts/plot_bench.py bench.json [more.json ...]   (writes docs/*.svg)

- docs/claim-latency.svg: claim latency p50 and p99 against the backlog (log scale), per backend
- docs/throughput.svg: end-to-end dispatches/s against workers, per backend
"""

import json
import math
import re
import sys
from pathlib import Path

COLORS = {"embedded": "#1f77b4", "nats": "#d62728"}
W, H, L, R, T, B = 640, 400, 70, 150, 40, 50


def load(paths):
    figures = []
    for path in paths:
        figures.extend(json.loads(Path(path).read_text()))
    return figures


def axes(title, xlabel, ylabel, xticks, yticks, x, y):
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
        f'<rect width="{W}" height="{H}" fill="white"/>',
        f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="15">{title}</text>',
        f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
        f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>',
        f'<text x="{(L + W - R) / 2}" y="{H - 12}" text-anchor="middle">{xlabel}</text>',
        f'<text x="16" y="{(T + H - B) / 2}" text-anchor="middle" transform="rotate(-90 16 {(T + H - B) / 2})">{ylabel}</text>',
    ]
    for value, label in xticks:
        out.append(f'<line x1="{x(value)}" y1="{H - B}" x2="{x(value)}" y2="{H - B + 5}" stroke="black"/>')
        out.append(f'<text x="{x(value)}" y="{H - B + 18}" text-anchor="middle">{label}</text>')
    for value in yticks:
        out.append(f'<line x1="{L - 5}" y1="{y(value)}" x2="{W - R}" y2="{y(value)}" stroke="#ddd"/>')
        out.append(f'<text x="{L - 8}" y="{y(value) + 4}" text-anchor="end">{value:,.0f}</text>')
    return out


def series(out, points, color, label, index, dash=""):
    path = " ".join(f"{'M' if i == 0 else 'L'}{px:.1f},{py:.1f}" for i, (px, py) in enumerate(points))
    style = f' stroke-dasharray="{dash}"' if dash else ""
    out.append(f'<path d="{path}" fill="none" stroke="{color}" stroke-width="2"{style}/>')
    for px, py in points:
        out.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3.5" fill="{color}"/>')
    ly = T + 10 + 20 * index
    out.append(f'<line x1="{W - R + 10}" y1="{ly}" x2="{W - R + 35}" y2="{ly}" stroke="{color}" stroke-width="2"{style}/>')
    out.append(f'<text x="{W - R + 40}" y="{ly + 4}">{label}</text>')


def nice_max(v):
    if v <= 0:
        return 1
    mag = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if v <= m * mag:
            return m * mag
    return 10 * mag


def latency(figures):
    pts = {}
    for f in figures:
        m = re.match(r"claim latency (p50|p99), (\w+), (\d+) queued", f["scenario"])
        if m:
            pts.setdefault((m[2], m[1]), []).append((int(m[3]), f["median"]))
    if not pts:
        return None
    xs = sorted({q for v in pts.values() for q, _ in v})
    lo, hi = math.log10(min(xs)), math.log10(max(xs))
    hi = hi if hi > lo else lo + 1
    ymax = nice_max(max(v for p in pts.values() for _, v in p))
    x = lambda q: L + (math.log10(q) - lo) / (hi - lo) * (W - R - L)
    y = lambda v: H - B - v / ymax * (H - B - T)
    out = axes(
        "Claim latency against backlog",
        "dispatches queued (log scale)",
        "µs per claim",
        [(q, f"{q:,}") for q in xs],
        [ymax * i / 5 for i in range(6)],
        x,
        y,
    )
    for i, ((backend, pct), p) in enumerate(sorted(pts.items())):
        p.sort()
        series(out, [(x(q), y(v)) for q, v in p], COLORS.get(backend, "gray"), f"{backend} {pct}", i, "" if pct == "p50" else "5,4")
    out.append("</svg>")
    return "\n".join(out)


def throughput(figures):
    pts = {}
    for f in figures:
        m = re.match(r"end to end, echo, (\w+), (\d+) workers", f["scenario"])
        if m:
            pts.setdefault(m[1], []).append((int(m[2]), f["median"]))
    if not pts:
        return None
    xs = sorted({w for v in pts.values() for w, _ in v})
    ymax = nice_max(max(v for p in pts.values() for _, v in p))
    x = lambda w: L + (math.log2(w) - math.log2(xs[0])) / max(math.log2(xs[-1]) - math.log2(xs[0]), 1) * (W - R - L)
    y = lambda v: H - B - v / ymax * (H - B - T)
    out = axes("End-to-end throughput against workers", "workers (echo guest, one host)", "dispatches/s", [(w, str(w)) for w in xs], [ymax * i / 5 for i in range(6)], x, y)
    for i, (backend, p) in enumerate(sorted(pts.items())):
        p.sort()
        series(out, [(x(w), y(v)) for w, v in p], COLORS.get(backend, "gray"), backend, i)
    out.append("</svg>")
    return "\n".join(out)


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    figures = load(sys.argv[1:])
    docs = Path(__file__).resolve().parent.parent / "docs"
    for name, svg in (("claim-latency.svg", latency(figures)), ("throughput.svg", throughput(figures))):
        if svg:
            (docs / name).write_text(svg + "\n")
            print(f"wrote docs/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

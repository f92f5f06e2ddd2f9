#!/usr/bin/env python3
"""Draws what python/bench/bench.py measured: p50 latency (bars) with p99 (ticks), and
items/s, per transport and size, on log axes.

    python python/bench/plot.py BENCH.json OUT.png [TITLE]

Needs matplotlib.
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def panel(ax_lat, ax_tput, table, title):
    transports = list(table)
    sizes = list(next(iter(table.values())))
    width = 0.8 / len(transports)
    for k, name in enumerate(transports):
        xs = [i + (k - (len(transports) - 1) / 2) * width for i in range(len(sizes))]
        p50 = [table[name][s]["p50_us"] for s in sizes]
        p99 = [table[name][s]["p99_us"] for s in sizes]
        tput = [table[name][s]["items_per_s"] for s in sizes]
        bars = ax_lat.bar(xs, p50, width, label=name)
        ax_lat.scatter(xs, p99, marker="_", s=120, color=bars.patches[0].get_facecolor(), zorder=3)
        ax_tput.bar(xs, tput, width, label=name)
    for ax in (ax_lat, ax_tput):
        ax.set_yscale("log")
        ax.set_xticks(range(len(sizes)))
        ax.set_xticklabels(sizes)
        ax.grid(axis="y", which="both", alpha=0.3)
    ax_lat.set_ylabel("one-way latency, µs (bar p50, tick p99)")
    ax_tput.set_ylabel("items/s")
    ax_lat.set_title(title + ": latency (lower is better)")
    ax_tput.set_title(title + ": throughput (higher is better)")
    ax_lat.legend(fontsize=7)


def main():
    data = json.load(open(sys.argv[1]))
    title = sys.argv[3] if len(sys.argv) > 3 else data.get("device", "")
    tables = [
        (t, data[k]) for t, k in (("CUDA tensors", "gpu"), ("numpy arrays", "host")) if data.get(k)
    ]
    fig, axes = plt.subplots(len(tables), 2, figsize=(13, 4.5 * len(tables)), squeeze=False)
    for row, (t, table) in zip(axes, tables):
        panel(row[0], row[1], table, t)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=90)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Plots the one-way latency distributions that `gpuring bench --samples FILE` wrote.

    gpuring bench --samples samples.csv            # on the machine to measure
    python3 scripts/plot_latency.py samples.csv docs/latency.png

One panel per payload size; in each, the empirical CDF of one-way latency (log scale) per
path: gpuring channels, a pipe, a Unix socket (and the GPU rows when present). Needs
matplotlib.
"""
import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def human(n):
    for unit, size in (("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"


def main(src, dst):
    data = defaultdict(lambda: defaultdict(list))
    with open(src) as f:
        for row in csv.DictReader(f):
            data[int(row["payload_bytes"])][row["path"]].append(int(row["one_way_ns"]) / 1e3)
    sizes = sorted(data)
    fig, axes = plt.subplots(1, len(sizes), figsize=(5.5 * len(sizes), 4), squeeze=False)
    for ax, size in zip(axes[0], sizes):
        for path, us in sorted(data[size].items()):
            us.sort()
            n = len(us)
            ax.plot(us, [(i + 1) / n for i in range(n)], label=f"{path} (n={n})")
        ax.set_xscale("log")
        ax.set_xlabel("one-way latency (µs, log scale)")
        ax.set_ylabel("fraction of hand-offs ≤ x")
        ax.set_title(f"{human(size)} payload")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle("gpuring bench: one-way hand-off latency, one run")
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: plot_latency.py SAMPLES.csv OUT.png")
    main(sys.argv[1], sys.argv[2])

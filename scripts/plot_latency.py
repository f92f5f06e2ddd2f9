#!/usr/bin/env python3
"""Plots latency distributions that the bench tooling wrote, one panel per case.

    python3 scripts/plot_latency.py SAMPLES.csv [MORE.csv ...] OUT.png

Inputs (any mix; each is `payload_bytes,path,<measure>_ns`, one row per sample):
  - `gpuring bench --samples FILE`: one-way latency per hand-off (ping-pong / 2);
  - `cargo bench --bench rings`: target/criterion/samples-rings.csv, one-way descriptor
    latency per round trip, for gpuring, the raw floors, a pipe, a Unix socket,
    ipc-channel and iceoryx2 (paths whose name contains "spin" get their own panel);
  - `cargo bench --bench payloads`: target/criterion/samples-payloads.csv, the time from
    writing an item to learning that the consumer has it, per payload size and path.

In each panel, the empirical CDF per path on a log time axis. Needs matplotlib.
"""
import csv
import math
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MEASURES = {
    "one_way_ns": "one-way latency",
    "handoff_ack_ns": "hand-off until acknowledged",
}


def human(n):
    if n >= 1e6:
        return f"{n / 1e6:g} MB"
    if n >= 1024 and n % 1024 == 0:
        return f"{n // 1024} KiB"
    return f"{n} B"


def load(paths):
    """{(measure, payload, spinning): {path: [µs, ...]}}"""
    panels = defaultdict(lambda: defaultdict(list))
    for src in paths:
        with open(src) as f:
            reader = csv.DictReader(f)
            measure = reader.fieldnames[2]
            for row in reader:
                key = (measure, int(row["payload_bytes"]), "spin" in row["path"])
                panels[key][row["path"]].append(int(row[measure]) / 1e3)
    return panels


def main(srcs, dst):
    panels = load(srcs)
    keys = sorted(panels)
    # One colour per path across all panels.
    names = sorted({p for k in keys for p in panels[k]})
    palette = plt.get_cmap("tab20").colors
    colour = {p: palette[i % len(palette)] for i, p in enumerate(names)}
    cols = min(2, len(keys))
    rows = math.ceil(len(keys) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(7 * cols, 4.5 * rows), squeeze=False)
    for ax in axes.flat[len(keys):]:
        ax.set_visible(False)
    for ax, key in zip(axes.flat, keys):
        measure, size, spinning = key
        for path, us in sorted(panels[key].items()):
            us.sort()
            n = len(us)
            style = "-" if path.startswith("gpuring") else "--"
            ax.plot(
                us,
                [(i + 1) / n for i in range(n)],
                style,
                color=colour[path],
                label=f"{path} (n={n})",
            )
        ax.set_xscale("log")
        what = MEASURES.get(measure, measure)
        ax.set_xlabel(f"{what} (µs, log scale)")
        ax.set_ylabel("fraction of samples ≤ x")
        title = f"{human(size)}: {what}"
        if spinning:
            title += ", spinning peers"
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle("gpuring vs the alternatives: latency distributions, one run per file")
    fig.tight_layout()
    fig.savefig(dst, dpi=100)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: plot_latency.py SAMPLES.csv [MORE.csv ...] OUT.png")
    main(sys.argv[1:-1], sys.argv[-1])

#!/usr/bin/env python3
"""Draws the GPU bench per setup from saved criterion logs (issue 17's picture).

    python3 scripts/plot_gpu_setups.py OUT.png LABEL=LOG[:SECTION,...] ...

Each LOG is a file of `bench-gpu` criterion output; files that concatenate several logs
(docs/data/gpu-run-*.txt) separate them with `== <name>` lines or prefix each line with
`<name>| ` (run AH on), and SECTION names the ones to read (the first match of each row
wins). LABEL names the setup on the x axis. Left
panel: one-way latency, the raw IPC-event floor, gpuring, and the stream-value floor
(issue 17 part 3). Right panel: the stream, items/s, the raw IPC-event stream, gpuring,
and the stream-value stream. Both panels also show gpuring with host ready flags
(`GpuReady::HostFlag`) where the log has it. Needs matplotlib.
"""
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROWS = {
    "latency": [
        ("gpu_handoff_one_way/floor_ipc_events_spin", "raw floor, IPC events"),
        ("gpu_handoff_one_way/gpuring_spsc_spin", "gpuring"),
        ("gpu_handoff_one_way/gpuring_spsc_spin_host_flags", "gpuring, host flags"),
        ("gpu_stream_values/floor_stream_values_spin", "raw floor, stream values"),
    ],
    "stream": [
        ("gpu_stream/floor_ipc_events_stream", "raw stream, IPC events"),
        ("gpu_stream/gpuring_spsc_1p1c", "gpuring"),
        ("gpu_stream/gpuring_spsc_1p1c_host_flags", "gpuring, host flags"),
        ("gpu_stream_values/floor_stream_values_stream", "raw stream, stream values"),
    ],
}
UNITS = {"ns": 1e-3, "µs": 1.0, "ms": 1e3}


def read(path, sections):
    """Medians per row: µs for times, k items/s for throughputs."""
    out, keep, row = {}, not sections, None
    for line in open(path, encoding="utf-8"):
        tagged = re.match(r"^([a-z0-9-]+)\| (.*)$", line)
        if tagged:
            if sections and tagged.group(1) not in sections:
                continue
            line = tagged.group(2) + "\n"
        elif line.startswith("== "):
            keep = not sections or line[3:].strip() in sections
            continue
        elif not keep:
            continue
        if re.match(r"^[a-z_0-9]+/[a-z_0-9]+$", line.strip()):
            row = line.strip()
            continue
        m = re.match(r"^\s+time:\s+\[\S+ \S+ (\S+) (\S+)", line)
        if m and row and row not in out:
            out[row] = float(m.group(1)) * UNITS[m.group(2)]
            continue
        m = re.match(r"^\s+thrpt:\s+\[\S+ \S+ (\S+) (\S+)", line)
        if m and row:
            scale = {"Kelem/s": 1.0, "Melem/s": 1e3, "elem/s": 1e-3}[m.group(2)]
            out[row + " thrpt"] = float(m.group(1)) * scale
    return out


def main():
    out_png, setups = sys.argv[1], []
    for arg in sys.argv[2:]:
        label, spec = arg.split("=", 1)
        path, _, secs = spec.partition(":")
        setups.append((label, read(path, [s for s in secs.split(",") if s])))
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    for ax, (panel, rows) in zip(axes, ROWS.items()):
        width, top = 0.8 / len(rows), 0.0
        for i, (row, name) in enumerate(rows):
            key = row if panel == "latency" else row + " thrpt"
            xs, ys = [], []
            for j, (_, vals) in enumerate(setups):
                if key in vals:
                    xs.append(j + (i - (len(rows) - 1) / 2) * width)
                    ys.append(vals[key])
            if not ys:
                continue  # no setup has this row
            bars = ax.bar(xs, ys, width, label=name)
            top = max([top, *ys])
            ax.bar_label(bars, fmt="%.1f", fontsize=7)
        ax.set_xticks(range(len(setups)), [label for label, _ in setups], fontsize=8)
        if panel == "latency":
            ax.set_yscale("log")
            ax.set_ylim(top=top * 4)
            ax.set_ylabel("one-way latency, µs (median, log scale)")
            ax.set_title("GPU hand-off, ping-pong / 2")
        else:
            ax.set_ylabel("k items/s (median)")
            ax.set_ylim(top=top * 1.3)
            ax.set_title("GPU stream, one producer, one consumer")
        ax.legend(fontsize=8, loc="upper left", ncols=3)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)


if __name__ == "__main__":
    main()

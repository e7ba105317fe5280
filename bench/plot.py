#!/usr/bin/env python3
"""Bar chart of a run_table.py results.json: samples/s per configuration, replica and PyTorch side by side,
one panel per network.

    python3 bench/plot.py /tmp/bench-cpu/results.json            # writes /tmp/bench-cpu/results.png
    python3 bench/plot.py results/h200x2 --out h200x2.png
    python3 bench/plot.py docs/results/gpu4.json --lines --out gpu4.png    # samples/s against device count
"""

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_table import batch_text, kind_of, ok, sig3  # noqa: E402

REPLICA_COLOURS = ("#1f77b4", "#2ca02c", "#17becf", "#9467bd", "#8c564b", "#7f7f7f")
PYTORCH_COLOURS = ("#ff7f0e", "#d62728", "#e377c2", "#bcbd22")


def series_of(r):
    """The bar's series: the library with its settings and, for replica, the model variant and dispatch."""
    if r["library"] == "pytorch":
        return r["config"]
    variant = f" {r['model']}" if r["model"] != r["network"] else ""
    return f"{r['config']}{variant}, {r['dispatch']}"


def group_of(r):
    """Runs in one group of bars do the same work: device kind and count, scaling, batch."""
    scaling = f" {r['scaling']}" if r["devices"] > 1 else ""
    devices = f"{r['devices']} {kind_of(r)} device{'s' if r['devices'] > 1 else ''}"
    return f"{devices}{scaling}\nbatch {batch_text(r)}"


def line_of(r):
    """The line a run belongs to in --lines: library, scaling and (ours) dispatch; None for runs off any line."""
    if r["dispatch"] == "auto" or r.get("reproducible"):
        return None
    if r["library"] == "pytorch":
        return f"pytorch DDP, {r['scaling']}"
    return f"replica {r['dispatch']}, {r['scaling']}"


def plot_lines(plt, doc, results, out):
    """Samples/s against the number of devices: one panel per model and batch, one line per library,
    scaling and dispatch (the 1-device run starts every line of its library)."""
    panels = list(dict.fromkeys((r["model"] if r["library"] == "replica" else r["network"], r["batch"])
                                for r in results if r["library"] == "replica"))
    cols = min(len(panels), 3)
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.0 * rows), squeeze=False)
    styles = {"replica threaded, strong": ("#2ca02c", "-"), "replica single, strong": ("#1f77b4", "-"),
              "replica threaded, weak": ("#2ca02c", "--"), "replica single, weak": ("#1f77b4", "--"),
              "pytorch DDP, strong": ("#ff7f0e", "-"), "pytorch DDP, weak": ("#ff7f0e", "--")}
    for ax, (model, batch) in zip(axes.flat, panels):
        network = next(r["network"] for r in results if r["model"] == model)
        runs = [r for r in results if r["batch"] == batch and
                (r["model"] == model if r["library"] == "replica" else r["network"] == network)]
        for line, (colour, dash) in styles.items():
            library = "pytorch" if line.startswith("pytorch") else "replica"
            points = {r["devices"]: r["samples_per_s"] for r in runs if line_of(r) == line}
            single = [r for r in runs if r["library"] == library and r["devices"] == 1 and line_of(r)]
            if not points:
                continue
            if single:
                points[1] = max(r["samples_per_s"] for r in single)
            xs = sorted(points)
            ax.plot(xs, [points[x] for x in xs], dash, color=colour, marker="o", markersize=4, label=line)
        ax.set_xticks(sorted({r["devices"] for r in runs}))
        ax.set_xlabel("GPUs" if kind_of(runs[0]) == "cuda" else "devices")
        ax.set_ylabel("samples/s")
        ax.set_title(f"{model}, batch {batch} (per device when weak)", fontsize=10)
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    m = doc.get("machine", {})
    where = ", ".join(m["gpus"]) if m.get("gpus") else m.get("cpu") or ""
    fig.suptitle(f"Scaling, preset {doc.get('preset', '?')}: {m.get('hostname', '')} ({where})", fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(out)
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description="bar chart of samples/s from run_table.py's results.json")
    p.add_argument("results", help="results.json, or the folder holding it")
    p.add_argument("--out", help="the PNG to write (default: results.png beside results.json)")
    p.add_argument("--lines", action="store_true", help="samples/s against the number of devices instead of bars")
    args = p.parse_args(argv)
    path = os.path.join(args.results, "results.json") if os.path.isdir(args.results) else args.results
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(path)), "results.png")

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot.py needs matplotlib: on Debian or Ubuntu `sudo apt-get install python3-matplotlib` (then run "
              "this with /usr/bin/python3), elsewhere `python3 -m pip install matplotlib`", file=sys.stderr)
        return 1

    with open(path) as f:
        doc = json.load(f)
    results = [r for r in doc["results"] if ok(r)]
    if not results:
        print(f"plot.py: no successful runs in {path}", file=sys.stderr)
        return 1
    if args.lines:
        return plot_lines(plt, doc, results, out)
    networks = list(dict.fromkeys(r["network"] for r in results))
    # Series in the order they first ran, ours before PyTorch's.
    series = list(dict.fromkeys(series_of(r) for r in results))
    replica_series = [s for s in series if not s.startswith("pytorch")]
    pytorch_series = [s for s in series if s.startswith("pytorch")]
    series = replica_series + pytorch_series
    colour = {s: REPLICA_COLOURS[i % len(REPLICA_COLOURS)] for i, s in enumerate(replica_series)}
    colour.update({s: PYTORCH_COLOURS[i % len(PYTORCH_COLOURS)] for i, s in enumerate(pytorch_series)})

    cols = min(len(networks), 2)
    rows = math.ceil(len(networks) / cols)
    width = max(7.0, 1.6 * max(len({group_of(r) for r in results if r["network"] == n}) for n in networks))
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, 4.6 * rows), squeeze=False)
    for ax, net in zip(axes.flat, networks):
        runs = [r for r in results if r["network"] == net]
        groups = list(dict.fromkeys(group_of(r) for r in runs))
        drawn = set()
        for g, group in enumerate(groups):
            members = [r for r in runs if group_of(r) == group]
            members.sort(key=lambda r: series.index(series_of(r)))
            bar = 0.8 / len(members)
            for j, r in enumerate(members):
                s = series_of(r)
                x = g - 0.4 + bar * (j + 0.5)
                ax.bar(x, r["samples_per_s"], bar * 0.92, color=colour[s], label=None if s in drawn else s)
                ax.text(x, r["samples_per_s"], sig3(r["samples_per_s"]), ha="center", va="bottom", fontsize=7,
                        rotation=90 if len(members) > 3 else 0)
                drawn.add(s)
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels(groups, fontsize=8)
        ax.set_ylabel("samples/s")
        ax.set_title(net)
        ax.margins(y=0.18)
        ax.grid(axis="y", alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        order = sorted(range(len(labels)), key=lambda i: series.index(labels[i]))
        ax.legend([handles[i] for i in order], [labels[i] for i in order], fontsize=7, loc="upper left")
    for ax in list(axes.flat)[len(networks):]:
        ax.set_visible(False)
    m = doc.get("machine", {})
    where = ", ".join(m["gpus"]) if m.get("gpus") else m.get("cpu") or ""
    fig.suptitle(f"Training throughput, preset {doc.get('preset', '?')}: {m.get('hostname', '')} ({where})",
                 fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

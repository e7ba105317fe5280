#!/usr/bin/python3
"""Draws docs/results/current.png: our training step over PyTorch's on one H200, per network, in fp32
and bf16, from docs/results/current.csv (the ratios of docs/benchmarks.md's tables, each with the
commit it was measured at and the PyTorch mode it is set against).

    docs/results/plot_current.py [--csv FILE] [--out FILE]

Needs Debian's python3-matplotlib (drawn without a display)."""

import argparse
import csv
import os

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

here = os.path.dirname(os.path.abspath(__file__))
p = argparse.ArgumentParser()
p.add_argument("--csv", default=os.path.join(here, "current.csv"))
p.add_argument("--out", default=os.path.join(here, "current.png"))
o = p.parse_args()
rows = list(csv.DictReader(open(o.csv)))

fig, ax = plt.subplots(figsize=(9, 6.8))
height = 0.38
series = (("fp32", "#1f77b4", "fp32: over PyTorch fp32 eager (ResNets: its CUDA graph, the faster)"),
          ("bf16", "#ff7f0e", "bf16: over PyTorch bf16's fastest of eager, CUDA graph, torch.compile"))
for k, (key, colour, label) in enumerate(series):
    ys = [i + (k - 0.5) * height for i in range(len(rows))]
    values = [float(r[key]) for r in rows]
    ax.barh(ys, values, height, color=colour, label=label)
    for y, v, r in zip(ys, values, rows):
        ax.text(v + 0.01, y, f"{r[key]}  ({r[key + '_commit']})", va="center", fontsize=8)
ax.axvline(1.0, color="black", linewidth=1)
ax.text(1.0, -0.9, " PyTorch = 1", fontsize=8, va="center")
ax.axvline(0.8, color="#ff7f0e", linewidth=1, linestyle=":")
ax.text(0.8, -0.9, "bf16 target 0.8 ", fontsize=8, va="center", ha="right", color="#c05000")
ax.set_yticks(range(len(rows)), [r["network"] for r in rows])
ax.invert_yaxis()
ax.set_ylim(len(rows) - 0.4, -1.3)
ax.set_xlim(0, 1.25)
ax.set_xlabel("our step time / PyTorch's (below 1: replica is faster)")
ax.set_title("One NVIDIA H200: a training step, replica over PyTorch 2.11 (commit beside each bar)", fontsize=10)
ax.legend(loc="upper center", bbox_to_anchor=(0.4, -0.1), fontsize=8, frameon=False)
fig.tight_layout()
fig.savefig(o.out, dpi=110)
print(o.out)

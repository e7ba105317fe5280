#!/usr/bin/env python3
"""The character-level GPT demo side by side on the CPU: examples/train_gpt (ours, auto_parallel over
the CPU's cores) and bench/pytorch_gpt.py (PyTorch from Debian's python3-torch, at 1 and at 2 threads),
one after the other in one run, with the same text, steps, batch and schedule. Prints a Markdown table
(validation loss at the end, in nats and bits per character; wall time of the whole run, evaluations
included) and writes the JSON of every run to --out.

    python3 bench/gpt_cpu.py --program build/examples/train_gpt --steps 2000 --out /tmp/gpt-cpu.json
"""

import argparse
import glob
import json
import math
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def fortunes():
    files = sorted(f for f in glob.glob("/usr/share/games/fortunes/*")
                   if os.path.isfile(f) and not f.endswith((".dat", ".u8")))
    if not files:
        sys.exit("no fortunes: apt-get install fortunes, or pass --text")
    return files


def timed(cmd):
    start = time.perf_counter()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    record = json.loads(out.strip().splitlines()[-1])
    record["wall_seconds"] = time.perf_counter() - start
    return record


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--program", default="build/examples/train_gpt")
    p.add_argument("--text", nargs="*", help="text files (default: Debian's fortunes)")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--threads", default="1,2", help="PyTorch's thread counts to run")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    text = a.text or fortunes()
    common = ["--steps", str(a.steps), "--eval-every", str(a.eval_every), "--warmup", str(a.warmup), "--lr", str(a.lr)]
    runs = [("replica, auto_parallel", timed([a.program, "--json", "--text", *text] + common))]
    for t in a.threads.split(","):
        runs.append((f"PyTorch, {t} thread{'s' if t != '1' else ''}",
                     timed(["/usr/bin/python3", os.path.join(HERE, "pytorch_gpt.py"), "--json", "--threads", t] + common + text)))
    best = min(r["wall_seconds"] for name, r in runs if name.startswith("PyTorch"))
    print(f"| run | validation loss (nats) | bits per character | wall time (s) | against PyTorch's fastest |")
    print("|---|---|---|---|---|")
    for name, r in runs:
        print(f"| {name} | {r['val_loss']:.4f} | {r['val_loss'] / math.log(2):.3f} | {r['wall_seconds']:.1f} | "
              f"{r['wall_seconds'] / best:.2f} |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump([{"run": n, **r} for n, r in runs], f, indent=1)


if __name__ == "__main__":
    main()

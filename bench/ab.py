#!/usr/bin/env python3
"""Old against new: two train_bench programs on the same configurations, in interleaved processes.

usage: ab.py OLD NEW [--rounds K] [--out FILE] -- "ARGS" ["ARGS" ...]

Each configuration (a quoted train_bench argument string) runs K times per program, alternating
old, new, new, old, ... so that drift in the machine's speed falls on both. Each run reports its
median step (--json is added); the table gives each program's median of those medians and new / old.
"""
import argparse
import json
import shlex
import statistics
import subprocess
import sys


def run(program, args):
    out = subprocess.run([program] + shlex.split(args) + ["--json"], capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"{program} {args} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    line = [l for l in out.stdout.splitlines() if l.startswith("{")][-1]
    return json.loads(line)["median_ms"]


def main():
    argv = sys.argv[1:]
    if "--" not in argv:
        raise SystemExit(__doc__)
    cut = argv.index("--")
    p = argparse.ArgumentParser()
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out")
    o = p.parse_args(argv[:cut])
    configs = argv[cut + 1:]
    rows = []
    for args in configs:
        times = {"old": [], "new": []}
        for k in range(o.rounds):
            order = ("old", "new") if k % 2 == 0 else ("new", "old")
            for which in order:
                times[which].append(run(o.old if which == "old" else o.new, args))
        old, new = statistics.median(times["old"]), statistics.median(times["new"])
        rows.append({"args": args, "old_ms": old, "new_ms": new, "ratio": new / old, "runs": times})
        print(f"{args:70s} old {old:8.4f} ms  new {new:8.4f} ms  new/old {new / old:.3f}", flush=True)
    if o.out:
        with open(o.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The loss-curve comparison end to end on the CPU: train_bench --model gpt2 --gpt-config tiny --curve
records 6 updates, bench/pytorch_bench.py --curve repeats them in float32 and must agree within its
default tolerance; then again from the same files with blocks 0 and 1 of the initial parameters swapped,
which must not agree. Skipped (77) where PyTorch cannot be imported.

    gpt_curve.py TRAIN_BENCH PYTORCH_BENCH_PY
"""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

# GPT<2, 2, 64, 64, 512>'s flat vector: wte, wpe, two blocks, ln_f.
VOCAB, DIM, CONTEXT = 512, 64, 64
BLOCK = 4 * DIM + (DIM * 3 * DIM + 3 * DIM) + (DIM * DIM + DIM) + (DIM * 4 * DIM + 4 * DIM) + (4 * DIM * DIM + DIM)


def compare(bench_py, prefix):
    done = subprocess.run([sys.executable, bench_py, "--model", "gpt2", "--gpus", "0", "--threads", "1",
                           "--curve", prefix], capture_output=True, text=True)
    if done.returncode not in (0, 1):
        sys.exit(f"pytorch_bench --curve failed ({done.returncode}):\n{done.stderr}")
    return done.returncode, json.loads(done.stdout)


def main(bench, bench_py):
    if importlib.util.find_spec("torch") is None:
        print("PyTorch is not installed: skipped")
        return 77
    with tempfile.TemporaryDirectory() as out:
        prefix = os.path.join(out, "tiny")
        subprocess.run([bench, "--model", "gpt2", "--gpt-config", "tiny", "--devices", "cpu:0", "--steps", "6",
                        "--curve", prefix, "--json"], check=True, stdout=subprocess.DEVNULL)
        with open(prefix + ".json") as f:
            run = json.load(f)
        problems = []
        if run["parameters"] != VOCAB * DIM + CONTEXT * DIM + 2 * BLOCK + 2 * DIM:
            problems.append(f"tiny.json says {run['parameters']} parameters")
        code, r = compare(bench_py, prefix)
        if code != 0 or not r["agree"] or len(r["pytorch"]["losses"]) != 6:
            problems.append(f"the curves differ: largest relative difference {r['max_rel']:.3g} at update "
                            f"{r['max_rel_step']} (tolerance {r['rtol']:.3g})")
        with open(prefix + ".params", "rb") as f:
            params = bytearray(f.read())
        at = 4 * (VOCAB * DIM + CONTEXT * DIM)
        first, second = params[at:at + 4 * BLOCK], params[at + 4 * BLOCK:at + 8 * BLOCK]
        params[at:at + 8 * BLOCK] = second + first
        with open(prefix + ".params", "wb") as f:
            f.write(params)
        code, swapped = compare(bench_py, prefix)
        if code != 1 or swapped["agree"]:
            problems.append(f"the blocks swapped still agree: largest relative difference {swapped['max_rel']:.3g}")
    for p in problems:
        print("gpt_curve:", p)
    if not problems:
        print(f"curves agree to {r['max_rel']:.3g} relative; swapped blocks differ by {swapped['max_rel']:.3g}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))

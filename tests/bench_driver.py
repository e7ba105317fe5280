#!/usr/bin/env python3
"""The benchmark driver end to end on the CPU: the cpu preset's LeNet runs, 2 steps each, in 2
interleaved rounds; every configuration must report both runs and the median of their medians. And
every preset's commands (--dry-run, with PyTorch), so that the GPU presets fail here, not on a lent GPU.

    bench_driver.py TRAIN_BENCH RUN_TABLE_PY
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile


def main(bench, driver):
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, driver, "--preset", "cpu", "--bench", bench, "--out", out,
                        "--steps", "2", "--warmup", "0", "--repeat", "2"], check=True)
        with open(os.path.join(out, "results.json")) as f:
            results = json.load(f)["results"]
        with open(os.path.join(out, "results.md")) as f:
            table = f.read()
    problems = []
    if len(results) != 6:
        problems.append(f"expected the cpu preset's 6 configurations, got {len(results)}")
    for r in results:
        runs = r.get("runs_ms", [])
        if r.get("error") or len(runs) != 2:
            problems.append(f"{r['config']} on {r['device_list']}: {r.get('error') or f'{len(runs)} runs, expected 2'}")
        elif r["median_ms"] != statistics.median(runs) or not r["samples_per_s"] > 0:
            problems.append(f"{r['config']} on {r['device_list']}: median {r['median_ms']} of runs {runs}")
    if "ran in 2 processes" not in table:
        problems.append("results.md does not say that each configuration ran twice")
    sys.path.insert(0, os.path.dirname(os.path.abspath(driver)))
    import run_table  # noqa: E402
    for preset in run_table.PRESETS:
        listed = subprocess.run([sys.executable, driver, "--preset", preset, "--bench", bench, "--out", "unused",
                                 "--pytorch", "--dry-run"], capture_output=True, text=True)
        commands = [line for line in listed.stdout.splitlines() if line.strip()]
        if listed.returncode != 0 or not commands:
            problems.append(f"preset {preset}: exit {listed.returncode}, {len(commands)} commands; {listed.stderr.strip()}")
        elif any("--model" not in c for c in commands):
            problems.append(f"preset {preset}: a command without --model")
    for p in problems:
        print("bench_driver: " + p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))

#!/usr/bin/env python3
"""Training steps on the CPU, ours and PyTorch's side by side in one run.

For each network and thread count, runs build/bench/train_bench (one CPU replica whose BLAS and oneDNN
calls use the threads; with two threads or more, also one replica per thread, each on one thread) and
bench/pytorch_bench.py --gpus 0 (PyTorch's CPU build: Debian's python3-torch, python3-torchvision for
resnet18) with the same batch, steps and warm-up, and reports each one's median step time and the ratio
ours / PyTorch's (ours: the faster of our configurations). The load average before each run is recorded
beside it: on a shared machine the times are only indicative.

    python3 bench/pytorch_cpu_bench.py                                  # every network, 1 and 2 threads
    python3 bench/pytorch_cpu_bench.py --models resnet20,lenet --threads 2 --steps 10 --json out.json
    python3 bench/pytorch_cpu_bench.py --models resnet20 --precision bf16   # bf16 activations (autocast there)
    python3 bench/pytorch_cpu_bench.py --baseline-isa     # ours also on SSE2 loops (REPLICA_CPU_ISA=baseline)

Networks and batches (--models; --batch NAME=B overrides): resnet20 128, resnet18 16 (224x224),
alexnet 128, googlenet 32, textcnn 128, fcn 16, lenet 64 (the defaults of train_bench, resnet18's cut
to 16 for the CPU). --precision bf16 (the residual networks): ours with bf16 activations and fp32
master parameters (oneDNN's bf16 convolutions where the CPU has bf16 products), PyTorch under
torch.autocast to bfloat16 with channels_last. JSON (--json FILE, or - for standard output): {"machine": ..., "runs": [{"model",
"batch", "threads", "ours": {config: median_ms}, "ours_ms", "pytorch_ms", "ratio", "load": [...]; with
--baseline-isa also "ours_baseline", "baseline_ms", "baseline_ratio"}]}.
"""

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_MODELS = ("resnet20", "resnet18", "alexnet", "googlenet", "textcnn", "fcn", "lenet")
BATCH = {"resnet20": 128, "resnet18": 16, "alexnet": 128, "googlenet": 32, "textcnn": 128, "fcn": 16, "lenet": 64}


def torch_python():
    """A Python that imports torch: this one, else Debian's (python3-torch installs there)."""
    for candidate in (sys.executable, "/usr/bin/python3"):
        if candidate and subprocess.run([candidate, "-c", "import torch"], capture_output=True).returncode == 0:
            return candidate
    raise SystemExit("pytorch_cpu_bench: no Python here imports torch (apt-get install python3-torch python3-torchvision)")


def blas_coretype():
    """The OpenBLAS kernels to name, as scripts/lib.sh does: Debian's OpenBLAS does not know recent CPUs."""
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    if " avx512f" in flags and " avx512bw" in flags:
        return "SkylakeX"
    return "Haswell" if " avx2" in flags else None


def run_json(command, env=None):
    """Runs a benchmark that prints one JSON object (its last line) and returns it."""
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def ours(s, model, batch, threads, isa=None):
    """train_bench's median step times: {configuration: ms}; isa: REPLICA_CPU_ISA for the run."""
    common = [s.train_bench, "--model", model, "--batch", str(batch), "--steps", str(s.steps), "--warmup",
              str(s.warmup), "--precision", s.precision, "--json"]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    if isa:
        env["REPLICA_CPU_ISA"] = isa
    times = {}
    record = run_json(common + ["--devices", "cpu:0", "--blas-threads", str(threads)], env)
    times[f"1 replica x {threads} threads"] = record["median_ms"]
    if threads > 1:
        devices = ",".join(f"cpu:{i}" for i in range(threads))
        record = run_json(common + ["--devices", devices, "--dispatch", "threaded"], env)
        times[f"{threads} replicas x 1 thread"] = record["median_ms"]
    return times


def pytorch(s, python, model, batch, threads):
    record = run_json([python, os.path.join(HERE, "pytorch_bench.py"), "--model", model, "--gpus", "0", "--threads",
                       str(threads), "--batch", str(batch), "--steps", str(s.steps), "--warmup", str(s.warmup),
                       "--precision", s.precision, "--json"], dict(os.environ, OMP_NUM_THREADS=str(threads)))
    return record["median_ms"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train-bench", default=os.path.join(ROOT, "build", "bench", "train_bench"),
                   help="our benchmark program (default: build/bench/train_bench)")
    p.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma-separated networks")
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts (default: 1,2)")
    p.add_argument("--batch", action="append", default=[], metavar="NAME=B", help="another batch for a network")
    p.add_argument("--steps", type=int, default=10, help="timed steps per run (default: 10)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (default: 3)")
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16"),
                   help="the activations' type in both (default: fp32; bf16: the residual networks)")
    p.add_argument("--baseline-isa", action="store_true",
                   help="also run ours with the backend's own loops on the build's baseline instructions "
                        "(REPLICA_CPU_ISA=baseline: SSE2 on plain x86-64), beside the default (the widest the CPU has)")
    p.add_argument("--json", metavar="FILE", help="write the JSON record there (- : standard output)")
    s = p.parse_args(argv)
    s.models = [m for m in s.models.split(",") if m]
    s.threads = [int(t) for t in s.threads.split(",") if t]
    s.batches = dict(BATCH)
    for item in s.batch:
        name, _, value = item.partition("=")
        s.batches[name] = int(value)
    unknown = [m for m in s.models if m not in s.batches]
    if unknown:
        p.error(f"unknown networks {', '.join(unknown)}: name some of {', '.join(DEFAULT_MODELS)}")
    if not os.access(s.train_bench, os.X_OK):
        p.error(f"{s.train_bench} is not a program: build it (ninja -C build bench/train_bench) or name it")
    return s


def main(argv=None):
    s = parse_args(argv)
    if "OPENBLAS_CORETYPE" not in os.environ and blas_coretype():
        os.environ["OPENBLAS_CORETYPE"] = blas_coretype()
    python = torch_python()
    runs = []
    extra = f" {'baseline':>9} {'ratio':>6}" if s.baseline_isa else ""
    print(f"{'network':10} {'batch':>5} {'threads':>7} {'ours ms':>9} {'PyTorch ms':>10} {'ratio':>6}{extra}  load  (ours by configuration)")
    for model in s.models:
        batch = s.batches[model]
        for threads in s.threads:
            load = os.getloadavg()[0]
            mine = ours(s, model, batch, threads)
            theirs = pytorch(s, python, model, batch, threads)
            best = min(mine.values())
            run = {"model": model, "batch": batch, "threads": threads, "ours": mine, "ours_ms": best,
                   "pytorch_ms": theirs, "ratio": best / theirs, "load": [load, os.getloadavg()[0]]}
            columns = ""
            if s.baseline_isa:
                old = ours(s, model, batch, threads, isa="baseline")
                run.update(ours_baseline=old, baseline_ms=min(old.values()), baseline_ratio=min(old.values()) / theirs)
                columns = f" {run['baseline_ms']:9.1f} {run['baseline_ratio']:6.2f}"
            runs.append(run)
            detail = ", ".join(f"{k}: {v:.1f}" for k, v in mine.items())
            print(f"{model:10} {batch:5} {threads:7} {best:9.1f} {theirs:10.1f} {run['ratio']:6.2f}{columns}  {load:4.1f}  ({detail})",
                  flush=True)
    record = {"machine": {"cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                          "train_bench": s.train_bench, "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"),
                          "torch_python": shutil.which(python) or python},
              "steps": s.steps, "warmup": s.warmup, "precision": s.precision, "runs": runs}
    if s.json == "-":
        print(json.dumps(record, indent=1))
    elif s.json:
        with open(s.json, "w") as f:
            json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

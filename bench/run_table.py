#!/usr/bin/env python3
"""Runs a preset of benchmark configurations and writes the results as JSON and Markdown tables.

    python3 bench/run_table.py --preset cpu --bench build/bench/train_bench --out /tmp/bench-cpu
    python3 bench/run_table.py --preset gpu2 --bench build/bench/train_bench --out results/h200x2 --pytorch

Each configuration runs as its own process (bench/train_bench --json, or bench/pytorch_bench.py --json);
a run that fails is recorded with its error text and the others go on. Writes, after every run:

    DIR/results.json   {"preset", "machine": {hostname, cpu, nproc, gpus, date, ...}, "results": [...]}
    DIR/results.md     one table per network: config | devices | dispatch | scaling | batch | median ms |
                       samples/s | ratio

Ratio: our median step time over PyTorch's for the same network, device kind, device count, scaling and
batch (below 1: replica is faster); for a multi-device run also the speed-up in samples/s over the same
library's 1-device run at the same global batch (strong scaling) or per-device batch (weak scaling).
"""

import argparse
import datetime
import json
import math
import os
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_BATCH = {"lenet": 64, "alexnet": 128, "alexnet-plain": 128, "googlenet": 32, "textcnn": 128, "fcn": 16,
                 "resnet18": 256, "resnet50": 128}
RESNET_RUNS = (("resnet18", 256), ("resnet50", 128), ("resnet50", 256))   # issue 22's comparison
GPU2_RUNS = (("lenet", 64), ("alexnet", 128), ("alexnet-plain", 128), ("googlenet", 32), ("googlenet", 128),
             ("textcnn", 128), ("fcn", 16))
GPU4_RUNS = (("lenet", 64), ("alexnet-plain", 128), ("googlenet", 32), ("googlenet", 128), ("textcnn", 128),
             ("fcn", 16))
PRESETS = ("cpu", "gpu1", "gpu2", "gpu4", "reproducible", "reproducible-cpu", "mpi2", "mpi-cpu", "graphs", "buckets",
           "resnet")


def network_of(model):
    """The network a model name stands for: alexnet-plain is AlexNet without the nested DataParallel."""
    return "alexnet" if model == "alexnet-plain" else model


def sig3(x):
    """x to 3 significant digits, never in exponent notation: 2801.8 -> 2800, 22.84 -> 22.8, 0.8512 -> 0.851."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    if x == 0:
        return "0"
    r = round(x, 2 - int(math.floor(math.log10(abs(x)))))
    digits = 2 - int(math.floor(math.log10(abs(r))))
    return f"{r:.{max(digits, 0)}f}"


# ---------------------------------------------------------------------------------------------------
# Configurations


def replica_config(model, devices, batch, dispatch="single", scaling="strong", blas_threads=0, reproducible=False,
                   processes=1, graphs=None, bucket_floats=0):
    count = len(devices.split(","))
    config = "replica" if blas_threads == 0 else \
        f"replica, {blas_threads} BLAS thread{'s' if blas_threads > 1 else ''}"
    if reproducible:
        config += ", reproducible"
    if bucket_floats:
        config += f", buckets of {bucket_floats} floats"
    if processes > 1:
        config += f", {processes} processes (mpirun)"
    return {"library": "replica", "config": config, "model": model, "network": network_of(model),
            "device_list": devices, "devices": count, "dispatch": dispatch, "scaling": scaling, "batch": batch,
            "global_batch": batch if scaling == "strong" else batch * count,
            "blas_threads": blas_threads or None, "reproducible": reproducible, "processes": processes,
            "graphs_requested": graphs,   # None: the library's default (graphs where the model allows them)
            "bucket_floats": bucket_floats or None}   # None: the library's default


def gpu_list(count):
    return ",".join(f"cuda:{i}" for i in range(count))


def pytorch_config(model, gpus, batch, scaling="strong", threads=0, cudnn_benchmark=False, modes=None):
    """modes: pytorch_bench.py's --modes (None: its default, eager)."""
    count = max(gpus, 1)
    config = "pytorch" if gpus > 0 or threads == 0 else f"pytorch, {threads} thread{'s' if threads > 1 else ''}"
    if cudnn_benchmark:
        config += ", cudnn.benchmark"
    if modes and modes != "eager":
        config += f", {modes}"
    return {"library": "pytorch", "config": config, "model": model, "network": network_of(model),
            "device_list": ",".join(f"cuda:{i}" for i in range(gpus)) if gpus else "cpu", "devices": count,
            "dispatch": "ddp" if gpus > 1 else "eager", "scaling": scaling, "batch": batch,
            "global_batch": batch if scaling == "strong" else batch * count, "gpus": gpus,
            "threads": threads or None, "cudnn_benchmark": cudnn_benchmark, "modes_requested": modes}


def preset_configs(preset, pytorch):
    """The configurations of a preset, in the order they run."""
    runs = []
    if preset == "cpu":
        runs += [replica_config("lenet", "cpu:0", 64, blas_threads=1),
                 replica_config("lenet", "cpu:0", 64, blas_threads=2)]
        # One BLAS thread per device: two devices on two cores.
        runs += [replica_config("lenet", "cpu:0,cpu:1", 64, dispatch, scaling, blas_threads=1)
                 for scaling in ("strong", "weak") for dispatch in ("single", "threaded")]
        if pytorch:
            runs += [pytorch_config("lenet", 0, 64, threads=1), pytorch_config("lenet", 0, 64, threads=2)]
    elif preset == "gpu1":
        batches = [(m, DEFAULT_BATCH[m]) for m in ("lenet", "alexnet", "googlenet", "textcnn", "fcn")]
        batches.insert(3, ("googlenet", 128))
        runs += [replica_config(m, "cuda:0", b) for m, b in batches]
        if pytorch:   # its default, and with cuDNN's autotuning as replica's default does it
            runs += [pytorch_config(m, 1, b, cudnn_benchmark=tuned) for m, b in batches for tuned in (False, True)]
    elif preset == "gpu2":
        for model, b in GPU2_RUNS:
            runs += [replica_config(model, "cuda:0", b), replica_config(model, "cuda:0", b // 2)]
            runs += [replica_config(model, "cuda:0,cuda:1", b, dispatch, scaling)
                     for scaling in ("strong", "weak") for dispatch in ("single", "threaded")]
            runs.append(replica_config(model, "cuda:0,cuda:1", b, "auto"))   # never slower than one GPU
            # alexnet and alexnet-plain are one network in PyTorch (whole under DDP): run it once.
            if pytorch and model != "alexnet-plain":
                runs += [pytorch_config(model, 1, b), pytorch_config(model, 1, b // 2)]
                runs += [pytorch_config(model, 2, b, scaling) for scaling in ("strong", "weak")]
    elif preset == "gpu4":
        # 1 to 4 GPUs, both scalings and dispatch policies, then auto_parallel's measured choice over all
        # four (strong scaling: it must never pick something slower than fewer GPUs).
        for model, b in GPU4_RUNS:
            runs.append(replica_config(model, "cuda:0", b))
            runs += [replica_config(model, gpu_list(k), b, dispatch, scaling)
                     for k in (2, 3, 4) for scaling in ("strong", "weak") for dispatch in ("single", "threaded")]
            runs.append(replica_config(model, gpu_list(4), b, "auto"))
            if pytorch:
                runs.append(pytorch_config(model, 1, b))
                runs += [pytorch_config(model, k, b, scaling) for k in (2, 3, 4) for scaling in ("strong", "weak")]
    elif preset == "reproducible":
        # The reproducible mode's cost: the same runs in the fast and the reproducible mode.
        for model, b in (("lenet", 64), ("alexnet-plain", 128), ("googlenet", 32)):
            for devices in ("cuda:0", "cuda:0,cuda:1"):
                runs += [replica_config(model, devices, b, "threaded", reproducible=r) for r in (False, True)]
    elif preset in ("mpi2", "mpi-cpu"):
        # One process driving 2 devices against 2 processes with one each (mpirun), and DDP.
        if preset == "mpi2":
            models, devices = [(m, DEFAULT_BATCH[m]) for m in ("lenet", "alexnet-plain", "googlenet", "textcnn", "fcn")], gpu_list(2)
        else:
            models, devices = [("lenet", 64)], "cpu:0,cpu:1"
        for model, b in models:
            for scaling in ("strong", "weak"):
                runs.append(replica_config(model, devices, b, "threaded", scaling, blas_threads=0 if preset == "mpi2" else 1))
                runs.append(replica_config(model, devices, b, "threaded", scaling, processes=2,
                                           blas_threads=0 if preset == "mpi2" else 1))
                if pytorch and preset == "mpi2":
                    runs.append(pytorch_config(model, 2, b, scaling))
    elif preset == "graphs":
        # Eager steps against steps replayed from CUDA graphs (the default) on 1 GPU, PyTorch beside.
        # (DataParallel replicas run eagerly whatever the option says: docs/design.md.)
        for model in ("lenet", "alexnet-plain", "googlenet", "textcnn", "fcn"):
            b = DEFAULT_BATCH[model]
            runs += [replica_config(model, "cuda:0", b, "threaded", graphs=g) for g in (False, True)]
            if pytorch:
                runs.append(pytorch_config(model, 1, b))
    elif preset == "buckets":
        # Gradient bucket size against 2-GPU scaling, for the networks whose gradient fits in few buckets
        # of the default size: one GPU at the batch and at half of it, then 2 GPUs (both policies, both
        # scalings) with the default buckets and with smaller ones (cut at layer boundaries).
        for model in ("lenet", "textcnn", "fcn"):
            b = DEFAULT_BATCH[model]
            runs += [replica_config(model, "cuda:0", b), replica_config(model, "cuda:0", b // 2)]
            runs += [replica_config(model, "cuda:0,cuda:1", b, dispatch, scaling, bucket_floats=floats)
                     for floats in (0, 1 << 16) for scaling in ("strong", "weak") for dispatch in ("single", "threaded")]
    elif preset == "resnet":
        # ResNet-18 and -50 on one GPU; PyTorch eager and its whole step replayed from a CUDA graph.
        for model, b in RESNET_RUNS:
            runs.append(replica_config(model, "cuda:0", b))
            if pytorch:
                runs += [pytorch_config(model, 1, b, modes=m) for m in ("eager", "graph")]
    elif preset == "reproducible-cpu":
        for devices in ("cpu:0", "cpu:0,cpu:1"):
            runs += [replica_config("lenet", devices, 64, "threaded", blas_threads=1, reproducible=r)
                     for r in (False, True)]
    else:
        raise ValueError(f"unknown preset {preset!r}")
    return runs


def command(cfg, args):
    """The argv that runs cfg."""
    common = ["--model", cfg["model"], "--scaling", cfg["scaling"], "--batch", str(cfg["batch"]), "--json"]
    if args.steps is not None:
        common += ["--steps", str(args.steps)]
    if args.warmup is not None:
        common += ["--warmup", str(args.warmup)]
    if cfg["library"] == "replica":
        argv = [args.bench, "--devices", cfg["device_list"], "--dispatch", cfg["dispatch"]] + common
        if cfg.get("processes", 1) > 1:   # each process takes its share of the devices
            argv = [args.mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np",
                    str(cfg["processes"]), "-x", "NCCL_NVLS_ENABLE=0", "-x", "OPENBLAS_CORETYPE"] + argv
        if cfg["blas_threads"]:
            argv += ["--blas-threads", str(cfg["blas_threads"])]
        if cfg.get("reproducible"):
            argv += ["--reproducible"]
        if cfg.get("graphs_requested") is False:
            argv += ["--eager"]
        if cfg.get("bucket_floats"):
            argv += ["--bucket-floats", str(cfg["bucket_floats"])]
        argv += args.replica_arg
        return argv
    argv = [args.python, os.path.join(HERE, "pytorch_bench.py"), "--gpus", str(cfg["gpus"])] + common
    if cfg["threads"]:
        argv += ["--threads", str(cfg["threads"])]
    if cfg.get("cudnn_benchmark"):
        argv += ["--cudnn-benchmark"]
    if cfg.get("modes_requested"):
        argv += ["--modes", cfg["modes_requested"]]
    return argv + args.pytorch_arg


# ---------------------------------------------------------------------------------------------------
# Running


def bench_environment():
    """The environment for the runs: as scripts/lib.sh does, name OpenBLAS kernels this CPU can run
    (OpenBLAS 0.3.21 falls back to slow ones on recent CPUs) unless the caller chose."""
    env = dict(os.environ)
    if "OPENBLAS_CORETYPE" not in env:
        flags = set()
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("flags"):
                        flags = set(line.split(":", 1)[1].split())
                        break
        except OSError:
            pass
        if {"avx512f", "avx512bw"} <= flags:
            env["OPENBLAS_CORETYPE"] = "SkylakeX"
        elif "avx2" in flags:
            env["OPENBLAS_CORETYPE"] = "Haswell"
    return env


def run_one(argv, env, timeout):
    """Runs argv; returns (JSON record or None, error text or None)."""
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                start_new_session=True)
    except OSError as e:
        return None, f"could not start: {e}"
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)   # the run's own process group (DDP workers included)
        proc.communicate()
        return None, f"timed out after {timeout} s"
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    record = None
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                pass
            break
    if proc.returncode == 0 and record is not None:
        return record, None
    lines = [l for l in err.splitlines() if l.strip()] or [l for l in out.splitlines() if l.strip()]
    text = "\n".join(lines[-5:]) if lines else "no output"
    return None, f"exit code {proc.returncode}: {text}"


def command_output(argv):
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def machine_record(env):
    cpu = None
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), None)
    except OSError:
        pass
    gpus = []
    if shutil.which("nvidia-smi"):
        names = command_output(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"])
        gpus = [n.strip() for n in names.splitlines() if n.strip()] if names else []
    repo = os.path.dirname(HERE)
    # REPLICA_COMMIT: where the tree's git metadata is not the tree's (the GPU machine gets a copy of
    # the working tree whose .git may be older), the caller says which commit the programs are.
    commit = os.environ.get("REPLICA_COMMIT") or command_output(["git", "-C", repo, "rev-parse", "--short", "HEAD"])
    if commit and not os.environ.get("REPLICA_COMMIT") and \
            command_output(["git", "-C", repo, "status", "--porcelain", "--untracked-files=no"]):
        commit += " (modified)"
    return {"hostname": socket.gethostname(), "cpu": cpu, "nproc": os.cpu_count(), "gpus": gpus,
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "commit": commit, "openblas_coretype": env.get("OPENBLAS_CORETYPE")}


# ---------------------------------------------------------------------------------------------------
# Tables


def kind_of(r):
    return "cuda" if str(r.get("device_list", "")).startswith("cuda") else "cpu"


def ok(r):
    return not r.get("error") and r.get("median_ms")


def pytorch_match(r, results, tuned=False):
    """The PyTorch run to set against our run r: same network, device kind and count, scaling, batch,
    precision, with its defaults (tuned: with cudnn.benchmark); of several (CPU runs with different thread
    counts) the one whose threads equal our BLAS threads."""
    found = [p for p in results if p["library"] == "pytorch" and ok(p) and p["network"] == r["network"]
             and kind_of(p) == kind_of(r) and p["devices"] == r["devices"] and p["batch"] == r["batch"]
             and (r["devices"] == 1 or p["scaling"] == r["scaling"]) and bool(p.get("cudnn_benchmark")) == tuned
             and p.get("precision", "fp32") == r.get("precision", "fp32")]
    same_threads = [p for p in found if p.get("threads") and p.get("threads") == r.get("blas_threads")]
    return (same_threads or found or [None])[0]


def one_device_base(r, results):
    """The same library's 1-device run that a multi-device run r scales from: the same global batch
    (strong) or the same per-device batch (weak); the same model and BLAS threads where there is one."""
    batch = r["global_batch"] if r["scaling"] == "strong" else r["batch"]
    found = [b for b in results if b["library"] == r["library"] and ok(b) and b["devices"] == 1
             and b["network"] == r["network"] and kind_of(b) == kind_of(r) and b["global_batch"] == batch
             and bool(b.get("reproducible")) == bool(r.get("reproducible"))]
    found.sort(key=lambda b: (b["model"] != r["model"], b.get("blas_threads") != r.get("blas_threads"),
                              b.get("threads") != r.get("threads")))
    return found[0] if found else None


def work_of(r):
    """What a run computes per step: device kind and count, scaling (with several devices), batch."""
    return kind_of(r), r["devices"], r["scaling"] if r["devices"] > 1 else "", r["batch"]


def batch_text(r):
    return f"{r['devices']}×{r['batch']} = {r['global_batch']}" if r["global_batch"] != r["batch"] else str(r["batch"])


def ratio_text(r, results):
    parts = []
    if r["library"] == "replica":
        p = pytorch_match(r, results)
        if p:
            parts.append(f"{sig3(r['median_ms'] / p['median_ms'])} of PyTorch")
        p = pytorch_match(r, results, tuned=True)
        if p:
            parts.append(f"{sig3(r['median_ms'] / p['median_ms'])} of PyTorch with cudnn.benchmark")
    if r["devices"] > 1:
        b = one_device_base(r, results)
        if b:
            parts.append(f"speed-up {sig3(r['samples_per_s'] / b['samples_per_s'])}")
    if r.get("reproducible"):
        fast = [f for f in results if ok(f) and f["library"] == "replica" and not f.get("reproducible")
                and all(f[k] == r[k] for k in ("model", "device_list", "dispatch", "scaling", "batch"))]
        if fast:
            parts.append(f"{sig3(r['median_ms'] / fast[0]['median_ms'])}× the fast mode's time")
    if r.get("processes", 1) > 1:
        one = [f for f in results if ok(f) and f["library"] == "replica" and f.get("processes", 1) == 1
               and all(f[k] == r[k] for k in ("model", "device_list", "dispatch", "scaling", "batch"))]
        if one:
            parts.append(f"{sig3(r['median_ms'] / one[0]['median_ms'])}× one process's time")
    if r.get("dispatch") == "auto":
        fixed = [f for f in results if ok(f) and f["library"] == "replica" and f["dispatch"] != "auto"
                 and f["model"] == r["model"] and f["global_batch"] == r["global_batch"]
                 and (f["devices"] == 1 or f["scaling"] == "strong")]
        if fixed:
            best = max(fixed, key=lambda f: f["samples_per_s"])
            parts.append(f"{sig3(r['samples_per_s'] / best['samples_per_s'])} of the fastest fixed choice "
                         f"({best['devices']} device{'s' if best['devices'] > 1 else ''}"
                         f"{', ' + best['dispatch'] if best['devices'] > 1 else ''})")
    return "; ".join(parts)


def cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def config_text(r, models):
    """The config column: the library (and settings), with the model where a table holds several, and
    what auto_parallel chose."""
    text = f"{r['config']} ({r['model']})" if len(models) > 1 and r["library"] == "replica" else r["config"]
    if r.get("chosen"):
        text += f" → {r['chosen']}"
    return text


def markdown(doc):
    results = doc["results"]
    m = doc["machine"]
    lines = [f"# Training-step benchmark: preset {doc['preset']}", ""]
    gpus = ", ".join(m["gpus"]) if m.get("gpus") else "none"
    lines.append(f"{m['hostname']}: {m['cpu']}, {m['nproc']} CPUs; GPUs: {gpus}. {m['date']}, "
                 f"commit {m.get('commit') or 'unknown'}, OPENBLAS_CORETYPE {m.get('openblas_coretype') or 'unset'}.")
    torch = sorted({(r.get("torch"), r.get("tf32")) for r in results if r["library"] == "pytorch" and ok(r)},
                   key=str)
    tf32_text = {"conv": "TF32 in cuDNN convolutions only (PyTorch's default)", "on": "TF32 in convolutions and matmuls",
                 "off": "no TF32", "matmul": "TF32 in matmuls only", "n/a": "CPU"}
    for version, tf32 in torch:
        lines.append(f"PyTorch {version}: {tf32_text.get(tf32, tf32)}.")
    steps = sorted({r["steps"] for r in results if ok(r)})
    if steps:
        lines.append(f"Median over {', '.join(map(str, steps))} timed steps after warm-up.")
    if doc.get("repeat", 1) > 1:
        lines.append(f"Every configuration ran in {doc['repeat']} processes, in interleaved rounds; the table gives "
                     "the median of their medians (each run's figures are in results.json, `runs_ms`).")
    lines += ["", "ratio: our median step time over PyTorch's for the same network, devices, scaling and batch "
              "(below 1: replica is faster). speed-up: samples/s over the same library's 1-device run at the "
              "same global batch (strong scaling) or the same batch per device (weak scaling); ideal: the "
              "number of devices.", ""]

    networks = []
    for r in results:
        if r["network"] not in networks:
            networks.append(r["network"])
    for net in networks:
        # Runs that do the same work stand together, ours first, in the order they ran.
        rows = [r for r in results if r["network"] == net]
        work = list(dict.fromkeys(work_of(r) for r in rows))
        rows.sort(key=lambda r: (work.index(work_of(r)), r["library"] == "pytorch"))
        models = {r["model"] for r in rows if r["library"] == "replica"}
        lines += [f"## {net}", "",
                  "| config | devices | dispatch | scaling | batch | median ms | samples/s | ratio |",
                  "|---|---|---|---|---|--:|--:|---|"]
        failures = []
        for r in rows:
            if ok(r):
                ms, rate, ratio = sig3(r["median_ms"]), sig3(r["samples_per_s"]), ratio_text(r, results)
            else:
                failures.append(r)
                ms, rate, ratio = f"failed ({len(failures)})", "—", ""
            scaling = r["scaling"] if r["devices"] > 1 else "—"
            lines.append("| " + " | ".join(cell(c) for c in (config_text(r, models), r["device_list"], r["dispatch"],
                                                              scaling, batch_text(r), ms, rate, ratio)) + " |")
        lines.append("")
        notes = sorted({r["note"] for r in rows if r.get("note")})
        lines += [f"Note: {n}." for n in notes]
        for i, r in enumerate(failures, 1):
            lines.append(f"Failure {i}: `{r['error'].splitlines()[-1]}` (command: `{r['cmd']}`)")
        if notes or failures:
            lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def write(doc, out):
    """Writes results.json and results.md (each replaced whole, never half-written)."""
    for name, text in (("results.json", json.dumps(doc, indent=1) + "\n"), ("results.md", markdown(doc))):
        path = os.path.join(out, name)
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)


# ---------------------------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="run a preset of benchmark configurations; write results.json "
                                            "and results.md")
    p.add_argument("--preset", required=True, choices=PRESETS,
                   help="cpu: lenet on 1 and 2 CPU devices; gpu1: every network on cuda:0; gpu2: 1 and 2 GPUs; "
                        "gpu4: 1 to 4 GPUs and auto_parallel's choice; reproducible(-cpu): fast against "
                        "reproducible mode; mpi2 (mpi-cpu): one process with 2 devices against 2 processes; graphs: eager "
                        "against CUDA graphs; resnet: ResNet-18 (256) and -50 (128, 256) on cuda:0, PyTorch eager and "
                        "graph-replayed")
    p.add_argument("--bench", default="build/bench/train_bench", help="the train_bench program")
    p.add_argument("--out", required=True, help="folder for results.json and results.md (made if missing)")
    p.add_argument("--steps", type=int, help="timed steps per run (default: the programs' own, 20)")
    p.add_argument("--warmup", type=int, help="untimed steps first (default: the programs' own, 3)")
    p.add_argument("--pytorch", action="store_true", help="also run bench/pytorch_bench.py")
    p.add_argument("--replica-arg", action="append", default=[], metavar="ARG",
                   help="pass ARG on to train_bench, e.g. --replica-arg=--eager (repeatable)")
    p.add_argument("--mpirun", default="mpirun", help="the MPI launcher for runs of several processes")
    p.add_argument("--python", default=sys.executable, help="the Python with PyTorch (default: this one)")
    p.add_argument("--pytorch-arg", action="append", default=[], metavar="ARG",
                   help="pass ARG on to pytorch_bench.py, e.g. --pytorch-arg=--tf32=off (repeatable)")
    p.add_argument("--models", help="only these models, comma-separated (e.g. lenet,fcn)")
    p.add_argument("--append", action="store_true", help="add to the results already in DIR/results.json")
    p.add_argument("--timeout", type=float, default=900, help="seconds one run may take (default: 900)")
    p.add_argument("--repeat", type=int, default=1,
                   help="run every configuration this many times, in interleaved rounds (forward, then reverse "
                        "order), and report the median of the runs' medians: host-bound runs vary between "
                        "processes (default: 1)")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    configs = preset_configs(args.preset, args.pytorch)
    if args.models:
        wanted = set(args.models.split(","))
        unknown = wanted - set(DEFAULT_BATCH)
        if unknown:
            sys.exit(f"run_table: unknown model(s) {', '.join(sorted(unknown))}; use {', '.join(DEFAULT_BATCH)}")
        configs = [c for c in configs if c["model"] in wanted]
    if args.dry_run:
        for c in configs:
            print(shlex.join(command(c, args)))
        return 0
    if not (os.path.isfile(args.bench) and os.access(args.bench, os.X_OK)):
        sys.exit(f"run_table: no program at {args.bench}; build it first (scripts/test, or "
                 f"meson setup build && ninja -C build)")

    os.makedirs(args.out, exist_ok=True)
    env = bench_environment()
    doc = {"preset": args.preset, "machine": machine_record(env), "results": []}
    previous = os.path.join(args.out, "results.json")
    if args.append and os.path.exists(previous):
        with open(previous) as f:
            doc["results"] = json.load(f)["results"]
    if args.repeat < 1:
        sys.exit("run_table: --repeat must be at least 1")
    doc["repeat"] = args.repeat
    earlier = doc["results"]
    entries = [None] * len(configs)
    runs_ms = [[] for _ in configs]
    failed = 0
    order = [(r, i) for r in range(args.repeat)
             for i in (range(len(configs)) if r % 2 == 0 else reversed(range(len(configs))))]
    for k, (round_, i) in enumerate(order, 1):
        cfg = configs[i]
        argv = command(cfg, args)
        what = (f"{cfg['config']} {cfg['model']} on {cfg['device_list']} {cfg['dispatch']} {cfg['scaling']} "
                f"batch {cfg['batch']}")
        print(f"[{k}/{len(order)}] {what} ...", end=" ", file=sys.stderr, flush=True)
        record, error = run_one(argv, env, args.timeout)
        if record:
            runs_ms[i].append(record["median_ms"])
            entry = dict(cfg)
            entry["cmd"] = shlex.join(argv)
            entry.update(record)
            if record.get("graphs"):
                entry["config"] += ", graphs"
            if record.get("precision", "fp32") != "fp32":
                entry["config"] += f", {record['precision']}"
            if len(record.get("modes") or {}) > 1:   # pytorch_bench --modes: the fastest of those that ran
                entry["config"] += f", fastest of {'/'.join(record['modes'])}"
            if args.repeat > 1:   # the median process; samples/s follows from it
                entry["runs_ms"] = sorted(runs_ms[i])
                entry["median_ms"] = statistics.median(runs_ms[i])
                entry["samples_per_s"] = record["samples_per_s"] * record["median_ms"] / entry["median_ms"]
            entries[i] = entry
            print(f"{sig3(record['median_ms'])} ms, {sig3(record['samples_per_s'])} samples/s", file=sys.stderr)
        else:
            failed += 1
            if entries[i] is None:
                entries[i] = dict(cfg, cmd=shlex.join(argv), error=error)
            print("FAILED: " + error.splitlines()[-1], file=sys.stderr)
        doc["results"] = earlier + [e for e in entries if e is not None]
        write(doc, args.out)
    if not configs:
        write(doc, args.out)
    print(f"{len(order) - failed} runs, {failed} failed: {os.path.join(args.out, 'results.md')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

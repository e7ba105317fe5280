#!/usr/bin/env python3
"""Training steps in a GPU timeline written by bench/kernel_trace.cpp (REPLICA_TRACE_TIMELINE).

    REPLICA_TRACE_TIMELINE=/tmp/t.txt CUDA_INJECTION64_PATH=$PWD/build/bench/libreplica_kernel_trace.so \\
        build/bench/train_bench_cuda --model lenet --devices cuda:0,cuda:1 --steps 60
    bench/timeline.py /tmp/t.txt                        # one table, a column per device
    bench/timeline.py /tmp/t.txt --skip 5 --steps-detail 2
    bench/timeline.py --self-test                       # checks the analysis on a timeline made up here

The file has one activity a line, "device start_us end_us kind name", and header lines starting with '#'.
Every training step ends, on every device, with the optimizer's update: a kernel whose name contains
"kernels::sgd" (--update), or a run of them with no other kernel between. On each device:

- a step runs from the end of one update to the end of the next; the first --skip steps (default 3) are
  left out, and the first update only opens the first step;
- busy: the union of the kernel intervals within the step; idle: the step's length minus busy; longest
  idle gap: the longest time within the step no kernel runs;
- host gap: from the end of the previous step's update to the start of the step's first kernel;
- NCCL: the union of the intervals of kernels whose name contains "nccl" (any case) within the step;
  exposed: the part of it during which no other kernel runs on the device;
- skew (2+ devices): the start of step k's first kernel on the device minus that on the first device,
  steps matched by index.

Figures per step are summarised by their median (the upper middle, as train_bench reports), in
microseconds. Memcpys and memsets count for nothing but --steps-detail, which lists every activity of
the first N steps: offset from the step's start, duration, short name.
"""

import argparse
import bisect
import gzip
import io
import re
import sys


# Reading


def parse(lines):
    """Activities by device, {device: [(start, end, kind, name), ...]} sorted by start, and the headers."""
    devices, headers = {}, []
    for number, line in enumerate(lines, 1):
        line = line.rstrip("\n")
        if not line.strip():
            continue
        if line.startswith("#"):
            headers.append(line)
            continue
        fields = line.split(" ", 4)
        if len(fields) != 5:
            raise ValueError(f"line {number}: expected 'device start_us end_us kind name', got {line!r}")
        device, start, end, kind, name = fields
        devices.setdefault(int(device), []).append((float(start), float(end), kind, name))
    for acts in devices.values():
        acts.sort()
    return devices, headers


def left_out(headers):
    """The number of activities the tool did not keep (its header line says), 0 if none."""
    for h in headers:
        m = re.search(r"(\d+) left out", h)
        if m:
            return int(m.group(1))
    return 0


# Intervals


def union(intervals):
    """The union of (start, end) intervals: sorted, disjoint, as a list of [start, end]."""
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


class Union:
    """A union of intervals that can be cut to a window quickly."""

    def __init__(self, intervals):
        self.parts = union(intervals)
        self.ends = [e for _, e in self.parts]

    def within(self, a, b):
        """The union's parts within [a, b], clipped to it."""
        out, i = [], bisect.bisect_right(self.ends, a)
        while i < len(self.parts) and self.parts[i][0] < b:
            s, e = self.parts[i]
            out.append((max(s, a), min(e, b)))
            i += 1
        return out


def length(parts):
    return sum(e - s for s, e in parts)


def overlap(x, y):
    """The total length of the intersection of two sorted, disjoint lists of intervals."""
    total, i, j = 0.0, 0, 0
    while i < len(x) and j < len(y):
        lo, hi = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if hi > lo:
            total += hi - lo
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return total


def longest_gap(parts, a, b):
    """The longest stretch of [a, b] that parts (sorted, disjoint, within [a, b]) leave uncovered."""
    gap, at = 0.0, a
    for s, e in parts:
        gap, at = max(gap, s - at), max(at, e)
    return max(gap, b - at)


def median(values):
    """The upper middle, as train_bench's median."""
    return sorted(values)[len(values) // 2] if values else float("nan")


# Analysis


def is_nccl(name):
    return "nccl" in name.lower()


def update_ends(kernels, update):
    """The ends of the updates: runs of kernels whose name contains `update`, none other between."""
    ends, run = [], None
    for _, e, name in kernels:
        if update in name:
            run = e if run is None else max(run, e)
        elif run is not None:
            ends.append(run)
            run = None
    if run is not None:
        ends.append(run)
    return ends


def device_steps(acts, update, skip):
    """One dict per step of one device's activities, after the first `skip` steps."""
    kernels = [(s, e, name) for s, e, kind, name in acts if kind == "kernel"]
    starts = [s for s, _, _ in kernels]
    every = Union((s, e) for s, e, _ in kernels)
    nccl = Union((s, e) for s, e, name in kernels if is_nccl(name))
    rest = Union((s, e) for s, e, name in kernels if not is_nccl(name))
    ends = update_ends(kernels, update)
    steps = []
    for a, b in list(zip(ends, ends[1:]))[skip:]:
        busy = every.within(a, b)
        first = bisect.bisect_left(starts, a)
        n = bisect.bisect_left(starts, b) - first
        comm = nccl.within(a, b)
        steps.append({
            "from": a,
            "to": b,
            "length": b - a,
            "busy": length(busy),
            "idle": b - a - length(busy),
            "longest_gap": longest_gap(busy, a, b),
            "first_kernel": starts[first] if n > 0 else b,
            "host_gap": (starts[first] if n > 0 else b) - a,
            "kernels": n,
            "nccl": length(comm),
            "exposed": length(comm) - overlap(comm, rest.within(a, b)),
        })
    return steps, ends


def analyse(devices, update="kernels::sgd", skip=3):
    """Per device: its steps and their summary; with 2+ devices, the skew against the first."""
    result = {}
    for d in sorted(devices):
        steps, ends = device_steps(devices[d], update, skip)
        summary = {"steps": len(steps), "updates": len(ends)}
        if steps:
            lengths = [s["length"] for s in steps]
            summary.update(step_median=median(lengths), step_min=min(lengths))
            for key in ("busy", "idle", "longest_gap", "host_gap", "nccl", "exposed", "kernels"):
                summary[key] = median([s[key] for s in steps])
        result[d] = {"steps": steps, "summary": summary}
    ids = sorted(result)
    if len(ids) > 1:
        ref = result[ids[0]]["steps"]
        for d in ids[1:]:
            mine = result[d]["steps"]
            skew = [m["first_kernel"] - r["first_kernel"] for m, r in zip(mine, ref)]
            if skew:
                result[d]["summary"].update(skew_median=median(skew), skew_min=min(skew), skew_max=max(skew))
    return result


# Report

ROWS = [
    ("steps", "steps (after --skip)", "{:.0f}"),
    ("step_median", "step median", "{:.1f}"),
    ("step_min", "step min", "{:.1f}"),
    ("kernels", "kernels per step", "{:.0f}"),
    ("busy", "busy (kernel union)", "{:.1f}"),
    ("idle", "idle", "{:.1f}"),
    ("longest_gap", "longest idle gap", "{:.1f}"),
    ("host_gap", "host gap (update -> 1st kernel)", "{:.1f}"),
    ("nccl", "NCCL", "{:.1f}"),
    ("exposed", "NCCL exposed", "{:.1f}"),
    ("skew_median", "skew median (vs first device)", "{:+.1f}"),
    ("skew_min", "skew min", "{:+.1f}"),
    ("skew_max", "skew max", "{:+.1f}"),
]


def table(result, update, skip):
    ids = sorted(result)
    out = [f"steps end with '{update}'; first {skip} left out; us, medians per step unless min/max"]
    out.append(f"{'':34}" + "".join(f"{'device ' + str(d):>14}" for d in ids))
    for key, label, fmt in ROWS:
        if not any(key in result[d]["summary"] for d in ids):
            continue
        cells = [result[d]["summary"].get(key) for d in ids]
        out.append(f"{label:34}" + "".join(f"{fmt.format(c) if c is not None else '-':>14}" for c in cells))
    return "\n".join(out)


def short_name(name, width=48):
    """A kernel's name without return type, outer namespaces and parameters; template arguments kept."""
    name = name.replace("(anonymous namespace)", "{anon}")
    depth, cut = 0, len(name)
    for i, c in enumerate(name):   # the parameter list: the first '(' outside template arguments
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif c == "(" and depth == 0:
            cut = i
            break
    name = name[:cut]
    head, bracket, args = name.partition("<")
    head = head.split(" ")[-1]   # drops a return type
    head = "::".join(head.split("::")[-2:])
    name = head + bracket + args
    return name if len(name) <= width else name[: width - 3] + "..."


def detail(devices, result, count):
    out = []
    for d in sorted(result):
        acts = devices[d]
        starts = [s for s, _, _, _ in acts]
        for k, step in enumerate(result[d]["steps"][:count]):
            a, b = step["from"], step["to"]
            out.append(f"-- device {d}, step {k} (after the skip): {a:.3f} .. {b:.3f} us, {b - a:.1f} us")
            out.append(f"   {'offset':>10} {'duration':>10}  name")
            for s, e, kind, name in acts[bisect.bisect_left(starts, a):bisect.bisect_left(starts, b)]:
                shown = short_name(name) if kind == "kernel" else f"[{kind}]"
                out.append(f"   {s - a:10.1f} {e - s:10.1f}  {shown}")
    return "\n".join(out)


def report(devices, headers, update, skip, steps_detail):
    result = analyse(devices, update, skip)
    out = []
    if left_out(headers):
        out.append(f"warning: the tool left {left_out(headers)} activities out of the file (its cap): "
                   "the last steps are missing")
    for d in sorted(result):
        if result[d]["summary"]["steps"] == 0:
            out.append(f"warning: device {d}: {result[d]['summary']['updates']} updates ('{update}'), "
                       f"no step after the first {skip}")
    counts = {result[d]["summary"]["steps"] for d in result if result[d]["summary"]["steps"]}
    if len(counts) > 1:
        out.append("warning: the devices have different numbers of steps; skew matches steps by index")
    out.append(table(result, update, skip))
    if steps_detail > 0:
        out.append(detail(devices, result, steps_detail))
    return "\n".join(out), result


# Self-test


def synthetic(origin=1000.125):
    """A two-device timeline of 8 steps whose figures are known (see self_test), as the tool writes it.

    Device 0, step start t (the previous update's end), host gap g: kernels [g, g+200] and [g+200, g+350],
    a gemm [g+450, g+650], NCCL [g+550, g+750] (100 under the gemm), a copy, then the update as two sgd
    kernels [g+800, g+820], [g+820, g+850]. Device 1 runs 5 us behind with the same step lengths, host gap
    h: [h, h+300], NCCL [h+300, h+500] with a kernel [h+300, h+350] beside it, a memset, the update
    [L-50, L] with L = g+850.
    """
    conv = "void replica::backend::cuda::kernels::conv2d_forward<float, 3>(float const*, float const*, float*, int)"
    relu = "replica::backend::cuda::kernels::relu(float*, unsigned long)"
    gemm = "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4>(cutlass_80_tensorop_s1688g..."
    nccl = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    sgd = "replica::backend::cuda::kernels::sgd(float*, float const*, float*, unsigned long, float, float, float, bool)"
    g = [300, 200, 100, 50, 60, 40, 150, 70]
    delta = [0, 0, 0, 0, 20, -10, 5, 30]   # device 1's host gap minus device 0's
    acts = [(0, 0, 100, "kernel", conv), (0, 150, 200, "kernel", sgd), (1, 0, 50, "HtoD", "-"),
            (1, 155, 205, "kernel", sgd)]
    t = 200
    for gk, dk in zip(g, delta):
        L, h, u = gk + 850, gk + dk, t + 5
        acts += [(0, t + gk, t + gk + 200, "kernel", conv), (0, t + gk + 200, t + gk + 350, "kernel", relu),
                 (0, t + gk + 450, t + gk + 650, "kernel", gemm), (0, t + gk + 550, t + gk + 750, "kernel", nccl),
                 (0, t + gk + 770, t + gk + 780, "HtoD", "-"), (0, t + gk + 800, t + gk + 820, "kernel", sgd),
                 (0, t + gk + 820, t + L, "kernel", sgd)]
        acts += [(1, u + h, u + h + 300, "kernel", conv), (1, u + h + 300, u + h + 500, "kernel", nccl),
                 (1, u + h + 300, u + h + 350, "kernel", relu), (1, u + h + 360, u + h + 370, "memset", "-"),
                 (1, u + L - 50, u + L, "kernel", sgd)]
        t += L
    acts += [(0, t + 20, t + 30, "kernel", relu), (0, t + 40, t + 45, "DtoH", "-"), (1, t + 25, t + 35, "kernel", relu)]
    acts.sort(key=lambda x: (x[1], x[0], x[2]))
    text = ["# replica kernel_trace timeline [self-test] pid 0: device start_us end_us kind name",
            f"# {len(acts)} activities, 0 left out (at most 2000000 are kept)"]
    text += [f"{d} {s + origin:.3f} {e + origin:.3f} {kind} {name}" for d, s, e, kind, name in acts]
    return "\n".join(text) + "\n"


def self_test():
    devices, headers = parse(io.StringIO(synthetic()))
    text, result = report(devices, headers, "kernels::sgd", 3, 1)
    print(text)
    # Steps 3..7: device 0's host gaps 50 60 40 150 70, device 1's 50 80 30 155 100 (skew 5 25 -5 10 35).
    expected = {
        0: dict(steps=5, step_median=910, step_min=890, kernels=6, busy=700, idle=210, longest_gap=100,
                host_gap=60, nccl=200, exposed=100),
        1: dict(steps=5, step_median=910, step_min=890, kernels=4, busy=550, idle=360, longest_gap=295,
                host_gap=80, nccl=200, exposed=150, skew_median=10, skew_min=-5, skew_max=35),
    }
    wrong = []
    for d, want in expected.items():
        got = result[d]["summary"]
        for key, value in want.items():
            if key not in got or abs(got[key] - value) > 1e-6:
                wrong.append(f"device {d} {key}: expected {value}, got {got.get(key)}")
    if "skew_median" in result[0]["summary"]:
        wrong.append("device 0 has a skew against itself")
    if short_name(devices[0][0][3]) != "kernels::conv2d_forward<float, 3>":
        wrong.append(f"short name: {short_name(devices[0][0][3])!r}")
    if union([(0, 1), (1, 2), (3, 4)]) != [[0, 2], [3, 4]]:
        wrong.append("union")
    for line in wrong:
        print("self-test FAILED:", line)
    if not wrong:
        print("self-test passed")
    return 1 if wrong else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("file", nargs="?", help="timeline written by kernel_trace (REPLICA_TRACE_TIMELINE); - for stdin")
    parser.add_argument("--skip", type=int, default=3, help="steps left out at the start (default 3)")
    parser.add_argument("--update", default="kernels::sgd",
                        help="text in the name of the kernel that ends every step (default kernels::sgd)")
    parser.add_argument("--steps-detail", type=int, default=0, metavar="N",
                        help="list every activity of the first N steps (after the skip), per device")
    parser.add_argument("--self-test", action="store_true", help="check the analysis on a made-up timeline")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    if args.file is None:
        parser.error("a timeline file is needed (or --self-test)")
    if args.skip < 0:
        parser.error("--skip must be >= 0")
    if args.file == "-":
        devices, headers = parse(sys.stdin)
    else:
        with (gzip.open(args.file, "rt") if args.file.endswith(".gz") else open(args.file)) as f:   # gpu-check gzips them
            devices, headers = parse(f)
    if not devices:
        print(f"{args.file}: no activities")
        return 1
    text, _ = report(devices, headers, args.update, args.skip, args.steps_detail)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

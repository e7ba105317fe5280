#!/usr/bin/env python3
"""Training-step benchmark in PyTorch: the networks of bench/train_bench.cpp, layer for layer.

Same synthetic data (uniform in [-1, 1), random integer labels, two distinct batches alternated), same
loss (mean softmax cross-entropy; per pixel for fcn), same optimiser (SGD, lr 0.001, momentum 0.9), same
report (median step time after warm-up), so that bench/run_table.py can set the two side by side.
resnet18 and resnet50 are torchvision's definitions (torchvision.models.resnet18(num_classes=1000)); resnet20
is the CIFAR layout of include/replica/models/resnet.hpp on 1x28x28 inputs (projection shortcuts).

    python3 bench/pytorch_bench.py --model googlenet --batch 128 --json
    python3 bench/pytorch_bench.py --model alexnet --gpus 2 --scaling weak --json
    python3 bench/pytorch_bench.py --model lenet --gpus 0 --threads 1      # CPU reference
    python3 bench/pytorch_bench.py --model resnet50 --precision bf16 --modes all
    python3 bench/pytorch_bench.py --params
    python3 bench/pytorch_bench.py --model gpt2 --modes eager,compile --json    # GPT-2 124M, bf16 (issue 44)
    python3 bench/pytorch_bench.py --model gpt2 --curve /tmp/gpt2    # the loss curve of train_bench --curve /tmp/gpt2

Modes (--modes, one GPU or the CPU): eager, a plain loop; graph, the whole step (forward, backward,
optimiser) captured once in a CUDA graph and replayed; compile, the model under
torch.compile(mode="reduce-overhead") with the optimiser step eager. Each mode runs on a fresh copy of
the network (same seed) and reports its own median; the record's figures are the fastest mode's. A mode
that fails is reported with its reason, the others still run. Several GPUs: DistributedDataParallel,
eager, one process per GPU started by this script (torch.multiprocessing.spawn, NCCL). alexnet and
alexnet-plain are the same network here: the whole of it under DDP (replica's alexnet keeps the
classifier on the first device; PyTorch has no such split in this script).

--precision bf16: the forward pass and the loss under torch.autocast(dtype=torch.bfloat16) (parameters,
gradients and the optimiser stay fp32, as autocast does it), with the model and the 4-D inputs in
channels_last.

With --json: one JSON object, the keys of train_bench plus precision, mode (the fastest), modes (each
mode's median_ms, min_ms, samples_per_s and loss, or its error), tf32, channels_last, cudnn_benchmark,
threads, torch (the version) and, for alexnet, note. It exits with status 1 when every mode failed.

--model gpt2: GPT-2 124M as nanoGPT writes it (bench/pytorch_gpt.py's GPT: pre-LN blocks, GELU's tanh
form, F.scaled_dot_product_attention(is_causal=True), the head tied to the token embedding) on sequences
of 1024 synthetic token ids (seed 1, uniform over GPT-2's 50,257), bf16 autocast, AdamW (fused on the GPU,
betas 0.9 and 0.95, weight decay 0.1 on matrices and embeddings), clipping at 1.0, --micro-batch
sequences a micro-batch and --accumulate micro-batches an update (default: 524,288 tokens; tiny: 2), as
train_bench --model gpt2. Modes eager and compile (torch.compile's default mode, the optimiser eager); a
step is one update. Its JSON: tokens_per_s, median_ms, peak_memory_mib (torch.cuda.max_memory_allocated),
reserved_memory_mib, mfu (6N + 6LCT FLOPs a token over --peak-tflops), per mode and for the fastest.
--gpt-config tiny is a 2-layer GPT of width 64 for a check of the plumbing on the CPU.

--model gpt2 --curve PREFIX repeats a run that train_bench --model gpt2 --curve PREFIX recorded: the same
model (its shape from PREFIX.json), its initial parameters (PREFIX.params, replica's flat vector, in
pytorch_gpt.GPT.in_replica_order), its micro-batches (PREFIX.ids), the same optimiser; eager, fp32 on the
CPU and bf16 autocast on a GPU unless --precision says. It writes PREFIX.pytorch-PRECISION.losses.json and
prints one JSON object: both curves, each update's absolute and relative difference, the largest of
each, and whether the largest relative one is within --curve-rtol (exit status 1 when not).
"""

import argparse
import contextlib
import json
import math
import os
import socket
import sys
import time

# NVLink SHARP (NVLS) multicast stays off: set before anything can initialise NCCL, here and in every
# spawned process (they import this module again).
os.environ["NCCL_NVLS_ENABLE"] = "0"

MODELS = ("lenet", "alexnet", "alexnet-plain", "googlenet", "textcnn", "fcn", "resnet18", "resnet50", "resnet20", "gpt2")
NETWORKS = ("lenet", "alexnet", "googlenet", "textcnn", "fcn", "resnet18", "resnet50", "resnet20")
TORCHVISION = ("resnet18", "resnet50")   # built by torchvision, which must be installed to run them
DEFAULT_BATCH = {"lenet": 64, "alexnet": 128, "googlenet": 32, "textcnn": 128, "fcn": 16,
                 "resnet18": 256, "resnet50": 128, "resnet20": 128}
# The parameter counts of replica's networks (include/replica/models/*.hpp); checked at start-up. The
# ResNets' are torchvision's (v1.5: the bottleneck's stride on its 3x3), which issue 22 requires of ours.
EXPECTED_PARAMS = {"lenet": 431080, "alexnet": 61100840, "googlenet": 6998552, "textcnn": 11348238, "fcn": 40917,
                   "resnet18": 11689512, "resnet50": 25557032, "resnet20": 272186}
INPUT_SHAPE = {"lenet": (1, 28, 28), "alexnet": (3, 224, 224), "googlenet": (3, 224, 224),
               "textcnn": (69, 1014), "fcn": (3, 256, 256), "resnet18": (3, 224, 224), "resnet50": (3, 224, 224),
               "resnet20": (1, 28, 28)}
CLASSES = {"lenet": 10, "alexnet": 1000, "googlenet": 1000, "textcnn": 14, "fcn": 21, "resnet18": 1000, "resnet20": 10,
           "resnet50": 1000}
MODES = ("eager", "graph", "compile")
LABEL_SHAPE = {"fcn": (256, 256)}   # per-pixel labels; the others have one label per sample
ALEXNET_NOTE = ("PyTorch runs the whole AlexNet under DDP for both alexnet and alexnet-plain "
                "(replica's alexnet keeps the classifier on the first device)")


def network_of(model):
    """The network a --model names: alexnet-plain is alexnet here."""
    return "alexnet" if model == "alexnet-plain" else model


def global_batch(batch, replicas, scaling):
    """Samples per step over all replicas: batch itself (strong) or batch per replica (weak)."""
    return batch if scaling == "strong" else batch * replicas


def share(n, replicas, r):
    """Replica r's (offset, count) of n samples: the first n % replicas replicas take one more."""
    base, extra = divmod(n, replicas)
    count = base + (1 if r < extra else 0)
    offset = r * base + min(r, extra)
    return offset, count


def median(values):
    """The median as train_bench takes it: the upper middle of the sorted values."""
    s = sorted(values)
    return s[len(s) // 2]


def available_cpus():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="median training-step time of a standard network in PyTorch, "
                                            "on synthetic data (the counterpart of bench/train_bench)")
    p.add_argument("--model", default="lenet", choices=MODELS,
                   help="network; alexnet and alexnet-plain are the same network here (default: lenet)")
    p.add_argument("--batch", type=int, default=0,
                   help="batch size (0: the network's default); global with strong scaling, per GPU with weak")
    p.add_argument("--steps", type=int, default=20, help="timed steps (default: 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (default: 3)")
    p.add_argument("--gpus", type=int, default=1,
                   help="GPUs: 0 runs on the CPU, 1 eager on cuda:0, N > 1 DDP on cuda:0..N-1 (default: 1)")
    p.add_argument("--scaling", default="strong", choices=("strong", "weak"), help="(default: strong)")
    p.add_argument("--threads", type=int, default=0,
                   help="CPU runs: torch.set_num_threads (0: all CPUs this process may use)")
    p.add_argument("--tf32", default="default", choices=("default", "on", "off"),
                   help="TF32 on GPUs; default is PyTorch's: cuDNN convolutions may use it, matmuls not")
    p.add_argument("--channels-last", action="store_true",
                   help="NHWC for the 2-D networks (default: off; always on with --precision bf16)")
    p.add_argument("--precision", default=None, choices=("fp32", "bf16"),
                   help="bf16: forward and loss under torch.autocast to bfloat16, channels_last for the 2-D "
                        "networks (default: fp32; gpt2: bf16)")
    p.add_argument("--micro-batch", type=int, default=0,
                   help="gpt2: sequences of 1024 tokens a micro-batch (0: 16; tiny: 2)")
    p.add_argument("--accumulate", type=int, default=0,
                   help="gpt2: micro-batches an update (0: as many as make 524,288 tokens; tiny: 2)")
    p.add_argument("--peak-tflops", type=float, default=989.0,
                   help="gpt2: the device's peak rate for the model FLOP utilisation (default: 989, H100 and "
                        "H200 dense bf16)")
    p.add_argument("--gpt-config", default="124m", choices=("124m", "tiny"),
                   help="gpt2: GPT-2 124M, or a 2-layer GPT of width 64 and context 64 (the plumbing on a CPU)")
    p.add_argument("--curve", metavar="PREFIX",
                   help="gpt2: repeat the run train_bench --model gpt2 --curve PREFIX recorded (its configuration, "
                        "micro-batch, accumulate and steps, from PREFIX.json; --gpt-config, --micro-batch, "
                        "--accumulate, --steps and --modes are not used), eager, from its initial parameters on its "
                        "ids; write PREFIX.pytorch-PRECISION.losses.json and print both curves and their "
                        "differences as JSON (precision: fp32 on the CPU, bf16 on a GPU, unless given); exit status 1 "
                        "when the largest relative difference exceeds --curve-rtol")
    p.add_argument("--curve-rtol", type=float, default=None,
                   help="gpt2 --curve: the largest relative difference of an update's loss that counts as agreement "
                        "(default: 1e-5 where both ran in fp32, else 2e-2)")
    p.add_argument("--modes", default="eager",
                   help="comma-separated, run in this order: eager, graph (the whole step replayed from a CUDA "
                        "graph), compile (torch.compile, mode reduce-overhead); all = eager,graph,compile "
                        "(default: eager). Several GPUs: eager only (the others are reported as failed)")
    p.add_argument("--cudnn-benchmark", action="store_true",
                   help="let cuDNN time its algorithms (default: off, as in PyTorch)")
    p.add_argument("--input", default="host", choices=("host", "device"),
                   help="host: batches in pinned host memory, copied to the GPU each step (non_blocking), as "
                        "replica's bench does; device: batches made on the GPU once (default: host)")
    p.add_argument("--params", action="store_true", help="print each network's parameter count and exit")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    s = p.parse_args(argv)
    if s.batch < 0 or s.steps < 1 or s.warmup < 0 or s.gpus < 0 or s.threads < 0:
        p.error("--batch, --warmup, --gpus and --threads must not be negative and --steps must be at least 1")
    s.modes = list(MODES) if s.modes == "all" else [m.strip() for m in s.modes.split(",") if m.strip()]
    unknown = [m for m in s.modes if m not in MODES]
    if unknown or not s.modes or len(set(s.modes)) != len(s.modes):
        p.error(f"--modes {','.join(s.modes)}: give each of {', '.join(MODES)} at most once, comma-separated, or all")
    if (s.curve or s.curve_rtol is not None) and s.model != "gpt2":
        p.error("--curve and --curve-rtol are for --model gpt2")
    if s.precision is None:
        s.precision = "bf16" if s.model == "gpt2" and not (s.curve and s.gpus == 0) else "fp32"
    if s.model == "gpt2":
        if s.micro_batch < 0 or s.accumulate < 0 or s.peak_tflops <= 0:
            p.error("--micro-batch and --accumulate must not be negative, --peak-tflops must be positive")
        if s.gpus > 1:
            p.error("--model gpt2 runs on one GPU (--gpus 1) or the CPU (--gpus 0)")
        if s.threads == 0:
            s.threads = available_cpus()
        return s
    s.batch = s.batch or DEFAULT_BATCH[network_of(s.model)]
    if global_batch(s.batch, max(s.gpus, 1), s.scaling) < max(s.gpus, 1):
        p.error(f"a global batch of {s.batch} leaves some of the {s.gpus} GPUs without samples")
    if s.threads == 0:
        s.threads = available_cpus()
    return s


def torchvision_models():
    """torchvision.models, or None where torchvision is not installed."""
    try:
        import torchvision
    except ImportError:
        return None
    return torchvision.models


def build(name):
    """The network named: as an nn.Sequential, layer for layer the one in include/replica/models/; the
    ResNets as torchvision defines them."""
    import torch
    from torch import nn

    if name in TORCHVISION:
        models = torchvision_models()
        if models is None:
            raise SystemExit(f"pytorch_bench: {name} is torchvision's definition and torchvision is not installed "
                             "(pip install torchvision, or apt-get install python3-torchvision)")
        return getattr(models, name)(num_classes=1000)

    class Inception(nn.Module):
        """1x1 | 1x1 -> 3x3 | 1x1 -> 5x5 | 3x3 max pool -> 1x1, each with ReLU, concatenated on channels."""

        def __init__(self, cin, c1, c3_reduce, c3, c5_reduce, c5, pool_proj):
            super().__init__()
            self.b1 = nn.Sequential(nn.Conv2d(cin, c1, 1), nn.ReLU(inplace=True))
            self.b3 = nn.Sequential(nn.Conv2d(cin, c3_reduce, 1), nn.ReLU(inplace=True),
                                    nn.Conv2d(c3_reduce, c3, 3, 1, 1), nn.ReLU(inplace=True))
            self.b5 = nn.Sequential(nn.Conv2d(cin, c5_reduce, 1), nn.ReLU(inplace=True),
                                    nn.Conv2d(c5_reduce, c5, 5, 1, 2), nn.ReLU(inplace=True))
            self.bp = nn.Sequential(nn.MaxPool2d(3, 1, 1), nn.Conv2d(cin, pool_proj, 1), nn.ReLU(inplace=True))

        def forward(self, x):
            return torch.cat([self.b1(x), self.b3(x), self.b5(x), self.bp(x)], 1)

    class BasicBlock(nn.Module):
        """Two 3x3 convolutions without bias, each with BatchNorm, ReLU between; the shortcut a 1x1
        convolution and BatchNorm where the block changes the size or the channels; ReLU after the sum."""

        def __init__(self, cin, c, stride):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(cin, c, 3, stride, 1, bias=False), nn.BatchNorm2d(c),
                                      nn.ReLU(inplace=True), nn.Conv2d(c, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c))
            self.shortcut = (nn.Sequential(nn.Conv2d(cin, c, 1, stride, bias=False), nn.BatchNorm2d(c))
                             if stride != 1 or cin != c else nn.Identity())

        def forward(self, x):
            return torch.relu(self.body(x) + self.shortcut(x))

    relu = lambda: nn.ReLU(inplace=True)  # noqa: E731
    if name == "resnet20":
        stages = [BasicBlock(16, 16, 1), BasicBlock(16, 16, 1), BasicBlock(16, 16, 1),
                  BasicBlock(16, 32, 2), BasicBlock(32, 32, 1), BasicBlock(32, 32, 1),
                  BasicBlock(32, 64, 2), BasicBlock(64, 64, 1), BasicBlock(64, 64, 1)]
        return nn.Sequential(nn.Conv2d(1, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), relu(), *stages,
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
    if name == "lenet":
        return nn.Sequential(nn.Conv2d(1, 20, 5), nn.MaxPool2d(2), nn.Conv2d(20, 50, 5), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(800, 500), relu(), nn.Linear(500, 10))
    if name in ("alexnet", "alexnet-plain"):
        features = nn.Sequential(nn.Conv2d(3, 64, 11, 4, 2), relu(), nn.MaxPool2d(3, 2),
                                 nn.Conv2d(64, 192, 5, 1, 2), relu(), nn.MaxPool2d(3, 2),
                                 nn.Conv2d(192, 384, 3, 1, 1), relu(),
                                 nn.Conv2d(384, 256, 3, 1, 1), relu(),
                                 nn.Conv2d(256, 256, 3, 1, 1), relu(), nn.MaxPool2d(3, 2))   # -> 256x6x6
        classifier = nn.Sequential(nn.Flatten(), nn.Dropout(0.5), nn.Linear(256 * 6 * 6, 4096), relu(),
                                   nn.Dropout(0.5), nn.Linear(4096, 4096), relu(), nn.Linear(4096, 1000))
        return nn.Sequential(features, classifier)
    if name == "googlenet":
        pool = lambda: nn.MaxPool2d(3, 2, ceil_mode=True)  # noqa: E731
        return nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3), relu(), pool(),
                             nn.Conv2d(64, 64, 1), relu(), nn.Conv2d(64, 192, 3, 1, 1), relu(), pool(),
                             Inception(192, 64, 96, 128, 16, 32, 32),        # 3a -> 256x28x28
                             Inception(256, 128, 128, 192, 32, 96, 64),      # 3b -> 480x28x28
                             pool(),
                             Inception(480, 192, 96, 208, 16, 48, 64),       # 4a -> 512x14x14
                             Inception(512, 160, 112, 224, 24, 64, 64),      # 4b
                             Inception(512, 128, 128, 256, 24, 64, 64),      # 4c
                             Inception(512, 112, 144, 288, 32, 64, 64),      # 4d -> 528x14x14
                             Inception(528, 256, 160, 320, 32, 128, 128),    # 4e -> 832x14x14
                             pool(),
                             Inception(832, 256, 160, 320, 32, 128, 128),    # 5a -> 832x7x7
                             Inception(832, 384, 192, 384, 48, 128, 128),    # 5b -> 1024x7x7
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.4), nn.Linear(1024, 1000))
    if name == "textcnn":
        return nn.Sequential(nn.Conv1d(69, 256, 7), relu(), nn.MaxPool1d(3),
                             nn.Conv1d(256, 256, 7), relu(), nn.MaxPool1d(3),
                             nn.Conv1d(256, 256, 3), relu(), nn.Conv1d(256, 256, 3), relu(),
                             nn.Conv1d(256, 256, 3), relu(), nn.Conv1d(256, 256, 3), relu(), nn.MaxPool1d(3),  # -> 256x34
                             nn.Flatten(), nn.Linear(256 * 34, 1024), relu(), nn.Dropout(0.5),
                             nn.Linear(1024, 1024), relu(), nn.Dropout(0.5), nn.Linear(1024, 14))
    if name == "fcn":
        return nn.Sequential(nn.Conv2d(3, 32, 3, 1, 1), relu(),
                             nn.Conv2d(32, 64, 3, 2, 1), relu(),           # -> 64x128x128
                             nn.ConvTranspose2d(64, 21, 4, 2, 1))          # -> 21x256x256
    raise ValueError(f"unknown model {name!r}")


def check_networks():
    """Builds every network on the meta device (no memory, no arithmetic; on the CPU where PyTorch has no
    default-device context, before 2.0) and checks its parameter count and output shape against
    replica's. The ResNets are skipped, with a note, where torchvision is missing. Returns {network:
    parameter count}."""
    import torch
    place = torch.device("meta") if hasattr(torch.device, "__enter__") else contextlib.nullcontext()
    counts = {}
    for name in NETWORKS:
        if name in TORCHVISION and torchvision_models() is None:
            print(f"pytorch_bench: {name} not checked: torchvision is not installed", file=sys.stderr)
            continue
        with place, torch.no_grad():
            net = build(name).eval()
            out = net(torch.empty((2,) + INPUT_SHAPE[name]))
        counts[name] = sum(p.numel() for p in net.parameters())
        want_out = (2, CLASSES[name]) + LABEL_SHAPE.get(name, ())
        if counts[name] != EXPECTED_PARAMS[name] or tuple(out.shape) != want_out:
            raise SystemExit(f"pytorch_bench: {name} has {counts[name]} parameters and output {tuple(out.shape)}; "
                             f"replica's has {EXPECTED_PARAMS[name]} and {want_out}: the definitions differ")
    return counts


def set_tf32(torch, mode):
    """Sets TF32 for cuDNN convolutions and matmuls; returns what is in force: conv, matmul, on or off."""
    if mode == "on":
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = True, True
    elif mode == "off":
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = False, False
    conv, mm = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    return {(True, True): "on", (True, False): "conv", (False, True): "matmul", (False, False): "off"}[(conv, mm)]


def autocast_of(torch, s, device, cache_enabled=True):
    """The context the forward pass and the loss run in: autocast to bfloat16 for --precision bf16.
    cache_enabled=False under CUDA-graph capture, as PyTorch requires there."""
    if s.precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, cache_enabled=cache_enabled)


def error_text(e):
    """One line saying why a mode failed: the exception's type and its message, lines joined, cut at 300
    characters (torch.compile's errors run to pages; their first lines name the cause)."""
    text = " / ".join(line.strip() for line in str(e).splitlines() if line.strip()) or "no message"
    return f"{type(e).__name__}: {text[:300]}{'...' if len(text) > 300 else ''}"


def run_mode(mode, s, torch, device, world, make_model, xs, ys, weight, wait_all):
    """Runs the warm-up and timed steps of one mode on a fresh model; returns (step times in ms, the last
    step's loss as a tensor). Raises when the mode cannot run here."""
    from torch import nn

    cuda = device.type == "cuda"
    on_host = cuda and s.input == "host"
    if mode != "eager" and world > 1:
        raise RuntimeError(f"{mode} runs on one GPU; with several, DistributedDataParallel runs eager only")
    model = make_model()
    criterion = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)
    times = []

    if mode == "graph":
        if not cuda:
            raise RuntimeError("CUDA graphs need a GPU (--gpus 1)")
        # The whole step captured once, as in PyTorch's CUDA-graph notes: warm-up steps on a side stream
        # (they make cuDNN's choices and SGD's momentum buffers), then forward, backward and the optimiser
        # step recorded; each step copies its batch into the graph's input tensors and replays.
        static_x = torch.empty_like(xs[0], device=device)
        static_y = torch.empty_like(ys[0], device=device)
        static_x.copy_(xs[0])
        static_y.copy_(ys[0])
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(max(s.warmup, 3)):
                opt.zero_grad(set_to_none=True)
                with autocast_of(torch, s, device, cache_enabled=False):
                    loss = criterion(model(static_x), static_y)
                (loss * weight if weight != 1 else loss).backward()
                opt.step()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            with autocast_of(torch, s, device, cache_enabled=False):
                static_loss = criterion(model(static_x), static_y)
            (static_loss * weight if weight != 1 else static_loss).backward()
            opt.step()
        wait_all()
        for i in range(s.warmup + s.steps):   # the first replays (graph upload) untimed, as eager's warm-up
            t0 = time.perf_counter()
            static_x.copy_(xs[i % 2], non_blocking=True)
            static_y.copy_(ys[i % 2], non_blocking=True)
            graph.replay()
            wait_all()
            if i >= s.warmup:
                times.append((time.perf_counter() - t0) * 1000.0)
        return times, static_loss

    mark_step = None
    if mode == "compile":
        if not hasattr(torch, "compile"):
            raise RuntimeError(f"torch.compile needs PyTorch 2.0 or later; this is {torch.__version__}")
        model = torch.compile(model, mode="reduce-overhead")
        # Tells the CUDA-graph trees of reduce-overhead that a new step begins (the last step's outputs
        # are no longer read).
        mark_step = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)
    loss = None
    wait_all()
    for i in range(s.warmup + s.steps):
        t0 = time.perf_counter()
        if mark_step is not None:
            mark_step()
        x, y = xs[i % 2], ys[i % 2]
        if on_host:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        with autocast_of(torch, s, device):
            loss = criterion(model(x), y)
        (loss * weight if weight != 1 else loss).backward()
        opt.step()
        wait_all()   # every device has finished the step
        t1 = time.perf_counter()
        if i >= s.warmup:
            times.append((t1 - t0) * 1000.0)
    return times, loss


def train(s, rank, world):
    """Runs the benchmark on one device (rank of world; the process group exists when world > 1), each of
    s.modes in turn, and returns rank 0's result record (other ranks: None)."""
    import torch

    cuda = s.gpus > 0
    if cuda:
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        tf32 = set_tf32(torch, s.tf32)
        torch.backends.cudnn.benchmark = s.cudnn_benchmark
    else:
        device = torch.device("cpu")
        torch.set_num_threads(s.threads)
        tf32 = "n/a"
    dist = None
    if world > 1:
        import torch.distributed as dist

    name = network_of(s.model)
    image = len(INPUT_SHAPE[name]) == 3
    channels_last = image and (s.channels_last or s.precision == "bf16")

    def make_model():
        torch.manual_seed(1)   # every mode starts from the same weights
        model = build(name).to(device)
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
        model.train()
        if world > 1:
            from torch.nn.parallel import DistributedDataParallel
            model = DistributedDataParallel(model, device_ids=[rank])
        return model

    glob = global_batch(s.batch, world, s.scaling)
    _, n = share(glob, world, rank)
    # Two distinct batches, made once on the device, alternated.
    gen = torch.Generator(device=device)
    gen.manual_seed(1000 + rank)
    xs = [torch.rand((n,) + INPUT_SHAPE[name], generator=gen, device=device) * 2 - 1 for _ in range(2)]
    ys = [torch.randint(0, CLASSES[name], (n,) + LABEL_SHAPE.get(name, ()), generator=gen, device=device)
          for _ in range(2)]
    if channels_last:
        xs = [x.contiguous(memory_format=torch.channels_last) for x in xs]
    if cuda and s.input == "host":
        xs = [x.cpu().pin_memory() for x in xs]
        ys = [y.cpu().pin_memory() for y in ys]
    # DDP averages the replicas' gradients; with uneven shares, weight each replica's mean loss so that
    # the average is the gradient of the mean over the global batch, as replica computes it.
    weight = n * world / glob

    def wait_all():
        if cuda:
            torch.cuda.synchronize(device)
        if world > 1:
            dist.barrier()
            torch.cuda.synchronize(device)

    modes = {}
    for mode in s.modes:
        try:
            times, loss = run_mode(mode, s, torch, device, world, make_model, xs, ys, weight, wait_all)
        except Exception as e:   # reported in the record; the other modes still run
            if world > 1 and mode == "eager":
                raise
            modes[mode] = {"error": error_text(e)}
            continue
        finally:
            if cuda:
                torch.cuda.synchronize(device)
                torch.cuda.empty_cache()
        # The loss of the last step over the global batch (outside the timing).
        last = loss.detach().float() * (n / glob)
        if world > 1:
            dist.all_reduce(last)
        med = median(times)
        modes[mode] = {"median_ms": round(med, 4), "min_ms": round(min(times), 4),
                       "samples_per_s": round(glob / (med / 1000.0), 1), "loss": round(float(last), 5)}
        if mode == "compile" and hasattr(torch, "_dynamo"):
            torch._dynamo.reset()   # the next mode's model is compiled afresh, not from this one's cache
    if rank != 0:
        return None
    done = [m for m in s.modes if "error" not in modes[m]]
    fastest = min(done, key=lambda m: modes[m]["median_ms"]) if done else None
    result = {
        "library": "pytorch", "model": s.model, "devices": max(world, 1),
        "device": str(torch.device("cuda", 0)) if cuda else "cpu",
        "dispatch": "ddp" if world > 1 else (fastest or s.modes[0]), "scaling": s.scaling, "batch": s.batch,
        "global_batch": glob, "steps": s.steps, "precision": s.precision, "mode": fastest, "modes": modes,
        "tf32": tf32, "channels_last": channels_last, "input": s.input if cuda else "host",
        "cudnn_benchmark": bool(cuda and s.cudnn_benchmark),
        "threads": torch.get_num_threads() if not cuda else None, "torch": torch.__version__,
    }
    if fastest is not None:
        result.update({k: modes[fastest][k] for k in ("median_ms", "min_ms", "samples_per_s", "loss")})
    else:
        result["error"] = "every mode failed: " + "; ".join(f"{m}: {modes[m]['error']}" for m in s.modes)
    if name == "alexnet":
        result["note"] = ALEXNET_NOTE
    return result


def ddp_worker(rank, world, s, port, queue):
    """One process of a DDP run (started by torch.multiprocessing.spawn)."""
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    import torch
    import torch.distributed as dist
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    try:
        result = train(s, rank, world)
        if rank == 0:
            queue.put(result)
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def describe(r):
    """The record as lines of text: one per mode, then which mode was fastest."""
    where = r["device"] if r["devices"] == 1 else f"{r['devices']} GPUs ({r['dispatch']}, {r['scaling']} scaling)"
    lines = [f"pytorch {r['model']} on {where}: batch {r['batch']} (global {r['global_batch']}), {r['precision']}, "
             f"tf32 {r['tf32']}, channels_last {'on' if r['channels_last'] else 'off'}"]
    for mode, m in r["modes"].items():
        if "error" in m:
            lines.append(f"  {mode:8s} failed: {m['error']}")
        else:
            lines.append(f"  {mode:8s} median step {m['median_ms']:.3f} ms (min {m['min_ms']:.3f}), "
                         f"{m['samples_per_s']:.0f} samples/s, loss {m['loss']:.4f}")
    if len(r["modes"]) > 1:
        lines.append(f"  fastest: {r['mode']}" if r["mode"] else "  every mode failed")
    return "\n".join(lines)


# train_bench --model gpt2's optimizer: AdamW under clip_grad_norm_ at GPT2_CLIP (--curve checks that the
# run it repeats used the same).
GPT2_ADAMW = {"lr": 6e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}
GPT2_CLIP = 1.0


def gpt2_optimizer(torch, model, fused):
    """AdamW with GPT2_ADAMW's settings, weight decay on the tensors of two dimensions (matrices and
    embeddings: replica's DecayWeights), none on biases and LayerNorms; fused where asked."""
    decay = [q for q in model.parameters() if q.dim() >= 2]
    plain = [q for q in model.parameters() if q.dim() < 2]
    a = GPT2_ADAMW
    return torch.optim.AdamW([{"params": decay, "weight_decay": a["weight_decay"]},
                              {"params": plain, "weight_decay": 0.0}],
                             lr=a["lr"], betas=(a["beta1"], a["beta2"]), eps=a["eps"],
                             **({"fused": True} if fused else {}))


def gpt2_update(torch, s, device, forward, model, opt, micro_batches):
    """One update of train_bench --model gpt2: the mean loss of each (inputs, labels) micro-batch (host
    tensors, copied to the device as needed) under s's autocast, its gradient accumulated over them,
    clipped at GPT2_CLIP, opt's step. Returns the micro-batches' mean loss, once the step has finished."""
    import torch.nn.functional as F

    total = torch.zeros((), device=device)
    for x, y in micro_batches:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast_of(torch, s, device):
            logits = forward(x)
            micro_loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        (micro_loss / len(micro_batches)).backward()
        total += micro_loss.detach()
    torch.nn.utils.clip_grad_norm_(model.parameters(), GPT2_CLIP)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(total) / len(micro_batches)


def gpt2_device(torch, s):
    """cuda:0 for --gpus 1, else the CPU with --threads threads; and the TF32 setting in force there."""
    if s.gpus > 0:
        device = torch.device("cuda", 0)
        torch.cuda.set_device(device)
        return device, set_tf32(torch, s.tf32)
    torch.set_num_threads(s.threads)
    return torch.device("cpu"), "n/a"


def train_gpt2(s):
    """--model gpt2: each of s.modes from the same initial weights; the record of the fastest, every mode's
    figures (or its error) under "modes"."""
    import inspect

    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import pytorch_gpt

    big = s.gpt_config == "124m"
    cfg = pytorch_gpt.GPT2SMALL if big else pytorch_gpt.Config(2, 2, 64, 64, 512)
    tokens = 50257 if big else cfg.vocab   # GPT-2's vocabulary; the table is padded to 50,304 rows
    device, tf32 = gpt2_device(torch, s)
    cuda = device.type == "cuda"
    micro = s.micro_batch or (16 if big else 2)
    k = s.accumulate or (max(1, (1 << 19) // (micro * cfg.context)) if big else 2)
    tokens_per_step = k * micro * cfg.context
    # 2k micro-batches of ids (seed 1), each label the id after it; step s takes micro-batches s k ..
    # s k + k - 1 modulo 2k, copied to the GPU from pinned memory as they are needed.
    ids = torch.randint(0, tokens, (2 * k, micro, cfg.context + 1), generator=torch.Generator().manual_seed(1))
    xs, ys = ids[..., :-1].contiguous(), ids[..., 1:].contiguous()
    if cuda:
        xs, ys = xs.pin_memory(), ys.pin_memory()

    def make_model():
        torch.manual_seed(1)   # every mode starts from the same weights
        return pytorch_gpt.GPT(cfg).to(device)

    probe = make_model()
    params = sum(q.numel() for q in probe.parameters())   # the tied table once
    if big and params != 124475904:
        raise SystemExit(f"pytorch_bench: GPT-2 has {params:,d} parameters here, replica's GPT2Small 124,475,904")
    n = params - probe.wpe.weight.numel()   # without the position embedding
    flops_per_token = 6 * n + 6 * cfg.layers * cfg.dim * cfg.context
    attention = "sdpa" if probe.blocks[0].attn.fused else "written out"
    del probe
    fused = cuda and "fused" in inspect.signature(torch.optim.AdamW).parameters

    def run(mode):
        if mode == "graph":
            raise RuntimeError("graph: not for gpt2 (its micro-batches accumulate outside one captured step)")
        model = make_model()
        opt = gpt2_optimizer(torch, model, fused)
        forward = model
        if mode == "compile":
            if not hasattr(torch, "compile"):
                raise RuntimeError(f"torch.compile needs PyTorch 2.0 or later; this is {torch.__version__}")
            forward = torch.compile(model)
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        times, loss = [], float("nan")
        for step in range(s.warmup + s.steps):
            t0 = time.perf_counter()
            at = [(step * k + m) % (2 * k) for m in range(k)]
            loss = gpt2_update(torch, s, device, forward, model, opt, [(xs[i], ys[i]) for i in at])
            if step >= s.warmup:
                times.append((time.perf_counter() - t0) * 1000.0)
        med = median(times)
        rate = tokens_per_step / (med / 1000.0)
        r = {"median_ms": med, "min_ms": min(times), "tokens_per_s": rate,
             "mfu": flops_per_token * rate / (s.peak_tflops * 1e12), "loss": loss}
        if cuda:
            r["peak_memory_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
            r["reserved_memory_mib"] = torch.cuda.max_memory_reserved(device) / 2**20
        del forward, model, opt
        return r

    modes = {}
    for mode in s.modes:
        try:
            modes[mode] = run(mode)
        except Exception as e:   # a mode that cannot run here is reported, the others still run
            modes[mode] = {"error": error_text(e)}
    ran = [m for m in modes if "error" not in modes[m]]
    best = min(ran, key=lambda m: modes[m]["median_ms"]) if ran else None
    record = {"library": "pytorch", "torch": torch.__version__, "model": "gpt2", "config": s.gpt_config,
              "precision": s.precision, "device": str(device) if cuda else "cpu", "tf32": tf32,
              "threads": None if cuda else s.threads, "attention": attention, "fused_adamw": fused,
              "sequence": cfg.context, "micro_batch": micro, "accumulate": k, "tokens_per_step": tokens_per_step,
              "steps": s.steps, "warmup": s.warmup, "parameters": params, "flops_per_token": flops_per_token,
              "peak_tflops": s.peak_tflops, "mode": best, "modes": modes}
    if best is not None:
        record.update(modes[best])
    else:
        record["error"] = "every mode failed"
    return record


def read_array(torch, path, dtype, count):
    """The count little-endian values of dtype in the file at path (all of it)."""
    with open(path, "rb") as f:
        data = f.read()
    width = torch.tensor([], dtype=dtype).element_size()
    if len(data) != count * width:
        raise SystemExit(f"pytorch_bench: {path} has {len(data):,d} bytes, expected {count:,d} values of "
                         f"{width} bytes")
    if sys.byteorder != "little":
        raise SystemExit("pytorch_bench: --curve reads little-endian files on a little-endian host only")
    return torch.frombuffer(bytearray(data), dtype=dtype)


def compare_curves(ours, theirs):
    """Each update's absolute and relative (to PyTorch's loss) difference, and the largest of each."""
    steps = [{"step": i + 1, "abs": abs(a - b), "rel": abs(a - b) / abs(b) if b else float("inf")}
             for i, (a, b) in enumerate(zip(ours, theirs))]
    worst_abs = max(steps, key=lambda d: d["abs"])
    worst_rel = max(steps, key=lambda d: d["rel"])
    return {"per_step": steps, "max_abs": worst_abs["abs"], "max_abs_step": worst_abs["step"],
            "max_rel": worst_rel["rel"], "max_rel_step": worst_rel["step"]}


def curve_gpt2(s):
    """--model gpt2 --curve PREFIX: the run train_bench --curve PREFIX recorded (PREFIX.json), repeated in
    PyTorch eager from its initial parameters (PREFIX.params) on its ids (PREFIX.ids); writes
    PREFIX.pytorch-PRECISION.losses.json and returns the comparison with PREFIX.losses.json."""
    import inspect

    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import pytorch_gpt

    prefix = s.curve
    with open(prefix + ".json") as f:
        run = json.load(f)
    if run.get("model") != "gpt2":
        raise SystemExit(f"pytorch_bench: {prefix}.json is not a gpt2 run of train_bench --curve")
    want = dict(GPT2_ADAMW, name="AdamW", clip_grad_norm=GPT2_CLIP)
    got = {key: run["optimizer"].get(key) for key in want}
    if any(got[key] != want[key] if isinstance(want[key], str) else
           not math.isclose(got[key], want[key], rel_tol=1e-6) for key in want):
        raise SystemExit(f"pytorch_bench: {prefix}.json's optimizer is {got}, this script's {want}")
    cfg = pytorch_gpt.Config(run["layers"], run["heads"], run["width"], run["context"], run["vocab"])
    micro, k, steps = run["micro_batch"], run["accumulate"], run["steps"]
    device, tf32 = gpt2_device(torch, s)
    cuda = device.type == "cuda"

    model = pytorch_gpt.GPT(cfg)
    order = model.in_replica_order()
    if {id(q) for q in order} != {id(q) for q in model.parameters()} or len(order) != len(list(model.parameters())):
        raise SystemExit("pytorch_bench: pytorch_gpt.GPT.in_replica_order does not name every parameter once")
    params = sum(q.numel() for q in model.parameters())
    if params != run["parameters"]:
        raise SystemExit(f"pytorch_bench: this GPT has {params:,d} parameters, {prefix}.json says "
                         f"{run['parameters']:,d}")
    model.load_replica(read_array(torch, prefix + ".params", torch.float32, params))
    model.to(device)
    ids = read_array(torch, prefix + ".ids", torch.int32, steps * k * 2 * micro * cfg.context)
    ids = ids.view(steps * k, 2, micro, cfg.context).long()
    if int(ids.min()) < 0 or int(ids.max()) >= cfg.vocab:
        raise SystemExit(f"pytorch_bench: {prefix}.ids names ids outside [0, {cfg.vocab})")
    fused = cuda and "fused" in inspect.signature(torch.optim.AdamW).parameters
    opt = gpt2_optimizer(torch, model, fused)

    losses, start = [], time.perf_counter()
    for step in range(steps):
        used = ids[step * k:(step + 1) * k]
        losses.append(gpt2_update(torch, s, device, model, model, opt, [(b[0], b[1]) for b in used]))
    seconds = time.perf_counter() - start
    with open(f"{prefix}.pytorch-{s.precision}.losses.json", "w") as f:
        json.dump(losses, f)
        f.write("\n")
    with open(prefix + ".losses.json") as f:
        ours = json.load(f)
    if len(ours) != len(losses):
        raise SystemExit(f"pytorch_bench: {prefix}.losses.json has {len(ours)} losses, {steps} updates expected")
    rtol = s.curve_rtol if s.curve_rtol is not None else (1e-5 if s.precision == run["precision"] == "fp32" else 2e-2)
    result = {"curve": prefix, "config": run["config"], "parameters": params, "micro_batch": micro,
              "accumulate": k, "steps": steps,
              "replica": {"precision": run["precision"], "device": run["device"], "losses": ours},
              "pytorch": {"torch": torch.__version__, "precision": s.precision, "device": str(device),
                          "tf32": tf32, "fused_adamw": fused, "seconds": seconds, "losses": losses}}
    result.update(compare_curves(ours, losses))
    result["rtol"] = rtol
    result["agree"] = result["max_rel"] <= rtol
    return result


def describe_gpt2(r):
    lines = [f"pytorch gpt2 ({r['config']}) on {r['device']}: {r['micro_batch']} x {r['sequence']} tokens a "
             f"micro-batch, {r['accumulate']} a step ({r['tokens_per_step']} tokens), {r['precision']}, attention "
             f"{r['attention']}, fused AdamW {'on' if r['fused_adamw'] else 'off'}"]
    for mode, m in r["modes"].items():
        if "error" in m:
            lines.append(f"  {mode:8s} failed: {m['error']}")
        else:
            memory = f", peak memory {m['peak_memory_mib']:.0f} MiB" if "peak_memory_mib" in m else ""
            lines.append(f"  {mode:8s} median step {m['median_ms']:.1f} ms (min {m['min_ms']:.1f}), "
                         f"{m['tokens_per_s']:.0f} tokens/s, MFU {100 * m['mfu']:.1f}%, loss {m['loss']:.4f}{memory}")
    if len(r["modes"]) > 1:
        lines.append(f"  fastest: {r['mode']}" if r["mode"] else "  every mode failed")
    return "\n".join(lines)


def main(argv=None):
    s = parse_args(argv)
    import torch

    if s.model == "gpt2":
        if s.gpus > 0 and not torch.cuda.is_available():
            raise SystemExit("pytorch_bench: no CUDA device; use --gpus 0 for a CPU run")
        if s.curve:
            result = curve_gpt2(s)
            print(json.dumps(result), flush=True)
            return 0 if result["agree"] else 1
        result = train_gpt2(s)
        print(json.dumps(result) if s.json else describe_gpt2(result), flush=True)
        if result["mode"] is None:
            print(f"pytorch_bench: {result['error']}", file=sys.stderr)
            return 1
        return 0

    counts = check_networks()
    if s.params:
        for name in counts:
            print(f"{name:10s} {counts[name]:>10,d} parameters (replica: {EXPECTED_PARAMS[name]:,d})")
        return 0
    if s.gpus > 0:
        if not torch.cuda.is_available():
            raise SystemExit("pytorch_bench: no CUDA device; use --gpus 0 for a CPU run")
        if s.gpus > torch.cuda.device_count():
            raise SystemExit(f"pytorch_bench: --gpus {s.gpus}, but only {torch.cuda.device_count()} visible")

    if s.gpus <= 1:
        result = train(s, 0, 1)
    else:
        import torch.multiprocessing as mp
        queue = mp.get_context("spawn").SimpleQueue()
        for attempt in range(3):   # the free port can be taken between free_port() and the workers' bind
            try:
                mp.spawn(ddp_worker, args=(s.gpus, s, free_port(), queue), nprocs=s.gpus, join=True)
                break
            except Exception as e:
                if "EADDRINUSE" not in str(e) or attempt == 2:
                    raise
        result = queue.get()
    print(json.dumps(result) if s.json else describe(result), flush=True)
    if result["mode"] is None:
        print(f"pytorch_bench: {result['error']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

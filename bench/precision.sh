#!/usr/bin/env bash
# fp32 against bf16 on one GPU, and PyTorch's bf16 (autocast, channels_last) on the same machine: the
# table of docs/benchmarks.md ("One GPU, bf16"). Builds train_bench_cuda (its network families are
# translation units of their own, compiled side by side) while PyTorch runs, then runs every network
# in fp32 and bf16, ROUNDS times interleaved.
#   bench/precision.sh BUILD OUT        # BUILD: a build folder configured with -Dcuda=enabled
# PROGRAM=path: use this train_bench_cuda (built elsewhere, optimisation on) instead of building it.
# TORCH_MODES (default eager,graph): pytorch_bench's modes (compile takes minutes per network).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$(cd "$1" && pwd)
out=$(mkdir -p "$2" && cd "$2" && pwd)
export NCCL_NVLS_ENABLE=0
runs=(lenet:64 alexnet:128 googlenet:32 googlenet:128 textcnn:128 fcn:16 resnet18:256 resnet50:256)

bin=${PROGRAM:-$build/bench/train_bench_cuda}
[ -n "${PROGRAM:-}" ] || ninja -C "$build" bench/train_bench_cuda > "$out/build.log" 2>&1 &
# The GPU is idle while nvcc compiles: PyTorch first.
for m in "${runs[@]}"; do
    timeout 300 python3 "$root/bench/pytorch_bench.py" --model "${m%%:*}" --batch "${m##*:}" --precision bf16 \
        --modes "${TORCH_MODES:-eager,graph}" --json >> "$out/pytorch.jsonl" 2>> "$out/pytorch.err"
done
wait
for r in $(seq "${ROUNDS:-2}"); do
    for m in "${runs[@]}"; do
        for p in fp32 bf16; do
            timeout 120 "$bin" --model "${m%%:*}" --batch "${m##*:}" --devices cuda:0 --precision $p \
                --steps 30 --json >> "$out/replica.jsonl" 2>> "$out/replica.err"
        done
    done
done
python3 - "$out" <<'P'
import collections, json, os, statistics, sys
out = sys.argv[1]
def records(name):
    path = os.path.join(out, name)
    for line in open(path) if os.path.exists(path) else []:
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            pass
ours = collections.defaultdict(list)
memory = {}
for r in records("replica.jsonl"):
    ours[(r["model"], r["batch"], r["precision"])].append(r["median_ms"])
    memory[(r["model"], r["batch"], r["precision"])] = r["activation_mib"]
torch = {(r["model"], r["batch"]): r for r in records("pytorch.jsonl")}
print("| network (batch) | ours fp32 | ours bf16 | bf16/fp32 | PyTorch bf16 (mode) | ours bf16 / PyTorch | activations bf16/fp32 |")
print("|---|--:|--:|--:|--:|--:|--:|")
for m, b in sorted({k[:2] for k in ours}):
    f, h = ours.get((m, b, "fp32")), ours.get((m, b, "bf16"))
    if not f or not h:
        continue
    f, h = statistics.median(f), statistics.median(h)
    t = torch.get((m, b), {})
    modes = {k: v["median_ms"] for k, v in t.get("modes", {}).items() if isinstance(v, dict) and "median_ms" in v}
    best = min(modes.items(), key=lambda kv: kv[1]) if modes else None
    mem = memory[(m, b, "bf16")] / memory[(m, b, "fp32")]
    print(f"| {m} ({b}) | {f:.3f} | {h:.3f} | {h / f:.2f} | " +
          (f"{best[1]:.3f} ({best[0]}) | {h / best[1]:.2f}" if best else "- | -") + f" | {mem:.3f} |")
P

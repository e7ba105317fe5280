#!/usr/bin/env bash
# The tensor-core attention kernels of commit OLD (or of a folder holding replica/... headers) against
# the working tree's, on one GPU: the working
# tree's bench/attention_bench.cpp built against each one's headers, run on a few shapes with --dump
# (the forward, and the backward from a delta computed on the host, so that the delta pass is out of
# it). Prints, for each shape, whether the two builds' results have the same bits, and both builds'
# times (JSON lines). Needs nvcc; the CLI11 headers from the system or .deps/include.
#   bench/attention_ab.sh OLD [folder]        (default folder: /tmp/attention-ab)
#   bench/attention_ab.sh path/to/include [folder]   (headers missing there come from the tree's)
# AB_BUILD_ONLY=1: build both into folder and stop (on a machine with nvcc and no GPU); AB_RUN_ONLY=1:
# run the two programs already in folder (old_bench, new_bench; OLD is then only a label), as the GPU
# machine does with a folder built elsewhere and carried there.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
old=${1:?usage: bench/attention_ab.sh OLD [folder]}
out=${2:-/tmp/attention-ab}
if [ -z "${AB_RUN_ONLY:-}" ]; then
    rm -rf "$out" && mkdir -p "$out/old"
    if [ -d "$old" ]; then cp -r "$old" "$out/old/include"; else git -C "$root" archive "$old" include | tar -x -C "$out/old"; fi
    cp "$root/bench/attention_bench.cpp" "$out/attention_bench.cu"
    nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
    # shellcheck disable=SC2054 # -gencode's commas are nvcc's
    flags=(-std=c++20 --expt-relaxed-constexpr -O3 -gencode=arch=compute_90,code=sm_90 -I"$root/examples")
    [ -d "$root/.deps/include" ] && flags+=(-I"$root/.deps/include")
    libs=(-lcublas -lcublasLt -lcudnn -lnccl)
    # OLD's headers first: attention.hpp and attention_tc.hpp (and whatever else OLD has) come from there.
    "$nvcc" "${flags[@]}" -I"$out/old/include" -I"$root/include" "$out/attention_bench.cu" -o "$out/old_bench" "${libs[@]}" &
    first=$!
    "$nvcc" "${flags[@]}" -I"$root/include" "$out/attention_bench.cu" -o "$out/new_bench" "${libs[@]}"
    wait "$first"
fi
[ -z "${AB_BUILD_ONLY:-}" ] || { echo "built $out/old_bench and $out/new_bench"; exit 0; }
for shape in "--n 16 --t 1024 --heads 12 --head 64" "--n 2 --t 200 --heads 3 --head 64" "--n 1 --t 1000 --heads 2 --head 32" \
             "--n 2 --t 333 --heads 2 --head 40" "--n 2 --t 77 --heads 3 --head 20" "--n 2 --t 300 --heads 2 --head 64 --type fp16"; do
    # shellcheck disable=SC2086 # shape is a list of options
    "$out/old_bench" $shape --dump "$out/old.bin" > "$out/old.json"
    # shellcheck disable=SC2086
    "$out/new_bench" $shape --dump "$out/new.bin" > "$out/new.json"
    if cmp -s "$out/old.bin" "$out/new.bin"; then verdict="same bits"; else verdict="DIFFERENT BITS"; fi
    echo "== $shape: $verdict"
    echo "old: $(tr -d '\n' < "$out/old.json")"
    echo "new: $(tr -d '\n' < "$out/new.json")"
done

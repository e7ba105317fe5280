#!/usr/bin/env python3
"""Checks ONNX files written by replica against the predict() outputs written beside them.

    python3 tests/onnx/compare.py MODEL.onnx [MODEL.onnx ...] [--tolerance 1e-5]

For each MODEL.onnx: onnx.checker.check_model(full_check=True), then ONNX Runtime (its Python package,
CPU) runs the inputs of MODEL.onnx.reference (written by replica::onnx::write_reference, e.g. by the
examples' --export) and its outputs are compared to replica's predict() outputs stored there. The
difference is max |ort - replica| / max(max |replica|, 1e-6): the largest difference relative to the
largest output. Exit status 0 when every model passes the checker and is within the tolerance.

Needs the onnx and onnxruntime Python packages (and numpy). tests/onnx/check.py, the CI check, uses the
reader and the metric below with Debian's onnx and ONNX Runtime from npm.
"""
import argparse
import struct
import sys

import numpy as np

# The magic names the inputs' element: floats, or a token model's int32 ids.
INPUT_TYPES = {b"RPLREF01": "<f4", b"RPLREF02": "<i4"}


def read_reference(path):
    """(inputs, outputs) as arrays of the shapes written, batch first: inputs float32 or int32 (token
    ids), outputs float32."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] not in INPUT_TYPES:
        raise SystemExit(f"{path}: not a replica reference file (write it with replica::onnx::write_reference)")
    rank_in, rank_out = struct.unpack_from("<II", data, 8)
    offset = 16
    dims_in = struct.unpack_from(f"<{rank_in}Q", data, offset)
    offset += 8 * rank_in
    dims_out = struct.unpack_from(f"<{rank_out}Q", data, offset)
    offset += 8 * rank_out
    count_in, count_out = int(np.prod(dims_in)), int(np.prod(dims_out))
    if len(data) != offset + 4 * (count_in + count_out):
        raise SystemExit(f"{path}: {len(data)} bytes, the header says {offset + 4 * (count_in + count_out)}")
    x = np.frombuffer(data, INPUT_TYPES[data[:8]], count_in, offset).reshape(dims_in)
    y = np.frombuffer(data, "<f4", count_out, offset + 4 * count_in).reshape(dims_out)
    return x, y


def relative_difference(got, want):
    """max |got - want| / max(max |want|, 1e-6), or inf when the shapes differ."""
    if got.shape != want.shape:
        return float("inf")
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    return float(diff.max() / max(float(np.abs(want).max()), 1e-6))


def check_model(path):
    """onnx.checker with the full check (shape inference included); raises on a bad model."""
    import onnx
    onnx.checker.check_model(path, full_check=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="ONNX files, each with FILE.reference beside it")
    parser.add_argument("--tolerance", type=float, default=1e-5)
    args = parser.parse_args()
    import onnx
    import onnxruntime as ort
    print(f"onnx {onnx.__version__}, onnxruntime {ort.__version__}")
    failed = 0
    for path in args.models:
        try:
            check_model(path)
        except Exception as e:
            print(f"FAIL {path}: onnx.checker: {e}")
            failed += 1
            continue
        x, y = read_reference(path + ".reference")
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        got = session.run(["output"], {"input": x})[0]
        diff = relative_difference(got, y)
        ok = diff <= args.tolerance
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {path}: checker passed; ONNX Runtime vs predict(): "
              f"max |a - b| / max |b| = {diff:.2e} (tolerance {args.tolerance:.0e}, outputs {tuple(y.shape)})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

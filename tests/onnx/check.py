#!/usr/bin/python3
"""The CI check of ONNX export: every network exported, checked by onnx.checker and run by ONNX Runtime.

    tests/onnx/check.py RUNNER DEPS_DIR [--keep]

1. RUNNER "[onnx][networks]" (tests/onnx/test_onnx.cpp) writes NAME.onnx and NAME.onnx.reference for
   every network into a folder beside this run (onnx-models/ in the working directory).
2. onnx.checker.check_model(full_check=True) on each, in this process: Debian's python3-onnx, so this
   script runs under /usr/bin/python3.
3. ONNX Runtime from npm (onnxruntime-node, installed once with --ignore-scripts into DEPS_DIR, where
   a rerun finds it) runs each model on the reference inputs in one node process
   (tests/onnx/run_ort.js) and compares with predict(): max |a - b| / max |b| <= 1e-5.
The folder is removed when everything passed (its files are large), kept otherwise (--keep: always).
"""
import os
import pathlib
import shutil
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from compare import check_model  # noqa: E402

TOLERANCE = 1e-5
ORT_PACKAGE = "onnxruntime-node@1.30.0"


def ensure_onnxruntime(deps):
    modules = deps / "node_modules"
    if (modules / "onnxruntime-node" / "package.json").exists():
        return modules
    if shutil.which("npm") is None:
        sys.exit("check.py: npm not found: install nodejs and npm (scripts/test does)")
    deps.mkdir(parents=True, exist_ok=True)
    print(f"installing {ORT_PACKAGE} into {deps} (once)", flush=True)
    subprocess.run(["npm", "install", "--ignore-scripts", "--no-audit", "--no-fund", "--prefix", str(deps),
                    ORT_PACKAGE], check=True, stdout=sys.stderr)
    return modules


def main():
    runner, deps = sys.argv[1], pathlib.Path(sys.argv[2])
    keep = "--keep" in sys.argv[3:]
    out = pathlib.Path.cwd() / "onnx-models"
    shutil.rmtree(out, ignore_errors=True)
    start = time.monotonic()
    env = dict(os.environ, REPLICA_ONNX_DIR=str(out))
    subprocess.run([runner, "[onnx]"], env=env, check=True)
    models = sorted(out.glob("*.onnx"))
    print(f"exported {len(models)} models in {time.monotonic() - start:.1f} s", flush=True)
    if not models:
        sys.exit("check.py: the runner wrote no models")

    failed = 0
    start = time.monotonic()
    for m in models:
        try:
            check_model(str(m))
        except Exception as e:  # the checker's own exception types differ between versions
            print(f"FAIL {m.name}: onnx.checker: {e}")
            failed += 1
    import onnx
    print(f"onnx.checker {onnx.__version__} (full check): {len(models) - failed} of {len(models)} models pass "
          f"({time.monotonic() - start:.1f} s)", flush=True)

    modules = ensure_onnxruntime(deps)
    start = time.monotonic()
    ort = subprocess.run(["node", str(HERE / "run_ort.js"), str(out), str(TOLERANCE)],
                         env=dict(os.environ, NODE_PATH=str(modules)))
    print(f"ONNX Runtime: {time.monotonic() - start:.1f} s", flush=True)
    failed += ort.returncode != 0
    if failed or keep:
        print(f"models kept in {out}")
    else:
        shutil.rmtree(out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

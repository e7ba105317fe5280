#!/usr/bin/env python3
"""Compiles each case in this folder and expects failure with the message named in its first line.

usage: run.py INCLUDE_DIR CASE_DIR -- COMPILER [ARGS...]
A case starts with `// expect: <text>`; it passes when the compiler fails and prints <text>. The
cases compile side by side, one per core; the report lists them in name order.
"""
import concurrent.futures
import os
import pathlib
import subprocess
import sys

include, cases = sys.argv[1], pathlib.Path(sys.argv[2])
compiler = sys.argv[sys.argv.index("--") + 1:]
files = sorted(cases.glob("*.cpp"))


def check(case):
    """The case's report line, and whether it failed."""
    first = case.read_text().splitlines()[0]
    assert first.startswith("// expect: "), f"{case.name}: first line must be // expect: <message>"
    expected = first[len("// expect: "):]
    result = subprocess.run(compiler + ["-I", include, "-fsyntax-only", str(case)],
                            capture_output=True, text=True)
    if result.returncode == 0:
        return f"FAIL {case.name}: compiled, but should not have", True
    if expected not in result.stderr:
        return f"FAIL {case.name}: failed without the message '{expected}'\n{result.stderr[:3000]}", True
    return f"ok   {case.name}: {expected}", False


with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
    reports = list(pool.map(check, files))
failures = 0
for line, failed in reports:
    print(line)
    failures += failed
print(f"{len(files) - failures} passed, {failures} failed")
sys.exit(1 if failures or not files else 0)

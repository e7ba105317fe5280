#!/usr/bin/env python3
"""Compiles each case in this folder and expects failure with the message named in its first line.

usage: run.py INCLUDE_DIR CASE_DIR -- COMPILER [ARGS...]
A case starts with `// expect: <text>`; it passes when the compiler fails and prints <text>.
"""
import pathlib
import subprocess
import sys

include, cases = sys.argv[1], pathlib.Path(sys.argv[2])
compiler = sys.argv[sys.argv.index("--") + 1:]
failures = 0
files = sorted(cases.glob("*.cpp"))
for case in files:
    first = case.read_text().splitlines()[0]
    assert first.startswith("// expect: "), f"{case.name}: first line must be // expect: <message>"
    expected = first[len("// expect: "):]
    result = subprocess.run(compiler + ["-I", include, "-fsyntax-only", str(case)],
                            capture_output=True, text=True)
    if result.returncode == 0:
        print(f"FAIL {case.name}: compiled, but should not have")
        failures += 1
    elif expected not in result.stderr:
        print(f"FAIL {case.name}: failed without the message '{expected}'")
        print(result.stderr[:3000])
        failures += 1
    else:
        print(f"ok   {case.name}: {expected}")
print(f"{len(files) - failures} passed, {failures} failed")
sys.exit(1 if failures or not files else 0)

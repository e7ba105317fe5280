#!/usr/bin/env python3
"""Compiles each case in this folder and expects failure with the message named in its first line.

usage: run.py INCLUDE_DIR CASE_DIR -- COMPILER [ARGS...]
A case starts with `// expect: <text>`; it passes when the compiler fails and prints <text>. The
cases compile side by side, one per core (-fsyntax-only); the report lists them in name order.

Most cases include replica/replica.hpp before anything else, and reading it is nearly all of a case's
time (4 s of about 4.5 s with GCC 12). With GCC that header is precompiled once per run, with the
cases' compiler and flags, into a scratch folder searched first (-I), where GCC finds
replica/replica.hpp.gch in place of the header (0.8 s a case); the cases that start with another
include compile meanwhile without it. GCC checks that the precompiled header fits each compilation and
otherwise reads the header itself, so it changes no verdict, only the time; where the header does not
precompile, every case reads it itself. Other compilers (Clang) read the header in each case.
"""
import concurrent.futures
import os
import pathlib
import re
import subprocess
import sys
import tempfile

include, cases = sys.argv[1], pathlib.Path(sys.argv[2])
compiler = sys.argv[sys.argv.index("--") + 1:]
files = sorted(cases.glob("*.cpp"))
PRELUDE = "replica/replica.hpp"
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)


def check(case, pch_dir=None):
    """The case's report line, and whether it failed."""
    first = case.read_text().splitlines()[0]
    assert first.startswith("// expect: "), f"{case.name}: first line must be // expect: <message>"
    expected = first[len("// expect: "):]
    search = ["-I", pch_dir] if pch_dir else []
    result = subprocess.run(compiler + search + ["-I", include, "-fsyntax-only", str(case)],
                            capture_output=True, text=True)
    if result.returncode == 0:
        return f"FAIL {case.name}: compiled, but should not have", True
    if expected not in result.stderr:
        return f"FAIL {case.name}: failed without the message '{expected}'\n{result.stderr[:3000]}", True
    return f"ok   {case.name}: {expected}", False


def is_gcc():
    """Whether the compiler is GCC (Clang defines __GNUC__ too, and __clang__)."""
    macros = subprocess.run(compiler + ["-dM", "-E", "-x", "c++", os.devnull], capture_output=True, text=True)
    return macros.returncode == 0 and "__GNUC__" in macros.stdout and "__clang__" not in macros.stdout


def precompile(pch_dir):
    """The prelude precompiled into pch_dir; the folder to search first, or None where it failed."""
    target = pathlib.Path(pch_dir) / (PRELUDE + ".gch")
    target.parent.mkdir(parents=True)
    done = subprocess.run(compiler + ["-I", include, "-x", "c++-header", os.path.join(include, PRELUDE),
                                      "-o", str(target)], capture_output=True, text=True)
    return pch_dir if done.returncode == 0 and target.exists() else None


def starts_with_prelude(case):
    first = INCLUDE.search(case.read_text())
    return first is not None and first.group(1) == PRELUDE


# The pool ends (its compilers done) before the scratch folder is removed.
with tempfile.TemporaryDirectory(prefix="replica-compile-fail.") as scratch, \
        concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
    prelude_first = [c for c in files if starts_with_prelude(c)] if is_gcc() else []
    # The precompiled header first, the cases that cannot use it beside it, then the rest.
    pch = pool.submit(precompile, scratch) if prelude_first else None
    futures = {c: pool.submit(check, c) for c in files if c not in prelude_first}
    pch_dir = pch.result() if pch else None
    futures.update({c: pool.submit(check, c, pch_dir) for c in prelude_first})
    reports = [futures[c].result() for c in files]
if prelude_first and pch_dir is None:
    print(f"note: {PRELUDE} did not precompile; each case read it itself")
failures = 0
for line, failed in reports:
    print(line)
    failures += failed
print(f"{len(files) - failures} passed, {failures} failed")
sys.exit(1 if failures or not files else 0)

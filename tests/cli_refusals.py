#!/usr/bin/env python3
"""Bad command lines and bad runs of the examples and the benchmark: each must exit non-zero with a
message that says what was wrong (and, for command lines, points to --help); none may train.

usage: cli_refusals.py LENET_BINARY TRAIN_BENCH_BINARY FEATURE_PARALLEL_BINARY [TRAIN_IMAGES_BINARY]
"""
import os
import subprocess
import sys

lenet, bench, feature = sys.argv[1:4]
images = sys.argv[4] if len(sys.argv) > 4 else None
SMALL = ["--train-samples", "256", "--test-samples", "50", "--dispatch", "single"]

# (program, arguments, exit status, parts the message must hold)
CASES = [
    (lenet, ["--epochs", "0"], 2, ["--epochs", "'0' is not a whole number from 1 to 1000000"]),
    (lenet, ["--epochs", "-3"], 2, ["'-3' is not a whole number"]),
    (lenet, ["--seed", "-1"], 2, ["--seed", "'-1' is not a whole number from 0 to 18446744073709551615"]),
    (lenet, ["--seed", "18446744073709551616"], 2, ["is not a whole number from 0 to 18446744073709551615"]),
    (lenet, ["--batch-size", "4611686018427387904"], 2, ["--batch-size", "not a whole number from 1 to 60000"]),
    (lenet, ["--batch-size", "9223372036854775809"], 2, ["not a whole number from 1 to 60000"]),
    (lenet, ["--batch-size", "010"], 2, ["'010' is not a whole number"]),
    (lenet, ["--devices", "cpu:0,"], 2, ["has an empty item", "separated by single commas"]),
    (lenet, ["--devices", ",cpu:0"], 2, ["has an empty item"]),
    (lenet, ["--devices", "cpu:0,,cpu:1"], 2, ["has an empty item"]),
    (lenet, ["--devices", "cpu:0,cpu:0"], 2, ["names cpu:0 twice"]),
    (lenet, ["--devices", f"cpu:{os.cpu_count() + 1}"], 2, ["is beyond this machine's", "hardware threads"]),
    (lenet, ["--devices", "cuda:4096"], 2, ["--devices: cuda:4096"]),
    (lenet, ["--devices", "gpu:0"], 2, ["bad device 'gpu:0'", "cpu:N or cuda:N"]),
    (lenet, ["--devices", ""], 2, ["--devices is empty"]),
    (lenet, ["--checkpoint", "--resume"], 2, ["--checkpoint: got the option --resume where a value was expected"]),
    (lenet, ["--epochs", "--resume"], 2, ["--epochs: got the option --resume where a value was expected"]),
    (lenet, ["--devices", "--resume"], 2, ["--devices: got the option --resume where a value was expected"]),
    (lenet, ["--checkpoint="], 2, ["--checkpoint", "missing"]),
    (lenet, ["--epochs="], 2, ["--epochs", "missing"]),
    (lenet, ["--data", ""], 2, ["an empty value is not allowed"]),
    (lenet, ["--resume"], 2, ["--resume requires --checkpoint"]),
    (lenet, ["--lr", "nan"], 2, ["--lr", "is not a number from"]),
    (lenet, ["--lr", "-1"], 2, ["'-1' is not a number from"]),
    (lenet, ["--momentum", "1"], 2, ["--momentum"]),
    (lenet, ["--dispatch", "fast"], 2, ["--dispatch", "fast not in {auto,single,threaded}"]),
    (lenet, ["--scaling", "huge"], 2, ["--scaling"]),
    (lenet, ["--micro-shard", "0"], 2, ["--micro-shard", "'0' is not a whole number from 1"]),
    (lenet, ["--memory-budget", "8X"], 2, ["--memory-budget", "'8X' is not a size", "K, M, G or T"]),
    (lenet, ["--memory-budget", "-1"], 2, ["'-1' is not a size"]),
    (lenet, ["--memory-budget", "99999999999T"], 2, ["'99999999999T' is not a size"]),
    (lenet, ["--memory-budget", "1K", "--devices", "cpu:0,cpu:1"] + SMALL, 1, ["no layout fits the memory budget of 1.00 KiB", "pipeline over"]),
    (lenet, ["--no-such-flag"], 2, ["--no-such-flag"]),
    (lenet, ["stray"], 2, ["stray"]),
    (bench, ["--batch", "4611686018427387904"], 2, ["--batch", "not a whole number from 0 to 65536"]),
    (bench, ["--model", "resnet"], 2, ["--model", "resnet not in"]),
    (bench, ["--steps", "0"], 2, ["--steps"]),
    (bench, ["--devices", "cpu:0,"], 2, ["has an empty item"]),
    (feature, ["--devices", "cpu:0,"], 2, ["has an empty item"]),
    (feature, ["--steps", ""], 2, ["--steps"]),
    (lenet, ["--export", ""], 2, ["--export", "an empty value is not allowed"]),
    # Without the ONNX part the flag is refused on the command line; with it, a folder that does not
    # exist is refused before training.
    (lenet, ["--export", "/nonexistent/m.onnx"], 2 if os.environ.get("REPLICA_NO_ONNX") else 1,
     ["built without ONNX export"] if os.environ.get("REPLICA_NO_ONNX") else
     ["--export /nonexistent/m.onnx: the folder /nonexistent does not exist"]),
    (feature, ["--export", "/nonexistent/m.onnx"], 2 if os.environ.get("REPLICA_NO_ONNX") else 1,
     ["built without ONNX export"] if os.environ.get("REPLICA_NO_ONNX") else ["the folder /nonexistent does not exist"]),
    # Runs refused after the command line: the batch against the data set, divergence.
    (lenet, SMALL + ["--devices", "cpu:0", "--batch-size", "300"], 1, ["--batch-size 300 is larger than the 256 training samples",
                                                 "use --batch-size 256 or less"]),
    (lenet, SMALL + ["--batch-size", "200", "--scaling", "weak", "--devices", "cpu:0,cpu:1"], 1,
     ["--batch-size 200 per device (global 400) is larger than the 256 training samples"]),
    (lenet, SMALL + ["--devices", "cpu:0", "--lr", "1000", "--epochs", "3", "--validate-every", "0"], 1,
     ["training diverged", "(epoch 1, batch ", "learning rate too high", "--skip-nonfinite"]),
]
# The image example takes the same checked flags (examples/support/cli.hpp); it refuses before reading --data.
if images:
    CASES += [
        (images, ["--data", "/nonexistent", "--epochs", "0"], 2, ["'0' is not a whole number from 1 to 1000000"]),
        (images, ["--data", "/nonexistent", "--devices", "cpu:0,"], 2, ["has an empty item"]),
        (images, ["--data", "/nonexistent", "--seed", "-1"], 2, ["'-1' is not a whole number"]),
        (images, ["--data", "/nonexistent", "--model", "resnet"], 2, ["--model", "not in"]),
        (images, ["--data", ""], 2, ["an empty value is not allowed"]),
        (images, ["--data", "/nonexistent", "--resume"], 2, ["--resume requires --checkpoint"]),
    ]


def main():
    failed = 0
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    for program, args, status, parts in CASES:
        if "cpu:0,cpu:1" in args and (os.cpu_count() or 1) < 2:
            continue   # a machine of one hardware thread refuses cpu:1 itself
        p = subprocess.run([program] + args, capture_output=True, text=True, env=env, timeout=300)
        text = p.stdout + p.stderr
        problems = []
        if p.returncode != status:
            problems.append(f"exit status {p.returncode}, expected {status}")
        problems += [f"no '{part}'" for part in parts if part not in text]
        if status == 2 and "--help" not in text:
            problems.append("no pointer to --help")
        if "test accuracy" in text:
            problems.append("it trained")
        name = os.path.basename(program) + " " + " ".join(repr(a) if a == "" or " " in a else a for a in args)
        if problems:
            failed += 1
            print(f"FAIL {name}: {'; '.join(problems)}\n     output: {text.strip()}")
        else:
            print(f"ok   {name}: {text.strip().splitlines()[0] if text.strip() else ''}")
    print(f"{len(CASES) - failed} of {len(CASES)} refused as they should be")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

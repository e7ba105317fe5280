#!/usr/bin/env python3
"""Kill and resume: the LeNet example on a small slice of Fashion-MNIST, killed with SIGKILL at random
moments (some of them while it writes a checkpoint), resumed each time from its checkpoint until it
finishes; its final parameters and optimizer state must equal those of a run never interrupted, and
after every kill the checkpoint on disk must be whole (right size, right checksum) or absent.

usage: kill_resume.py LENET_BINARY [TRIALS]
"""
import os
import random
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zlib

ARGS = ["--devices", "cpu:0", "--dispatch", "single", "--train-samples", "384", "--test-samples", "50",
        "--batch-size", "32", "--epochs", "6", "--validate-every", "0", "--seed", "3", "--lr", "0.02"]


def checkpoint(path):
    """(epoch, step, parameter and optimizer bytes) of a whole checkpoint; raises on a damaged one."""
    data = open(path, "rb").read()
    if len(data) < 72 or data[:8] != b"REPLICA\0":
        raise ValueError(f"{path}: {len(data)} bytes, not a checkpoint")
    version = struct.unpack_from("<I", data, 8)[0]
    params, states, epoch, step, _seed, records = struct.unpack_from("<QQQQQQ", data, 20)
    # Format 2 (train/checkpoint.hpp) adds the optimizer's id and step count and the statistics count;
    # format 3 the loss scaling state (20 bytes).
    header, statistics = (68, 0) if version == 1 else (88 if version == 2 else 108, struct.unpack_from("<Q", data, 80)[0])
    size = header + 40 * records + 4 * (params + states + statistics) + 4
    if len(data) != size:
        raise ValueError(f"{path}: {len(data)} bytes, its header promises {size}")
    if zlib.crc32(data[:-4]) != struct.unpack_from("<I", data, len(data) - 4)[0]:
        raise ValueError(f"{path}: checksum mismatch")
    return epoch, step, data[header + 40 * records:-4]


def run(binary, ckpt, env, resume):
    return subprocess.Popen([binary] + ARGS + ["--checkpoint", ckpt] + (["--resume"] if resume else []),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


def main():
    binary = sys.argv[1]
    trials = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    rng = random.Random(int(os.environ.get("REPLICA_KILL_SEED", "0")) or None)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as tmp:
        ref = os.path.join(tmp, "ref.ckpt")
        t0 = time.monotonic()
        p = run(binary, ref, env, False)
        out, err = p.communicate()
        if p.returncode != 0:
            sys.exit(f"the uninterrupted run failed ({p.returncode}): {err.decode()}")
        span = time.monotonic() - t0
        ref_epoch, ref_step, ref_values = checkpoint(ref)
        print(f"uninterrupted run: {span:.2f} s, epoch {ref_epoch}, step {ref_step}")

        kills = during_write = 0
        for trial in range(trials):
            ckpt = os.path.join(tmp, f"trial{trial}.ckpt")
            resume = False
            for attempt in range(5):
                p = run(binary, ckpt, env, resume)
                resume = True
                # Odd trials kill as soon as a checkpoint write begins; even ones at a random time.
                # The fifth run of a trial is left to finish, so that every trial ends.
                deadline = time.monotonic() + (rng.uniform(0.05, span) if attempt < 4 else 1e9)
                watch_write = trial % 2 == 1 and attempt < 3
                killed = False
                while p.poll() is None:
                    writing = os.path.exists(ckpt + ".tmp")
                    if (watch_write and writing) or (not watch_write and time.monotonic() >= deadline):
                        p.send_signal(signal.SIGKILL)
                        killed = True
                        during_write += writing
                        break
                    time.sleep(0.0005)
                p.communicate()
                if not killed or p.returncode == 0:
                    break
                kills += 1
                if os.path.exists(ckpt):
                    checkpoint(ckpt)   # raises if the kill left it damaged
            if p.returncode != 0:
                sys.exit(f"trial {trial}: the resumed run failed ({p.returncode})")
            epoch, step, values = checkpoint(ckpt)
            same = (epoch, step, values) == (ref_epoch, ref_step, ref_values)
            print(f"trial {trial}: {attempt} kills, final epoch {epoch} step {step}, "
                  f"{'equal to' if same else 'DIFFERENT from'} the uninterrupted run")
            if not same:
                sys.exit(1)
        print(f"{trials} trials, {kills} kills ({during_write} while a checkpoint was being written): "
              f"every checkpoint whole, every final state equal")


if __name__ == "__main__":
    main()

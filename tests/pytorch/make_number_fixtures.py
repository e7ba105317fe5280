#!/usr/bin/python3
"""Writes numbers.txt, PyTorch's bf16 and fp16 conversions that tests/test_precision.cpp compares
core::from_float and core::to_float against.

Run with Debian's python3-torch (a CPU build):  /usr/bin/python3 tests/pytorch/make_number_fixtures.py
Format (as make_fixtures.py's): records of two lines, "name count" then count numbers, here integers:
  input        the float32 inputs, as their 32 bits: ties to even for both formats, values one unit
               either side of a tie, float and fp16 subnormals, the fp16 normal/subnormal boundary,
               overflow (fp16 at 65520, bf16 near FLT_MAX), infinities, NaNs, -0, and random values
               and random bit patterns
  bf16, fp16   x.bfloat16() and x.half(), as their 16 bits
  bf16_float, fp16_float   those converted back with .float(), as 32 bits
A NaN's bits are PyTorch's own choice (its vectorised conversion may differ from its scalar one); the
test compares NaN inputs by NaN-ness only.
"""

import os
import struct

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def bits_of(f):
    return struct.unpack("<I", struct.pack("<f", f))[0]


def inputs():
    u = []
    # Specials and float's own extremes.
    u += [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FBFFFFF,
          0x3F800000, 0xBF800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x00800000, 0x00000001, 0x807FFFFF, 0x007FFFFF]
    # bf16: exact ties (lower 16 bits 0x8000) above even and odd upper halves, and one unit either side.
    for hi in [0x3F80, 0x3F81, 0x4049, 0x404A, 0xC2F6, 0xC2F7, 0x0001, 0x0002, 0x007F, 0x0080, 0x7F7E, 0x7F7F,
               0x8001, 0x8080, 0x1234, 0x1235]:
        for lo in [0x7FFF, 0x8000, 0x8001, 0x0000, 0xFFFF]:
            u.append((hi << 16) | lo)
    # fp16 normals: exact ties (13 dropped bits = 0x1000) above even and odd mantissas, one unit either side.
    for e in [1, 2, 14, 15, 16, 29, 30]:
        for m in [0, 1, 2, 0x155, 0x3FE, 0x3FF]:
            base = ((e + 112) << 23) | (m << 13)
            for d in [0x0FFF, 0x1000, 0x1001, 0x0000, 0x1FFF]:
                u += [base | d, (base | d) | 0x80000000]
    # fp16 subnormals m * 2^-24 and the ties between them (m + 1/2) * 2^-24, and the boundary 2^-14.
    for m in [0, 1, 2, 3, 4, 5, 511, 512, 1022, 1023]:
        for t in [m, m + 0.5]:
            f = t * 2.0 ** -24
            if f != 0.0:
                u += [bits_of(f), bits_of(f) + 1, bits_of(f) - 1, bits_of(-f)]
    u += [bits_of(2.0 ** -14), bits_of(2.0 ** -14) - 1, bits_of(2.0 ** -25), bits_of(2.0 ** -26), bits_of(1e-8)]
    # fp16 overflow: 65504 is the largest finite value; 65520 and above round to infinity.
    for f in [65504.0, 65519.0, 65519.996, 65520.0, 65536.0, 1e5, 1e38, -65520.0, -65519.0]:
        u.append(bits_of(f))
    u += [bits_of(65520.0) - 1, bits_of(65520.0) + 1]
    # Random values of many magnitudes, and random bit patterns (NaNs among them).
    g = torch.Generator().manual_seed(23)
    values = torch.randn(300, generator=g) * torch.pow(10.0, torch.randint(-12, 12, (300,), generator=g).float())
    u += [bits_of(float(v)) for v in values.tolist()]
    u += [int(b) & 0xFFFFFFFF for b in torch.randint(0, 2 ** 32, (300,), generator=g, dtype=torch.int64).tolist()]
    return u


def main():
    u = inputs()
    x = torch.tensor(u, dtype=torch.int64).to(torch.int32).view(torch.float32)
    b = x.bfloat16()
    h = x.half()
    records = [("input", u),
               ("bf16", (b.view(torch.int16).to(torch.int64) & 0xFFFF).tolist()),
               ("fp16", (h.view(torch.int16).to(torch.int64) & 0xFFFF).tolist()),
               ("bf16_float", (b.float().view(torch.int32).to(torch.int64) & 0xFFFFFFFF).tolist()),
               ("fp16_float", (h.float().view(torch.int32).to(torch.int64) & 0xFFFFFFFF).tolist())]
    with open(os.path.join(HERE, "numbers.txt"), "w") as f:
        for name, values in records:
            f.write(f"{name} {len(values)}\n")
            f.write(" ".join(str(v) for v in values) + "\n")


if __name__ == "__main__":
    main()

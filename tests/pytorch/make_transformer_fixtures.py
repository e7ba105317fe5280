#!/usr/bin/python3
"""Writes the PyTorch reference values that tests/test_transformer.cpp compares replica against.

Run with Debian's python3-torch (a CPU build):  /usr/bin/python3 tests/pytorch/make_transformer_fixtures.py
It rewrites transformer.txt, beside this script: for each layer a fixed input x, a fixed output gradient
dy, the parameters (replica's flat layout), and PyTorch's output y, input gradient dx and parameter
gradients dparams (a backward of y with dy). Inputs and parameters are float32 values; PyTorch computes
in float64 from them, so the records are the float32 inputs' exact results to ~1e-16.
  ln_<variant>_*     nn.LayerNorm(8) on (3, 5, 8) samples: "affine" (eps 1e-5), "affine_eps" (eps 1e-3),
                     "plain" (elementwise_affine=False, eps 1e-5), "plain_eps" (False, 1e-3); "vector":
                     nn.LayerNorm(12) on (4, 12) samples (affine, eps 1e-5)
  gelu_tanh_*        nn.GELU(approximate='tanh') on 41 values
  linear_seq_*       nn.Linear(8, 6) on (3, 5, 8) samples
  attn_<H>_<T>_<D>_* nanoGPT's CausalSelfAttention without dropout (c_attn, causal softmax over
                     q k^T / sqrt(D / H), c_proj) on (3, T, D) samples
Format: records of two lines, "name count" then count numbers separated by spaces.
"""

import math
import os

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
N = 3
ATTENTION = [(2, 5, 8), (4, 8, 16), (2, 7, 12), (4, 6, 8)]


def write(path, records):
    with open(path, "w") as f:
        for name, values in records:
            values = [float(v) for v in torch.as_tensor(values).flatten().tolist()]
            f.write(f"{name} {len(values)}\n")
            f.write(" ".join(f"{v:.17g}" for v in values) + "\n")


def f32(t):
    """float32 values, held in float64."""
    return t.float().double()


def run(f, x, dy, params):
    """y, dx and the parameters' gradients (in order) of f(x) with output gradient dy."""
    x = x.clone().requires_grad_(True)
    for p in params:
        p.grad = None
    y = f(x)
    y.backward(dy)
    grads = [p.grad.flatten() for p in params]
    return y.detach(), x.grad, (torch.cat(grads) if grads else torch.zeros(0))


def layer_norm(records):
    variants = {"affine": (1e-5, True), "affine_eps": (1e-3, True), "plain": (1e-5, False), "plain_eps": (1e-3, False)}
    x = f32(torch.randn(N, 5, 8) * 1.5 + torch.linspace(-1.0, 2.0, 5).view(1, 5, 1))
    dy = f32(torch.randn(N, 5, 8))
    records += [("ln_x", x), ("ln_dy", dy)]
    for name, (eps, affine) in variants.items():
        ln = torch.nn.LayerNorm(8, eps=eps, elementwise_affine=affine).double()
        params = list(ln.parameters())
        if affine:
            with torch.no_grad():
                ln.weight.copy_(f32(torch.empty(8).uniform_(0.5, 1.5)))
                ln.bias.copy_(f32(torch.empty(8).uniform_(-0.5, 0.5)))
            records.append((f"ln_{name}_params", torch.cat([p.detach() for p in params])))
        y, dx, dp = run(ln, x, dy, params)
        records += [(f"ln_{name}_y", y), (f"ln_{name}_dx", dx)]
        if affine:
            records.append((f"ln_{name}_dparams", dp))
    ln = torch.nn.LayerNorm(12).double()
    with torch.no_grad():
        ln.weight.copy_(f32(torch.empty(12).uniform_(0.5, 1.5)))
        ln.bias.copy_(f32(torch.empty(12).uniform_(-0.5, 0.5)))
    x = f32(torch.randn(4, 12) * 2.0 + 0.5)
    dy = f32(torch.randn(4, 12))
    params = list(ln.parameters())
    records += [("ln_vector_x", x), ("ln_vector_dy", dy), ("ln_vector_params", torch.cat([p.detach() for p in params]))]
    y, dx, dp = run(ln, x, dy, params)
    records += [("ln_vector_y", y), ("ln_vector_dx", dx), ("ln_vector_dparams", dp)]


def gelu_tanh(records):
    x = f32(torch.linspace(-5.0, 5.0, 41) + 0.01 * torch.randn(41))
    dy = f32(torch.randn(41))
    y, dx, _ = run(torch.nn.GELU(approximate="tanh"), x, dy, [])
    records += [("gelu_tanh_x", x), ("gelu_tanh_dy", dy), ("gelu_tanh_y", y), ("gelu_tanh_dx", dx)]


def linear_seq(records):
    lin = torch.nn.Linear(8, 6).double()
    with torch.no_grad():
        for p in lin.parameters():
            p.copy_(f32(p))
    x = f32(torch.randn(N, 5, 8))
    dy = f32(torch.randn(N, 5, 6))
    params = [lin.weight, lin.bias]
    y, dx, dp = run(lin, x, dy, params)
    records += [("linear_seq_x", x), ("linear_seq_dy", dy),
                ("linear_seq_params", torch.cat([p.detach().flatten() for p in params])),
                ("linear_seq_y", y), ("linear_seq_dx", dx), ("linear_seq_dparams", dp)]


class CausalSelfAttention(torch.nn.Module):
    """nanoGPT's, without dropout and written out (this torch has no scaled_dot_product_attention);
    causal=False drops the mask (a wrong variant for make_gpt_fixtures.py)."""

    def __init__(self, d, heads, causal=True):
        super().__init__()
        self.heads = heads
        self.causal = causal
        self.c_attn = torch.nn.Linear(d, 3 * d)
        self.c_proj = torch.nn.Linear(d, d)

    def forward(self, x):
        n, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (z.view(n, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)
        if self.causal:
            scores = scores.masked_fill(~torch.tril(torch.ones(t, t, dtype=torch.bool)), float("-inf"))
        o = torch.softmax(scores, dim=-1) @ v
        return self.c_proj(o.transpose(1, 2).contiguous().view(n, t, d))


def attention(records):
    for heads, t, d in ATTENTION:
        name = f"attn_{heads}_{t}_{d}"
        m = CausalSelfAttention(d, heads).double()
        with torch.no_grad():
            for p in m.parameters():   # larger than Linear's default, for weights far from uniform
                p.copy_(f32(torch.empty_like(p).uniform_(-2.0, 2.0) / math.sqrt(d)))
        x = f32(torch.randn(N, t, d))
        dy = f32(torch.randn(N, t, d))
        params = [m.c_attn.weight, m.c_attn.bias, m.c_proj.weight, m.c_proj.bias]
        y, dx, dp = run(m, x, dy, params)
        records += [(name + "_x", x), (name + "_dy", dy),
                    (name + "_params", torch.cat([p.detach().flatten() for p in params])),
                    (name + "_y", y), (name + "_dx", dx), (name + "_dparams", dp)]


if __name__ == "__main__":
    torch.set_num_threads(1)
    torch.manual_seed(43)
    records = []
    layer_norm(records)
    gelu_tanh(records)
    linear_seq(records)
    attention(records)
    write(os.path.join(HERE, "transformer.txt"), records)

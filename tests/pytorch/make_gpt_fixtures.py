#!/usr/bin/python3
"""Writes the PyTorch reference values that tests/test_transformer.cpp compares models::GPT against.

Run with Debian's python3-torch (a CPU build):  /usr/bin/python3 tests/pytorch/make_gpt_fixtures.py
It rewrites gpt.txt, beside this script: nanoGPT's GPT (pre-LN blocks, GELU's tanh form, learned
positions, a final LayerNorm and the head tied to the token embedding, no dropout) with 2 layers, 2
heads, Dim 16, Context 8 and Vocab 24, replica's GPT<2, 2, 16, 8, 24>. Parameters are float32 values
in replica's flat layout; PyTorch computes in float64 from them.
  initial      the parameters: wte, wpe, then per block ln_1, c_attn, c_proj, ln_2, c_fc, mlp c_proj
               (weight then bias each), then ln_f; the head is wte
  inputs       token ids (20, 8): 5 batches of 4; labels: the next ids (20, 8)
  logits       the model's output on batch 0 (4, 8, 24), at the initial parameters
  loss         the sum over batch 0's samples of each sample's mean loss over its 8 positions
  grads        that sum's gradient, in the parameters' layout (wte's the head's plus the embedding's)
  hyper        AdamW's lr, beta1, beta2, eps, weight decay, and the clipping norm: 5 steps on the 5
               batches (mean loss), gradients clipped to the norm (every step's norm is above it), weight
               decay on weights and embeddings only (nanoGPT's groups: tensors of 2 dimensions)
  norms        the 5 steps' gradient norms before clipping
  losses       the 5 steps' mean losses; after: the parameters after them
  wrong_<v>    batch 0's logits of a wrong variant: nomask (no causal mask), eps (LayerNorm eps 1e-3),
               erf (GELU's erf form), untied (a head of its own, initialised to a copy of wte); and
               wrong_untied_after, that variant's wte after the 5 steps
Format: records of two lines, "name count" then count numbers separated by spaces.
"""

import math
import os

import torch
import torch.nn.functional as F

from make_transformer_fixtures import CausalSelfAttention, f32, write

HERE = os.path.dirname(os.path.abspath(__file__))
LAYERS, HEADS, DIM, CONTEXT, VOCAB = 2, 2, 16, 8, 24
BATCH, STEPS = 4, 5
LR, BETAS, EPS, WD, CLIP = 0.01, (0.9, 0.95), 1e-8, 0.1, 0.5


class Block(torch.nn.Module):
    def __init__(self, causal, eps, approximate):
        super().__init__()
        self.ln_1 = torch.nn.LayerNorm(DIM, eps=eps)
        self.attn = CausalSelfAttention(DIM, HEADS, causal)
        self.ln_2 = torch.nn.LayerNorm(DIM, eps=eps)
        self.c_fc = torch.nn.Linear(DIM, 4 * DIM)
        self.gelu = torch.nn.GELU(approximate=approximate)
        self.c_proj = torch.nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(self.gelu(self.c_fc(self.ln_2(x))))


class GPT(torch.nn.Module):
    def __init__(self, causal=True, eps=1e-5, approximate="tanh", tied=True):
        super().__init__()
        self.wte = torch.nn.Embedding(VOCAB, DIM)
        self.wpe = torch.nn.Embedding(CONTEXT, DIM)
        self.blocks = torch.nn.ModuleList(Block(causal, eps, approximate) for _ in range(LAYERS))
        self.ln_f = torch.nn.LayerNorm(DIM, eps=eps)
        self.head = None if tied else torch.nn.Linear(DIM, VOCAB, bias=False)

    def in_order(self):
        """The parameters in replica's layout (the untied head last)."""
        out = [self.wte.weight, self.wpe.weight]
        for b in self.blocks:
            out += [b.ln_1.weight, b.ln_1.bias, b.attn.c_attn.weight, b.attn.c_attn.bias, b.attn.c_proj.weight,
                    b.attn.c_proj.bias, b.ln_2.weight, b.ln_2.bias, b.c_fc.weight, b.c_fc.bias, b.c_proj.weight,
                    b.c_proj.bias]
        out += [self.ln_f.weight, self.ln_f.bias]
        return out + ([] if self.head is None else [self.head.weight])

    def forward(self, ids):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1])).unsqueeze(0)
        for b in self.blocks:
            x = b(x)
        x = self.ln_f(x)
        return x @ (self.wte.weight if self.head is None else self.head.weight).t()


def load(net, flat):
    with torch.no_grad():
        at = 0
        for p in net.in_order():
            p.copy_(flat[at:at + p.numel()].view_as(p))
            at += p.numel()
    return at


def mean_loss(net, ids, labels):
    logits = net(ids)
    return F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))


def train(net, ids, labels):
    params = net.in_order()
    decayed = [p for p in params if p.dim() >= 2]
    plain = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decayed, "weight_decay": WD}, {"params": plain, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS)
    losses, norms = [], []
    for s in range(STEPS):
        opt.zero_grad()
        loss = mean_loss(net, ids[s * BATCH:(s + 1) * BATCH], labels[s * BATCH:(s + 1) * BATCH])
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(params, CLIP)))
        opt.step()
        losses.append(float(loss))
    return losses, norms


def main():
    torch.manual_seed(47)
    torch.set_num_threads(1)
    net = GPT().double()
    initial = []
    for p in net.in_order():   # larger than nanoGPT's 0.02 for the embeddings, so that every part matters
        scale = 0.3 if p.dim() == 2 and p.shape[1] == DIM and p.shape[0] in (VOCAB, CONTEXT) else 1.0
        initial.append(f32((torch.rand_like(p) * 2 - 1) * scale / math.sqrt(p.shape[-1])).flatten())
    initial = torch.cat(initial)
    # layer norms start near PyTorch's 1 and 0
    load(net, initial)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.copy_(f32(1 + 0.2 * (torch.rand_like(m.weight) - 0.5)))
                m.bias.copy_(f32(0.2 * (torch.rand_like(m.bias) - 0.5)))
    initial = torch.cat([p.detach().flatten() for p in net.in_order()])

    ids_all = torch.randint(0, VOCAB, (STEPS * BATCH, CONTEXT + 1))
    ids, labels = ids_all[:, :-1].contiguous(), ids_all[:, 1:].contiguous()
    records = [("initial", initial), ("inputs", ids), ("labels", labels)]

    logits = net(ids[:BATCH])
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), labels[:BATCH].reshape(-1)) * BATCH
    net.zero_grad()
    loss.backward()
    grads = torch.cat([p.grad.flatten() for p in net.in_order()])
    records += [("logits", logits.detach()), ("loss", loss.detach()), ("grads", grads)]

    for name, variant in {"nomask": GPT(causal=False), "eps": GPT(eps=1e-3), "erf": GPT(approximate="none")}.items():
        variant = variant.double()
        load(variant, initial)
        records.append((f"wrong_{name}", variant(ids[:BATCH]).detach()))
    untied = GPT(tied=False).double()
    n = load(untied, torch.cat([initial, initial[:VOCAB * DIM]]))
    assert n == initial.numel() + VOCAB * DIM
    records.append(("wrong_untied", untied(ids[:BATCH]).detach()))   # the same as logits: a copy of wte

    losses, norms = train(net, ids, labels)
    assert min(norms) > CLIP, norms
    records += [("hyper", torch.tensor([LR, BETAS[0], BETAS[1], EPS, WD, CLIP], dtype=torch.float64)),
                ("norms", torch.tensor(norms)), ("losses", torch.tensor(losses)),
                ("after", torch.cat([p.detach().flatten() for p in net.in_order()]))]
    train(untied, ids, labels)
    records.append(("wrong_untied_after", untied.wte.weight.detach()))
    write(os.path.join(HERE, "gpt.txt"), records)


if __name__ == "__main__":
    main()

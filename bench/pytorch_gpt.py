#!/usr/bin/env python3
"""The character-level GPT demo of examples/train_gpt.cpp in PyTorch, for a side-by-side run on the CPU.

The same model (models::CharGPT: 4 pre-LN blocks of 4 heads, width 128, context 64, vocabulary 256, the
head tied to the token embedding, GELU's tanh form, no dropout), the same data (the bytes of the given
text files, concatenated in the order given; the last --validation fraction held out; training windows
of 65 bytes at uniform random offsets; validation: the held-out bytes cut into consecutive windows of
64 inputs and 64 labels), the same optimisation (AdamW with weight decay on matrices and embeddings
only, betas 0.9 and 0.95, gradients clipped to norm 1, a linear warm-up then cosine decay to a tenth of
the rate, per step) and the same report: the validation loss in nats and bits per character at each
evaluation and the wall time of the run, evaluations included, as train_gpt reports it. The windows are drawn by PyTorch's
generator, not replica's: the same distribution, not the same samples.

    /usr/bin/python3 bench/pytorch_gpt.py --threads 2 --steps 2000 --json /usr/share/games/fortunes/fortunes ...

Debian's python3-torch (1.13) has no scaled_dot_product_attention: attention is written out with the
causal mask there, as nanoGPT's fallback does. The model (Config, GPT) is also bench/pytorch_bench.py's
GPT-2 124M.
"""

import argparse
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

class Config:
    """A GPT's shape: models::GPT<Layers, Heads, Dim, Context, Vocab>."""

    def __init__(self, layers, heads, dim, context, vocab):
        self.layers, self.heads, self.dim, self.context, self.vocab = layers, heads, dim, context, vocab


CHARGPT = Config(4, 4, 128, 64, 256)           # models::CharGPT
GPT2SMALL = Config(12, 12, 768, 1024, 50304)   # models::GPT2Small: GPT-2 124M, its vocabulary padded to 50,304
CONTEXT, VOCAB = CHARGPT.context, CHARGPT.vocab   # the demo trains CharGPT


class Attention(nn.Module):
    """Causal self-attention: F.scaled_dot_product_attention(is_causal=True) where PyTorch has it (2.0 on),
    else written out with the causal mask, as nanoGPT's fallback does."""

    def __init__(self, c):
        super().__init__()
        self.heads = c.heads
        self.c_attn = nn.Linear(c.dim, 3 * c.dim)
        self.c_proj = nn.Linear(c.dim, c.dim)
        self.fused = hasattr(F, "scaled_dot_product_attention")
        if not self.fused:
            self.register_buffer("mask", torch.tril(torch.ones(c.context, c.context, dtype=torch.bool)))

    def forward(self, x):
        n, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (z.view(n, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        if self.fused:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
            y = scores.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(-1) @ v
        return self.c_proj(y.transpose(1, 2).reshape(n, t, d))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(c.dim), Attention(c), nn.LayerNorm(c.dim)
        self.c_fc, self.c_proj = nn.Linear(c.dim, 4 * c.dim), nn.Linear(4 * c.dim, c.dim)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    """Pre-LN blocks, learned positions, GELU's tanh form, a final LayerNorm, the head tied to the token
    embedding; the logits (n, t, vocab)."""

    def __init__(self, c=CHARGPT):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(c.vocab, c.dim), nn.Embedding(c.context, c.dim)
        nn.init.normal_(self.wte.weight, std=0.02)
        nn.init.normal_(self.wpe.weight, std=0.02)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.ln_f = nn.LayerNorm(c.dim)

    def in_replica_order(self):
        """The parameters in the order of replica's flat vector (models::GPT, as tests/pytorch/
        make_gpt_fixtures.py lays it out): wte, wpe, then per block ln_1, attn.c_attn, attn.c_proj, ln_2,
        c_fc, c_proj (weight then bias each; a Linear's weight (out, in) as here, c_attn's rows q, k, v),
        then ln_f. The tied head is wte, once."""
        out = [self.wte.weight, self.wpe.weight]
        for b in self.blocks:
            out += [b.ln_1.weight, b.ln_1.bias, b.attn.c_attn.weight, b.attn.c_attn.bias, b.attn.c_proj.weight,
                    b.attn.c_proj.bias, b.ln_2.weight, b.ln_2.bias, b.c_fc.weight, b.c_fc.bias, b.c_proj.weight,
                    b.c_proj.bias]
        return out + [self.ln_f.weight, self.ln_f.bias]

    def load_replica(self, flat):
        """Copies replica's flat parameter vector (a 1-D float tensor) into the parameters."""
        order = self.in_replica_order()
        count = sum(q.numel() for q in order)
        if flat.numel() != count:
            raise ValueError(f"replica's vector has {flat.numel():,d} parameters, this GPT {count:,d}")
        with torch.no_grad():
            at = 0
            for q in order:
                q.copy_(flat[at:at + q.numel()].view_as(q))
                at += q.numel()

    def forward(self, ids):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
        for b in self.blocks:
            x = b(x)
        return self.ln_f(x) @ self.wte.weight.t()


def lr_at(step, steps, warmup, base):
    """replica's Schedule::cosine(steps, base / 10).with_warmup(warmup), evaluated per step."""
    cosine = base / 10 + (base - base / 10) * (1 + math.cos(math.pi * min(step, steps) / steps)) / 2
    return cosine * min(1.0, step / warmup) if warmup > 0 else cosine


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", help="the text, as train_gpt reads it")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=100, help="steps of linear warm-up")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--validation", type=float, default=0.05)
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="one JSON object at the end")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

    text = b"".join(open(f, "rb").read() for f in a.files)
    held = int(len(text) * a.validation)
    data = torch.tensor(list(text), dtype=torch.long)
    train, val = data[:len(text) - held], data[len(text) - held:]
    windows = (len(val) - 1) // CONTEXT
    val_x = val[:windows * CONTEXT].view(windows, CONTEXT)
    val_y = val[1:windows * CONTEXT + 1].view(windows, CONTEXT)

    net = GPT(CHARGPT)
    decay = [q for q in net.parameters() if q.dim() >= 2]
    plain = [q for q in net.parameters() if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay}, {"params": plain, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95))

    def evaluate():
        net.eval()
        total = 0.0
        with torch.no_grad():
            for i in range(0, windows, 64):
                logits = net(val_x[i:i + 64])
                total += float(F.cross_entropy(logits.reshape(-1, VOCAB), val_y[i:i + 64].reshape(-1), reduction="sum"))
        net.train()
        return total / (windows * CONTEXT)

    record, start = [], time.perf_counter()
    for step in range(a.steps):
        offsets = torch.randint(0, len(train) - CONTEXT, (a.batch,))
        x = torch.stack([train[o:o + CONTEXT] for o in offsets])
        y = torch.stack([train[o + 1:o + CONTEXT + 1] for o in offsets])
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a.steps, a.warmup, a.lr)
        loss = F.cross_entropy(net(x).reshape(-1, VOCAB), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        if (step + 1) % a.eval_every == 0 or step + 1 == a.steps:
            v = evaluate()
            train_seconds = time.perf_counter() - start
            record.append({"step": step + 1, "train_loss": float(loss), "val_loss": v, "val_bits": v / math.log(2),
                           "train_seconds": train_seconds})
            if not a.json:
                print(f"step {step + 1:5d}  train {float(loss):.4f}  validation {v:.4f} nats "
                      f"({v / math.log(2):.3f} bits) per character  {train_seconds:.1f} s", flush=True)
    if a.json:
        print(json.dumps({"framework": "pytorch", "torch": torch.__version__, "threads": a.threads,
                          "steps": a.steps, "batch": a.batch, "train_bytes": len(train), "val_windows": windows,
                          "seconds": time.perf_counter() - start, "val_loss": record[-1]["val_loss"], "record": record}))


if __name__ == "__main__":
    sys.exit(main())

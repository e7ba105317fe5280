#!/usr/bin/python3
"""Writes the PyTorch reference values that tests/test_tokens.cpp compares replica against.

Run with Debian's python3-torch (a CPU build):  /usr/bin/python3 tests/pytorch/make_token_fixtures.py
It rewrites tokens.txt, beside this script. Inputs and parameters are float32 values; PyTorch computes
in float64 from them.
  seq_ce_*     F.cross_entropy on logits (N * T, V) = (3 * 5, 7) and labels (N * T): the mean loss
               ("loss") and the logits' gradient of the mean ("dlogits"), in replica's (N, T, V) order
  emb_*        nn.Embedding(11, 8) on ids (3, 6): the table ("params"), the output gradient dy,
               y and the table's gradient ("dparams"); ids repeat, so rows gather several gradients
  pos_*        a learned position embedding (Context 9, Dim 8) added to x (3, 6, 8): wpe ("params"),
               y = x + wpe[:6], dx and wpe's gradient (rows 6 to 8 zero)
  gpt_*        the two together, GPT-2's input: wte(ids) + wpe(arange(T)) on ids (3, 6): y and both
               tables' gradients, in replica's layout (wte, then wpe)
Format: records of two lines, "name count" then count numbers separated by spaces.
"""

import os

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))


from make_transformer_fixtures import f32, write  # the same record format and float32 rounding


def sequence_cross_entropy(records):
    n, t, v = 3, 5, 7
    logits = f32(torch.randn(n, t, v) * 2.0).requires_grad_(True)
    labels = torch.randint(0, v, (n, t))
    loss = F.cross_entropy(logits.view(n * t, v), labels.view(n * t))
    loss.backward()
    records += [("seq_ce_logits", logits.detach()), ("seq_ce_labels", labels), ("seq_ce_loss", loss.detach()),
                ("seq_ce_dlogits", logits.grad)]


def embeddings(records):
    n, t, vocab, dim, context = 3, 6, 11, 8, 9
    ids = torch.randint(0, vocab, (n, t))
    ids[0, :3] = 4   # a row gathered several times in one sample
    ids[2, 5] = 4    # and across samples
    wte = f32(torch.randn(vocab, dim) * 0.5).requires_grad_(True)
    wpe = f32(torch.randn(context, dim) * 0.5).requires_grad_(True)
    dy = f32(torch.randn(n, t, dim))
    records += [("emb_ids", ids), ("emb_params", wte.detach()), ("emb_dy", dy)]
    y = F.embedding(ids, wte)
    y.backward(dy)
    records += [("emb_y", y.detach()), ("emb_dparams", wte.grad.clone())]

    x = f32(torch.randn(n, t, dim)).requires_grad_(True)
    y = x + wpe[:t].unsqueeze(0)
    y.backward(dy)
    records += [("pos_x", x.detach()), ("pos_params", wpe.detach()), ("pos_dy", dy), ("pos_y", y.detach()),
                ("pos_dx", x.grad), ("pos_dparams", wpe.grad.clone())]

    wte.grad = None
    wpe.grad = None
    y = F.embedding(ids, wte) + wpe[torch.arange(t)].unsqueeze(0)
    y.backward(dy)
    records += [("gpt_y", y.detach()), ("gpt_dparams", torch.cat([wte.grad.flatten(), wpe.grad.flatten()]))]


def main():
    torch.manual_seed(43)
    records = []
    sequence_cross_entropy(records)
    embeddings(records)
    write(os.path.join(HERE, "tokens.txt"), records)


if __name__ == "__main__":
    main()

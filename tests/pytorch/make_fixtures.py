#!/usr/bin/python3
"""Writes the PyTorch reference values that tests/test_optim.cpp compares replica against.

Run with Debian's python3-torch (a CPU build):  /usr/bin/python3 tests/pytorch/make_fixtures.py
It rewrites, beside this script:
  activations.txt   for Identity, Sigmoid, Tanh and GELU (exact erf form): a fixed input x, a fixed
                    output gradient dy, the forward y and the input gradient dx.
  adam.txt, adamw.txt  a small model (Linear(8,16) GELU Linear(16,12) Tanh Linear(12,10) Sigmoid
                    Linear(10,4), CrossEntropyLoss with mean reduction) trained 5 steps with
                    torch.optim.Adam or AdamW (weight_decay non-zero) from the given initial parameters
                    on the given batches: the parameters after the 5 steps and each step's loss.
Format: records of two lines, "name count" then count numbers separated by spaces. Parameters are
in replica's flat layout: each Linear's weight (out, in) row-major, then its bias.
"""

import os

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
BATCH, STEPS = 6, 5
HYPER = {"lr": 0.01, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.1}


def write(path, records):
    with open(path, "w") as f:
        for name, values in records:
            values = [float(v) for v in torch.as_tensor(values).flatten().tolist()]
            f.write(f"{name} {len(values)}\n")
            f.write(" ".join(f"{v:.9g}" for v in values) + "\n")


def activations():
    torch.manual_seed(1)
    x = torch.linspace(-5.0, 5.0, 41) + 0.01 * torch.randn(41)
    dy = torch.randn(41)
    records = [("x", x), ("dy", dy)]
    for name, f in [("identity", lambda v: v), ("sigmoid", torch.sigmoid), ("tanh", torch.tanh),
                    ("gelu", torch.nn.GELU())]:
        xi = x.clone().requires_grad_(True)
        y = f(xi)
        y.backward(dy)
        records += [(name + "_y", y.detach()), (name + "_dx", xi.grad)]
    write(os.path.join(HERE, "activations.txt"), records)


def model():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 12), torch.nn.Tanh(),
                               torch.nn.Linear(12, 10), torch.nn.Sigmoid(), torch.nn.Linear(10, 4))


def flat(net):
    parts = []
    for m in net:
        if isinstance(m, torch.nn.Linear):
            parts += [m.weight.detach().flatten(), m.bias.detach().flatten()]
    return torch.cat(parts)


def optimizer(kind):
    torch.manual_seed(2)
    net = model()
    initial = flat(net)
    inputs = torch.randn(STEPS, BATCH, 8)
    labels = torch.randint(0, 4, (STEPS, BATCH))
    opt = (torch.optim.Adam if kind == "adam" else torch.optim.AdamW)(net.parameters(), **HYPER)
    loss_fn = torch.nn.CrossEntropyLoss(reduction="mean")
    losses = []
    for s in range(STEPS):
        opt.zero_grad()
        loss = loss_fn(net(inputs[s]), labels[s])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    write(os.path.join(HERE, kind + ".txt"),
          [("hyper", [HYPER["lr"], HYPER["betas"][0], HYPER["betas"][1], HYPER["eps"], HYPER["weight_decay"]]),
           ("initial", initial), ("inputs", inputs), ("labels", labels), ("losses", losses), ("final", flat(net))])


if __name__ == "__main__":
    torch.set_num_threads(1)
    activations()
    optimizer("adam")
    optimizer("adamw")

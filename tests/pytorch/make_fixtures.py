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
  resnet.txt        a small ResNet-style model (convolutions without bias, BatchNorm2d, an identity and
                    a projection residual block, global average pooling, Linear; tests/models.hpp,
                    TorchResNet): one training forward and backward with a given output gradient (y,
                    the input gradient, the parameter gradients, the running statistics after it), then
                    3 SGD steps from the same start (parameters, running statistics, evaluation output).
  batchnorm.txt     BatchNorm2d(3) with options, one record set a variant (prefix "nonaffine_": eps 1e-3,
                    momentum 0.01, affine=False; "cumulative_": momentum=None; "untracked_":
                    track_running_stats=False): the weight and bias (affine), then 3 training steps, each
                    a forward and a backward with a given output gradient (y, the input gradient, the
                    parameter gradients, the running statistics after it), then an evaluation forward.
  param_groups.txt  the resnet model trained 5 steps with AdamW over parameter groups: its first block
                    frozen, weight decay on filters and weights only, the Linear's weight at half the
                    rate (the initial parameters, inputs, labels, losses, final parameters, statistics).
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


def resnet_model():
    """The small ResNet-style model of resnet.txt (tests/models.hpp, TorchResNet)."""
    nn = torch.nn

    def conv(cin, cout, k, stride=1):
        return nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, bias=False)

    class Residual(nn.Module):
        def __init__(self, body, shortcut=None):
            super().__init__()
            self.body, self.shortcut = body, shortcut

        def forward(self, x):
            return self.body(x) + (x if self.shortcut is None else self.shortcut(x))

    return nn.Sequential(
        conv(2, 4, 3), nn.BatchNorm2d(4), nn.ReLU(),
        Residual(nn.Sequential(conv(4, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), conv(4, 4, 3), nn.BatchNorm2d(4))), nn.ReLU(),
        Residual(nn.Sequential(conv(4, 6, 3, 2), nn.BatchNorm2d(6), nn.ReLU(), conv(6, 6, 3), nn.BatchNorm2d(6)),
                 nn.Sequential(conv(4, 6, 1, 2), nn.BatchNorm2d(6))), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 5))


def in_order(net, kinds):
    """Modules of the given kinds in replica's layout order (body before shortcut: definition order)."""
    return [m for m in net.modules() if isinstance(m, kinds)]


def resnet_parameters(net):
    parts = []
    for m in in_order(net, (torch.nn.Conv2d, torch.nn.BatchNorm2d, torch.nn.Linear)):
        parts += [m.weight.detach().flatten()] + ([m.bias.detach().flatten()] if m.bias is not None else [])
    return torch.cat(parts)


def resnet_gradients(net):
    parts = []
    for m in in_order(net, (torch.nn.Conv2d, torch.nn.BatchNorm2d, torch.nn.Linear)):
        parts += [m.weight.grad.flatten()] + ([m.bias.grad.flatten()] if m.bias is not None else [])
    return torch.cat(parts)


def resnet_statistics(net):
    parts = []
    for m in in_order(net, torch.nn.BatchNorm2d):
        parts += [m.running_mean.flatten(), m.running_var.flatten()]
    return torch.cat(parts)


def resnet():
    torch.manual_seed(3)
    net = resnet_model()
    with torch.no_grad():   # BatchNorm's affine parameters away from 1 and 0, so that they matter
        for m in in_order(net, torch.nn.BatchNorm2d):
            m.weight.uniform_(0.5, 1.5)
            m.bias.uniform_(-0.5, 0.5)
    initial = resnet_parameters(net)
    initial_state = {k: v.clone() for k, v in net.state_dict().items()}
    x = torch.randn(6, 2, 8, 8) * 1.5 + 0.5
    dy = torch.randn(6, 5)
    # One training forward and backward from the initial parameters, with the given output gradient.
    xg = x.clone().requires_grad_(True)
    y = net(xg)
    y.backward(dy)
    records = [("initial", initial), ("x", x), ("dy", dy), ("y", y.detach()), ("dx", xg.grad),
               ("dparams", resnet_gradients(net)), ("statistics_after_forward", resnet_statistics(net))]
    # Three SGD steps (momentum, weight decay) from the initial state, CrossEntropy with mean reduction.
    net.load_state_dict(initial_state)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    inputs = torch.randn(3, 6, 2, 8, 8)
    labels = torch.randint(0, 5, (3, 6))
    losses = []
    for s in range(3):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(inputs[s]), labels[s])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    net.eval()
    with torch.no_grad():
        evaluated = net(inputs[0])
    records += [("inputs", inputs), ("labels", labels), ("losses", losses), ("final", resnet_parameters(net)),
                ("statistics", resnet_statistics(net)), ("eval_y", evaluated)]
    write(os.path.join(HERE, "resnet.txt"), records)


def param_groups():
    """AdamW over parameter groups on the resnet model: the first convolution and its BatchNorm frozen
    (requires_grad off: no gradient, no state, no update; the running statistics still move), weight
    decay on the other convolutions' filters and the Linear's weight only, the Linear's weight at half
    the rate (tests/test_optim.cpp, GroupRule)."""
    torch.manual_seed(5)
    net = resnet_model()
    with torch.no_grad():
        for m in in_order(net, torch.nn.BatchNorm2d):
            m.weight.uniform_(0.5, 1.5)
            m.bias.uniform_(-0.5, 0.5)
    initial = resnet_parameters(net)
    for p in list(net[0].parameters()) + list(net[1].parameters()):
        p.requires_grad_(False)
    head = net[-1]
    decayed = [m.weight for m in in_order(net, torch.nn.Conv2d)[1:]]
    plain = [p for m in in_order(net, torch.nn.BatchNorm2d)[1:] for p in (m.weight, m.bias)] + [head.bias]
    lr, wd = 0.01, 0.1
    opt = torch.optim.AdamW([{"params": decayed, "weight_decay": wd},
                             {"params": [head.weight], "weight_decay": wd, "lr": lr / 2},
                             {"params": plain, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.999), eps=1e-8)
    inputs = torch.randn(STEPS, 6, 2, 8, 8)
    labels = torch.randint(0, 5, (STEPS, 6))
    losses = []
    for s in range(STEPS):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(inputs[s]), labels[s])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    write(os.path.join(HERE, "param_groups.txt"),
          [("hyper", [lr, wd]), ("initial", initial), ("inputs", inputs), ("labels", labels), ("losses", losses),
           ("final", resnet_parameters(net)), ("statistics", resnet_statistics(net))])


BATCH_NORM_VARIANTS = {
    "nonaffine": dict(eps=1e-3, momentum=0.01, affine=False),
    "cumulative": dict(momentum=None),
    "untracked": dict(track_running_stats=False),
}


def batchnorm():
    torch.manual_seed(4)
    steps = 3
    xs = torch.randn(steps, 4, 3, 5, 5) * torch.tensor([1.5, 0.5, 2.0]).view(1, 1, 3, 1, 1) + \
        torch.tensor([0.5, -1.0, 3.0]).view(1, 1, 3, 1, 1)
    dys = torch.randn(steps, 4, 3, 5, 5)
    x_eval = torch.randn(4, 3, 5, 5) + 0.25
    records = [("x", xs), ("dy", dys), ("x_eval", x_eval)]
    for name, options in BATCH_NORM_VARIANTS.items():
        bn = torch.nn.BatchNorm2d(3, **options)
        if bn.affine:
            with torch.no_grad():
                bn.weight.uniform_(0.5, 1.5)
                bn.bias.uniform_(-0.5, 0.5)
            records.append((name + "_params", torch.cat([bn.weight.detach(), bn.bias.detach()])))
        for s in range(steps):
            bn.train()
            if bn.affine:
                bn.weight.grad = None
                bn.bias.grad = None
            x = xs[s].clone().requires_grad_(True)
            y = bn(x)
            y.backward(dys[s])
            records += [(f"{name}_y{s}", y.detach()), (f"{name}_dx{s}", x.grad)]
            if bn.affine:
                records.append((f"{name}_dparams{s}", torch.cat([bn.weight.grad, bn.bias.grad])))
            if bn.track_running_stats:
                stats = [bn.running_mean, bn.running_var]
                if options.get("momentum", 0.1) is None:
                    stats.append(bn.num_batches_tracked.view(1).float())
                records.append((f"{name}_statistics{s}", torch.cat(stats)))
        bn.eval()
        with torch.no_grad():
            records.append((name + "_eval_y", bn(x_eval)))
    write(os.path.join(HERE, "batchnorm.txt"), records)


if __name__ == "__main__":
    torch.set_num_threads(1)
    activations()
    optimizer("adam")
    optimizer("adamw")
    resnet()
    batchnorm()
    param_groups()

#!/usr/bin/python3
"""ResNet-50, GPT-2 blocks and train_cnn's CNN in PyTorch, functional, taking
their parameters in the order bench/models.c walks them, so that both run on
one set of weights (torchvision's architecture: bottlenecks with the stride
on the 3x3 convolution, inference batch norm; GPT-2: pre-norm causal
attention, a tanh-GELU MLP, tied output embedding; the CNN: 3x3
convolutions, batch norm on the batch's statistics, ReLU, 2x2 max pools).

    /usr/bin/python3 bench/models.py check resnet|gpt DIR [--blocks a,b,c,d --width W] [--heads H]

check: DIR holds p000.npy... (the parameters), input.npy and output.npy (what
kiln computed); prints the largest difference from PyTorch's output relative
to its largest magnitude, and exits 1 when it passes 1e-4 (f32 through many
layers). Exits 77 when torch is missing, so a test can skip.
"""
import glob
import math
import os
import sys

TOLERANCE = 1e-4


def resnet(torch, params, x, blocks, width):
    F = torch.nn.functional
    it = iter(params)

    def conv_bn(x, k, stride, relu):
        y = F.conv2d(x, next(it), None, stride, k // 2)
        gamma, beta, mean, var = next(it), next(it), next(it), next(it)
        y = F.batch_norm(y, mean, var, gamma, beta, False, 0.0, 1e-5)
        return F.relu(y) if relu else y

    y = F.max_pool2d(conv_bn(x, 7, 2, True), 3, 2, 1)
    inp = width
    for stage in range(4):
        w = width << stage
        for b in range(blocks[stage]):
            stride = 2 if b == 0 and stage > 0 else 1
            out = conv_bn(conv_bn(conv_bn(y, 1, 1, True), 3, stride, True), 1, 1, False)
            shortcut = conv_bn(y, 1, stride, False) if stride != 1 or inp != 4 * w else y
            y = F.relu(out + shortcut)
            inp = 4 * w
    features = F.adaptive_avg_pool2d(y, 1).flatten(1)
    fc, bias = next(it), next(it)
    return features @ fc.t() + bias


def gpt(torch, params, ids, heads):
    F = torch.nn.functional
    it = iter(params)
    wte, wpe = next(it), next(it)
    b, t = ids.shape
    d = wte.shape[1]
    future = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)

    def ln(x):
        gamma, beta = next(it), next(it)
        return F.layer_norm(x, (d,), gamma, beta, 1e-5)

    def linear(x):
        w, bias = next(it), next(it)
        return x @ w + bias

    def split_heads(x):
        return x.reshape(b, t, heads, d // heads).transpose(1, 2)

    x = wte[ids] + wpe[:t]
    for _ in range((len(params) - 4) // 12):
        q, k, v = (split_heads(part) for part in linear(ln(x)).split(d, 2))
        scores = (q @ k.transpose(-2, -1)) * (1 / math.sqrt(d // heads))
        mixed = torch.softmax(scores.masked_fill(future, float("-inf")), -1) @ v
        x = x + linear(mixed.transpose(1, 2).reshape(b, t, d))
        x = x + linear(F.gelu(linear(ln(x)), approximate="tanh"))
    return ln(x) @ wte.t()


def cnn(torch, params, x, stages=3):
    F = torch.nn.functional
    it = iter(params)
    for stage in range(stages):
        w, gamma, beta = next(it), next(it), next(it)
        y = F.conv2d(x, w, None, 1, 1)
        var, mean = torch.var_mean(y, (0, 2, 3), unbiased=False, keepdim=True)
        y = (y - mean) / torch.sqrt(var + 1e-5) * gamma[:, None, None] + beta[:, None, None]
        x = F.relu(y)
        if stage + 1 < stages:
            x = F.max_pool2d(x, 2)
    fc, bias = next(it), next(it)
    return x.mean((2, 3)) @ fc + bias


def resnet_param_specs(blocks, width, classes):
    """(shape, scale, offset) of each parameter in order, values offset + scale * N(0, 1),
    as bench/models.c makes them (its running variances are 0.75 + 0.5 U[0, 1): here 1)."""
    specs = []

    def conv_bn(inp, out, k):
        specs.append(((out, inp, k, k), math.sqrt(2.0 / (inp * k * k)), 0.0))
        specs.extend([((out,), 0.1, 1.0), ((out,), 0.1, 0.0), ((out,), 0.1, 0.0), ((out,), 0.0, 1.0)])

    conv_bn(3, width, 7)
    inp = width
    for stage in range(4):
        w = width << stage
        for b in range(blocks[stage]):
            stride = 2 if b == 0 and stage > 0 else 1
            conv_bn(inp, w, 1)
            conv_bn(w, w, 3)
            conv_bn(w, 4 * w, 1)
            if stride != 1 or inp != 4 * w:
                conv_bn(inp, 4 * w, 1)
            inp = 4 * w
    return specs + [((classes, inp), 1 / math.sqrt(inp), 0.0), ((classes,), 0.01, 0.0)]


def gpt_param_specs(vocab, seq, d, layers):
    """The same for gpt (bench/models.c's order)."""
    def ln():
        return [((d,), 0.1, 1.0), ((d,), 0.1, 0.0)]

    def linear(inp, out):
        return [((inp, out), 1 / math.sqrt(inp), 0.0), ((out,), 0.02, 0.0)]

    specs = [((vocab, d), 0.02, 0.0), ((seq, d), 0.01, 0.0)]
    for _ in range(layers):
        specs += ln() + linear(d, 3 * d) + linear(d, d) + ln() + linear(d, 4 * d) + linear(4 * d, d)
    return specs + ln()


def cnn_param_specs(width, classes, stages=3):
    """The same for the CNN."""
    specs, inp = [], 3
    for stage in range(stages):
        out = width << stage
        specs += [((out, inp, 3, 3), math.sqrt(2.0 / (inp * 9)), 0.0), ((out,), 0.1, 1.0), ((out,), 0.1, 0.0)]
        inp = out
    return specs + [((inp, classes), 1 / math.sqrt(inp), 0.0), ((classes,), 0.01, 0.0)]


def option(args, name, default):
    return args[args.index(name) + 1] if name in args else default


def check(torch, np, model, directory, args):
    params = [torch.from_numpy(np.load(p)) for p in sorted(glob.glob(os.path.join(directory, "p[0-9]*.npy")))]
    x = torch.from_numpy(np.load(os.path.join(directory, "input.npy")))
    got = np.load(os.path.join(directory, "output.npy"))
    with torch.no_grad():
        if model == "resnet":
            blocks = [int(b) for b in option(args, "--blocks", "3,4,6,3").split(",")]
            want = resnet(torch, params, x, blocks, int(option(args, "--width", "64")))
        else:
            want = gpt(torch, params, x, int(option(args, "--heads", "12")))
    want = want.numpy()
    if got.shape != want.shape:
        print(f"{model}: kiln's shape {got.shape}, PyTorch's {want.shape}")
        return 1
    diff = float(np.max(np.abs(got - want))) / max(float(np.max(np.abs(want))), 1e-30)
    print(f"{model}: largest difference {diff:.3g} of PyTorch's largest magnitude (tolerance {TOLERANCE:g})")
    return 0 if diff <= TOLERANCE else 1


def main():
    if len(sys.argv) < 4 or sys.argv[1] != "check" or sys.argv[2] not in ("resnet", "gpt"):
        print(__doc__, file=sys.stderr)
        return 2
    try:
        import numpy as np
        import torch
    except ImportError as e:
        print(f"models.py: {e}: skipped", file=sys.stderr)
        return 77
    torch.set_num_threads(2)
    return check(torch, np, sys.argv[2], sys.argv[3], sys.argv[4:])


if __name__ == "__main__":
    sys.exit(main())

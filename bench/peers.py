#!/usr/bin/python3
"""Peer figures for kiln-bench: the standard workloads in PyTorch and numpy.

Times each workload of kiln-bench (gelu, softmax, layernorm, mlp, attention,
tiny, mish, rmsnorm, silu, softmax_row, the training steps train_mlp, train_gpt and
train_cnn, and resnet50, resnet50_b16 and gpt, the models from
bench/models.py, in torch only; all f32) in PyTorch eager, in TorchScript (torch.jit.trace of the same
function) and in numpy, with the same thread count for all, and writes the
kiln-bench/1 JSON schema (docs/bench-json.md) so that `kiln-bench --compare`
can put these runs beside kiln. Torch is optional: without it only numpy runs.

--device cuda does what `kiln-bench --device cuda` does: the GPU sizes, matmul
8192^3 as well, PyTorch eager and torch.compile (default mode, static shapes)
on CUDA tensors, each timed call followed by torch.cuda.synchronize, peak
memory from torch.cuda.max_memory_allocated above the inputs. Matrix products
stay in full f32 (no TF32), as kiln computes them. numpy does not run there.

Every workload is written once, from primitive ops (tanh, exp, max, sum,
matmul, ...) as kiln-bench builds it, not from fused library calls such as
F.softmax, so the systems run the same computation.

    /usr/bin/python3 bench/peers.py [--device cpu|cuda] [--threads N] [--quick]
                                    [--reps N] [--workload NAME] [--json FILE]
"""
import argparse
import collections
import json
import math
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402 (bench/models.py, beside this file)

WARMUPS = 2
TINY_CALLS_PER_REP = 1000  # one tiny call is microseconds: too short to time alone
SEED = 1234
WEIGHT_SCALE = 0.03  # as kiln-bench: keeps the mlp's activations near unit size
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
LAYERNORM_EPS = 1e-5
RMSNORM_EPS = 1e-6


# --- the workloads, written once over an ops adapter (numpy or torch) ---

def gelu(ops, dims, x):
    return 0.5 * x * (1.0 + ops.tanh(SQRT_2_OVER_PI * (x + 0.044715 * (x * x * x))))


def softmax(ops, dims, x):
    # Subtracting the row max keeps exp from overflowing; the result is unchanged.
    e = ops.exp(x - ops.row_max(x))
    return e / ops.row_sum(e)


def layernorm(ops, dims, x, gamma, beta):
    centered = x - ops.row_mean(x)
    variance = ops.row_mean(centered * centered)
    return centered / ops.sqrt(variance + LAYERNORM_EPS) * gamma + beta


def mlp(ops, dims, x, w1, b1, w2, b2):
    return gelu(ops, dims, x @ w1 + b1) @ w2 + b2


def attention(ops, dims, q, k, v):
    # The scale comes from dims, a Python constant, so that tracing records no shape ops.
    scores = q @ ops.swap_last(k) * (1.0 / math.sqrt(dims[-1]))
    return softmax(ops, dims, scores) @ v


def tiny(ops, dims, x):
    for _ in range(10):
        x = x * 1.0001 + 0.5
    return x


def mish(ops, dims, x):
    return x * ops.tanh(ops.log(ops.exp(x) + 1.0))


def rmsnorm(ops, dims, x, gamma):
    return x / ops.sqrt(ops.row_mean(x * x) + RMSNORM_EPS) * gamma


def silu(ops, dims, x):
    return x / (1.0 + ops.exp(-x))


def matmul(ops, dims, a, b):
    return a @ b


def log_softmax(ops, logits):
    """As kiln's: its max shift carries no gradient."""
    shifted = logits - ops.row_max(logits).detach()
    return shifted - ops.log(ops.row_sum(ops.exp(shifted)))


def train_mlp(ops, dims, x, labels, w1, b1, w2, b2):
    """The loss of one training step: the mlp, then cross-entropy against one-hot labels."""
    return -(log_softmax(ops, mlp(ops, dims, x, w1, b1, w2, b2)) * labels).sum(-1).mean()


def cross_entropy(ops, logits, labels):
    """The mean of -log_softmax(logits)[label] over the rows."""
    return -log_softmax(ops, logits).gather(-1, labels[:, None]).mean()


def train_gpt(ops, dims, ids, targets, *params):
    """The loss of a train_gpt step: cross-entropy of the blocks' logits against the next ids."""
    logits = models.gpt(ops.torch, params, ids, dims[3])
    return cross_entropy(ops, logits.reshape(-1, dims[0]), targets.reshape(-1))


def train_cnn(ops, dims, x, labels, *params):
    """The loss of a train_cnn step: cross-entropy of the CNN's logits against the labels."""
    return cross_entropy(ops, models.cnn(ops.torch, params, x), labels)


# The models (torch only), from bench/models.py, on random weights of their own
# (not kiln's: tests/test_models.c compares the two on one set of weights).
# resnet dims: (batch, image, width, classes, blocks...); gpt dims: (vocab,
# position table, d, heads, layers, sequence).

def resnet50(ops, dims, x, *params):
    return models.resnet(ops.torch, params, x, dims[4:], dims[2])


def gpt(ops, dims, x, *params):
    # The ids drawn from the first input's magnitudes: inputs are f32 normals here.
    ids = (x.abs() * 1000).long() % dims[0]
    return models.gpt(ops.torch, params, ids, dims[3])


def resnet_inputs(d):
    return [((d[0], 3, d[1], d[1]), 1.0, 0.0)] + models.resnet_param_specs(d[4:], d[2], d[3])


def gpt_inputs(d):
    return [((1, d[5]), 1.0, 0.0)] + models.gpt_param_specs(d[0], d[1], d[2], d[4])


# train_gpt dims: (vocab, sequence, d, heads, layers, batch); train_cnn dims:
# (batch, image, width, classes). Their FLOPs, as bench/workloads.c counts
# them: each product forward and its two gradients' (dA left out where A is
# the images).

def train_gpt_flop(d):
    vocab, t, dim, heads, layers, batch = d
    m = batch * t
    forward = layers * (m * dim * 3 * dim + 2 * batch * heads * t * t * (dim // heads) + m * dim * dim
                        + 2 * m * dim * 4 * dim) + m * dim * vocab
    return 3 * 2 * forward


def train_cnn_flop(d):
    batch, side, width, classes = d
    flop, inp = 0, 3
    for stage in range(3):
        out = width << stage
        flop += (2 if stage == 0 else 3) * 2 * batch * out * inp * 9 * side * side
        side //= 2 if stage < 2 else 1
        inp = out
    return flop + 3 * 2 * batch * inp * classes


def gpt_batch(torch, dims, inputs):
    """train_gpt's ids (from the first input's magnitudes), the ids that follow, the parameters."""
    x, *params = inputs
    ids = (x.abs() * 1000).long() % dims[0]
    return [ids[:, :-1].contiguous(), ids[:, 1:].contiguous()], params


def cnn_batch(torch, dims, inputs):
    """train_cnn's images, their labels (image i: class 7i mod classes), the parameters."""
    x, *params = inputs
    return [x, torch.arange(dims[0]) * 7 % dims[3]], params


def mlp_batch(torch, dims, inputs):
    """train_mlp's x, its one-hot labels (row i: class 7i mod m), the weights."""
    x, labels, *weights = inputs
    labels[torch.arange(dims[0]), torch.arange(dims[0]) * 7 % dims[1]] = 1.0
    return [x, labels], weights


def adamw(torch, params):
    return torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)


def sgd(torch, params):
    return torch.optim.SGD(params, lr=1e-2, momentum=0.9, weight_decay=5e-4)


# Each training step's batch from its inputs, and its optimizer.
TRAINING = {"train_mlp": (mlp_batch, adamw), "train_gpt": (gpt_batch, adamw), "train_cnn": (cnn_batch, sgd)}


# Sizes as bench/workloads.c has them: quick, full (a CPU's), gpu. An input is
# (shape from dims, scale, offset): values are offset + scale * N(0, 1).
# gemm_flop: the FLOPs of the workload's matrix products, or None.
# standard: run by default (matmul only on CUDA, as kiln-bench does).
# torch_only: numpy does not run it.
Workload = collections.namedtuple("Workload", "name fn quick full gpu size inputs gemm_flop standard torch_only",
                                  defaults=[False])

WORKLOADS = [
    Workload("gelu", gelu, (1 << 16,), (1 << 24,), (1 << 28,),
             lambda d: f"2^{d[0].bit_length() - 1}",
             lambda d: [(d, 1.0, 0.0)], lambda d: None, True),
    Workload("softmax", softmax, (256, 256), (4096, 4096), (16384, 16384),
             lambda d: "x".join(map(str, d)),
             lambda d: [(d, 1.0, 0.0)], lambda d: None, True),
    Workload("layernorm", layernorm, (256, 128), (8192, 1024), (16384, 4096),
             lambda d: "x".join(map(str, d)),
             lambda d: [(d, 1.0, 0.0), (d[-1:], 0.1, 1.0), (d[-1:], 0.1, 0.0)], lambda d: None, True),
    # dims are (batch, model, hidden): x [b,m], W1 [m,h], W2 [h,m].
    Workload("mlp", mlp, (32, 64, 256), (256, 1024, 4096), (4096, 2048, 8192),
             lambda d: f"x {d[0]}x{d[1]}, W1 {d[1]}x{d[2]}, W2 {d[2]}x{d[1]}",
             lambda d: [((d[0], d[1]), 1.0, 0.0),
                        ((d[1], d[2]), WEIGHT_SCALE, 0.0), ((d[2],), WEIGHT_SCALE, 0.0),
                        ((d[2], d[1]), WEIGHT_SCALE, 0.0), ((d[1],), WEIGHT_SCALE, 0.0)],
             lambda d: 2 * 2 * d[0] * d[1] * d[2], True),
    Workload("attention", attention, (2, 2, 32, 16), (8, 8, 256, 64), (8, 16, 2048, 64),
             lambda d: "x".join(map(str, d)),
             lambda d: [(d, 1.0, 0.0)] * 3,
             lambda d: 2 * 2 * d[0] * d[1] * d[2] * d[2] * d[3], True),
    Workload("tiny", tiny, (64,), (64,), (64,),
             lambda d: str(d[0]),
             lambda d: [(d, 1.0, 0.0)], lambda d: None, True),
    Workload("mish", mish, (1 << 16,), (1 << 24,), (1 << 28,),
             lambda d: f"2^{d[0].bit_length() - 1}",
             lambda d: [(d, 1.0, 0.0)], lambda d: None, True),
    Workload("rmsnorm", rmsnorm, (256, 128), (8192, 1024), (16384, 4096),
             lambda d: "x".join(map(str, d)),
             lambda d: [(d, 1.0, 0.0), (d[-1:], 1.0, 0.0)], lambda d: None, True),
    Workload("silu", silu, (1 << 16,), (1 << 24,), (1 << 28,),
             lambda d: f"2^{d[0].bit_length() - 1}",
             lambda d: [(d, 1.0, 0.0)], lambda d: None, True),
    Workload("softmax_row", softmax, (1, 1 << 14), (1, 1 << 20), (1, 1 << 26),
             lambda d: f"1x2^{d[1].bit_length() - 1}",
             lambda d: [(d, 1.0, 0.0)], lambda d: None, True),
    # One AdamW step (lr 1e-3, weight decay 1e-2) of the mlp on one-hot labels (row i: class 7i mod m).
    Workload("train_mlp", train_mlp, (32, 64, 256), (256, 1024, 4096), (4096, 2048, 8192),
             lambda d: f"{d[0]}x{d[1]}, {d[1]}x{d[2]}",
             lambda d: [((d[0], d[1]), 1.0, 0.0), ((d[0], d[1]), 0.0, 0.0),
                        ((d[1], d[2]), WEIGHT_SCALE, 0.0), ((d[2],), WEIGHT_SCALE, 0.0),
                        ((d[2], d[1]), WEIGHT_SCALE, 0.0), ((d[1],), WEIGHT_SCALE, 0.0)],
             lambda d: 5 * 2 * d[0] * d[1] * d[2], True, True),
    # AdamW as train_mlp's, next-token cross-entropy over the ids drawn from the first input.
    Workload("train_gpt", train_gpt, (256, 16, 64, 4, 2, 2), (8192, 128, 768, 12, 4, 4),
             (8192, 128, 768, 12, 4, 4),
             lambda d: f"{d[4]} blocks, d {d[2]}, seq {d[1]}, batch {d[5]}, vocab {d[0]}",
             lambda d: [((d[5], d[1] + 1), 1.0, 0.0)] + models.gpt_param_specs(d[0], d[1], d[2], d[4]),
             train_gpt_flop, True, True),
    # SGD (lr 1e-2, momentum 0.9, weight decay 5e-4) of the CNN of bench/models.py.
    Workload("train_cnn", train_cnn, (4, 16, 4, 10), (32, 32, 16, 10), (32, 32, 16, 10),
             lambda d: f"{d[0]}x3x{d[1]}x{d[1]}, width {d[2]}",
             lambda d: [((d[0], 3, d[1], d[1]), 1.0, 0.0)] + models.cnn_param_specs(d[2], d[3]),
             train_cnn_flop, True, True),
    Workload("matmul", matmul, (128,), (2048,), (8192,),
             lambda d: f"{d[0]}^3",
             lambda d: [((d[0], d[0]), 1.0, 0.0), ((d[0], d[0]), 1.0 / math.sqrt(d[0]), 0.0)],
             lambda d: 2 * d[0] ** 3, False),
    Workload("resnet50", resnet50, (1, 32, 8, 10, 1, 1, 1, 1), (1, 224, 64, 1000, 3, 4, 6, 3),
             (16, 224, 64, 1000, 3, 4, 6, 3), lambda d: f"{d[0]}x3x{d[1]}x{d[1]}",
             resnet_inputs, lambda d: None, True, True),
    Workload("resnet50_b16", resnet50, (2, 32, 8, 10, 1, 1, 1, 1), (16, 224, 64, 1000, 3, 4, 6, 3),
             (16, 224, 64, 1000, 3, 4, 6, 3), lambda d: f"{d[0]}x3x{d[1]}x{d[1]}",
             resnet_inputs, lambda d: None, True, True),
    Workload("gpt", gpt, (256, 32, 64, 4, 2, 32), (50257, 1024, 768, 12, 12, 256), (50257, 1024, 768, 12, 12, 256),
             lambda d: f"{d[4]} blocks, d {d[2]}, {d[3]} heads, seq {d[5]}",
             gpt_inputs, lambda d: None, True, True),
]


class NumpyOps:
    def __init__(self, np):
        self.tanh, self.exp, self.sqrt, self.log = np.tanh, np.exp, np.sqrt, np.log
        self.swap_last = lambda x: np.swapaxes(x, -1, -2)

    @staticmethod
    def row_max(x):
        return x.max(axis=-1, keepdims=True)

    @staticmethod
    def row_sum(x):
        return x.sum(axis=-1, keepdims=True)

    @staticmethod
    def row_mean(x):
        return x.mean(axis=-1, keepdims=True)


class TorchOps:
    def __init__(self, torch):
        self.torch = torch
        self.tanh, self.exp, self.sqrt, self.log = torch.tanh, torch.exp, torch.sqrt, torch.log
        self.swap_last = lambda x: x.transpose(-1, -2)

    @staticmethod
    def row_max(x):
        return x.amax(-1, keepdim=True)

    @staticmethod
    def row_sum(x):
        return x.sum(-1, keepdim=True)

    @staticmethod
    def row_mean(x):
        return x.mean(-1, keepdim=True)


def bind(workload, ops, dims):
    """The workload as a function of its input tensors only, as torch.jit.trace wants."""
    def run(*inputs):
        return workload.fn(ops, dims, *inputs)
    run.__name__ = run.__qualname__ = workload.name
    return run


# --- timing ---

def median_ms(call, reps):
    """Median milliseconds of call() after the warm-ups; call returns the seconds it measured."""
    for _ in range(WARMUPS):
        call()
    return 1e3 * statistics.median(call() for _ in range(reps))


def no_sync():
    pass


def timer(fn, inputs, calls, sync=no_sync):
    """A call() for median_ms: seconds per fn(*inputs), over `calls` back-to-back calls,
    each waited for by sync (torch.cuda.synchronize on CUDA, as kiln-bench waits)."""
    def call():
        start = time.perf_counter()
        for _ in range(calls):
            result = fn(*inputs)
            sync()
        elapsed = time.perf_counter() - start
        del result  # freed outside the timed region, as kiln-bench does
        return elapsed / calls
    return call


def calls_per_rep(workload):
    return TINY_CALLS_PER_REP if workload.name == "tiny" else 1


def make_inputs(np, workload, dims):
    rng = np.random.default_rng(SEED)
    return [(offset + scale * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
            for shape, scale, offset in workload.inputs(dims)]


def make_cuda_inputs(torch, workload, dims):
    """The inputs made on the GPU: numpy's generator would take seconds for the GPU sizes."""
    generator = torch.Generator(device="cuda").manual_seed(SEED)
    return [offset + scale * torch.randn(shape, generator=generator, device="cuda", dtype=torch.float32)
            for shape, scale, offset in workload.inputs(dims)]


def blank_result(workload, dims, reps):
    """One workload entry of the schema; every field present, null until measured."""
    flop = workload.gemm_flop(dims)
    return {"name": workload.name, "size": workload.size(dims), "eager_ms": None,
            "traced_ms": None, "first_call_ms": None, "disk_hit_ms": None, "compile_ms": None,
            "disk_load_ms": None, "kernels": None, "peak_eager_bytes": None, "peak_traced_bytes": None,
            "max_abs_diff": None, "gemm_gflop": None if flop is None else flop / 1e9,
            "limit_ms": None, "limit_kind": None, "reps": reps}


def progress(message):
    print(f"peers: {message}", file=sys.stderr, flush=True)


def numpy_peak_bytes(fn, inputs):
    """Bytes numpy allocated at its high-water mark during one call (numpy reports its
    buffers to tracemalloc); run apart from the timed calls, which tracing would slow."""
    import tracemalloc
    tracemalloc.start()
    try:
        result = fn(*inputs)
        peak = tracemalloc.get_traced_memory()[1]
        del result
    finally:
        tracemalloc.stop()
    return peak or None


def bench_numpy(np, workload, dims, reps):
    result = blank_result(workload, dims, reps)
    fn, inputs = bind(workload, NumpyOps(np), dims), make_inputs(np, workload, dims)
    progress(f"numpy {workload.name} {result['size']}")
    result["eager_ms"] = median_ms(timer(fn, inputs, calls_per_rep(workload)), reps)
    result["peak_eager_bytes"] = numpy_peak_bytes(fn, inputs)
    return result


def cuda_peak_bytes(torch, fn, inputs):
    """Bytes PyTorch's CUDA allocator held above the inputs at its high-water mark
    during one call."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    result = fn(*inputs)
    torch.cuda.synchronize()
    del result
    return torch.cuda.max_memory_allocated() - base


def bench_torch(torch, np, workload, dims, reps, device):
    """PyTorch eager, and TorchScript on the CPU or torch.compile on CUDA."""
    cuda = device == "cuda"
    result = blank_result(workload, dims, reps)
    fn = bind(workload, TorchOps(torch), dims)
    if cuda:
        inputs = make_cuda_inputs(torch, workload, dims)
    else:
        inputs = [torch.from_numpy(a) for a in make_inputs(np, workload, dims)]
    calls = calls_per_rep(workload)
    sync = torch.cuda.synchronize if cuda else no_sync
    with torch.no_grad():
        progress(f"torch eager {workload.name} {result['size']}")
        result["eager_ms"] = median_ms(timer(fn, inputs, calls, sync), reps)

        progress(f"{'torch.compile' if cuda else 'TorchScript'} {workload.name} {result['size']}")
        start = time.perf_counter()
        if cuda:
            traced = torch.compile(fn, dynamic=False)
        else:
            # check_trace would rerun both versions to compare them, which is not part of a
            # first call; max_abs_diff below does that comparison instead.
            traced = torch.jit.trace(fn, tuple(inputs), check_trace=False)
        traced(*inputs)
        sync()
        result["first_call_ms"] = 1e3 * (time.perf_counter() - start)
        result["traced_ms"] = median_ms(timer(traced, inputs, calls, sync), reps)
        result["max_abs_diff"] = (traced(*inputs) - fn(*inputs)).abs().max().item()
        if cuda:
            result["peak_eager_bytes"] = cuda_peak_bytes(torch, fn, inputs)
            result["peak_traced_bytes"] = cuda_peak_bytes(torch, traced, inputs)
    return result


def bench_torch_train(torch, np, workload, dims, reps):
    """A training step: zero_grad, the loss, backward and the torch.optim step (TRAINING),
    with the forward pass eager and as TorchScript (torch.jit.trace: autograd runs its
    backward)."""
    result = blank_result(workload, dims, reps)
    make_batch, make_optimizer = TRAINING[workload.name]
    batch, weights = make_batch(torch, dims, [torch.from_numpy(a) for a in make_inputs(np, workload, dims)])
    loss_fn = bind(workload, TorchOps(torch), dims)

    def trainer(forward):
        params = [w.clone().requires_grad_() for w in weights]
        optimizer = make_optimizer(torch, params)

        def step():
            optimizer.zero_grad(set_to_none=True)
            loss = forward(*batch, *params)
            loss.backward()
            optimizer.step()
            return loss.detach()
        return step, params

    progress(f"torch eager {workload.name} {result['size']}")
    eager, _ = trainer(loss_fn)
    result["eager_ms"] = median_ms(timer(eager, [], 1), reps)
    progress(f"TorchScript {workload.name} {result['size']}")
    start = time.perf_counter()
    params = [w.clone().requires_grad_() for w in weights]
    script = torch.jit.trace(loss_fn, (*batch, *params), check_trace=False)
    traced, _ = trainer(script)
    traced()
    result["first_call_ms"] = 1e3 * (time.perf_counter() - start)
    result["traced_ms"] = median_ms(timer(traced, [], 1), reps)
    first_eager, _ = trainer(loss_fn)
    first_traced, _ = trainer(script)
    result["max_abs_diff"] = (first_traced() - first_eager()).abs().item()
    result["peak_eager_bytes"] = step_peak_in_fresh_process(workload, dims is workload.quick)
    return result


def step_peak_in_fresh_process(workload, quick):
    """PyTorch eager's training step peak (step_peak), run by this script again in a
    fresh interpreter whose glibc returns every freed block over 128 KiB at once
    (MALLOC_MMAP_THRESHOLD_; here it would slow the timings), so that its resident
    memory follows the live tensors; None if that run fails."""
    command = [sys.executable, os.path.abspath(__file__), "--step-peak", workload.name,
               "--threads", os.environ.get("OMP_NUM_THREADS", "1")] + (["--quick"] if quick else [])
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    try:
        return int(done.stdout.split()[-1])
    except (ValueError, IndexError):
        progress(f"no step peak for {workload.name}: {done.stderr.strip()[-300:]}")
        return None


def step_peak(torch, np, workload, dims):
    """Bytes of resident memory one eager training step adds at its highest, after a
    first step has made the optimizer's state; the gradients are freed before it."""
    make_batch, make_optimizer = TRAINING[workload.name]
    batch, weights = make_batch(torch, dims, [torch.from_numpy(a) for a in make_inputs(np, workload, dims)])
    loss_fn = bind(workload, TorchOps(torch), dims)
    params = [w.clone().requires_grad_() for w in weights]
    optimizer = make_optimizer(torch, params)

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss_fn(*batch, *params).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def status(key):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))
    step()
    base = status("VmRSS:")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the high-water mark starts again from here
    step()
    return status("VmHWM:") - base


# --- the run ---

def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cuda: PyTorch eager and torch.compile on the GPU, at GPU sizes")
    parser.add_argument("--threads", type=int, default=os.cpu_count(),
                        help="threads for numpy's BLAS and torch (default: cores)")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--reps", type=int, help="timed repetitions after 2 warm-ups (10; 3 with --quick)")
    parser.add_argument("--workload", choices=[w.name for w in WORKLOADS],
                        help="run this one only (default: all but matmul; on cuda all)")
    parser.add_argument("--json", metavar="FILE", help="write the kiln-bench/1 JSON to FILE")
    parser.add_argument("--step-peak", metavar="NAME", choices=sorted(TRAINING),
                        help="print the peak bytes of one PyTorch eager training step of NAME, and exit")
    args = parser.parse_args()
    if args.reps is None:
        args.reps = 3 if args.quick else 10
    if args.threads < 1 or args.reps < 1:
        parser.error("--threads and --reps must be at least 1")
    return args


def import_libraries(threads):
    """numpy, and torch or None. The BLAS libraries read their thread count when they
    load, so the variables must be set before either import."""
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(threads)
    import numpy
    try:
        import torch
    except (ImportError, OSError) as error:  # OSError: a shared library that will not load
        progress(f"torch not importable ({error}); skipping PyTorch and TorchScript")
        return numpy, None
    torch.set_num_threads(threads)
    return numpy, torch


def machine(gpu):
    cpu = None
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "gpu": gpu, "peak_fp32_tflops": None}


def make_run(system, traced_label, args, gpu=None):
    return {"system": system, "eager_label": "eager", "traced_label": traced_label,
            "device": args.device, "threads": args.threads, "quick": args.quick,
            "machine": machine(gpu), "probes": None, "workloads": []}


def write_json(path, runs):
    with open(path, "w") as f:
        json.dump({"schema": "kiln-bench/1", "runs": runs}, f, indent=2)
        f.write("\n")


def print_table(runs, args):
    """One row per workload; a column per system and mode."""
    by_system = [{w["name"]: w for w in run["workloads"]} for run in runs]
    columns = []  # (heading, run index, field, format)
    for i, run in enumerate(runs):
        columns.append((f"{run['system']} {run['eager_label']} ms", i, "eager_ms", "{:.3f}"))
        if run["traced_label"]:
            columns += [(f"{run['traced_label']} ms", i, "traced_ms", "{:.3f}"),
                        ("first call ms", i, "first_call_ms", "{:.1f}"),
                        ("max|diff|", i, "max_abs_diff", "{:.1e}")]
    names = list(by_system[0])
    rows = [["workload", "size"] + [c[0] for c in columns]]
    for name in names:
        row = [name, by_system[0][name]["size"]]
        for _, i, field, fmt in columns:
            value = by_system[i].get(name, {}).get(field)  # numpy runs no model
            row.append("-" if value is None else fmt.format(value))
        rows.append(row)
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    sizes = "quick" if args.quick else "GPU" if args.device == "cuda" else "full"
    print(f"peers: {args.device}, threads={args.threads}, {sizes} sizes, "
          f"median of {args.reps} reps after {WARMUPS} warm-ups; tiny is per call, "
          f"timed in batches of {TINY_CALLS_PER_REP}")
    for row in rows:
        print("  ".join(cell.ljust(w) if c < 2 else cell.rjust(w)
                        for c, (cell, w) in enumerate(zip(row, widths))))


def main():
    args = parse_args()
    np, torch = import_libraries(args.threads)
    if args.step_peak:
        w = next(w for w in WORKLOADS if w.name == args.step_peak)
        print(step_peak(torch, np, w, w.quick if args.quick else w.full))
        return
    cuda = args.device == "cuda"
    if cuda and not (torch and torch.cuda.is_available()):
        progress("--device cuda: no PyTorch with CUDA here")
        sys.exit(2)
    selected = [w for w in WORKLOADS if args.workload == w.name or (args.workload is None and (w.standard or cuda))]
    runs = []
    if cuda:
        # kiln multiplies in full f32; TF32 would be a different computation.
        torch.set_float32_matmul_precision("highest")
        runs.append(make_run(f"pytorch {torch.__version__}", "torch.compile", args,
                             gpu=torch.cuda.get_device_name(0)))
    elif torch:
        runs.append(make_run(f"pytorch {torch.__version__}", "TorchScript", args))
    if not cuda:
        runs.append(make_run(f"numpy {np.__version__}", None, args))
    for w in selected:
        dims = w.quick if args.quick else w.gpu if cuda else w.full
        training = w.name.startswith("train_")
        if torch and training and cuda:
            runs[0]["workloads"].append(blank_result(w, dims, args.reps))
        elif torch and training:
            runs[0]["workloads"].append(bench_torch_train(torch, np, w, dims, args.reps))
        elif torch:
            runs[0]["workloads"].append(bench_torch(torch, np, w, dims, args.reps, args.device))
        if not cuda and not w.torch_only:
            runs[-1]["workloads"].append(bench_numpy(np, w, dims, args.reps))
        if args.json:  # after each workload, so that a run cut short keeps what it measured
            write_json(args.json, runs)
    print_table(runs, args)
    if args.json:
        progress(f"wrote {args.json}")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Peer figures for kiln-bench: the six standard workloads in PyTorch and numpy.

Times each workload of kiln-bench (gelu, softmax, layernorm, mlp, attention,
tiny; all f32) in PyTorch eager, in TorchScript (torch.jit.trace of the same
function) and in numpy, with the same thread count for all, and writes the
kiln-bench/1 JSON schema (docs/bench-json.md) so that `kiln-bench --compare`
can put these runs beside kiln. Torch is optional: without it only numpy runs.

Every workload is written once, from primitive ops (tanh, exp, max, sum,
matmul, ...) as kiln-bench builds it, not from fused library calls such as
F.softmax, so the three systems run the same computation.

    /usr/bin/python3 bench/peers.py [--threads N] [--quick] [--reps N]
                                    [--workload NAME] [--json FILE]
"""
import argparse
import collections
import json
import math
import os
import statistics
import sys
import time

WARMUPS = 2
TINY_CALLS_PER_REP = 1000  # one tiny call is microseconds: too short to time alone
SEED = 1234
WEIGHT_SCALE = 0.03  # as kiln-bench: keeps the mlp's activations near unit size
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
LAYERNORM_EPS = 1e-5


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


# An input is (shape from dims, scale, offset): values are offset + scale * N(0, 1).
Workload = collections.namedtuple("Workload", "name fn full quick size inputs")

WORKLOADS = [
    Workload("gelu", gelu, (1 << 24,), (1 << 16,),
             lambda d: f"2^{d[0].bit_length() - 1}",
             lambda d: [(d, 1.0, 0.0)]),
    Workload("softmax", softmax, (4096, 4096), (256, 256),
             lambda d: "x".join(map(str, d)),
             lambda d: [(d, 1.0, 0.0)]),
    Workload("layernorm", layernorm, (8192, 1024), (256, 128),
             lambda d: "x".join(map(str, d)),
             lambda d: [(d, 1.0, 0.0), (d[-1:], 0.1, 1.0), (d[-1:], 0.1, 0.0)]),
    # dims are (batch, model, hidden): x [b,m], W1 [m,h], W2 [h,m].
    Workload("mlp", mlp, (256, 1024, 4096), (32, 64, 256),
             lambda d: f"x {d[0]}x{d[1]}, W1 {d[1]}x{d[2]}, W2 {d[2]}x{d[1]}",
             lambda d: [((d[0], d[1]), 1.0, 0.0),
                        ((d[1], d[2]), WEIGHT_SCALE, 0.0), ((d[2],), WEIGHT_SCALE, 0.0),
                        ((d[2], d[1]), WEIGHT_SCALE, 0.0), ((d[1],), WEIGHT_SCALE, 0.0)]),
    Workload("attention", attention, (8, 8, 256, 64), (2, 2, 32, 16),
             lambda d: "x".join(map(str, d)),
             lambda d: [(d, 1.0, 0.0)] * 3),
    Workload("tiny", tiny, (64,), (64,),
             lambda d: str(d[0]),
             lambda d: [(d, 1.0, 0.0)]),
]


class NumpyOps:
    def __init__(self, np):
        self.tanh, self.exp, self.sqrt = np.tanh, np.exp, np.sqrt
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
        self.tanh, self.exp, self.sqrt = torch.tanh, torch.exp, torch.sqrt
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


def timer(fn, inputs, calls):
    """A call() for median_ms: seconds per fn(*inputs), over `calls` back-to-back calls."""
    def call():
        start = time.perf_counter()
        for _ in range(calls):
            result = fn(*inputs)
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


def blank_result(workload, dims, reps):
    """One workload entry of the schema; every field present, null until measured."""
    return {"name": workload.name, "size": workload.size(dims), "eager_ms": None,
            "traced_ms": None, "first_call_ms": None, "disk_hit_ms": None, "kernels": None,
            "peak_eager_bytes": None, "peak_traced_bytes": None, "max_abs_diff": None,
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


def bench_torch(torch, np, workload, dims, reps):
    result = blank_result(workload, dims, reps)
    fn = bind(workload, TorchOps(torch), dims)
    inputs = [torch.from_numpy(a) for a in make_inputs(np, workload, dims)]
    calls = calls_per_rep(workload)
    with torch.no_grad():
        progress(f"torch eager {workload.name} {result['size']}")
        result["eager_ms"] = median_ms(timer(fn, inputs, calls), reps)

        progress(f"TorchScript {workload.name} {result['size']}")
        # check_trace would rerun both versions to compare them, which is not part of a
        # first call; max_abs_diff below does that comparison instead.
        start = time.perf_counter()
        traced = torch.jit.trace(fn, tuple(inputs), check_trace=False)
        traced(*inputs)
        result["first_call_ms"] = 1e3 * (time.perf_counter() - start)
        result["traced_ms"] = median_ms(timer(traced, inputs, calls), reps)
        result["max_abs_diff"] = (traced(*inputs) - fn(*inputs)).abs().max().item()
    return result


# --- the run ---

def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count(),
                        help="threads for numpy's BLAS and torch (default: cores)")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--reps", type=int, help="timed repetitions after 2 warm-ups (10; 3 with --quick)")
    parser.add_argument("--workload", choices=[w.name for w in WORKLOADS], help="run this one only")
    parser.add_argument("--json", metavar="FILE", help="write the kiln-bench/1 JSON to FILE")
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


def machine():
    cpu = None
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count()}


def make_run(system, traced_label, args, workloads):
    return {"system": system, "eager_label": "eager", "traced_label": traced_label,
            "device": "cpu", "threads": args.threads, "quick": args.quick,
            "machine": machine(), "probes": None, "workloads": workloads}


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
            value = by_system[i][name][field]
            row.append("-" if value is None else fmt.format(value))
        rows.append(row)
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    print(f"peers: threads={args.threads}, {'quick' if args.quick else 'full'} sizes, "
          f"median of {args.reps} reps after {WARMUPS} warm-ups; tiny is per call, "
          f"timed in batches of {TINY_CALLS_PER_REP}")
    for row in rows:
        print("  ".join(cell.ljust(w) if c < 2 else cell.rjust(w)
                        for c, (cell, w) in enumerate(zip(row, widths))))


def main():
    args = parse_args()
    np, torch = import_libraries(args.threads)
    selected = [w for w in WORKLOADS if args.workload in (None, w.name)]
    runs = []
    if torch:
        runs.append(make_run(f"pytorch {torch.__version__}", "TorchScript", args, [
            bench_torch(torch, np, w, w.quick if args.quick else w.full, args.reps) for w in selected]))
    runs.append(make_run(f"numpy {np.__version__}", None, args, [
        bench_numpy(np, w, w.quick if args.quick else w.full, args.reps) for w in selected]))
    print_table(runs, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"schema": "kiln-bench/1", "runs": runs}, f, indent=2)
            f.write("\n")
        progress(f"wrote {args.json}")


if __name__ == "__main__":
    main()

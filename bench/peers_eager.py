#!/usr/bin/python3
"""Peer figures for kiln-bench-eager: the same eager measurements in numpy, and in torch if it imports."""
import argparse
import json
import os
import statistics
import sys
import time

WARMUPS = 2
# As in kiln-bench-eager: dispatch is timed in many short batches, so that the
# median steps over the batches a busy machine preempts.
DISPATCH_CALLS = 1000
DISPATCH_BATCHES_PER_REP = 10
SQRT_2_OVER_PI = 0.7978845608028654


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=0,
                        help="sets OMP_NUM_THREADS and OPENBLAS_NUM_THREADS, and torch.set_num_threads")
    parser.add_argument("--reps", type=int, default=10,
                        help="timed repetitions after 2 warm-ups; dispatch takes 10*N batches of 1000 calls")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--json", metavar="FILE", help="also write the medians to FILE")
    return parser.parse_args()


def median_of_runs(run, reps):
    """run() returns the seconds spent in the measured call only."""
    for _ in range(WARMUPS):
        run()
    return statistics.median(run() for _ in range(reps))


def timed(fn, *args, **kwargs):
    """Seconds for fn(*args, **kwargs); the result is freed after the timing, as in kiln-bench-eager."""
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    elapsed = time.perf_counter() - start
    del result
    return elapsed


def per_call_add(add, a, b):
    """Seconds per add whose result is dropped at once: dispatch, allocation, kernel, release
    and the Python loop around them."""
    start = time.perf_counter()
    for _ in range(DISPATCH_CALLS):
        add(a, b)
    return (time.perf_counter() - start) / DISPATCH_CALLS


def gelu_from_ops(lib, x):
    """The tanh-form GELU from nine individual ops, in kiln-bench-eager's order."""
    return 0.5 * x * (1.0 + lib.tanh(SQRT_2_OVER_PI * (x + 0.044715 * (x * x * x))))


class Report:
    def __init__(self):
        self.rows = []

    def add(self, key, label, value, unit, note=""):
        self.rows.append((key, label, value, unit, note))

    def print_table(self):
        print(f"{'benchmark':<40} {'median':>12}  {'unit':<8}  note")
        for _, label, value, unit, note in self.rows:
            print(f"{label:<40} {value:12.3f}  {unit:<8}  {note}")

    def write_json(self, path, args):
        medians = {key: value for key, _, value, *_ in self.rows}
        with open(path, "w") as f:
            json.dump({"threads": args.threads or None, "reps": args.reps, "quick": args.quick, **medians},
                      f, indent=2)


def bench_numpy(np, report, sizes, reps):
    n, m = sizes
    a, b = np.random.standard_normal((2, 64)).astype(np.float32)
    print("timing numpy ...", file=sys.stderr)
    report.add("numpy_add64_us", "numpy add f32[64]", 1e6 * median_of_runs(
        lambda: per_call_add(np.add, a, b), reps * DISPATCH_BATCHES_PER_REP), "us/call",
        "dispatch+alloc+kernel+release+loop")

    x = np.random.standard_normal(n).astype(np.float32)
    report.add("numpy_gelu_ops_ms", f"numpy gelu from 9 ops, f32[{n}]",
               1e3 * median_of_runs(lambda: timed(gelu_from_ops, np, x), reps), "ms", "single-threaded")

    ma, mb = (np.random.standard_normal((m, m)).astype(np.float32) for _ in range(2))
    matmul_ms = 1e3 * median_of_runs(lambda: timed(np.matmul, ma, mb), reps)
    report.add("numpy_matmul_ms", f"numpy matmul {m}^3", matmul_ms, "ms",
               f"{2e-6 * m ** 3 / matmul_ms:.1f} GFLOP/s")

    positive = np.random.uniform(0.5, 1.5, n).astype(np.float32)
    for name, fn, arg in (("neg", np.negative, x), ("exp", np.exp, x), ("log", np.log, positive),
                          ("tanh", np.tanh, x)):
        seconds = median_of_runs(lambda: timed(fn, arg), reps)
        report.add(f"numpy_{name}_ns_per_element", f"numpy {name}, f32[{n}]", 1e9 * seconds / n, "ns/elem")


def bench_torch(torch, report, sizes, reps):
    n, m = sizes
    a, b = torch.randn(2, 64)
    print("timing torch ...", file=sys.stderr)
    report.add("torch_add64_us", "torch add f32[64]", 1e6 * median_of_runs(
        lambda: per_call_add(torch.add, a, b), reps * DISPATCH_BATCHES_PER_REP), "us/call",
        "dispatch+alloc+kernel+release+loop")

    x = torch.randn(n)
    report.add("torch_gelu_ops_ms", f"torch gelu from 9 ops, f32[{n}]",
               1e3 * median_of_runs(lambda: timed(gelu_from_ops, torch, x), reps), "ms")
    gelu = torch.nn.functional.gelu
    report.add("torch_gelu_ms", f"torch gelu, f32[{n}]",
               1e3 * median_of_runs(lambda: timed(gelu, x, approximate="tanh"), reps), "ms",
               "F.gelu(approximate='tanh'), the composite")

    ma, mb = torch.randn(m, m), torch.randn(m, m)
    matmul_ms = 1e3 * median_of_runs(lambda: timed(torch.matmul, ma, mb), reps)
    report.add("torch_matmul_ms", f"torch matmul {m}^3", matmul_ms, "ms",
               f"{2e-6 * m ** 3 / matmul_ms:.1f} GFLOP/s")

    positive = torch.rand(n) + 0.5
    for name, fn, arg in (("neg", torch.neg, x), ("exp", torch.exp, x), ("log", torch.log, positive),
                          ("tanh", torch.tanh, x), ("erf", torch.erf, x), ("sigmoid", torch.sigmoid, x)):
        seconds = median_of_runs(lambda: timed(fn, arg), reps)
        report.add(f"torch_{name}_ns_per_element", f"torch {name}, f32[{n}]", 1e9 * seconds / n, "ns/elem")


def main():
    args = parse_args()
    if args.threads:
        # OpenBLAS reads these when it loads, so they must be set before numpy is imported.
        os.environ["OMP_NUM_THREADS"] = os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
    import numpy as np
    try:
        import torch
    except ImportError:
        torch = None
    if torch and args.threads:
        torch.set_num_threads(args.threads)

    sizes = (1 << 16, 256) if args.quick else (1 << 24, 2048)  # elementwise n, matmul n
    report = Report()
    bench_numpy(np, report, sizes, args.reps)
    if torch:
        bench_torch(torch, report, sizes, args.reps)

    print(f"peers_eager: python {sys.version.split()[0]}, numpy {np.__version__}, "
          f"torch {torch.__version__ if torch else 'not importable'}, threads={args.threads or 'default'}, "
          f"medians of {args.reps} reps after {WARMUPS} warm-ups")
    report.print_table()
    if args.json:
        report.write_json(args.json, args)


if __name__ == "__main__":
    main()

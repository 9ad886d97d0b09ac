#!/usr/bin/env python3
"""Real models through ONNX: PyTorch 1.13 exports them (random weights,
torch.manual_seed(0)) with their outputs on fixed inputs, and kiln-onnx runs
them; kiln's outputs must match within each model's tolerance.

    onnx_models.py KILN_ONNX WORK_DIR [--batch N] [--bench]
    onnx_models.py --bench-torch MODEL.onnx --batch N [--runs N] [--threads N]
    onnx_models.py --export MODEL.onnx

Models: torch.nn.TransformerEncoder (4 layers, d 256, 4 heads), and, where
torchvision is, resnet50 and mobilenet_v3_small. A model whose operators
kiln lacks is reported and skipped (not a failure); exit 77 when PyTorch is
absent. --bench also runs `kiln-onnx bench --torch` on each model, with this
script as its companion: --bench-torch rebuilds the model a file's name
names (resnet50.onnx: resnet50) and prints PyTorch eager's and
TorchScript's median times on it at batch N, as kiln-onnx reads them.
--export writes the model a file's name names with a symbolic batch size
(the weights the other modes use), for kiln-onnx bench at any --batch.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

try:
    import numpy as np
    import torch
except ImportError as e:
    print(f"SKIP: PyTorch or numpy is absent ({e}; Debian: python3-torch)")
    sys.exit(77)


def transformer():
    layer = torch.nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024, batch_first=True)
    return torch.nn.TransformerEncoder(layer, num_layers=4), (16, 256)


def vision(name):
    def make():
        import torchvision
        return getattr(torchvision.models, name)(weights=None), (3, 224, 224)
    return make


# name, maker, (relative, absolute) tolerance
MODELS = [("transformer_encoder", transformer, (1e-4, 1e-4))]
try:
    import torchvision  # noqa: F401
    MODELS += [("resnet50", vision("resnet50"), (1e-3, 1e-3)),
               ("mobilenet_v3_small", vision("mobilenet_v3_small"), (1e-3, 1e-3))]
except ImportError:
    print("note: torchvision is absent (Debian: python3-torchvision): resnet50 and mobilenet_v3_small left out")


def median_ms(fn, x, runs):
    with torch.no_grad():
        fn(x)
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            fn(x)
            times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[len(times) // 2]


def check(tool, work, name, maker, tol, batch, bench):
    torch.manual_seed(0)
    model, shape = maker()
    model.eval()
    x = torch.randn(batch, *shape)
    with torch.no_grad():
        want = model(x).numpy()
    path = os.path.join(work, name + ".onnx")
    torch.onnx.export(model, x, path, opset_version=14, input_names=["x"], output_names=["y"])
    np.save(os.path.join(work, "x.npy"), x.numpy())
    run = subprocess.run([tool, "run", path, "--input", "x=" + os.path.join(work, "x.npy"), "--output", work],
                         capture_output=True, text=True)
    if run.returncode != 0:
        if "not supported" in run.stderr:
            print(f"{name}: skipped, kiln lacks an operator: {run.stderr.strip().splitlines()[-1]}")
            return True
        print(f"{name}: kiln-onnx run failed:\n{run.stderr}")
        return False
    got = np.load(os.path.join(work, "y.npy"))
    rel, abs_ = tol
    err = np.abs(got - want)
    ok = got.shape == want.shape and bool(np.all(err <= abs_ + rel * np.abs(want)))
    print(f"{name}: batch {batch}, max |kiln - PyTorch| {err.max():.3g} (tolerance {abs_} + {rel} |y|): "
          f"{'ok' if ok else 'MISMATCH'}")
    if bench:
        env = dict(os.environ, KILN_PYTHON=sys.executable)
        runs = ["--runs", "2"] if bench == "quick" else []
        timed = subprocess.run([tool, "bench", path, "--batch", str(batch), "--torch", __file__] + runs, env=env,
                               capture_output=True, text=True)
        print(timed.stdout + timed.stderr, end="")
        if timed.returncode != 0 or "TorchScript, median" not in timed.stdout:
            print(f"{name}: kiln-onnx bench --torch failed")
            return False
    return ok


def model_named(path):
    """The (name, maker, tolerance) of the model path's file name names, or None (said on stderr)."""
    name = os.path.splitext(os.path.basename(path))[0]
    found = [m for m in MODELS if m[0] == name]
    if not found:
        print(f"onnx_models.py: no model named {name} (there are {', '.join(m[0] for m in MODELS)})",
              file=sys.stderr)
        return None
    return found[0]


def export(path):
    """The model path names, exported there with a symbolic batch size."""
    found = model_named(path)
    if not found:
        return 2
    torch.manual_seed(0)
    model, shape = found[1]()
    model.eval()
    batch = {0: "batch"}
    torch.onnx.export(model, torch.randn(1, *shape), path, opset_version=14, input_names=["x"],
                      output_names=["y"], dynamic_axes={"x": batch, "y": batch})
    return 0


def bench_torch(args):
    """PyTorch's times on the model args.bench_torch names, for kiln-onnx bench --torch."""
    found = model_named(args.bench_torch)
    if not found:
        return 2
    torch.manual_seed(0)
    model, shape = found[1]()
    model.eval()
    x = torch.randn(args.batch, *shape)
    with torch.no_grad():
        traced = torch.jit.trace(model, x)
    print(f"torch_eager_ms {median_ms(model, x, args.runs):.3f}")
    print(f"torchscript_ms {median_ms(traced, x, args.runs):.3f}")
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tool", nargs="?")
    ap.add_argument("work", nargs="?")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--bench-torch", metavar="MODEL")
    ap.add_argument("--export", metavar="MODEL")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("KILN_THREADS", torch.get_num_threads())))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.bench_torch:
        return bench_torch(args)
    if args.export:
        return export(args.export)
    if not args.tool or not args.work:
        ap.error("KILN_ONNX and WORK_DIR, please")
    with tempfile.TemporaryDirectory(dir=args.work) as work:
        # the transformer is timed briefly even without --bench: kiln-onnx bench --torch must work
        ok = all([check(args.tool, work, *m, args.batch, args.bench or ("quick" if m[0] == "transformer_encoder"
                                                                          else False)) for m in MODELS])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

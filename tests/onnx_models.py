#!/usr/bin/env python3
"""Real models through ONNX: PyTorch 1.13 exports them (random weights,
torch.manual_seed(0)) with their outputs on fixed inputs, and kiln-onnx runs
them; kiln's outputs must match within each model's tolerance.

    onnx_models.py KILN_ONNX WORK_DIR [--batch N] [--bench]

Models: torch.nn.TransformerEncoder (4 layers, d 256, 4 heads), and, where
torchvision is, resnet50 and mobilenet_v3_small. A model whose operators
kiln lacks is reported and skipped (not a failure); exit 77 when PyTorch is
absent. --bench also times PyTorch eager and TorchScript on the same input
and runs `kiln-onnx bench` for comparison.
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


def median_ms(fn, x, runs=20):
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
        traced = torch.jit.trace(model, x)
        print(f"  PyTorch eager {median_ms(model, x):.3f} ms, TorchScript {median_ms(traced, x):.3f} ms")
        subprocess.run([tool, "bench", path, "--batch", str(batch)])
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tool")
    ap.add_argument("work")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--bench", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("KILN_THREADS", torch.get_num_threads())))
    with tempfile.TemporaryDirectory(dir=args.work) as work:
        ok = all([check(args.tool, work, *m, args.batch, args.bench) for m in MODELS])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

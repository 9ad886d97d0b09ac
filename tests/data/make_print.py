#!/usr/bin/python3
"""Writes tests/data/print.txt, what PyTorch prints for the tensors of the io
suite's printing test (run once; the file is committed). From the repository
root, with Debian's python3-torch (PyTorch 1.13):

    /usr/bin/python3 tests/data/make_print.py

Each case is a line "case DTYPE SHAPE FORMULA SCALE SHIFT" (SHAPE "-" for a
0-d tensor) and then PyTorch's text for the tensor whose element i (row-major)
is (f(i) + SHIFT) * SCALE in double, converted to DTYPE: f(i) is i for iota,
sin(0.7 i) for sin and SPECIAL[i % 6] for special; integers truncate toward
zero, bools are nonzero. kiln names its dtypes itself (dtype=f64, not
dtype=torch.float64), so the suffix is PyTorch's _add_suffixes with kiln's
names; where PyTorch prints no suffix, the text is str(tensor) itself.
"""
import math
import os

import torch
import torch._tensor_str as tensor_str

HERE = os.path.dirname(os.path.abspath(__file__))
SPECIAL = [math.nan, math.inf, -math.inf, -0.0, 0.5, 1e-5]
DTYPES = {"f32": torch.float32, "f64": torch.float64, "i32": torch.int32, "i64": torch.int64, "bool": torch.bool}
CASES = [
    ("f32", [3, 100], "iota", 1 / 7, 0),
    ("f64", [2, 3, 4], "iota", 1e-6, 0),
    ("bool", [40], "iota", 1, -20),
    ("i64", [100, 100], "iota", 1, 0),
    ("f32", [2000], "iota", 1, 0),
    ("i32", [5, 30], "iota", 37, -13.5),
    ("f32", [4, 9], "sin", 1000, 0),
    ("f32", [12], "special", 1, 0),
    ("f32", [], "iota", 2.5, 1),
    ("f32", [0], "iota", 1, 0),
    ("i64", [2, 0], "iota", 1, 0),
    ("f64", [0, 3], "iota", 1, 0),
    ("bool", [0], "iota", 1, 0),
    ("f32", [7], "iota", 0, 0),
    ("f32", [30, 50], "sin", 1, 0),
    ("f64", [3], "iota", 1e9, 1),
    ("f32", [8, 20, 12], "sin", 3, 0),
    ("f32", [1, 100], "sin", -0.001, 0),
    ("i64", [1000], "iota", 1, -500),
    ("bool", [3, 4, 5], "sin", 1, 0),
    ("f64", [1], "iota", 1e-5, 1),
    ("i32", [], "iota", 1, -3),
    ("f32", [2, 2, 2, 2], "iota", 0.5, -3),
    ("f64", [5, 40], "iota", 1.5, 0),
    ("f32", [3, 4], "special", 1, 0),
    ("f32", [4, 4], "iota", 1e5, 0.5),
]


def f(formula, i):
    if formula == "iota":
        return float(i)
    if formula == "sin":
        return math.sin(0.7 * i)
    return SPECIAL[i % 6]


def make(dtype, shape, formula, scale, shift):
    n = math.prod(shape)
    values = [(f(formula, i) + shift) * scale for i in range(n)]
    if dtype == "bool":
        values = [v != 0 for v in values]
    elif dtype in ("i32", "i64"):
        values = [int(v) for v in values]
    return torch.tensor(values, dtype=DTYPES[dtype]).reshape(shape)


def text(t, dtype):
    indent, suffixes = len("tensor("), []
    if t.numel() == 0:
        body = "[]"
        if t.dim() != 1:
            suffixes.append("size=" + str(tuple(t.shape)))
        if t.dtype != torch.float32:
            suffixes.append("dtype=" + dtype)
    else:
        body = tensor_str._tensor_str(t, indent)
        if t.dtype not in (torch.float32, torch.int64, torch.bool):
            suffixes.append("dtype=" + dtype)
    out = tensor_str._add_suffixes("tensor(" + body, suffixes, indent, force_newline=False)
    if not suffixes:
        assert out == str(t), (out, str(t))
    return out


def main():
    with open(os.path.join(HERE, "print.txt"), "w") as out:
        for dtype, shape, formula, scale, shift in CASES:
            shape_text = ",".join(map(str, shape)) if shape else "-"
            out.write(f"case {dtype} {shape_text} {formula} {scale!r} {shift!r}\n")
            out.write(text(make(dtype, shape, formula, scale, shift), dtype) + "\n")


if __name__ == "__main__":
    main()

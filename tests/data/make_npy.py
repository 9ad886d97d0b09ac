#!/usr/bin/python3
"""Writes the .npy fixtures of the io suite with numpy (run once; the files are
committed). From the repository root, with Debian's python3-numpy:

    /usr/bin/python3 tests/data/make_npy.py

Element i (in row-major order of the array's shape) of each file is
value(dtype, i), the formula that tests/test_io.c repeats. np.save writes
version 1.0; numpy.lib.format.write_array writes 2.0 and 3.0 when asked.
"""
import os

import numpy as np
from numpy.lib import format as npy_format

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "npy")


def value(code, i):
    if code == "f4" or code == "f8":
        return (i - 7) * 0.375
    if code == "i4":
        return (i - 7) * 100003
    if code == "i8":
        return (i - 7) * 2**40 + 5
    return i % 3 == 0  # b1


def array(code, shape, order="C", byteorder="<"):
    n = int(np.prod(shape)) if shape else 1
    values = [value(code, i) for i in range(n)]
    dtype = np.dtype(byteorder + code if code != "b1" else "|b1")
    return np.array(values, dtype=dtype).reshape(shape, order="C").copy(order=order)


def save(name, a, version=None):
    with open(os.path.join(HERE, name), "wb") as f:
        if version is None:
            np.save(f, a)
        else:
            npy_format.write_array(f, a, version=version)


def main():
    os.makedirs(HERE, exist_ok=True)
    for code in ("f4", "f8", "i4", "i8", "b1"):
        save(f"{code}_C.npy", array(code, (2, 3, 4)))
        save(f"{code}_F.npy", array(code, (2, 3, 4), order="F"))
        save(f"{code}_v2.npy", array(code, (3, 5)), version=(2, 0))
    save("f4_v3.npy", array("f4", (4,)), version=(3, 0))
    save("f8_big.npy", array("f8", (2, 3), byteorder=">"))
    save("i4_big_F.npy", array("i4", (3, 4), order="F", byteorder=">"))
    save("i8_big_v2.npy", array("i8", (5,), byteorder=">"), version=(2, 0))
    save("f8_0d.npy", array("f8", ()))
    save("i8_empty.npy", array("i8", (0, 3)))
    save("f4_empty.npy", array("f4", (0,)))
    save("b1_1d.npy", array("b1", (7,)))
    save("f4_8d_F.npy", array("f4", (1, 2, 1, 2, 3, 2, 1, 2), order="F"))
    special = np.array([np.nan, np.inf, -np.inf, -0.0, 1e-45, 3.4028235e38], dtype="<f4")
    save("f4_special.npy", special)


if __name__ == "__main__":
    main()

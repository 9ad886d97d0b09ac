#!/usr/bin/python3
"""Writes tests/data/tensors.safetensors for the io suite (run once; the file is
committed). Plain Python, following the format of huggingface/safetensors:

    python3 tests/data/make_safetensors.py

An 8-byte little-endian header length, the JSON header padded with spaces to
a multiple of 8, then each tensor's little-endian bytes, in the order below
(not sorted by name, so that "the file's order" means something). Element i
of each tensor is value(code, i), the formula tests/test_io.c repeats.
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))

FORMATS = {"F32": "<f", "F64": "<d", "I32": "<i", "I64": "<q", "BOOL": "<?", "F16": "<e"}

# name, dtype, shape: every kiln dtype, a 0-d and an empty tensor, a dtype
# kiln does not have, and a name that needs escapes and is not ASCII.
TENSORS = [
    ("weight", "F32", [2, 3]),
    ("bias", "F64", [4]),
    ("ids", "I32", [3, 1, 2]),
    ("step", "I64", []),
    ("mask", "BOOL", [5]),
    ("half", "F16", [2]),
    ("empty", "F32", [0, 4]),
    ("na\u00efve \"name\"\n", "F32", [1]),
]


def value(code, i):
    if code in ("F32", "F64", "F16"):
        return (i - 2) * 0.5
    if code == "I32":
        return (i - 2) * 100003
    if code == "I64":
        return 2**40 + 5
    return i % 2 == 1  # BOOL


def main():
    header, data = {"__metadata__": {"format": "pt", "made by": "make_safetensors.py"}}, b""
    for name, code, shape in TENSORS:
        n = 1
        for s in shape:
            n *= s
        raw = b"".join(struct.pack(FORMATS[code], value(code, i)) for i in range(n))
        header[name] = {"dtype": code, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(HERE, "tensors.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Writes tests/data/onnx/*.onnx, seeds for tools/fuzz's ONNX loader (run
once; the files are committed; needs python3-onnx):

    python3 tests/data/make_onnx.py

small.onnx: y = softmax(relu(x @ w + b)) reshaped through Shape, Gather,
Unsqueeze and Concat, as PyTorch exports x.view(x.size(0), -1), so that a
mutation can reach the folding of constants and most of the loader's checks.
"""
import os

import numpy as np
from onnx import TensorProto, checker, helper, numpy_helper, save

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    inits = [numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4) / 10, "w"),
             numpy_helper.from_array(np.ones(4, dtype=np.float32), "b"),
             numpy_helper.from_array(np.array(0, dtype=np.int64), "zero"),
             numpy_helper.from_array(np.array([0], dtype=np.int64), "axes"),
             numpy_helper.from_array(np.array([-1], dtype=np.int64), "rest")]
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Gather", ["s", "zero"], ["n"], name="batch", axis=0),
             helper.make_node("Unsqueeze", ["n", "axes"], ["n1"], name="unsq"),
             helper.make_node("Concat", ["n1", "rest"], ["target"], name="cat", axis=0),
             helper.make_node("Reshape", ["x", "target"], ["flat"], name="flat"),
             helper.make_node("MatMul", ["flat", "w"], ["h"], name="mm"),
             helper.make_node("Add", ["h", "b"], ["h2"], name="bias"),
             helper.make_node("Relu", ["h2"], ["h3"], name="act"),
             helper.make_node("Softmax", ["h3"], ["y"], name="softmax", axis=-1)]
    model = helper.make_model(helper.make_graph(nodes, "small", [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", 14)])
    checker.check_model(model)
    os.makedirs(os.path.join(HERE, "onnx"), exist_ok=True)
    save(model, os.path.join(HERE, "onnx", "small.onnx"))


if __name__ == "__main__":
    main()

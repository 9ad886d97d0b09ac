"""Runs kiln-bench --quick with --json and --svg and checks what it wrote:
the JSON holds every workload with every field of docs/bench-json.md and
traced results that match eager; the SVG is well-formed with one group per
workload."""
import json
import math
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

WORKLOADS = ["gelu", "softmax", "layernorm", "mlp", "attention", "tiny", "mish", "rmsnorm", "silu", "softmax_row",
             "resnet50", "resnet50_b16", "gpt", "train_mlp", "train_gpt", "train_cnn"]
FIELDS = ["name", "size", "eager_ms", "traced_ms", "first_call_ms", "disk_hit_ms", "compile_ms", "disk_load_ms",
          "kernels",
          "peak_eager_bytes", "peak_traced_bytes", "max_abs_diff", "limit_ms", "limit_kind", "reps"]
RUN_FIELDS = ["system", "eager_label", "traced_label", "device", "threads", "quick", "machine",
              "probes", "workloads"]
# Traced runs the same eager kernels (INTERP): results agree to the last bit
# up to the order of commutative operands, so the bound is tight.
MAX_DIFF = 1e-5


def fail(why):
    print("check_bench: " + why)
    sys.exit(1)


def check_json(path):
    with open(path) as f:
        doc = json.load(f)
    if doc.get("schema") != "kiln-bench/1" or len(doc.get("runs", [])) != 1:
        fail("schema or runs missing")
    run = doc["runs"][0]
    for key in RUN_FIELDS:
        if key not in run:
            fail("run lacks " + key)
    if not run["probes"]["copy_gbps"] > 0 or not run["probes"]["sgemm_gflops"] > 0:
        fail("probes not measured")
    names = [w["name"] for w in run["workloads"]]
    if names != WORKLOADS:
        fail("workloads %s" % names)
    for w in run["workloads"]:
        for key in FIELDS:
            if key not in w:
                fail("%s lacks %s" % (w["name"], key))
        for key in ["eager_ms", "traced_ms", "first_call_ms", "disk_hit_ms", "compile_ms", "disk_load_ms"]:
            if not (isinstance(w[key], (int, float)) and w[key] > 0):
                fail("%s: %s is %r" % (w["name"], key, w[key]))
        if w["max_abs_diff"] is None or not math.isfinite(w["max_abs_diff"]) or w["max_abs_diff"] > MAX_DIFF:
            fail("%s: traced differs from eager by %r" % (w["name"], w["max_abs_diff"]))
        if w["kernels"] < 1:
            fail("%s: no kernels" % w["name"])
        if (w["limit_kind"] is None) != (w["name"] == "tiny"):
            fail("%s: limit_kind %r" % (w["name"], w["limit_kind"]))
        # A training step's limit is its products, forward and backward, timed alone.
        if w["name"].startswith("train_") and not (w["limit_kind"] == "compute" and w["gemm_gflop"] > 0):
            fail("%s: limit %r of %r GFLOP" % (w["name"], w["limit_kind"], w["gemm_gflop"]))
    check_serve(run)


def check_serve(run):
    serve = run.get("serve")
    if not serve or serve.get("calls", 0) < 1:
        fail("serve missing")
    for mode in ["eager", "static", "static_limited", "dynamic"]:
        m = serve[mode]
        if not (m["total_ms"] > 0 and m["p50_ms"] > 0 and m["p99_ms"] >= m["p50_ms"]):
            fail("serve %s: times %r" % (mode, m))
        if mode != "eager" and not (m["max_abs_diff"] is not None and m["max_abs_diff"] <= 1e-4):
            fail("serve %s differs from eager by %r" % (mode, m["max_abs_diff"]))
    # Dynamic shapes trace the first size, then once symbolically, and a
    # batch of 1 apart: at most three traces for every batch size.
    traces = [serve[m]["traces"] for m in ["static", "static_limited", "dynamic"]]
    if not (traces[0] > 8 and traces[1] == 8 and 1 <= traces[2] <= 3):
        fail("serve traces (static, static with limit 8, dynamic): %r" % traces)
    if len(serve["warm"]) != 4 or not all(w["static_ms"] > 0 and w["dynamic_ms"] > 0 for w in serve["warm"]):
        fail("serve warm calls %r" % serve["warm"])


MATMUL_SHAPES = ["square", "square", "mlp up", "mlp down", "attention q@k^T", "attention w@v", "tall-skinny",
                 "batched", "gpt linear"]


def check_matmul(path):
    with open(path) as f:
        run = json.load(f)["runs"][0]
    for key in RUN_FIELDS:
        if key not in run:
            fail("matmul run lacks " + key)
    mm = run.get("matmul")
    if run["workloads"] != [] or not mm or not mm["openblas_core"]:
        fail("matmul family: %r" % mm)
    if [s["name"] for s in mm["shapes"]] != MATMUL_SHAPES:
        fail("matmul shapes %s" % [s["name"] for s in mm["shapes"]])
    for s in mm["shapes"]:
        if not (s["kiln_gflops"] > 0 and s["openblas_gflops"] > 0 and min(s["batch"], s["m"], s["k"], s["n"]) > 0):
            fail("matmul %s: %r" % (s["name"], s))
        if mm["forced_core"] is None and s["forced_gflops"] is not None:
            fail("matmul %s: forced figure without a forced core" % s["name"])


def check_svg(path):
    root = ET.parse(path).getroot()
    ns = "{http://www.w3.org/2000/svg}"
    groups = [g.get("id") for g in root.iter(ns + "g")]
    if groups != ["workload-" + n for n in WORKLOADS]:
        fail("svg groups %s" % groups)


def main():
    bench = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([bench, "--quick", "--json", tmp + "/b.json", "--svg", tmp + "/b.svg"], check=True)
        check_json(tmp + "/b.json")
        check_svg(tmp + "/b.svg")
        subprocess.run([bench, "--quick", "--workload", "matmul", "--json", tmp + "/m.json"], check=True,
                       stdout=subprocess.DEVNULL)
        check_matmul(tmp + "/m.json")
    print("check_bench: json and svg are complete, the matmul family's json too")


main()

#!/bin/sh
# A bundle that kiln-onnx precompiles from an ONNX model for this host runs
# in a fresh process under KILN_CACHE=require with nothing compiled.
#   onnx_bundle.sh KILN_ONNX KILN_CACHE MODEL WORK_DIR
set -eu
tool=$1 cache_tool=$2 model=$3 work=$4
if [ ! -f "$model" ]; then
    echo "SKIP: $model is absent (Debian: libonnx-testdata)"
    exit 77
fi
dir=$(mktemp -d "$work/onnx-bundle-XXXXXX")
trap 'rm -rf "$dir"' EXIT
"$tool" precompile "$model" --target host --bundle "$dir/model.bundle"
mkdir -m 700 "$dir/deploy"
"$cache_tool" --dir "$dir/deploy" import "$dir/model.bundle"
said=$(KILN_CACHE=require KILN_CACHE_DIR="$dir/deploy" "$tool" run "$model" 2>&1 >/dev/null)
echo "$said"
echo "$said" | grep -q "kernels compiled 0, from the disk cache [1-9]"

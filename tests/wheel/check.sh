#!/usr/bin/env bash
# tests/wheel/check.sh — what `make test-wheel` runs: the product as a user installs it. A fresh
# venv, torch, then `pip install .` from this checkout (pip's isolated build: scikit-build-core
# and CMake, CMakeLists.txt); then, from a directory outside the checkout, `ortmod-train --help`,
# a short ortmod-train run, the demo with ORTModule, and a check that what ran is the installed
# package (its _C, its ortmod/bin/ortmod-train and, where nvcc and cuBLAS were found by the build,
# its libortmod_cuda.so), not the source tree.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
V=${WHEEL_VENV:-$ROOT/build/wheel-venv}
rm -rf "$V"
python3 -m venv "$V"
"$V/bin/pip" install -q --disable-pip-version-check torch==2.13.0
# where nvcc is here and the checkout's .venv holds the cuBLAS wheel (make setup installs it), the
# isolated build is pointed at it, so that the wheel must carry the CUDA provider
NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
CUBLAS=$(ls -d "$ROOT"/.venv/lib/python3*/site-packages/nvidia/cu*/include/cublas_v2.h 2>/dev/null | head -1 || true)
WANT_CUDA=0
if [ -n "$NVCC" ] && [ -n "$CUBLAS" ]; then export CUBLAS_ROOT=$(dirname "$(dirname "$CUBLAS")"); WANT_CUDA=1; fi
"$V/bin/pip" install -q --disable-pip-version-check "$ROOT"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
cd "$W"
"$V/bin/ortmod-train" --help | head -3
"$V/bin/python" - "$ROOT" "$WANT_CUDA" <<'PY'
import os, sys, glob
import ortmod, ortmod._C
from ortmod.runner import find_binary
root = sys.argv[1]
pkg = os.path.dirname(ortmod.__file__)
assert not pkg.startswith(root + os.sep + "ortmod"), f"imported the source tree's ortmod: {pkg}"
binary = find_binary()
assert binary == os.path.join(pkg, "bin", "ortmod-train"), binary
if sys.argv[2] == "1":
    assert os.path.isfile(os.path.join(pkg, "libortmod_cuda.so")), "nvcc and cuBLAS were there, the CUDA provider is not"
print("installed:", sorted(os.path.relpath(p, pkg) for p in glob.glob(os.path.join(pkg, "**", "*"), recursive=True)
                           if p.endswith(".so") or "/bin/" in p))
PY
# a few updates of an MLP through the runner: shards written with the package's own helper
"$V/bin/python" - <<'PY'
import warnings, numpy as np, torch
from ortmod.runner import write_shards
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    torch.onnx.export(m, (torch.zeros(2, 6),), "mlp.onnx", input_names=["x"], output_names=["logits"],
                      dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}}, dynamo=False)
rng = np.random.default_rng(0)
write_shards("train", {"x": rng.standard_normal((64, 6)).astype(np.float32),
                       "labels": rng.integers(0, 3, 64).astype(np.int64)})
PY
"$V/bin/ortmod-train" --model mlp.onnx --train_data_dir train --output_dir out --num_train_steps 8 \
    --train_batch_size 8 --display_loss_steps 4 | tail -2
test -f out/trained_model.onnx
cp "$ROOT/demo/train_mlp.py" .
"$V/bin/python" train_mlp.py | tail -4
echo "test-wheel: the installed package trains"

#!/usr/bin/env bash
# tests/gpu/run.sh — the one GPU check: on a GPU machine (torch with CUDA present; no package
# registries) it makes the extension and the CUDA provider importable, runs tests/gpu and the
# GPT-2 124M benchmark, and writes everything to $OUT (or ./gpu-results) within ~5 minutes.
#
#   extension: ortmod/_C*.so if it imports; else the prebuilt ones carried in build/gpu-carry
#              (tests/gpu/prepare.sh: one per CPython found there) with their libraries; else the
#              one build (CMakeLists.txt, where cmake exists) against the carried headers,
#              libraries and generated code
#   provider:  the carried libortmod_cuda.so (built for sm_90 by prepare.sh); else built there
#              when cmake and nvcc exist (cuBLAS from the nvidia wheels next to torch)
set -uo pipefail
cd "$(dirname "$0")/../.."
RES=${OUT:-gpu-results}
mkdir -p "$RES"
LOG="$RES/run.log"
exec > >(tee -a "$LOG") 2>&1
T0=$(date +%s)
echo "== $(date -u) on $(hostname); $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
PY=${PY:-}
for c in .venv/bin/python python3 python; do
    [ -n "$PY" ] && break
    command -v "$c" >/dev/null 2>&1 && "$c" -c "import torch" 2>/dev/null && PY=$(command -v "$c")
done
[ -n "$PY" ] || { echo "no python with torch"; exit 1; }
echo "python: $PY ($("$PY" -c 'import torch,sys; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'))"

CARRY=build/gpu-carry
# prepare.sh carries the shared objects xz-compressed
"$PY" - "$CARRY" <<'PYXZ'
import lzma, os, sys
for d, _, files in os.walk(sys.argv[1]):
    for f in files:
        if f.endswith(".xz"):
            p = os.path.join(d, f)
            with lzma.open(p) as src, open(p[:-3], "wb") as dst:
                dst.write(src.read())
            os.chmod(p[:-3], 0o755)
PYXZ
if [ -d "$CARRY/lib" ]; then export LD_LIBRARY_PATH="$PWD/$CARRY/lib:${LD_LIBRARY_PATH:-}"; fi
# the nvidia wheels next to torch: cuBLAS (and its headers when the wheel has them)
NV=$("$PY" - <<'PY' 2>/dev/null
import os, torch
site = os.path.dirname(os.path.dirname(torch.__file__))
for d in ("nvidia/cu13", "nvidia/cublas"):
    p = os.path.join(site, d)
    if os.path.isdir(os.path.join(p, "lib")):
        print(p); break
PY
)
[ -n "$NV" ] && export LD_LIBRARY_PATH="$NV/lib:${LD_LIBRARY_PATH:-}"

if ! "$PY" -c "import ortmod._C" 2>/dev/null; then
    # the carried builds (one per CPython prepare.sh found); else a build here against the
    # carried headers and libraries (the unversioned names the linker wants made here)
    if ls "$CARRY"/_C*.so >/dev/null 2>&1; then cp "$CARRY"/_C*.so ortmod/; fi
    if ! "$PY" -c "import ortmod._C" 2>/dev/null; then
        for l in "$CARRY"/lib/libprotobuf-c.so.* "$CARRY"/lib/libopenblas.so.*; do
            case "$l" in *.xz) continue ;; esac
            [ -e "$l" ] && ln -sf "$(basename "$l")" "${l%%.so.*}.so"
        done
        command -v cmake >/dev/null 2>&1 || { echo "no carried extension for this Python, and no cmake to build one"; exit 1; }
        echo "building the extension"
        cmake -S . -B build/gpu -DPython_EXECUTABLE="$PY" -DORTMOD_CUDA=OFF -DORTMOD_TEST_HARNESSES=OFF \
            -DORTMOD_ONNX_GEN="$PWD/$CARRY/gen" -DCMAKE_INCLUDE_PATH="$PWD/$CARRY/include" \
            -DCMAKE_LIBRARY_PATH="$PWD/$CARRY/lib" >/dev/null && cmake --build build/gpu --target _C \
            && cp build/gpu/_C*.so ortmod/ || { echo "extension build failed"; exit 1; }
    fi
fi
"$PY" -c "import ortmod._C" || { echo "ortmod._C does not import"; exit 1; }

if [ -f "$CARRY/libortmod_cuda.so" ]; then
    cp "$CARRY/libortmod_cuda.so" ortmod/
elif command -v cmake >/dev/null 2>&1; then
    echo "building the CUDA provider"
    cmake -S . -B build/gpu-cuda -DPython_EXECUTABLE="$PY" -DORTMOD_CUDA=ON -DORTMOD_TEST_HARNESSES=OFF \
        -DORTMOD_CUDA_ARCHS="${CUDA_ARCHS:-90}" -DORTMOD_ONNX_GEN="$PWD/$CARRY/gen" ${NV:+-DCUBLAS_ROOT="$NV"} \
        -DCMAKE_INCLUDE_PATH="$PWD/$CARRY/include" -DCMAKE_LIBRARY_PATH="$PWD/$CARRY/lib" >/dev/null \
        && cmake --build build/gpu-cuda --target ortmod_cuda && cp build/gpu-cuda/libortmod_cuda.so ortmod/ \
        || echo "provider build failed"
fi
ls -la ortmod/libortmod_cuda.so || echo "NO CUDA PROVIDER: the GPU tests will skip"

echo "== GPU tests ($(( $(date +%s) - T0 ))s)"
timeout 150 "$PY" -m pytest tests/gpu -q -x --no-header -p no:cacheprovider -rs 2>&1 | tail -60 | tee "$RES/gpu_tests.txt"
LEFT=$(( 290 - ($(date +%s) - T0) ))
echo "== benchmark (budget ${LEFT}s)"
if [ "$LEFT" -gt 40 ]; then
    timeout $((LEFT + 10)) "$PY" tests/gpu/bench_gpt2.py --out "$RES" --budget $((LEFT - 15)) 2>&1 | tail -40
fi
echo "== done in $(( $(date +%s) - T0 ))s; results in $RES"

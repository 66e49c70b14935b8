#!/usr/bin/env bash
# tests/gpu/prepare.sh — run HERE (the build machine) before a GPU run: collects what a bare GPU
# machine (torch + CUDA driver, no package registries, maybe no compilers) needs into
# build/gpu-carry/ (~13 MB, xz-compressed; the tree that travels is limited to 64 MiB): the
# extension built for this venv's CPython and for 3.12 / 3.13 where found here (the GPU image's
# python3 has been 3.12), the shared libraries it links that are not part of a base system
# (protobuf-c, OpenBLAS + gfortran), the headers and generated code to build it there for any
# other CPython (where cmake exists), and the CUDA provider built for sm_90.
# Then: run(command="bash tests/gpu/run.sh", carry=["build/gpu-carry"]).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
C=build/gpu-carry
rm -rf "$C"; mkdir -p "$C/lib" "$C/include"
make -s --no-print-directory build CMAKE_ARGS="-DORTMOD_CUDA_ARCHS=${CUDA_ARCHS:-90}" >/dev/null
cp ortmod/_C*.so "$C/"
[ -f ortmod/libortmod_cuda.so ] && cp ortmod/libortmod_cuda.so "$C/"
cp -r build/cmake/gen "$C/gen"   # the protobuf-c code, for a build there (no onnx or protoc-c needed)
# the extension for the other CPythons found here (the GPU image's python3 has been 3.12), each
# the one build configured for that interpreter, only its _C target
for v in 3.12 3.13; do
    exe=""   # a real interpreter (pyenv's shims exist for versions it does not select)
    for c in "$HOME"/.pyenv/versions/"$v".*/bin/"python$v" /usr/bin/"python$v" /usr/local/bin/"python$v"; do
        [ -x "$c" ] && "$c" -c "" 2>/dev/null && { exe=$c; break; }
    done
    [ -n "$exe" ] || continue
    { cmake -S . -B "build/py$v" -G Ninja -DPython_EXECUTABLE="$exe" -DORTMOD_CUDA=OFF -DORTMOD_TEST_HARNESSES=OFF \
        -DORTMOD_ONNX_GEN="$PWD/build/cmake/gen" >/dev/null && cmake --build "build/py$v" --target _C >/dev/null \
        && cp "build/py$v"/_C*.so "$C/"; } || echo "extension build for python$v failed"
done
# headers, so that run.sh can build the extension there for any other CPython (with the
# libraries below; the machine's gcc and Python.h)
mkdir -p "$C/include/protobuf-c" "$C/include/dlpack"
cp /usr/include/protobuf-c/protobuf-c.h "$C/include/protobuf-c/"
cp /usr/include/dlpack/dlpack.h "$C/include/dlpack/"
cblas=$(readlink -f /usr/include/x86_64-linux-gnu/cblas.h)
cp "$cblas" "$(dirname "$cblas")/openblas_config.h" "$C/include/"
for so in "$C"/_C*.so; do
    ldd "$so" | awk '/=> \// {print $3}' | while read -r lib; do
        case "$(basename "$lib")" in
            libc.so*|libm.so*|libgcc_s.so*|libpthread.so*|libdl.so*|librt.so*|libstdc++.so*) ;;
            *) cp -L "$lib" "$C/lib/" ;;
        esac
    done
done
# xz (~55 MB -> ~8 MB: the working tree that travels is limited to 64 MiB); run.sh unpacks with
# Python's lzma, which every CPython has
"$PY" - "$C" <<'PYXZ'
import lzma, os, sys
for d, _, files in os.walk(sys.argv[1]):
    for f in files:
        if f.endswith((".so", ".so.0", ".so.1", ".so.5")) or ".so." in f:
            p = os.path.join(d, f)
            with open(p, "rb") as src, lzma.open(p + ".xz", "wb", preset=6) as dst:
                dst.write(src.read())
            os.remove(p)
PYXZ
du -sh "$C"

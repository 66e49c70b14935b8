#!/usr/bin/env bash
# tests/gpu/prepare.sh — run HERE (the build machine) before a GPU run: collects what a bare GPU
# machine (torch + CUDA driver, no package registries, maybe no compilers) needs into
# build/gpu-carry/ (< 64 MiB): the built extension and the shared libraries it links that are
# not part of a base system (protobuf-c, OpenBLAS + gfortran), the CUDA provider built for sm_90,
# and the cuBLAS headers (to rebuild the provider there when nvcc exists).
# Then: run(command="bash tests/gpu/run.sh", carry=["build/gpu-carry", "csrc/graph/gen"]).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
C=build/gpu-carry
rm -rf "$C"; mkdir -p "$C/lib" "$C/include"
"$PY" setup.py -q build_ext --inplace >/dev/null
CUDA_ARCHS=${CUDA_ARCHS:-90} bash cuda/build.sh
cp ortmod/_C*.so "$C/"
[ -f ortmod/libortmod_cuda.so ] && cp ortmod/libortmod_cuda.so "$C/"
for so in ortmod/_C*.so; do
    ldd "$so" | awk '/=> \// {print $3}' | while read -r lib; do
        case "$(basename "$lib")" in
            libc.so*|libm.so*|libgcc_s.so*|libpthread.so*|libdl.so*|librt.so*|libstdc++.so*) ;;
            *) cp -L "$lib" "$C/lib/" ;;
        esac
    done
done
cp build/cuda-deps/include/*.h "$C/include/" 2>/dev/null || true
du -sh "$C"

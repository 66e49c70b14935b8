#!/usr/bin/env bash
# cuda/build.sh — builds the CUDA execution provider, ortmod/libortmod_cuda.so (what `make cuda`
# runs). Where the toolkit is missing it prints why and exits 0: the CPU build never needs it.
#
#   nvcc        $NVCC, else `nvcc` on PATH, else /usr/local/cuda*/bin/nvcc
#   cuBLAS      $CUBLAS_HOME (include/ and lib/), else the toolkit's own, else the venv's
#               nvidia-cublas wheel (nvidia/cu13 or nvidia/cublas) — installed into .venv here when
#               missing (pip, idempotent; CUBLAS_NO_INSTALL=1 to forbid)
#   GPUs        $CUDA_ARCHS, default "90" SASS + compute_80 PTX (JIT on Ampere and newer)
#
# Objects go to build/cuda-obj/ and are recompiled only when their .cu or a header changed; every
# .cu is compiled (a compile error fails the build). The cuBLAS headers used are copied to
# build/cuda-deps/include so a GPU machine without registries can be handed them (tests/gpu/run.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=ortmod/libortmod_cuda.so
OBJ=build/cuda-obj
DEPS=build/cuda-deps

skip() { echo "cuda: skipped: $*"; exit 0; }

NVCC=${NVCC:-$(command -v nvcc 2>/dev/null || true)}
if [ -z "$NVCC" ]; then
    for c in /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc; do [ -x "$c" ] && NVCC=$c && break; done
fi
[ -n "$NVCC" ] || skip "nvcc not found (the CUDA provider is built where the CUDA toolkit is installed)"
MAJOR=$("$NVCC" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
[ -n "$MAJOR" ] || skip "cannot tell the CUDA version of $NVCC"
if [ -z "${CUDA_HOME:-}" ]; then   # nvcc may be a wrapper script: look for the toolkit's headers
    for c in "$(dirname "$(readlink -f "$NVCC")")/.." /usr/local/cuda-"$MAJOR"* /usr/local/cuda; do
        if [ -f "$c/include/cuda_runtime.h" ] || [ -f "$c/targets/x86_64-linux/include/cuda_runtime.h" ]; then
            CUDA_HOME=$(cd "$c" && pwd); break
        fi
    done
fi
[ -n "${CUDA_HOME:-}" ] || skip "no CUDA runtime headers found for $NVCC (set CUDA_HOME)"

site_dirs() {
    [ -x "$PY" ] && "$PY" - <<'PY' 2>/dev/null || true
import site, sysconfig
for d in [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]] + site.getsitepackages():
    print(d)
PY
}

find_cublas() {   # prints a directory with include/cublas_v2.h and lib/
    local d
    for d in ${CUBLAS_HOME:-} "$DEPS" "$CUDA_HOME" "$CUDA_HOME/targets/x86_64-linux"; do
        [ -f "$d/include/cublas_v2.h" ] && [ -d "$d/lib" -o -d "$d/lib64" ] && { echo "$d"; return; }
    done
    for s in $(site_dirs); do
        for d in "$s/nvidia/cu$MAJOR" "$s/nvidia/cublas"; do
            [ -f "$d/include/cublas_v2.h" ] && { echo "$d"; return; }
        done
    done
}

CUBLAS=$(find_cublas || true)   # not found is not an error here (set -e)
if [ -z "$CUBLAS" ] && [ "${CUBLAS_NO_INSTALL:-0}" != 1 ] && [ -x "$PY" ]; then
    case "$MAJOR" in
        13) PKG="nvidia-cublas==13.10.0.20" ;;
        12) PKG="nvidia-cublas-cu12" ;;
        *) PKG="" ;;
    esac
    if [ -n "$PKG" ]; then
        echo "cuda: installing cuBLAS headers and libraries into .venv ($PKG)"
        "$PY" -m pip install -q --disable-pip-version-check --no-deps "$PKG" || true
        CUBLAS=$(find_cublas || true)
    fi
fi
[ -n "$CUBLAS" ] || skip "cuBLAS headers not found (set CUBLAS_HOME, or pip install nvidia-cublas into .venv)"
LIBDIR=$CUBLAS/lib
[ -d "$LIBDIR" ] || LIBDIR=$CUBLAS/lib64

# keep a copy of the headers (small) for machines that cannot reach a registry
if [ "$CUBLAS" != "$DEPS" ]; then
    mkdir -p "$DEPS/include"
    cp -u "$CUBLAS"/include/cublas*.h "$DEPS/include/" 2>/dev/null || true
fi

ARCH_FLAGS=""
for a in ${CUDA_ARCHS:-90}; do ARCH_FLAGS="$ARCH_FLAGS -gencode arch=compute_$a,code=sm_$a"; done
[ -n "${CUDA_ARCHS:-}" ] || ARCH_FLAGS="$ARCH_FLAGS -gencode arch=compute_80,code=compute_80"

NVFLAGS="-std=c++17 -O3 -Xcompiler -fPIC,-fvisibility=hidden -Icuda -Icsrc -Icsrc/include -I$CUBLAS/include \
 --expt-relaxed-constexpr -Xcudafe --diag_suppress=177 $ARCH_FLAGS"
mkdir -p "$OBJ"
# the headers a .cu may include: cuda's own, and the engine's (op.h, the shared geometry headers
# spatial.h, matmul_geom.h, slice_geom.h, ...): any newer than an object rebuilds it
HDRS="cuda/*.h cuda/*.cuh csrc/ops/*.h csrc/graph/ir.h csrc/core/core.h csrc/include/ortmod.h"
STAMP_FLAGS="$OBJ/flags"
echo "$NVCC $NVFLAGS" > "$STAMP_FLAGS.new"
cmp -s "$STAMP_FLAGS.new" "$STAMP_FLAGS" || { mv "$STAMP_FLAGS.new" "$STAMP_FLAGS"; rm -f "$OBJ"/*.o; }
rm -f "$STAMP_FLAGS.new"

todo=()
for src in cuda/*.cu; do
    o="$OBJ/$(basename "${src%.cu}").o"
    if [ ! -f "$o" ] || [ "$src" -nt "$o" ] || [ -n "$(find $HDRS -newer "$o" 2>/dev/null | head -1)" ]; then
        todo+=("$src")
    fi
done
if [ ${#todo[@]} -gt 0 ]; then
    echo "cuda: compiling ${#todo[@]} file(s) with $NVCC (CUDA $MAJOR, cuBLAS from $CUBLAS)"
    export NVCC NVFLAGS OBJ
    printf '%s\n' "${todo[@]}" | xargs -P "${CUDA_JOBS:-$(nproc)}" -I{} bash -c \
        'o="$OBJ/$(basename "${1%.cu}").o"; $NVCC $NVFLAGS -c "$1" -o "$o.tmp" && mv "$o.tmp" "$o"' _ {}
fi

need_link=0
[ -f "$OUT" ] || need_link=1
for o in "$OBJ"/*.o; do [ "$o" -nt "$OUT" ] && need_link=1; done
if [ $need_link = 1 ]; then
    # libcublas.so.N is what torch's CUDA wheels ship too; rpath finds the venv's copy, and a
    # process that already loaded torch's cuBLAS reuses it by soname
    lib_cublas=-lcublas; lib_lt=-lcublasLt
    [ -e "$LIBDIR/libcublas.so" ] || lib_cublas="-l:libcublas.so.$MAJOR"
    [ -e "$LIBDIR/libcublasLt.so" ] || lib_lt="-l:libcublasLt.so.$MAJOR"
    rel=$(realpath --relative-to=ortmod "$LIBDIR" 2>/dev/null || echo "$LIBDIR")
    "$NVCC" -shared -o "$OUT.tmp" "$OBJ"/*.o -L"$LIBDIR" $lib_cublas $lib_lt -cudart static \
        -Xlinker -rpath,"\$ORIGIN/$rel" -Xlinker -rpath,"$LIBDIR" -Xlinker --no-undefined -lpthread
    mv "$OUT.tmp" "$OUT"
    echo "cuda: built $OUT"
fi

"""Builds the ortmod._C extension: the C11 engine (csrc/) plus the CPython binding (python/).

The ONNX protobuf bindings are generated here with protoc-c from the onnx.proto that the
installed `onnx` package ships, so the parser always matches the exporter's schema.
"""
import glob
import os
import shutil
import subprocess
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
GEN = os.path.join(ROOT, "csrc", "graph", "gen")


def generate_onnx_protobuf():
    """protoc-c onnx.proto -> csrc/graph/gen/onnx.pb-c.{c,h}; skipped when up to date. Bindings
    that were generated already are used as they are where onnx or protoc-c is missing (a GPU
    machine builds from the carried csrc/graph/gen: tests/gpu/run.sh)."""
    out_c = os.path.join(GEN, "onnx.pb-c.c")
    try:
        import onnx
    except ImportError:
        onnx = None
    if os.path.exists(out_c) and (onnx is None or shutil.which("protoc-c") is None):
        return out_c
    if onnx is None:
        raise RuntimeError("building the ONNX parser needs the onnx package (for its onnx.proto)")
    proto = os.path.join(os.path.dirname(onnx.__file__), "onnx.proto")
    if os.path.exists(out_c) and os.path.getmtime(out_c) >= os.path.getmtime(proto):
        return out_c
    if shutil.which("protoc-c") is None:
        raise RuntimeError("protoc-c not found: install Debian's protobuf-c-compiler (make setup does)")
    os.makedirs(GEN, exist_ok=True)
    shutil.copy(proto, os.path.join(GEN, "onnx.proto"))
    subprocess.check_call(["protoc-c", "--c_out=.", "onnx.proto"], cwd=GEN)
    return out_c


class BuildExt(build_ext):
    def run(self):
        generate_onnx_protobuf()
        ext = self.extensions[0]
        ext.sources = sorted(set(ext.sources) | {os.path.relpath(os.path.join(GEN, "onnx.pb-c.c"), ROOT)})
        super().run()


def engine_sources():
    srcs = []
    for sub in ("core", "graph", "ops", "passes", "autodiff", "plan", "exec", "optim"):
        srcs += glob.glob(os.path.join("csrc", sub, "*.c"))
    srcs += glob.glob(os.path.join("python", "*.c"))
    return sorted(srcs)


# ORTMOD_DEBUG=1: an ASan + UBSan build (load it with LD_PRELOAD=$(gcc -print-file-name=libasan.so)).
# -fno-wrapv undoes the -fwrapv of Python's own CFLAGS, under which UBSan cannot see signed overflow;
# any undefined behaviour aborts (-fno-sanitize-recover), so that a test fails on it. Built out of
# place (build_ext --build-lib build/san), it is what tests/test_hostile_input.py runs under
# with ORTMOD_HOSTILE_SO.
debug = os.environ.get("ORTMOD_DEBUG") == "1"
sanitize = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"]
extra = ["-std=c11", "-fvisibility=hidden", "-Wall", "-Wextra", "-Wno-unused-parameter",
         "-Wno-missing-field-initializers", "-Wno-sign-compare"]
extra += ["-O1", "-g", "-fno-omit-frame-pointer", "-fno-wrapv", *sanitize] if debug else ["-O3"]

setup(
    ext_modules=[
        Extension(
            "ortmod._C",
            sources=engine_sources(),
            include_dirs=["csrc", "csrc/include", "csrc/graph/gen"],
            libraries=["protobuf-c", "openblas", "m"],
            extra_compile_args=extra,
            extra_link_args=sanitize if debug else [],
            define_macros=[("_GNU_SOURCE", "1"), ("NDEBUG", "1")],   # no assert() left in, generated code included
        )
    ],
    cmdclass={"build_ext": BuildExt},
)

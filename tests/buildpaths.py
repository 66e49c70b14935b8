"""Where the one build (CMakeLists.txt, run by `make build`) puts what the tests run, and the
call that brings it up to date (incremental: seconds when nothing changed)."""
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD_DIR = os.path.join(ROOT, "build", "cmake")            # the Makefile's BUILD_DIR
RUNNER = os.path.join(ROOT, "ortmod", "bin", "ortmod-train")   # installed into the source tree
CUDA_SO = os.path.join(ROOT, "ortmod", "libortmod_cuda.so")
ENGINE_LIB = os.path.join(BUILD_DIR, "libortmod_engine.a")
# what a C program linked against the engine library needs besides it
ENGINE_LINK = [ENGINE_LIB, "-lprotobuf-c", "-lopenblas", "-lm", "-lpthread", "-ldl"]


def build():
    """`make build`; returns the completed process (stdout and stderr captured, as text)."""
    return subprocess.run(["make", "-s", "--no-print-directory", "build"], cwd=ROOT, capture_output=True,
                          text=True, timeout=1800)

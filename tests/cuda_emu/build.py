"""Builds the CUDA provider for the CPU emulator: build/cuda-emu/libortmod_cuda_emu.so, from the
real cuda/*.cu (rewritten by preprocess.py, compiled as C++ by g++ against the shim headers in
tests/cuda_emu/include) and tests/cuda_emu/emu.cpp. The engine loads it like the real provider
when ORTMOD_CUDA_LIBRARY points at it.

Incremental: a file is recompiled when its source, any header g++ reported it including
(cuda/*.cuh, csrc/ headers, the shims), the preprocessor or the flags changed; the library is
relinked when an object changed. Files compile in parallel, with -O1 (fast enough to compile,
fast enough to run). Run directly to build: `.venv/bin/python tests/cuda_emu/build.py`.
"""
import concurrent.futures
import importlib.util
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(ROOT, "build", "cuda-emu")
LIB = os.path.join(OUT, "libortmod_cuda_emu.so")


def _load_preprocess():
    """preprocess.py by path: the test process keeps tests/cuda_emu off sys.path."""
    spec = importlib.util.spec_from_file_location("cuda_emu_preprocess", os.path.join(HERE, "preprocess.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


preprocess = _load_preprocess()

CXX = os.environ.get("CXX", "g++")
# small enough that the parity cases' convolutions take one or several im2col chunks
DEFINES = ["-DCONV_SCRATCH_BYTES=((size_t)4096)"]
COMMON = ["-std=gnu++17", "-O1", "-fPIC", "-fno-strict-aliasing", "-I" + os.path.join(HERE, "include"),
          "-I" + os.path.join(ROOT, "csrc"), "-I" + os.path.join(ROOT, "csrc", "include")]
PROVIDER = COMMON + DEFINES + ["-fvisibility=hidden", "-I" + os.path.join(ROOT, "cuda"),
                               "-include", os.path.join(HERE, "include", "emu.h")]
EXTRA = os.environ.get("ORTMOD_EMU_CXXFLAGS", "").split()   # e.g. -g for debugging


class CompilerMissing(Exception):
    pass


class BuildError(Exception):
    pass


def _mtime(path):
    try:
        return os.stat(path).st_mtime_ns
    except FileNotFoundError:
        return -1


def _deps(dfile):
    """The files a -MMD dependency file lists."""
    try:
        with open(dfile) as f:
            text = f.read().replace("\\\n", " ")
    except FileNotFoundError:
        return None
    _, _, deps = text.partition(":")
    return deps.split()


def _stale(obj, inputs, dfile):
    t = _mtime(obj)
    if t < 0:
        return True
    deps = _deps(dfile)
    if deps is None:
        return True
    return any(_mtime(p) > t for p in list(inputs) + deps)


def _compile(src, obj, flags):
    dfile = obj[:-2] + ".d"
    tmp = obj + ".tmp"
    cmd = [CXX] + flags + EXTRA + ["-MMD", "-MF", dfile, "-MT", obj, "-c", src, "-o", tmp]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return f"$ {' '.join(cmd)}\n{r.stdout}{r.stderr}"
    os.replace(tmp, obj)
    return None


def _flags_changed(stamp, text):
    try:
        with open(stamp) as f:
            if f.read() == text:
                return False
    except FileNotFoundError:
        pass
    return True


def build(jobs=None, verbose=False):
    """Builds (or finds up to date) the emulated provider; returns the library's path.
    Raises CompilerMissing when there is no C++ compiler and BuildError when a file fails."""
    if shutil.which(CXX) is None:
        raise CompilerMissing(f"no C++ compiler ({CXX}) on PATH")
    src_dir, obj_dir = os.path.join(OUT, "src"), os.path.join(OUT, "obj")
    os.makedirs(src_dir, exist_ok=True)
    os.makedirs(obj_dir, exist_ok=True)
    stamp = os.path.join(obj_dir, "flags")
    stamp_text = "\n".join([CXX] + PROVIDER + COMMON + EXTRA)
    if _flags_changed(stamp, stamp_text):
        for f in os.listdir(obj_dir):
            os.remove(os.path.join(obj_dir, f))
        with open(stamp, "w") as f:
            f.write(stamp_text)

    cuda_dir = os.path.join(ROOT, "cuda")
    sources = [os.path.join(cuda_dir, n) for n in sorted(os.listdir(cuda_dir)) if n.endswith(".cu")]
    sources.append(os.path.join(HERE, "selftest.cu"))   # the checks' own test kernels
    todo = []
    for cu in sources:
        name = os.path.basename(cu)
        cpp = os.path.join(src_dir, name[:-3] + ".cpp")
        if _mtime(cpp) < max(_mtime(cu), _mtime(preprocess.__file__)):
            try:
                preprocess.rewrite_file(cu, cpp, os.path.relpath(cu, ROOT))
            except ValueError as e:
                raise BuildError(str(e)) from None
        obj = os.path.join(obj_dir, name[:-3] + ".o")
        todo.append((cpp, obj, PROVIDER, [cu]))
    emu_src = os.path.join(HERE, "emu.cpp")
    todo.append((emu_src, os.path.join(obj_dir, "emu.o"), COMMON, [emu_src]))

    stale = [(s, o, fl) for s, o, fl, inputs in todo if _stale(o, inputs + [s], o[:-2] + ".d")]
    if stale:
        if verbose:
            print(f"cuda-emu: compiling {len(stale)} file(s)", flush=True)
        with concurrent.futures.ThreadPoolExecutor(jobs or os.cpu_count() or 2) as pool:
            errors = [e for e in pool.map(lambda t: _compile(*t), stale) if e]
        if errors:
            raise BuildError("\n".join(errors))

    objs = [o for _, o, _, _ in todo]
    if _mtime(LIB) < max(_mtime(o) for o in objs):
        tmp = LIB + ".tmp"
        cmd = [CXX, "-shared", "-o", tmp] + objs + ["-lpthread", "-Wl,--no-undefined"] + EXTRA
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise BuildError(f"$ {' '.join(cmd)}\n{r.stdout}{r.stderr}")
        os.replace(tmp, LIB)
    return LIB


if __name__ == "__main__":
    try:
        print(build(verbose=True))
    except (CompilerMissing, BuildError) as e:
        print(e, file=sys.stderr)
        sys.exit(1)

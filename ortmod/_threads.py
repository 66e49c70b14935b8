"""Optionally, one team of threads for torch and the engine (ORTMOD_THREADS=torch).

torch's CPU ops run on an OpenMP team; the engine's kernels run on a pool of their own
(csrc/core/threadpool.c), which spins only briefly before it sleeps. With
ORTMOD_THREADS=torch the engine instead runs its parallel work as regions of torch's
OpenMP runtime (its GOMP_parallel entry point, which GNU, Intel and LLVM OpenMP all
export), on torch's threads.

Not the default: on a loaded 2-core machine GPT-2-style steps measured 2-5x slower that
way (a region's closing barrier waits for a preempted team thread, and libgomp's threads
spin far longer than our pool's between regions), while the engine's own pool with
single-threaded BLAS held up.
"""
import ctypes
import os

import torch


def _torch_openmp_library():
    """Path of the OpenMP runtime loaded with torch (its bundled libgomp, or libiomp5)."""
    try:
        info = torch.__config__.parallel_info()
    except Exception:  # noqa: BLE001 - no info: do not guess
        return None
    if "parallel backend: OpenMP" not in info:
        return None
    torch_dir = os.path.dirname(torch.__file__)
    found = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rsplit(" ", 1)[-1].strip()
                name = os.path.basename(path)
                if path.startswith("/") and (name.startswith("libgomp") or name.startswith("libiomp")) \
                        and path not in found:
                    found.append(path)
    except OSError:
        return None
    # torch's own copy first: another runtime loaded by something else is not torch's team
    found.sort(key=lambda p: not os.path.realpath(p).startswith(os.path.realpath(torch_dir)))
    return found[0] if found else None


_decided = None


def share_torch_threads(C):
    """With ORTMOD_THREADS=torch, point the engine's pool at torch's OpenMP runtime (once per
    process); returns True when the engine runs on torch's threads."""
    global _decided
    if _decided is None:
        _decided = _share(C)
    return _decided


def _share(C):
    from ._options import options
    if options.threads != "torch":
        C.use_openmp(None)
        return False
    path = _torch_openmp_library()
    if path is None:
        return False
    try:
        lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        entry = ctypes.cast(lib.GOMP_parallel, ctypes.c_void_p).value
    except (OSError, AttributeError):
        return False
    if not entry:
        return False
    C.use_openmp(entry)
    return True

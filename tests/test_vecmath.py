"""vecmath.h's exp_f32_libm is glibc's expf to the bit (the softmax cross-entropy gradient uses it so
that its exp(log_prob) is libm's, only vectorized). A C harness sweeps every 251st float32 bit pattern
(17 M inputs: normals, denormal results, overflow, +-inf, NaN) through a loop compiled as the engine's
kernels are (the build's flags for csrc/ops/loss.c, at each instruction set this CPU runs) and compares
with the process's libm. Exhaustively (every float) it was checked once by hand: `tests/c/vecmath_check.c 1`."""
import os
import re
import shutil
import subprocess

import pytest

from tests.buildpaths import BUILD_DIR, ROOT, build

HARNESS = os.path.join(ROOT, "tests", "c", "vecmath_check.c")


def cpu_flags():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def kernel_cflags():
    """The compile flags build.ninja gives csrc/ops/loss.c (optimization level, -std, defines)."""
    r = build()
    assert r.returncode == 0, r.stdout + r.stderr
    with open(os.path.join(BUILD_DIR, "build.ninja")) as f:
        m = re.search(r"^build [^\n]*csrc/ops/loss\.c\.o: .*?\n((?:  .*\n)+)", f.read(), re.M)
    assert m, "loss.c.o is not in build.ninja"
    flags = next(l for l in m.group(1).splitlines() if l.strip().startswith("FLAGS ="))
    return [f for f in flags.split("=", 1)[1].split() if f not in ("-fPIC", "-fvisibility=hidden")]


ISAS = [("x86-64-v4", {"avx512f", "avx512bw", "avx512vl", "avx512dq"}), ("x86-64-v3", {"avx2", "fma", "bmi2"}),
        ("x86-64", set())]


@pytest.mark.parametrize("isa,needs", ISAS, ids=[i for i, _ in ISAS])
def test_exp_f32_libm_is_libm_expf_to_the_bit(isa, needs, tmp_path):
    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed")
    if not needs <= cpu_flags():
        pytest.skip(f"this CPU does not run {isa} code")
    exe = tmp_path / "vecmath_check"
    cc = subprocess.run(["gcc", *kernel_cflags(), f"-march={isa}", "-I", os.path.join(ROOT, "csrc"), HARNESS,
                         "-o", str(exe), "-lm"], capture_output=True, text=True)
    assert cc.returncode == 0, cc.stderr
    r = subprocess.run([str(exe), "251"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    m = re.match(r"checked (\d+) differ (\d+) maxulp (\d+)", r.stdout)
    assert m and int(m.group(1)) > 17_000_000, r.stdout
    assert int(m.group(2)) == 0, f"exp_f32_libm differs from libm's expf at {isa}: {r.stdout}{r.stderr}"

"""The engine's include layering (docs/design.md, "The rules we keep" and "Devices"): nothing under csrc/ includes cuda/,
since the engine defines the provider interface (csrc/exec/cuda_provider.h) and the provider
implements it; and the planner does not reach into the executor (exec/ uses plan/, never back).
Read from the sources: no build needed."""
import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "csrc")
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)


def includes(root=CSRC):
    """(path relative to root, included name) for every #include of every .c/.h under root."""
    for path in sorted(glob.glob(os.path.join(root, "**", "*.[ch]"), recursive=True)):
        with open(path, encoding="utf-8", errors="replace") as f:
            for name in INCLUDE.findall(f.read()):
                yield os.path.relpath(path, root), name


def reaches_outside(root=CSRC):
    """Includes that leave csrc/: a path with '..', or one that names the provider's cuda/."""
    return [f"{src}: #include {name}" for src, name in includes(root)
            if ".." in name.split("/") or name.split("/")[0] == "cuda"]


def planner_includes_executor(root=CSRC):
    """Includes of exec/ headers from plan/."""
    return [f"{src}: #include {name}" for src, name in includes(root)
            if src.startswith("plan" + os.sep) and name.startswith("exec/")]


def test_the_engine_includes_nothing_from_cuda():
    assert list(includes()), "found no #include under csrc/: the scan is broken"
    bad = reaches_outside()
    assert not bad, ("csrc/ must not include the CUDA provider's files (the engine owns the interface, in "
                     "csrc/exec/cuda_provider.h; includes are relative to csrc/):\n" + "\n".join(bad))


def test_the_planner_does_not_include_the_executor():
    assert any(src.startswith("plan" + os.sep) for src, _ in includes()), "found no file under csrc/plan/"
    bad = planner_includes_executor()
    assert not bad, ("csrc/plan/ must not include csrc/exec/ (exec/ uses plan/, never the other way):\n"
                     + "\n".join(bad))


def device_specific_in_engine(root=CSRC):
    """Lines of exec/engine.c that name the CUDA provider (its table, its device type, a `cu` handle):
    the engine runs every device through exec/provider.h's om_provider (docs/adding-a-device.md)."""
    word = re.compile(r"\bcu\b|OM_CUDA|om_cuda")
    with open(os.path.join(root, "exec", "engine.c"), encoding="utf-8") as f:
        return [f"engine.c:{i}: {line.strip()}" for i, line in enumerate(f, 1) if word.search(line)]


def test_the_engine_has_no_cuda_branch():
    bad = device_specific_in_engine()
    assert not bad, ("csrc/exec/engine.c must not branch on the CUDA provider: ask the plan's om_provider "
                     "(csrc/exec/provider.h) instead:\n" + "\n".join(bad))


def test_the_device_scan_finds_a_cuda_branch(tmp_path):
    (tmp_path / "exec").mkdir()
    (tmp_path / "exec" / "engine.c").write_text("static int x(void) { return f->cu != 0; }\n"
                                                "static int y(void) { return d == OM_CUDA; }\n")
    assert len(device_specific_in_engine(str(tmp_path))) == 2

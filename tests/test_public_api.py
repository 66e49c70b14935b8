"""The engine's public C API is csrc/include/ and nothing else.

The clients — the CPython binding (python/*.c, python/*.h) and the runner's front end
(csrc/runner/main.c, the ortmod-train command) — include no engine header outside
csrc/include/ (the binding also has its own python/binding.h). Every other header under
csrc/<layer>/ is internal: the engine may change it with any commit. The runner's library part
(csrc/runner/runner*.c) is engine code and may use internal headers.

Each public header compiles on its own, as C11 and as C++, with warnings as errors: a client
includes it first, alone, from either language.

The per-step methods (Engine.forward, Engine.backward) take positional arguments through
METH_FASTCALL; a wrong call is a TypeError that says what was wrong.
"""
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PUBLIC = os.path.join(ROOT, "csrc", "include")
PUBLIC_HEADERS = sorted(f for f in os.listdir(PUBLIC) if f.endswith(".h"))
BINDING_OWN = {"binding.h"}   # python/binding.h: what the binding's files share, not engine API

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)
# where an angle-bracket include could find a project header (the build's -I dirs)
PROJECT_DIRS = [os.path.join(ROOT, d) for d in ("csrc", "csrc/include", "build/cmake/gen", "python")]   # gen: the build's protobuf-c code


def client_files():
    py = sorted(os.path.join("python", f) for f in os.listdir(os.path.join(ROOT, "python"))
                if f.endswith((".c", ".h")))
    return py + [os.path.join("csrc", "runner", "main.c")]


def strip_comments(src):
    return re.sub(r"/\*.*?\*/|//[^\n]*", "", src, flags=re.S)


def non_public_includes(path, src):
    """The includes of one client file that are not public engine API: [(line text, why)]."""
    allowed = set(PUBLIC_HEADERS) | (BINDING_OWN if path.startswith("python") else set())
    bad = []
    for m in INCLUDE.finditer(strip_comments(src)):
        kind, name = m.groups()
        if kind == '"':
            if name not in allowed:
                bad.append((m.group(0).strip(), "not a header of csrc/include/"))
        else:
            # a system header, unless the project's include dirs hold it (<ops/op.h>, <onnx.pb-c.h>)
            hit = next((d for d in PROJECT_DIRS if os.path.isfile(os.path.join(d, name))), None)
            if hit is not None and os.path.normpath(hit) != os.path.normpath(PUBLIC):
                bad.append((m.group(0).strip(), f"an internal header ({os.path.relpath(hit, ROOT)})"))
    return bad


def test_the_rule_sees_the_clients():
    files = client_files()
    assert "python/module.c" in files and "python/optim.c" in files and "csrc/runner/main.c" in files
    assert PUBLIC_HEADERS == ["ortmod.h", "ortmod_optim.h", "ortmod_options.h", "ortmod_runner.h"]


def test_the_rule_catches_an_internal_include():
    src = '#include <stdio.h>\n#include "ortmod.h"\n#include "ops/op.h"\n#include <exec/device.h>\n' \
          '/* #include "core/core.h" in a comment is fine */\n#include "binding.h"\n'
    assert [b[0] for b in non_public_includes("python/x.c", src)] == ['#include "ops/op.h"',
                                                                      "#include <exec/device.h>"]
    assert [b[0] for b in non_public_includes("csrc/runner/main.c", src)] == [
        '#include "ops/op.h"', "#include <exec/device.h>", '#include "binding.h"']
    assert non_public_includes("csrc/runner/main.c", '#include <onnx.pb-c.h>\n')


@pytest.mark.parametrize("path", client_files())
def test_clients_include_only_public_headers(path):
    with open(os.path.join(ROOT, path)) as f:
        bad = non_public_includes(path, f.read())
    assert not bad, (f"{path} includes engine headers outside csrc/include/: {bad}. Add what it needs to a "
                     "public header (csrc/include/ortmod*.h) instead.")


def client_include_dirs(ninja_text, obj):
    """The -I directories build.ninja compiles one object with."""
    m = re.search(r"^build [^\n]*" + re.escape(obj) + r"\.o: .*?\n((?:  .*\n)+)", ninja_text, re.M)
    assert m, f"{obj}.o is not in build.ninja"
    line = next((l for l in m.group(1).splitlines() if l.strip().startswith("INCLUDES =")), "")
    return [os.path.normpath(d) for d in re.findall(r"-I\s*(\S+)", line)]


@pytest.mark.parametrize("obj", ["python/binding.c", "csrc/runner/main.c"])
def test_the_build_gives_clients_only_the_public_include_dir(obj):
    """The include rule above reads the sources; this one holds the build to it: a client's only
    project include directory is csrc/include/, so `#include "ops/op.h"` in a client does not compile."""
    from tests.buildpaths import BUILD_DIR, build
    r = build()
    assert r.returncode == 0, r.stdout + r.stderr
    with open(os.path.join(BUILD_DIR, "build.ninja")) as f:
        dirs = client_include_dirs(f.read(), obj)
    project = [d for d in dirs if d.startswith(ROOT + os.sep)]
    assert project == [os.path.normpath(PUBLIC)], f"{obj} is compiled with {project}: only csrc/include/ is public"


def compile_alone(header, lang, tmp_path):
    if lang == "c":
        cc, flags, suffix = "gcc", ["-std=c11", "-Wall", "-Wextra", "-pedantic", "-Werror"], ".c"
    else:
        cc, flags, suffix = "g++", ["-std=c++11", "-Wall", "-Wextra", "-pedantic", "-Werror"], ".cc"
    if shutil.which(cc) is None:
        pytest.skip(f"{cc} not installed")
    src = tmp_path / f"only_{header.replace('.', '_')}{suffix}"
    main = "int main(void) { return 0; }" if lang == "c" else "int main() { return 0; }"
    src.write_text(f'#include "{header}"\n#include "{header}"\n{main}\n')   # twice: the include guard holds
    # only the public dir on the path: a header that reaches for an internal one fails here
    r = subprocess.run([cc, *flags, "-fsyntax-only", "-I", PUBLIC, str(src)], capture_output=True, text=True)
    assert r.returncode == 0, f"{header} does not compile alone as {lang}:\n{r.stderr}"


@pytest.mark.parametrize("header", PUBLIC_HEADERS)
def test_public_header_compiles_alone_as_c11(header, tmp_path):
    compile_alone(header, "c", tmp_path)


@pytest.mark.parametrize("header", PUBLIC_HEADERS)
def test_public_header_compiles_alone_as_cpp(header, tmp_path):
    with open(os.path.join(PUBLIC, header)) as f:
        text = f.read()
    if "(" in strip_comments(text):   # declares functions: they need C linkage from C++
        assert 'extern "C"' in text, f"{header} declares functions without extern \"C\" for C++"
    compile_alone(header, "cpp", tmp_path)


# ---- the per-step methods: METH_FASTCALL, still strict ------------------------------------

def tiny_engine():
    from onnx import TensorProto, helper

    from ortmod import _C
    g = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["y"])], "mul",
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("x", "w")],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)]).SerializeToString()
    return _C.Engine(m, [False, True])


def test_forward_and_backward_are_strict_about_arguments():
    eng = tiny_engine()
    x, w = np.array([1, 2], np.float32), np.array([3, 4], np.float32)
    with pytest.raises(TypeError, match=r"forward\(\) takes at least 2 arguments \(1 given\)"):
        eng.forward([x, w])
    with pytest.raises(TypeError, match=r"forward\(\) takes at most 5 arguments \(6 given\)"):
        eng.forward([x, w], True, None, None, None, None)
    with pytest.raises(TypeError, match="converter must be callable"):
        eng.forward([x, w], True, None, 3)
    with pytest.raises(TypeError, match="keyword"):
        eng.forward([x, w], training=True)
    with pytest.raises(TypeError, match="stream must be an int"):
        eng.forward([x, w], True, "stream 0")
    with pytest.raises(TypeError, match="inputs must be a sequence"):
        eng.forward(7, True)

    class NoTruth:
        def __bool__(self):
            raise RuntimeError("no truth value")

    with pytest.raises(RuntimeError, match="no truth value"):
        eng.forward([x, w], NoTruth())
    outs, stash = eng.forward([x, w], True)
    with pytest.raises(TypeError, match=r"backward\(\) takes at least 2 arguments \(1 given\)"):
        eng.backward(stash)
    with pytest.raises(TypeError, match="keyword"):
        eng.backward(stash, grad_outputs=[None])
    with pytest.raises(TypeError, match=r"backward\(\) takes at most 7 arguments \(8 given\)"):
        eng.backward(stash, [None], None, None, None, None, 0, 0)
    with pytest.raises(TypeError, match="needs the stash"):
        eng.backward(object(), [None])
    with pytest.raises(TypeError, match="grad_outputs must be a sequence"):
        eng.backward(stash, 3)
    # the stash survives the wrong calls: the right one still runs, and once only
    grads = eng.backward(stash, [np.ones(2, np.float32)])
    assert grads[0] is None
    from oputil import _Cap
    np.testing.assert_array_equal(np.from_dlpack(_Cap(grads[1])), x)

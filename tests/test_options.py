"""Configuration in one place (ortmod/_options.py, csrc/include/ortmod_options.h).

The variables the code reads, docs/options.md's table and ortmod.options list the same names; one C
file and one Python file read the environment; fields set through the API take effect and are
validated; bad values in the environment are errors that name the variable."""
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
from onnx import TensorProto as T
from onnx import helper as h

import ortmod
from ortmod import DebugOptions, _C, options

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME = r"((?:ORTMOD|ORTMODULE|OMP)_[A-Z0-9_]+)"
OPTIONS_C = "csrc/core/options.c"
RUNNER_MAIN = "csrc/runner/main.c"   # the CLI's own testing aid, ORTMOD_RUNNER_DEBUG_STEP_DELAY_MS
OPTIONS_PY = "ortmod/_options.py"


def sources(top, exts):
    for d, _, files in os.walk(os.path.join(ROOT, top)):
        if os.path.relpath(d, ROOT).startswith(os.path.join("csrc", "graph", "gen")):
            continue
        for f in files:
            if f.endswith(exts):
                path = os.path.join(d, f)
                yield os.path.relpath(path, ROOT), open(path, encoding="utf-8").read()


def c_sources():
    for top in ("csrc", "cuda", "python"):
        yield from sources(top, (".c", ".h", ".cu", ".cuh", ".cpp"))


def names_read_in_code():
    names = set()
    text = open(os.path.join(ROOT, OPTIONS_C)).read()
    table = text[text.index("static const field_info FIELDS"):]
    table = table[:table.index("};")]
    names |= set(re.findall(r'"' + NAME + '"', table))
    names |= set(re.findall(r'getenv\("' + NAME + r'"\)', open(os.path.join(ROOT, RUNNER_MAIN)).read()))
    text = open(os.path.join(ROOT, OPTIONS_PY)).read()
    names |= set(re.findall(r'Variable\("' + NAME + '"', text))
    return names


def readme_table():
    text = open(os.path.join(ROOT, "docs", "options.md")).read()
    section = text[text.index("# Configuration: every environment variable"):]
    section = section[:section.index("Read by the tests and the build only")]
    return set(re.findall(r"^\| `" + NAME + r"` \|", section, re.M))


def test_the_environment_is_read_in_one_c_file_and_one_python_file():
    readers = {path for path, text in c_sources() if re.search(r"\bgetenv\s*\(", text)}
    assert readers == {OPTIONS_C, RUNNER_MAIN}, readers
    assert re.findall(r'getenv\("' + NAME + r'"\)', open(os.path.join(ROOT, RUNNER_MAIN)).read()) == \
        ["ORTMOD_RUNNER_DEBUG_STEP_DELAY_MS"]
    readers = {path for path, text in sources("ortmod", (".py",))
               if re.search(r"\bos\.environ\b|\bos\.getenv\b|\bgetenv\b|\bputenv\b", text)}
    assert readers == {OPTIONS_PY}, readers


def test_code_readme_and_options_list_the_same_variables():
    code = names_read_in_code()
    assert "ORTMOD_DISABLE_PASSES" in code and "ORTMODULE_LOG_LEVEL" in code     # the patterns found them
    assert code == readme_table(), (code ^ readme_table())
    in_options = {v.name for v in options.variables}
    assert in_options | {"ORTMOD_RUNNER_DEBUG_STEP_DELAY_MS"} == code, in_options ^ code
    # every variable name a C or Python source spells is one of them (none read another way)
    spelled = set()
    for path, text in list(c_sources()) + list(sources("ortmod", (".py",))):
        spelled |= set(re.findall(r'["\']' + NAME + r'["\']', text))
    assert spelled <= code, spelled - code
    # the engine's fields through the binding are the options object's engine fields
    engine = {v.field for v in options.variables if v.reader == "engine"}
    assert set(_C.get_options()) == engine
    # defaults the docs and the object give agree with what the engine starts from
    fresh = run_python("import json; from ortmod import _C; print(json.dumps(_C.get_options()))",
                       {v.name: "" for v in options.variables})
    defaults = json.loads(fresh.stdout.strip().splitlines()[-1])
    assert defaults == {v.field: v.default for v in options.variables if v.reader == "engine"}


def test_test_and_build_variables_are_listed_too():
    text = open(os.path.join(ROOT, "docs", "options.md")).read()
    section = text[text.index("Read by the tests and the build only"):]
    end = section.find("\n\n", section.index("|"))     # the table ends the section (or the file)
    section = section if end < 0 else section[:end]
    listed = set(re.findall(NAME, section))
    read = set()
    for top in ("tests", "scripts"):
        for _, src in sources(top, (".py", ".cpp", ".c")):
            read |= set(re.findall(r'(?:environ\.get\(|environ\[|getenv\()\s*["\']' + NAME, src))
    for build_file in ("CMakeLists.txt", os.path.join("cuda", "cuda.cmake"), "Makefile"):
        read |= set(re.findall(r"\$ENV\{" + NAME, open(os.path.join(ROOT, build_file)).read()))
    product = readme_table()
    assert read - product <= listed, (read - product) - listed


def relu_identity_model():
    g = h.make_graph([h.make_node("Relu", ["x"], ["a"]), h.make_node("Identity", ["a"], ["b"]),
                      h.make_node("Relu", ["b"], ["y"])], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, ["n"])], [h.make_tensor_value_info("y", T.FLOAT, None)])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)]).SerializeToString()


def test_overriding_through_the_api(ortmod_env):
    ortmod_env.delenv("ORTMOD_CAPTURE", raising=False)     # the defaults below, whatever the run's
    data = relu_identity_model()
    report = json.loads(_C.Engine(data, None).report())
    assert report["plan_cache"]["max_plans"] == 32
    assert report["optimized_nodes"] < report["exported_nodes"]
    with options.overridden(max_cached_plans=3, disable_passes="all"):
        assert options.max_cached_plans == 3 and _C.get_options()["disable_passes"] == "all"
        assert DebugOptions().max_cached_plans == 3
        report = json.loads(_C.Engine(data, None).report())
        assert report["plan_cache"]["max_plans"] == 3
        assert report["optimized_nodes"] == report["exported_nodes"]
        assert json.loads(_C.Engine(data, None, max_plans=5).report())["plan_cache"]["max_plans"] == 5   # argument wins
    assert options.max_cached_plans == 32 and options.disable_passes == ""
    with options.overridden(disable_passes=["eliminate_identity", "cse"]):
        assert options.disable_passes == "eliminate_identity,cse"
        report = json.loads(_C.Engine(data, None).report())
        assert report["optimized_nodes"] == report["exported_nodes"]
    with options.overridden(capture="export", max_cached_graphs=2, strict_trace=True):
        d = DebugOptions()
        assert (d.capture, d.max_cached_graphs, d.strict_trace) == ("export", 2, True)
        assert DebugOptions(capture="torchscript", max_cached_graphs=4).capture == "torchscript"   # the field wins
    assert DebugOptions().capture == "auto"
    before = _C.optim_num_threads()
    _C.optim_set_num_threads(1)
    try:
        assert options.optim_num_threads == 1 and _C.optim_num_threads() == 1
    finally:
        options.optim_num_threads = 0
    assert _C.optim_num_threads() == before


@pytest.mark.parametrize("field, value, message", [
    ("max_cached_plans", 0, "max_cached_plans: 0 is not a number of plans in 1..1048576"),
    ("memory_opt_level", 7, "memory_opt_level: memory optimization level 7 is not 0, 1 or 2"),
    ("disable_passes", "cse,nope", "disable_passes: unknown pass 'nope'"),
    ("optim_num_threads", -1, "optim_num_threads: -1 is not a number of threads"),
    ("num_threads", 5000, "num_threads: 5000 is not a number of threads"),
    ("cuda_attention", "fast", "cuda_attention: 'fast' is not flash or materialized"),
    ("capture", "jit", "options.capture: unknown capture path 'jit'"),
    ("max_cached_graphs", 0, "options.max_cached_graphs: 0 is not a whole number"),
    ("fallback_policy", "FALLBACK_NOPE", "options.fallback_policy: unknown policy 'FALLBACK_NOPE'"),
    ("log_level", "LOUD", "options.log_level: unknown level 'LOUD'"),
    ("threads", "both", "options.threads: 'both' is not own or torch"),
    ("strict_trace", "maybe", "options.strict_trace: 'maybe' is not on or off"),
])
def test_bad_values_set_through_the_api_name_the_field(field, value, message):
    before = options.as_dict()
    with pytest.raises(ValueError, match=re.escape(message)):
        setattr(options, field, value)
    assert options.as_dict() == before        # nothing changed
    with pytest.raises(AttributeError, match="no field 'max_plans'"):
        options.max_plans = 3
    with pytest.raises(TypeError, match="profile must be a bool"):
        options.profile = 1


def run_python(code, env, check=True):
    e = dict(os.environ, PYTHONPATH=ROOT)
    e.update(env)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=e,
                       timeout=300, cwd=ROOT)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def test_the_environment_is_read_once_and_bad_values_name_the_variable():
    bad = {"ORTMOD_MAX_CACHED_PLANS": "0x", "ORTMODULE_MEMORY_OPT_LEVEL": "high", "ORTMOD_PROFILE": "2",
           "ORTMOD_DISABLE_PASSES": "cse,nope", "ORTMOD_NUM_THREADS": "-3", "ORTMOD_CUDA_ATTENTION": "fast",
           "ORTMOD_CAPTURE": "jit", "ORTMOD_STRICT_TRACE": "maybe", "ORTMOD_MAX_CACHED_GRAPHS": "lots",
           "ORTMODULE_FALLBACK_POLICY": "FALLBACK_NOPE", "ORTMODULE_LOG_LEVEL": "LOUD",
           "ORTMOD_INLINE_AUTOGRAD_FUNCTIONS": "sometimes", "ORTMOD_THREADS": "both"}
    r = run_python("""
        import os, sys
        from ortmod import _C, options
        def error(f):
            try:
                f()
            except ValueError as e:
                return str(e)
            return "no error"
        print("GET", error(_C.get_options))
        print("ENGINE", error(lambda: _C.Engine(b"", None)))
        print("ONE", error(lambda: options.max_cached_plans))     # one field: only its variable counts
        print("GOOD", error(lambda: options.cuda_library))
        for v in options.variables:
            if v.reader == "python":
                print("FIELD", v.field, error(lambda: getattr(options, v.field)))
        options.capture = "export"              # setting a field clears its error
        print("SET", options.capture)
        options.set(max_cached_plans=4, memory_opt_level=1, profile=True, disable_passes="", optim_num_threads=0,
                    cuda_attention="flash")
        print("AFTER", error(_C.get_options))
        os.environ["ORTMOD_MAX_CACHED_PLANS"] = "9"      # read once: no effect until reload
        print("PLANS", options.max_cached_plans)
        for k in list(os.environ):
            if k != "ORTMOD_MAX_CACHED_PLANS" and (k.startswith("ORTMOD") or k == "OMP_NUM_THREADS"):
                del os.environ[k]
        options.reload()
        print("RELOADED", options.max_cached_plans, options.capture, options.memory_opt_level)
    """, bad)
    out = dict(line.split(" ", 1) for line in r.stdout.strip().splitlines())
    for var in ("ORTMOD_MAX_CACHED_PLANS: '0x'", "ORTMODULE_MEMORY_OPT_LEVEL: 'high'", "ORTMOD_PROFILE: '2'",
                "ORTMOD_DISABLE_PASSES: unknown pass 'nope'", "ORTMOD_NUM_THREADS: '-3'", "ORTMOD_CUDA_ATTENTION: 'fast'"):
        assert var in out["GET"] and var in out["ENGINE"], (var, out)
    fields = {line.split(" ", 2)[1]: line.split(" ", 2)[2] for line in r.stdout.splitlines() if line.startswith("FIELD")}
    for v in options.variables:
        if v.reader == "python" and v.name in bad:
            assert fields[v.field].startswith(v.name + ":"), (v.name, fields[v.field])
    assert out["ONE"].startswith("ORTMOD_MAX_CACHED_PLANS: '0x'") and "ORTMOD_PROFILE" not in out["ONE"], out["ONE"]
    assert out["GOOD"] == "no error"
    assert out["SET"] == "export" and out["AFTER"] == "no error" and out["PLANS"] == "4"
    assert out["RELOADED"] == "9 auto 0"


def test_thread_counts_follow_the_documented_precedence():
    r = run_python("""
        from ortmod import _C, options
        print(options.num_threads, _C.get_num_threads())
        options.num_threads = 3               # the pool is on its default: it follows
        print(_C.get_num_threads())
        _C.set_num_threads(2)                 # set explicitly (ORTModule: torch.get_num_threads()): wins
        options.num_threads = 5
        print(_C.get_num_threads())
        options.optim_num_threads = 1
        print(_C.optim_num_threads())
    """, {"OMP_NUM_THREADS": "4", "ORTMOD_NUM_THREADS": ""})
    assert r.stdout.split() == ["4", "4", "3", "2", "1"], r.stdout


def test_the_runner_checks_its_testing_aid():
    from ortmod.runner import find_binary
    binary = find_binary()
    if binary is None:
        pytest.skip("ortmod-train is not built")
    r = subprocess.run([binary, "--model", "x.onnx"], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, ORTMOD_RUNNER_DEBUG_STEP_DELAY_MS="soon"))
    assert r.returncode == 2 and "ORTMOD_RUNNER_DEBUG_STEP_DELAY_MS: 'soon'" in r.stderr, r.stderr


def test_ortmod_exports_the_options_object():
    assert ortmod.options is options and "options" in ortmod.__all__


def test_thread_setters_and_a_bad_thread_variable_are_refused_where_first_needed():
    r = run_python("""
        import torch
        from ortmod import _C
        def error(f):
            try:
                f()
            except ValueError as e:
                return str(e)
            return "no error"
        print("SET0", error(lambda: _C.set_num_threads(0)))
        print("SETBIG", error(lambda: _C.set_num_threads(2**32)))     # capped, never wrapped to 0
        print("OPT", error(lambda: _C.optim_set_num_threads(-1)))
        from ortmod.optim import FusedAdam
        print("ADAM", error(lambda: FusedAdam([torch.nn.Parameter(torch.ones(3))])))
    """, {"ORTMOD_NUM_THREADS": "-3"})
    out = dict(line.split(" ", 1) for line in r.stdout.strip().splitlines())
    assert "0 is not a thread count" in out["SET0"], out
    assert out["SETBIG"] == "no error", out
    assert "-1 is not a number of threads" in out["OPT"], out
    assert "ORTMOD_NUM_THREADS: '-3'" in out["ADAM"], out

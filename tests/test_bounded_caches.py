"""Bounded caches: an ORTModule keeps the max_cached_graphs most recently used exports and
engines, an engine the max_cached_plans most recently used plans (one per input shape set),
found by a hash of the shapes. A call that brings a new batch size, or a new value of a
non-tensor argument, every time must not grow memory without end (issue 15: 1.26 MiB per
batch size for a 4x1024 MLP, 16 KiB per value on a tiny model, kept forever)."""
import json
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import torch

import ortmod
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from ortmod import DebugOptions, ORTModule, _C

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

GROWTH = textwrap.dedent(r'''
    import json, os, sys, warnings
    sys.path.insert(0, sys.argv[1])
    import torch
    from ortmod import ORTModule
    torch.manual_seed(0)
    torch.set_num_threads(1)

    def rss_mib():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)
        def forward(self, x, scale=1.0):
            return (self.b(torch.tanh(self.a(x))) * scale).sum()

    mode, n = sys.argv[2], int(sys.argv[3])
    m = ORTModule(Net())
    rss, caught = {}, []
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for i in range(1, n + 1):
            if mode == "batch":     # a new batch size every call: a new plan, no new export
                loss = m(torch.randn(500 + i, 32))
            else:                   # a new non-tensor value every call: a new export and engine
                loss = m(torch.randn(4, 32), 1.0 + i * 1e-3)
            loss.backward()
            if i in (200, n):
                rss[i] = rss_mib()
    last = list(m._ortmod_cache.values())[-1]
    print(json.dumps({"rss": rss, "engines": len(m._ortmod_cache), "exports": len(m._ortmod_exports),
                      "exported": m._ortmod_export_count, "plan_cache": json.loads(last.engine.report())["plan_cache"],
                      "warnings": [str(x.message) for x in w if "non-tensor" in str(x.message)]}))
''')


def growth(mode, n=1000, env=None):
    r = subprocess.run([sys.executable, "-c", GROWTH, ROOT, mode, str(n)], capture_output=True, text=True,
                       timeout=900, env=dict(os.environ, **(env or {})))
    assert r.returncode == 0, r.stderr[-4000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["growth"] = out["rss"][str(n)] - out["rss"]["200"]
    print(f"{mode}: RSS {out['rss']['200']:.1f} MiB after 200 calls, {out['rss'][str(n)]:.1f} MiB after {n} "
          f"(+{out['growth']:.1f}); engines {out['engines']}, exports {out['exports']}, plans {out['plan_cache']}")
    return out


def test_rss_stays_flat_over_1000_new_batch_sizes():
    out = growth("batch")
    # every size was planned, the cache kept 32; the torch.export path exports the first size
    # statically, then once with the batch dim symbolic, whose engine plans the 999 others
    exports = 2 if ortmod.DebugOptions().capture == "export" else 1
    assert out["plan_cache"] == {"plans": 32, "max_plans": 32, "planned": 1001 - exports, "evicted": 969 - exports}
    assert out["exported"] == exports and out["engines"] == 1
    assert out["growth"] < 48, out     # unbounded: +430 MiB


def test_rss_stays_flat_over_1000_new_non_tensor_values():
    # the cache bound is the point, not the capture: the TorchScript path's exports are the
    # cheap ones (1000 torch.export exports take minutes)
    out = growth("value", env={"ORTMOD_CAPTURE": "torchscript"})
    assert out["exported"] == 1000 and out["engines"] == 16 and out["exports"] == 16
    assert out["growth"] < 8, out      # unbounded: +21 MiB
    # one warning, naming the argument
    assert len(out["warnings"]) == 1, out["warnings"]
    assert "exported 8 times" in out["warnings"][0] and "input 'scale' (argument 1) = 1.008" in out["warnings"][0]


# ---- the ORTModule cache ------------------------------------------------------------------

class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)

    def forward(self, x, scale):
        return self.lin(x) * scale


def test_least_recently_used_export_is_the_one_dropped():
    torch.manual_seed(0)
    net = Scaled()
    m = ORTModule(net, DebugOptions(max_cached_graphs=2))
    x = torch.randn(4, 3)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for scale in (2.0, 3.0, 2.0, 5.0):        # 3.0 is the least recently used when 5.0 comes
            torch.testing.assert_close(m(x, scale), net(x, scale))
    # the cache holds 2, the third value re-exports: warned (at the caller's line)
    (warning,) = [x for x in w if "non-tensor" in str(x.message)]
    assert "exported 3 times" in str(warning.message) and "max_cached_graphs" in str(warning.message)
    assert warning.filename == __file__, warning.filename
    assert m._ortmod_export_count == 3
    m(x, 2.0)
    assert m._ortmod_export_count == 3       # still cached
    m(x, 3.0)
    assert m._ortmod_export_count == 4       # was dropped: exported again
    assert len(m._ortmod_cache) == 2 and len(m._ortmod_exports) == 2


def test_cache_limits_come_from_options_or_environment(ortmod_env):
    assert DebugOptions().max_cached_graphs == 16 and DebugOptions().max_cached_plans == 32
    ortmod_env.setenv("ORTMOD_MAX_CACHED_GRAPHS", "3")
    ortmod_env.setenv("ORTMOD_MAX_CACHED_PLANS", "7")
    assert DebugOptions().max_cached_graphs == 3 and DebugOptions().max_cached_plans == 7
    assert DebugOptions(max_cached_plans=5).max_cached_plans == 5      # the option wins
    ortmod_env.setenv("ORTMOD_MAX_CACHED_GRAPHS", "lots")
    with pytest.raises(ValueError, match="ORTMOD_MAX_CACHED_GRAPHS: 'lots' is not a whole number in 1..1048576"):
        DebugOptions()
    ortmod_env.delenv("ORTMOD_MAX_CACHED_GRAPHS")
    for bad in (0, -1, 2.5, True, "4"):
        with pytest.raises(ValueError, match="DebugOptions.max_cached_plans"):
            DebugOptions(max_cached_plans=bad)


def test_no_warning_for_a_few_values():
    m = ORTModule(Scaled())
    x = torch.randn(4, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for scale in (1.0, 2.0, 3.0, 1.0, 2.0):
            m(x, scale)


# ---- the engine's plan cache ----------------------------------------------------------------

def mlp_bytes():
    rng = np.random.default_rng(0)
    w = nh.from_array(rng.standard_normal((5, 4)).astype(np.float32), "w")
    g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["h"]), h.make_node("Tanh", ["h"], ["y"])], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, ["n", 5])], [h.make_tensor_value_info("y", T.FLOAT, None)],
                     [w])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)]).SerializeToString(), nh.to_array(w)


class Cap:
    def __init__(self, c):
        self.c = c

    def __dlpack__(self, **kw):
        return self.c

    def __dlpack_device__(self):
        return (1, 0)


def test_a_stash_outlives_the_eviction_of_its_plan():
    """max_plans=2: the plan of batch 3 is evicted by batches 4 and 5 while the forward of
    batch 3 still waits for its backward; the backward still runs on it, right."""
    data, w = mlp_bytes()
    eng = _C.Engine(data, [True], max_plans=2)
    rng = np.random.default_rng(1)
    xs = {n: rng.standard_normal((n, 5)).astype(np.float32) for n in (3, 4, 5, 6)}
    pending = {}
    for n in (3, 4, 5, 6):
        caps, stash = eng.forward([xs[n]], True)
        pending[n] = (np.from_dlpack(Cap(caps[0])).copy(), stash)
    report = json.loads(eng.report())
    assert report["plan_cache"] == {"plans": 2, "max_plans": 2, "planned": 4, "evicted": 2}
    assert [p["input_shapes"] for p in report["plans"]] == [[[5, 5]], [[6, 5]]]   # least recently used first
    for n in (3, 6, 4, 5):
        y, stash = pending.pop(n)
        np.testing.assert_allclose(y, np.tanh(xs[n] @ w), rtol=1e-5)
        gy = np.ones_like(y)
        (gx,) = eng.backward(stash, [gy])
        gx = np.from_dlpack(Cap(gx))
        np.testing.assert_allclose(gx, ((1 - y ** 2) * gy) @ w.T, rtol=1e-4, atol=1e-6)
        del stash
    # the evicted shapes plan again when they come back
    eng.forward([xs[3]], False)
    assert json.loads(eng.report())["plan_cache"]["planned"] == 5


def test_engine_max_plans_is_checked():
    data, _ = mlp_bytes()
    with pytest.raises(_C.InvalidInputError, match=r"max_plans: -1 is not in 1..1048576"):
        _C.Engine(data, None, max_plans=-1)
    env = dict(os.environ, ORTMOD_MAX_CACHED_PLANS="0x")
    r = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); from ortmod import _C; "
                        "import onnx; from onnx import helper as h, TensorProto as T; "
                        "g = h.make_graph([h.make_node('Relu', ['x'], ['y'])], 'g', "
                        "[h.make_tensor_value_info('x', T.FLOAT, [2])], [h.make_tensor_value_info('y', T.FLOAT, [2])]); "
                        "_C.Engine(h.make_model(g).SerializeToString(), None)", ROOT],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode != 0 and "ORTMOD_MAX_CACHED_PLANS: '0x' is not a number of plans" in r.stderr, r.stderr

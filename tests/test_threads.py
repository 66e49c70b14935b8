"""The engine's pool: its own threads by default, torch's OpenMP team with
ORTMOD_THREADS=torch (ortmod/_threads.py); the same results either way, after a fork, and
from two Python threads at once."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import ortmod
from ortmod import _C

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

STEP = textwrap.dedent("""
    import os, sys, torch
    sys.path.insert(0, {root!r})
    import ortmod
    from ortmod import _C
    torch.manual_seed(0)
    torch.set_num_threads(2)
    model = ortmod.ORTModule(torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(),
                                                 torch.nn.Linear(512, 256)))
    x = torch.randn(512, 256)
    loss = model(x).square().mean()
    loss.backward()
    g = model.module[0].weight.grad
    print("RESULT", _C.uses_openmp(), repr(float(loss)), repr(float(g.abs().sum())))
""")


def run_step(env_extra):
    env = dict(os.environ, **env_extra)
    out = subprocess.run([sys.executable, "-c", STEP.format(root=ROOT)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")][-1]
    _, uses, loss, gsum = line.split()
    return uses == "True", float(loss), float(gsum)


def torch_uses_openmp():
    return "parallel backend: OpenMP" in torch.__config__.parallel_info()


def test_engine_uses_its_own_pool_by_default():
    ortmod.ORTModule(torch.nn.Linear(2, 2))   # loads the engine
    assert not _C.uses_openmp()


def test_own_pool_and_torch_team_give_the_same_step():
    shared = run_step({"ORTMOD_THREADS": "torch"})
    own = run_step({})
    assert own[0] is False
    assert shared[0] is torch_uses_openmp()
    # the same ranges either way: the reductions combine in the same order
    assert shared[1:] == own[1:]


FORK = textwrap.dedent("""
    import os, select, sys, torch
    sys.path.insert(0, {root!r})
    import ortmod
    from ortmod import _C
    torch.manual_seed(0)
    model = ortmod.ORTModule(torch.nn.Linear(512, 512))
    x = torch.randn(256, 512)
    ref = model(x).sum().item()
    assert _C.uses_openmp()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            y = model(x)
            torch.set_num_threads(1)   # torch's own ops would hang in this child (libgomp after fork)
            os.write(w, ("%s %r" % (_C.uses_openmp(), y.sum().item())).encode())
        finally:
            os._exit(0)
    os.close(w)
    ready, _, _ = select.select([r], [], [], 120)
    if not ready:
        os.kill(pid, 9)
        raise SystemExit("the forked child did not answer within 120 s")
    uses, value = os.read(r, 200).decode().split()
    os.waitpid(pid, 0)
    assert uses == "False", uses
    assert abs(float(value) - ref) <= 1e-5 * abs(ref) + 1e-4, (value, ref)
    print("FORK OK")
""")


@pytest.mark.skipif(not hasattr(os, "fork") or not torch_uses_openmp(), reason="needs fork and OpenMP torch")
def test_forked_child_of_a_torch_team_process_runs_the_engine():
    """GNU OpenMP cannot start a team in a child forked after the parent used one: with
    ORTMOD_THREADS=torch the child must go back to the engine's own threads, not hang."""
    env = dict(os.environ, ORTMOD_THREADS="torch")
    out = subprocess.run([sys.executable, "-c", FORK.format(root=ROOT)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and "FORK OK" in out.stdout, out.stderr[-2000:]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_runs_the_engine():
    """GNU OpenMP cannot start a team in a child forked after the parent used one: the
    child must fall back to the engine's own threads instead of hanging."""
    torch.manual_seed(0)
    model = ortmod.ORTModule(torch.nn.Linear(512, 512))
    x = torch.randn(256, 512)
    ref = model(x).sum().item()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:   # child: report, then leave without running the parent's atexit/pytest code
        try:
            os.close(r)
            y = model(x)
            # torch's own ops would hang in this child (its libgomp after a fork): one thread
            torch.set_num_threads(1)
            value = y.sum().item()
            os.write(w, f"{_C.uses_openmp()} {value!r}".encode())
        finally:
            os._exit(0)
    os.close(w)
    import select
    ready, _, _ = select.select([r], [], [], 120)
    assert ready, "the forked child did not answer within 120 s"
    msg = os.read(r, 200).decode()
    os.close(r)
    os.waitpid(pid, 0)
    uses, value = msg.split()
    assert uses == "False"
    assert float(value) == pytest.approx(ref, rel=1e-5)


def test_engine_inside_torch_parallel_work():
    """A call from a thread torch is already running work on (here: DataParallel-free, a
    second Python thread) runs serially rather than waiting on the team."""
    import threading
    torch.manual_seed(0)
    model = ortmod.ORTModule(torch.nn.Linear(256, 256))
    x = torch.randn(512, 256)
    ref = model(x).detach().clone()
    outs = [None, None]

    def work(i):
        outs[i] = model(x).detach().clone()

    ts = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert all(o is not None for o in outs)
    for o in outs:
        torch.testing.assert_close(o, ref)

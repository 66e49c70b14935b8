"""The one op registry (csrc/ops/op_list.h): every op has a CPU kernel and a CUDA kernel, or says
why it has no CUDA kernel; the CPU op table and the CUDA kernel table are both expanded from it
(the provider links --no-undefined, so a listed kernel that is missing fails its build).
scripts/ops.py lists and checks it from the sources; these tests run it on the real list and on
doctored copies, and hold the list against the built op table."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPS = os.path.join(ROOT, "scripts", "ops.py")
OP_LIST = os.path.join(ROOT, "csrc", "ops", "op_list.h")

# the ops without a CUDA kernel, by design
# NonZero: a data-dependent size; the CUDA executor refuses such graphs by name before any kernel
# (exec/engine.c), until the CUDA provider runs segmented plans (issue 37)
HOST_ONLY = {"Constant", "ConstantOfShape", "Range", "PythonOp", "PythonOpGrad", "NonZero"}


def _run(*args):
    r = subprocess.run([sys.executable, OPS, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout, r.stderr


def _doctored(tmp_path, edit):
    with open(OP_LIST) as f:
        text = f.read()
    new = edit(text)
    assert new != text, "the edit changed nothing"
    path = tmp_path / "op_list.h"
    path.write_text(new)
    return str(path)


def _list_entries():
    with open(OP_LIST) as f:
        text = f.read()
    text = text[text.index("#define OM_OP_LIST("):]
    return re.findall(r'\b(OP|HOST_OP)\((\w+), "(\w+)", "(\w*)", (\w+|"[^"]*")\)', text)


def test_every_op_has_a_cpu_and_a_cuda_kernel():
    rc, out, err = _run("--check")
    print(out + err)
    assert rc == 0, f"scripts/ops.py --check failed:\n{err}"


def test_the_listing_names_both_kernels_of_every_op():
    rc, out, err = _run()
    assert rc == 0, err
    rows = out.splitlines()[1:-1]
    entries = _list_entries()
    assert len(rows) == len(entries) > 100
    for row, (kind, sym, name, domain, _) in zip(rows, entries):
        cols = row.split()
        assert cols[0] == name and cols[1] == (domain or '""'), row
        assert re.fullmatch(r"csrc/ops/\w+\.c", cols[2]) and cols[3] == sym, row
        if kind == "OP":
            family = os.path.basename(cols[2])[:-2]
            assert cols[4] == f"cuda/{family}.cu" and cols[5].endswith("_cuda"), row
        else:
            assert cols[4] == "none:" and len(cols) > 5, f"a CPU-only op must say why: {row}"
    assert out.splitlines()[-1].startswith(f"{len(entries)} ops: {len(entries) - len(HOST_ONLY)} with")


def test_only_the_folded_and_callback_ops_lack_a_cuda_kernel():
    host = {name for kind, _, name, _, _ in _list_entries() if kind == "HOST_OP"}
    assert host == HOST_ONLY


def test_the_list_is_the_built_op_table():
    # the list's names are what the CUDA provider's table registers kernels under; the op table
    # takes its names from the om_op_defs: they must agree, op for op
    _C = pytest.importorskip("ortmod._C")
    table = [(name, domain) for name, domain, _ in _C.op_table()]
    assert [(name, domain) for _, _, name, domain, _ in _list_entries()] == table


def test_check_fails_when_an_op_is_left_out(tmp_path):
    path = _doctored(tmp_path, lambda t: re.sub(r'^    OP\(om_op_trilu, .*\n', "", t, flags=re.M))
    rc, _, err = _run("--check", "--list", path)
    assert rc == 1
    assert "om_op_trilu (defined in csrc/ops/misc.c) is not in the op list" in err


def test_check_fails_when_a_cuda_kernel_is_missing(tmp_path):
    path = _doctored(tmp_path, lambda t: t.replace("trilu_cuda)", "trilu_missing_cuda)"))
    rc, _, err = _run("--check", "--list", path)
    assert rc == 1
    assert "Trilu (om_op_trilu): no CUDA kernel: trilu_missing_cuda is not defined" in err


def test_check_fails_when_a_cpu_only_op_gives_no_reason(tmp_path):
    path = _doctored(tmp_path, lambda t: t.replace('OP(om_op_trilu, "Trilu", "", trilu_cuda)',
                                                   'HOST_OP(om_op_trilu, "Trilu", "", "")'))
    rc, _, err = _run("--check", "--list", path)
    assert rc == 1
    assert "Trilu (om_op_trilu): a HOST_OP (no CUDA kernel) must say why it needs none" in err


def test_check_fails_when_a_kernel_is_in_another_family_file(tmp_path):
    # TopK is topk.c's: listing it under nn.c means its kernel (in topk.cu) is in the wrong file
    path = _doctored(tmp_path, lambda t: t.replace("    /* topk.c */ \\\n", "", 1))
    rc, _, err = _run("--check", "--list", path)
    assert rc == 1
    assert "TopK (om_op_topk): listed under csrc/ops/reduce.c, defined in csrc/ops/topk.c" in err
    assert "its CUDA kernel select_cuda is in cuda/topk.cu, not in cuda/reduce.cu" in err

#!/usr/bin/env python
"""Lists every op with its CPU kernel and its CUDA kernel, from the one op list both devices are
built from (csrc/ops/op_list.h), and checks that each op has both. (The list also generates the
ops' ids, om_op_<sym>_id, which the compiler checks; tests/test_op_ids.py keeps names out of csrc/.)

    python scripts/ops.py            # the listing: name, domain, CPU family file and op def,
                                     # CUDA file and kernel function (or why the op has none)
    python scripts/ops.py --check    # exit 1, naming each problem, unless every op has both
    python scripts/ops.py --check --list COPY.h   # check another copy of the list (tests)

Read from the sources, nothing built or imported. --check finds:
  * an om_op_def in csrc/ops/*.c that the list leaves out, or a listed one defined nowhere;
  * an op listed under a family other than the file that defines it (csrc/ops/<family>.c);
  * an OP whose CUDA kernel is not defined in cuda/<family>.cu, or is `static` there (the
    provider's table, expanded from the list, could not link to it);
  * a HOST_OP (an op without a CUDA kernel) that gives no reason;
  * an op listed twice.
The provider's build fails on a missing kernel too (an undefined symbol, linked --no-undefined);
this check names the family file it belongs in, and runs without nvcc.
"""
import argparse
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OP_LIST = os.path.join(ROOT, "csrc", "ops", "op_list.h")

_FAMILY = re.compile(r"/\*\s*(\w+)\.c\s*\*/")
_ENTRY = re.compile(r'\b(OP|HOST_OP)\(\s*(\w+)\s*,\s*"(\w*)"\s*,\s*"(\w*)"\s*,\s*(\w+|"[^"]*")\s*\)')
# an op def: `const om_op_def om_op_x = {` or a family macro's `BIN(om_op_x, ...)`
_OP_DEF = re.compile(r"^(?:const om_op_def |[A-Z][A-Z0-9_]*\()(om_op_\w+)\b", re.M)
# a kernel: `om_status *x_cuda(const om_kernel_ctx ...` or a file's macro `UNARY(x_cuda, ...)`
_KERNEL = re.compile(r"^(static )?(?:om_status \*(\w+)\(const om_kernel_ctx|[A-Z][A-Z0-9_]*\((\w+)\s*,)", re.M)


def read_list(path):
    """The ops of an op list, in order: dicts with kind, sym, name, domain, family and cuda
    (the kernel function) or why (a HOST_OP's reason)."""
    with open(path) as f:
        text = f.read()
    start = text.find("#define OM_OP_LIST(")
    if start < 0:
        raise SystemExit(f"{path}: no OM_OP_LIST")
    ops, family = [], None
    for line in text[start:].splitlines():
        m = _FAMILY.search(line)
        if m:
            family = m.group(1)
        for kind, sym, name, domain, last in _ENTRY.findall(line):
            op = {"kind": kind, "sym": sym, "name": name, "domain": domain, "family": family}
            if kind == "OP":
                op["cuda"] = last
            else:
                op["why"] = last.strip('"')
            ops.append(op)
        if not line.rstrip().endswith("\\"):
            break
    return ops


def _sources(pattern, regex, groups):
    """{symbol: [(file relative to ROOT, is_static)]} over the files matching pattern."""
    found = {}
    for path in sorted(glob.glob(os.path.join(ROOT, pattern))):
        with open(path) as f:
            text = f.read()
        for m in regex.finditer(text):
            name = next(m.group(g) for g in groups if m.group(g))
            static = bool(m.lastindex and m.group(1) and m.group(1).startswith("static"))
            found.setdefault(name, []).append((os.path.relpath(path, ROOT), static))
    return found


def cpu_defs():
    return {k: [f for f, _ in v] for k, v in _sources("csrc/ops/*.c", _OP_DEF, (1,)).items()}


def cuda_defs():
    return _sources("cuda/*.cu", _KERNEL, (2, 3))


def problems(ops):
    """Every way the list and the sources disagree, one line each (empty: each op has both)."""
    out = []
    cpu, cuda = cpu_defs(), cuda_defs()
    seen = {}
    for op in ops:
        key = (op["name"], op["domain"])
        label = f"{op['domain'] + '.' if op['domain'] else ''}{op['name']} ({op['sym']})"
        if key in seen or op["sym"] in {o["sym"] for o in seen.values()}:
            out.append(f"{label}: listed twice")
        seen[key] = op
        want = f"csrc/ops/{op['family']}.c"
        where = cpu.get(op["sym"], [])
        if not where:
            out.append(f"{label}: no om_op_def {op['sym']} in csrc/ops/*.c")
        elif where != [want]:
            out.append(f"{label}: listed under {want}, defined in {', '.join(where)}")
        if op["kind"] == "HOST_OP":
            if not op["why"].strip():
                out.append(f"{label}: a HOST_OP (no CUDA kernel) must say why it needs none")
            continue
        want = f"cuda/{op['family']}.cu"
        where = cuda.get(op["cuda"], [])
        if not where:
            out.append(f"{label}: no CUDA kernel: {op['cuda']} is not defined in cuda/*.cu (define it in {want}, "
                       f"or list the op as a HOST_OP with the reason it needs none)")
        elif [f for f, _ in where] != [want]:
            out.append(f"{label}: its CUDA kernel {op['cuda']} is in {', '.join(f for f, _ in where)}, "
                       f"not in {want}")
        elif where[0][1]:
            out.append(f"{label}: its CUDA kernel {op['cuda']} is static in {want}: the provider cannot link to it")
    listed = {op["sym"] for op in ops}
    for sym, files in sorted(cpu.items()):
        if sym not in listed:
            out.append(f"{sym} (defined in {', '.join(files)}) is not in the op list: the engine cannot find it")
    return out


def listing(ops):
    cuda = cuda_defs()
    rows = [("op", "domain", "CPU", "CUDA")]
    for op in ops:
        cpu = f"csrc/ops/{op['family']}.c {op['sym']}"
        if op["kind"] == "OP":
            files = ", ".join(f for f, _ in cuda.get(op["cuda"], [])) or "MISSING"
            gpu = f"{files} {op['cuda']}"
        else:
            gpu = f"none: {op['why']}"
        rows.append((op["name"], op["domain"] or '""', cpu, gpu))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:3], widths)) + "  " + r[3] for r in rows]
    n_cuda = sum(op["kind"] == "OP" for op in ops)
    lines.append(f"{len(ops)} ops: {n_cuda} with a CPU and a CUDA kernel, {len(ops) - n_cuda} CPU only "
                 f"(never run as a CUDA kernel: the reason is given)")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 unless every op has both kernels")
    ap.add_argument("--list", default=OP_LIST, help="the op list to read (default: csrc/ops/op_list.h)")
    args = ap.parse_args(argv)
    ops = read_list(args.list)
    if not args.check:
        print(listing(ops))
        return 0
    bad = problems(ops)
    for line in bad:
        print(line, file=sys.stderr)
    if bad:
        print(f"op registry: {len(bad)} problem(s) in {os.path.relpath(args.list, ROOT)}", file=sys.stderr)
        return 1
    print(f"op registry: {len(ops)} ops, each with its CPU and CUDA kernel or a reason it has no CUDA kernel")
    return 0


if __name__ == "__main__":
    sys.exit(main())

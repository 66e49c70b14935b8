"""Ops by id (csrc/ops/op_list.h's om_op_id): the engine names the ops it emits and matches by
their generated id (om_op_mul_id), so a misspelled op fails to compile. An op's name, as a string,
belongs only to the op list, to each op's own definition (its om_op_def's .name), to the ONNX
import and export (where names come from and go to models) and to messages. This test reads the
sources and finds any other string literal that is exactly an op's name. Read from the sources: no
build needed."""
import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "csrc")
OP_LIST = os.path.join(CSRC, "ops", "op_list.h")

# Where an op's name is data, not a reference to the engine's op: file -> {name: why}.
ALLOWED = {
    "ops/op_list.h": "the list itself",
    "graph/onnx_import.c": "the ONNX import resolves names to ids",
    "graph/onnx_export.c": "the ONNX export writes names",
    # the runner builds its loss head as an ONNX model, which the import then reads
    "runner/runner_model.c": "writes ONNX NodeProtos",
}
ALLOWED_STRINGS = {
    ("ops/rnn_geom.h", "Relu"): "an LSTM/GRU/RNN 'activations' attribute value (ONNX's spelling)",
    ("ops/rnn_geom.h", "Tanh"): "an LSTM/GRU/RNN 'activations' attribute value (ONNX's spelling)",
    ("ops/pad_geom.h", "Pad"): "a message's fallback; the header is the CUDA provider's too, which has no op table",
    ("runner/runner_optim.c", "Constant"): "an LR schedule's name",
}

# a string literal, a char literal, or a comment: scanned in one pass so that quotes inside
# comments and comment markers inside strings are read as what they are
TOKEN = re.compile(r'"((?:[^"\\\n]|\\.)*)"|\'(?:[^\'\\\n]|\\.)*\'|/\*.*?\*/|//[^\n]*', re.S)
# an op's own definition names it: `.name = "Mul"` or a definition macro `BIN(om_op_mul, "Mul", ...)`
DEFINITION = re.compile(r'(\.name\s*=\s*|^\s*[A-Z][A-Z0-9_]*\(\s*om_op_\w+\s*,\s*)$', re.M)


def op_names():
    with open(OP_LIST) as f:
        return set(re.findall(r'\b(?:HOST_)?OP\(\s*\w+\s*,\s*"(\w+)"', f.read()))


def op_name_strings(root=CSRC):
    """'file:line: "Name"' for every string literal under root that is exactly an op's name, outside
    the allowed places."""
    names, found = op_names(), []
    for path in sorted(glob.glob(os.path.join(root, "**", "*.[ch]"), recursive=True)):
        rel = os.path.relpath(path, root).replace(os.sep, "/")
        if rel in ALLOWED:
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        for m in TOKEN.finditer(text):
            s = m.group(1)
            if s is None or s not in names or (rel, s) in ALLOWED_STRINGS:
                continue
            line_start = text.rfind("\n", 0, m.start()) + 1
            if DEFINITION.search(text[line_start:m.start()]):
                continue
            found.append(f'{rel}:{text.count(chr(10), 0, m.start()) + 1}: "{s}"')
    return found


def test_the_list_is_read():
    assert len(op_names()) > 100, "found too few ops in op_list.h: the scan is broken"


def test_no_op_is_named_by_string():
    bad = op_name_strings()
    assert not bad, ("the engine names ops by id (om_op_<name>_id, generated from csrc/ops/op_list.h), so that "
                     "a misspelled op fails to compile; these name one by string:\n" + "\n".join(bad))


def test_the_scan_finds_a_string(tmp_path):
    (tmp_path / "ops").mkdir()
    (tmp_path / "ops" / "x.c").write_text('/* "Mul" in a comment is fine */\n'
                                          'const om_op_def om_op_mul = {.name = "Mul"};\n'
                                          'int f(om_grad_ctx *c) { return om_emit1(c, "Mul", 0); }\n')
    assert op_name_strings(str(tmp_path)) == ['ops/x.c:3: "Mul"']

#!/usr/bin/env python
"""Mutation fuzzer for the ONNX importer and everything after it (passes, autodiff, planning,
the kernels of one forward and backward).

    python scripts/fuzz_onnx.py --seconds 300 --out /tmp/fuzz           # the normal build
    ORTMOD_HOSTILE_SO=build/san/_C...so \\
      LD_PRELOAD=$(gcc -print-file-name=libasan.so) \\
      ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1:max_allocation_size_mb=4096 \\
      python scripts/fuzz_onnx.py --seconds 300 --out /tmp/fuzz-asan   # under ASan/UBSan (build/san: make test-asan)
    python scripts/fuzz_onnx.py --replay /tmp/fuzz-asan/crash_*.onnx       # after a fix

Seeds are small valid models written with onnx.helper (no torch). Each input is a seed
mutated at the protobuf level (op types, names, dims, attribute types and values, opsets,
empty inputs, extreme integers) or at the byte level (flips, cuts, splices). A worker process
(only the extension is loaded, from ORTMOD_HOSTILE_SO or ortmod/_C*.so) builds an Engine from
the bytes and, when that works, runs a forward and a backward on inputs of the declared
shapes. A clean exception is the expected answer; a worker that dies (a signal, a sanitizer
report) is a finding: its input is saved to OUT/crash_<n>.onnx with the worker's stderr.
Prints how many inputs ran, how many the engine accepted, and the findings.
"""
import argparse
import json
import os
import random
import re
import struct
import subprocess
import sys
import time

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WORKER = r'''
import glob, importlib.util, os, resource, struct, sys
import numpy as np
if not os.environ.get("ORTMOD_HOSTILE_SO"):   # a huge model's malloc fails cleanly instead of the OOM killer
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
so = os.environ.get("ORTMOD_HOSTILE_SO") or glob.glob(os.path.join(sys.argv[1], "ortmod", "_C*.so"))[0]
spec = importlib.util.spec_from_file_location("ortmod._C", so)
_C = importlib.util.module_from_spec(spec)
spec.loader.exec_module(_C)
_C.set_num_threads(1)

class Cap:
    def __init__(self, c): self.c = c
    def __dlpack__(self, **kw): return self.c
    def __dlpack_device__(self): return (1, 0)

DT = {1: np.float32, 11: np.float64, 7: np.int64, 6: np.int32, 9: np.bool_, 2: np.uint8, 3: np.int8}
inp, out = sys.stdin.buffer, sys.stdout
while True:
    verdict = ""
    head = inp.read(4)
    if len(head) < 4: break
    (n,) = struct.unpack("<I", head)
    data = inp.read(n)
    spec_len = struct.unpack("<I", inp.read(4))[0]
    specs = eval(inp.read(spec_len).decode())   # [(dtype, shape) per graph input], written by the parent
    try:
        eng = _C.Engine(data, None)
        k = len(eng.input_names)
        flags = [bool(i < len(specs) and specs[i][0] in (1, 11)) for i in range(k)]
        if any(flags):
            eng = _C.Engine(data, flags)
        ins = []
        for i in range(k):
            dt, shape = specs[i] if i < len(specs) else (1, [2])
            a = (np.random.default_rng(i).standard_normal(shape) * 3).astype(DT.get(dt, np.float32))
            ins.append(a)
        verdict = "accepted"   # (the forward below may still refuse the inputs)
        caps, stash = eng.forward(ins, any(flags))
        outs = [np.from_dlpack(Cap(c)) for c in caps]
        if stash is not None:
            eng.backward(stash, [np.ones_like(o) if o.dtype.kind == "f" else None for o in outs])
        verdict = "ran"
    except Exception as e:
        msg = " ".join(str(e).split())[:90]
        verdict = ("run-error:" if verdict == "accepted" else "error:") + type(e).__name__ + ":" + msg
    out.write(verdict + "\n")
    out.flush()
'''


# ---- seeds ---------------------------------------------------------------------------------

def vi(name, dt=T.FLOAT, shape=None):
    return h.make_tensor_value_info(name, dt, shape)


def mk(nodes, inputs, outputs, inits=(), opset=17, ms=False):
    ops = [h.make_opsetid("", opset)] + ([h.make_opsetid("com.microsoft", 1)] if ms else [])
    return h.make_model(h.make_graph(nodes, "g", inputs, outputs, list(inits)), opset_imports=ops)


def f32(name, *shape, seed=0):
    return nh.from_array(np.random.default_rng(seed).standard_normal(shape).astype(np.float32), name)


def i64(name, vals):
    return nh.from_array(np.array(vals, np.int64), name)


def seeds():
    x = vi("x", T.FLOAT, [4, 6])
    y = vi("y")
    s = []
    s.append(mk([h.make_node("Relu", ["x"], ["y"])], [x], [y]))
    s.append(mk([h.make_node("Gemm", ["x", "w", "b"], ["h"], transB=1), h.make_node("Tanh", ["h"], ["y"])], [x], [y],
                [f32("w", 5, 6), f32("b", 5)]))
    s.append(mk([h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Add", ["m", "b"], ["a"]),
                 h.make_node("Gelu", ["a"], ["y"])], [x], [y], [f32("w", 6, 8), f32("b", 8)], opset=20))
    s.append(mk([h.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["y"])], [x], [y],
                [i64("st", [1, -1]), i64("en", [4, -7]), i64("ax", [0, 1]), i64("sp", [2, -2])]))
    s.append(mk([h.make_node("Softmax", ["x"], ["s"], axis=-1), h.make_node("ReduceSum", ["s", "r"], ["y"], keepdims=0)],
                [x], [y], [i64("r", [1])]))
    s.append(mk([h.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1, epsilon=1e-5)], [x], [y],
                [f32("g", 6), f32("b", 6)]))
    s.append(mk([h.make_node("Reshape", ["x", "sh"], ["r"]), h.make_node("Transpose", ["r"], ["t"], perm=[1, 0, 2]),
                 h.make_node("Concat", ["t", "t"], ["y"], axis=2)], [x], [y], [i64("sh", [2, 2, 6])]))
    s.append(mk([h.make_node("Expand", ["x", "sh"], ["e"]), h.make_node("ReduceMean", ["e"], ["y"], axes=[0], keepdims=1)],
                [x], [y], [i64("sh", [3, 4, 6])], opset=17))
    s.append(mk([h.make_node("Gather", ["w", "idx"], ["g"], axis=0), h.make_node("Mul", ["g", "x"], ["y"])], [x], [y],
                [f32("w", 10, 6), i64("idx", [1, 2, 3, 9])]))
    s.append(mk([h.make_node("Split", ["x", "sp"], ["a", "b"], axis=1), h.make_node("Sub", ["a", "b"], ["y"])], [x],
                [y], [i64("sp", [3, 3])]))
    s.append(mk([h.make_node("Conv", ["img", "k"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1]),
                 h.make_node("MaxPool", ["c"], ["y"], kernel_shape=[2, 2], strides=[2, 2])],
                [vi("img", T.FLOAT, [1, 2, 6, 6])], [y], [f32("k", 3, 2, 3, 3)]))
    s.append(mk([h.make_node("LogSoftmax", ["x"], ["l"], axis=1),
                 h.make_node("NegativeLogLikelihoodLoss", ["l", "t"], ["y"], reduction="mean")], [x], [y],
                [i64("t", [0, 1, 2, 5])]))
    s.append(mk([h.make_node("Dropout", ["x", "r", "tm"], ["d", "mask"]), h.make_node("Add", ["d", "x"], ["y"])], [x],
                [y], [nh.from_array(np.array(0.1, np.float32), "r"), nh.from_array(np.array(True), "tm")]))
    s.append(mk([h.make_node("Constant", [], ["c"], value=f32("v", 4, 6)), h.make_node("Where", ["m", "x", "c"], ["y"])],
                [x, vi("m", T.BOOL, [4, 6])], [y]))
    s.append(mk([h.make_node("CumSum", ["x", "ax"], ["cs"]), h.make_node("Pad", ["cs", "p"], ["y"], mode="constant")],
                [x], [y], [i64("ax", [1]), i64("p", [0, 1, 0, 1])]))
    s.append(mk([h.make_node("BiasGelu", ["x", "b"], ["y"], domain="com.microsoft")], [x], [y], [f32("b", 6)], ms=True))
    return s


OPS = ["Relu", "Gemm", "MatMul", "Add", "Mul", "Slice", "Softmax", "ReduceSum", "LayerNormalization", "Reshape",
       "Transpose", "Concat", "Expand", "Gather", "Split", "Conv", "MaxPool", "Dropout", "Where", "CumSum", "Pad",
       "Einsum", "Tile", "Trilu", "Range", "ConstantOfShape", "Unsqueeze", "Squeeze", "Flatten", "Cast", "Shape",
       "GatherElements", "ScatterElements", "LSTM", "GRU", "BatchNormalization", "AveragePool", "Clip", "Pow",
       "SoftmaxCrossEntropyLoss", "MatMulBias", "FusedAttention", "BiasDropout", "GeluGrad", "SliceGrad",
       "GatherGrad", "ReduceGrad", "Identity", "Size", "Sum", "Max", "Div", "Mod", "Sqrt", "Erf"]
EXTREME = [0, 1, -1, 2, 3, 7, 2 ** 31 - 1, -2 ** 31, 2 ** 32, 2 ** 62, 2 ** 63 - 1, -2 ** 63, 2 ** 40, -2 ** 40]


def mutate_proto(m, rng):
    m = onnx.ModelProto.FromString(m.SerializeToString())
    g = m.graph
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        # weighted toward changes that keep the model loadable, so that inputs reach the passes,
        # the planner and the kernels: op types, attributes, integer data, shapes
        k = rng.choice([0, 0, 1, 2, 3, 4, 4, 4, 5, 6, 6, 6, 6, 7, 8, 9, 10, 10, 11, 12, 13])
        nodes = list(g.node)
        n = rng.choice(nodes) if nodes else None
        if k == 0 and n is not None:
            n.op_type = rng.choice(OPS + [""])
            if rng.random() < 0.3:
                n.domain = rng.choice(["", "com.microsoft", "ortmod", "ai.onnx", "bogus"])
        elif k == 1 and n is not None and len(n.input):
            i = rng.randrange(len(n.input))
            n.input[i] = rng.choice(["", "x", "nope", n.input[i], *(o for nn in nodes for o in nn.output)])
        elif k == 2 and n is not None and len(n.output):
            n.output[rng.randrange(len(n.output))] = rng.choice(["", "x", "y", "dup"])
        elif k == 3 and len(g.initializer):
            t = rng.choice(list(g.initializer))
            if len(t.dims) and rng.random() < 0.7:
                t.dims[rng.randrange(len(t.dims))] = rng.choice(EXTREME)
            else:
                t.dims.append(rng.choice(EXTREME))
        elif k == 4 and len(g.initializer):
            t = rng.choice(list(g.initializer))
            if t.raw_data:
                b = bytearray(t.raw_data)
                if b and rng.random() < 0.8:
                    for _ in range(rng.randint(1, 8)):
                        b[rng.randrange(len(b))] = rng.randrange(256)
                else:
                    b = b[:rng.randrange(len(b) + 1)]
                t.raw_data = bytes(b)
            if t.data_type == T.INT64 and t.raw_data and len(t.raw_data) % 8 == 0:
                vals = np.frombuffer(t.raw_data, np.int64).copy()
                if len(vals):
                    vals[rng.randrange(len(vals))] = rng.choice(EXTREME)
                    t.raw_data = vals.tobytes()
        elif k == 5 and len(g.initializer):
            rng.choice(list(g.initializer)).data_type = rng.choice([0, 1, 2, 3, 6, 7, 8, 9, 10, 11, 12, 16, 99])
        elif k == 6 and n is not None:
            name = rng.choice(["axis", "perm", "axes", "keepdims", "transB", "alpha", "epsilon", "approximate", "mode",
                               "pads", "strides", "kernel_shape", "to", "value", "reduction", "split", "upper", "",
                               "equation", "direction", "hidden_size", "group", "dilations", "ignore_index"])
            val = rng.choice([rng.choice(EXTREME), 0.5, float("nan"), float("inf"), "tanh", "", b"\xff\x00",
                              [rng.choice(EXTREME) for _ in range(rng.randint(0, 9))], [0.5, -1.0],
                              nh.from_array(np.array([1.0], np.float32))])
            try:
                n.attribute.extend([h.make_attribute(name or "x", val)])
                if not name:
                    n.attribute[-1].name = ""
            except Exception:
                pass
        elif k == 7 and n is not None and len(n.attribute):
            a = rng.choice(list(n.attribute))
            a.type = rng.choice([0, 1, 2, 3, 4, 5, 6, 7, 8, 13])
        elif k == 8 and len(m.opset_import):
            m.opset_import[0].version = rng.choice([0, 1, 12, 13, 17, 20, 23, 99, 101, 2 ** 31, 2 ** 62, -1])
        elif k == 9 and nodes:
            g.node.insert(rng.randrange(len(nodes) + 1), onnx.NodeProto.FromString(rng.choice(nodes).SerializeToString()))
        elif k == 10 and len(g.input):
            vinfo = rng.choice(list(g.input))
            if rng.random() < 0.3:
                vinfo.name = rng.choice(["", "y", "x"])
            else:
                d = vinfo.type.tensor_type.shape.dim
                if len(d):
                    d[rng.randrange(len(d))].dim_value = rng.choice([0, 1, 3, 2 ** 20, 2 ** 40, 2 ** 62])
                vinfo.type.tensor_type.elem_type = rng.choice([1, 1, 1, 7, 9, 10, 11, 0])
        elif k == 11 and n is not None and rng.random() < 0.5:
            if len(n.input) < 12:
                n.input.append(rng.choice(["", "x", n.input[0] if len(n.input) else "x"]))
            else:
                del n.input[-1]
        elif k == 12 and len(g.output):
            rng.choice(list(g.output)).name = rng.choice(["", "x", "nope", *(o for nn in nodes for o in nn.output)])
        elif k == 13 and nodes:
            del g.node[rng.randrange(len(nodes))]
    return m.SerializeToString()


def mutate_bytes(b, rng):
    b = bytearray(b)
    for _ in range(rng.randint(1, 6)):
        k = rng.randrange(4)
        if k == 0 and b:
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        elif k == 1 and b:
            b[rng.randrange(len(b))] = rng.choice([0, 0x7f, 0x80, 0xff])
        elif k == 2 and b:
            i = rng.randrange(len(b))
            del b[i:i + rng.randint(1, 16)]
        else:
            i = rng.randrange(len(b) + 1)
            b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    return bytes(b)


def input_specs(data):
    """(dtype, shape) per declared graph input of data, for the worker to make inputs; [] when
    the bytes do not parse."""
    try:
        m = onnx.ModelProto.FromString(data)
    except Exception:
        return []
    inits = {t.name for t in m.graph.initializer}
    out = []
    for v in m.graph.input:
        if v.name in inits:
            continue
        tt = v.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") and 0 < d.dim_value <= 64 else 2 for d in tt.shape.dim]
        out.append((tt.elem_type, shape[:6]))
    return out


class Worker:
    def __init__(self):
        self.p = subprocess.Popen([sys.executable, "-c", WORKER, ROOT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)

    def run(self, data, specs):
        s = repr(specs).encode()
        try:
            self.p.stdin.write(struct.pack("<I", len(data)) + data + struct.pack("<I", len(s)) + s)
            self.p.stdin.flush()
            line = self.p.stdout.readline()
        except BrokenPipeError:
            line = b""
        if line:
            return line.decode().strip(), None
        self.p.wait()
        err = self.p.stderr.read().decode(errors="replace")
        return None, (self.p.returncode, err[-6000:])

    def close(self):
        self.p.stdin.close()
        self.p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="/tmp/ortmod-fuzz")
    ap.add_argument("--messages", type=int, default=0, help="also print the N most common error messages")
    ap.add_argument("--replay", nargs="+", metavar="FILE", help="run these saved inputs once each (no fuzzing)")
    args = ap.parse_args()
    if args.replay:
        w, bad = Worker(), 0
        for path in args.replay:
            data = open(path, "rb").read()
            verdict, crash = w.run(data, input_specs(data))
            if crash:
                bad += 1
                w = Worker()
                first = next((ln for ln in crash[1].splitlines() if "ERROR" in ln or "runtime error" in ln), "")
                print(f"{path}: status {crash[0]} {first}")
            else:
                print(f"{path}: {verdict[:150]}")
        w.close()
        sys.exit(1 if bad else 0)
    os.makedirs(args.out, exist_ok=True)
    rng = random.Random(args.seed)
    pool = [m for m in seeds()]
    w = Worker()
    counts, messages, crashes, t_end, n = {}, {}, 0, time.time() + args.seconds, 0
    while time.time() < t_end:
        m = rng.choice(pool)
        try:
            data = mutate_proto(m, rng) if rng.random() < 0.75 else mutate_bytes(m.SerializeToString(), rng)
        except (ValueError, TypeError, IndexError):   # the onnx package refused to build the mutant
            continue
        verdict, crash = w.run(data, input_specs(data))
        n += 1
        if crash:
            crashes += 1
            path = os.path.join(args.out, f"crash_{crashes}.onnx")
            with open(path, "wb") as f:
                f.write(data)
            with open(path + ".txt", "w") as f:
                f.write(f"status {crash[0]}\n{crash[1]}")
            print(f"finding {crashes}: status {crash[0]}, saved {path}", flush=True)
            w = Worker()
            continue
        kind = verdict.split(":")[0]
        counts[kind] = counts.get(kind, 0) + 1
        if kind in ("ran", "run-error") and len(pool) < 400:   # grow the corpus with what got deep
            try:
                pool.append(onnx.ModelProto.FromString(data))
            except Exception:
                pass
        if args.messages and ":" in verdict:
            key = re.sub(r"'[^']*'|[0-9]+", "_", verdict.split(":", 2)[2])
            messages[key] = messages.get(key, 0) + 1
    w.close()
    for k, v in sorted(messages.items(), key=lambda kv: -kv[1])[:args.messages]:
        print(f"{v:8d}  {k}")
    print(json.dumps({"inputs": n, "verdicts": counts, "findings": crashes}))


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""Writes the fuzz targets' seed and regression corpus (committed; run again after changing
the cases or the checkpoint format):

  tests/fuzz/runner/          the model and shard fuzz_checkpoint trains (FUZZ_RUNNER_DIR)
  tests/fuzz/corpus/onnx/     every crafted model of tests/test_hostile_input.py (the issue 15
                              crashes and what the fuzzers found since), the seeds of
                              scripts/fuzz_onnx.py
  tests/fuzz/corpus/checkpoint/  one byte of mode (fuzz_checkpoint.c) + a checkpoint written by
                              ortmod-train for that model, intact, bit-flipped, truncated, of
                              format 1, with crafted counters (mode 1: its checksum is fixed
                              up, so the header checks are what answers); shards, good and bad
  found_*                     inputs make fuzz found, kept as they are (this script leaves them)

    .venv/bin/python tests/fuzz/make_corpus.py       (needs ortmod/bin/ortmod-train: make build)
"""
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests"), os.path.join(ROOT, "scripts")]

import fuzz_onnx                       # noqa: E402
import test_hostile_input as hostile   # noqa: E402
from ortmod.runner import write_shards  # noqa: E402

I64_MIN, I64_MAX = -(2 ** 63), 2 ** 63 - 1


def runner_dir():
    d = os.path.join(HERE, "runner")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    rng = np.random.default_rng(0)
    w = nh.from_array(rng.standard_normal((3, 4)).astype(np.float32) * 0.1, "w")
    b = nh.from_array(np.zeros(3, np.float32), "b")
    g = h.make_graph([h.make_node("Gemm", ["x", "w", "b"], ["logits"], transB=1)], "linear",
                     [h.make_tensor_value_info("x", T.FLOAT, ["batch", 4])],
                     [h.make_tensor_value_info("logits", T.FLOAT, ["batch", 3])], [w, b])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], producer_name="make_corpus")
    with open(os.path.join(d, "model.onnx"), "wb") as f:
        f.write(m.SerializeToString())
    write_shards(os.path.join(d, "train"), {"x": rng.standard_normal((16, 4)).astype(np.float32),
                                            "labels": rng.integers(0, 3, 16).astype(np.int64)})
    return d


def fresh(d):
    """Empties d of what this script wrote before; found_* files (inputs libFuzzer found,
    committed by hand after the fix) stay."""
    os.makedirs(d, exist_ok=True)
    for name in os.listdir(d):
        if not name.startswith("found_"):
            os.remove(os.path.join(d, name))


def write(dirname, name, data):
    with open(os.path.join(dirname, name), "wb") as f:
        f.write(data)


def onnx_corpus():
    d = os.path.join(HERE, "corpus", "onnx")
    fresh(d)
    for name, case in hostile.CASES.items():
        write(d, f"hostile_{name}.onnx", case["model"])
    for i, m in enumerate(fuzz_onnx.seeds()):
        write(d, f"seed_{i:02d}.onnx", m.SerializeToString())


def records(data):
    out, pos = [], 0
    while pos < len(data):
        (n,) = struct.unpack_from("<I", data, pos)
        t = T()
        t.ParseFromString(data[pos + 4:pos + 4 + n])
        out.append(t)
        pos += 4 + n
    return out


def pack(recs):
    return b"".join(struct.pack("<I", len(b)) + b for b in (t.SerializeToString() for t in recs))


def with_counter(state, index, value):
    recs = records(state)
    c = next(t for t in recs if t.name == "meta/counters")
    vals = nh.to_array(c).copy()
    vals[index] = value
    c.CopyFrom(nh.from_array(vals, "meta/counters"))
    return pack(recs)   # the checksum is stale: mode 1 fixes it up


def checkpoint_corpus(rdir):
    d = os.path.join(HERE, "corpus", "checkpoint")
    fresh(d)
    binary = os.path.join(ROOT, "ortmod", "bin", "ortmod-train")
    with tempfile.TemporaryDirectory() as tmp:
        ck = os.path.join(tmp, "ck")
        r = subprocess.run([binary, "--model", os.path.join(rdir, "model.onnx"), "--train_data_dir",
                            os.path.join(rdir, "train"), "--optimizer", "AdamW", "--train_batch_size", "4",
                            "--num_train_steps", "3", "--checkpoints_dir", ck, "--checkpoint_period", "1"],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        state = open(os.path.join(ck, "checkpoint_3", "state.pb"), "rb").read()
    write(d, "intact", b"\0" + state)
    for k, pos in enumerate((10, len(state) // 2, len(state) - 3)):
        bad = bytearray(state)
        bad[pos] ^= 0x10
        write(d, f"bit_flip_{k}", b"\0" + bytes(bad))
    write(d, "truncated", b"\0" + state[:-40])
    recs = records(state)
    old = [t for t in recs if t.name != "meta/checksum"]
    next(t for t in old if t.name == "meta/format").CopyFrom(nh.from_array(np.array([1], np.int64), "meta/format"))
    write(d, "format_1", b"\0" + pack(old))
    # the rows: a negative data cursor (read before the data), negative or absurd counters
    for name, (index, value) in {"cursor_negative": (2, -5), "cursor_huge": (2, I64_MAX - 3),
                                 "step_negative": (0, -1), "update_negative": (1, -3),
                                 "weights_count": (7, 9), "optimizer_kind": (6, 7)}.items():
        write(d, f"header_{name}", b"\1" + with_counter(state, index, value))
    # shards (mode 2): good, cut short, a record that claims more bytes than there are, huge dims
    shard = open(os.path.join(rdir, "train", sorted(os.listdir(os.path.join(rdir, "train")))[0]), "rb").read()
    write(d, "shard_intact", b"\2" + shard)
    write(d, "shard_truncated", b"\2" + shard[:len(shard) // 3])
    write(d, "shard_length_lies", b"\2" + struct.pack("<I", 0x7FFFFFF0) + shard[4:64])
    huge = T(name="x", data_type=T.FLOAT, dims=[2 ** 31, 2 ** 31, 4])
    write(d, "shard_huge_dims", b"\2" + pack([huge]))


if __name__ == "__main__":
    rdir = runner_dir()
    onnx_corpus()
    checkpoint_corpus(rdir)
    for sub in ("onnx", "checkpoint"):
        print(sub, len(os.listdir(os.path.join(HERE, "corpus", sub))), "files")

"""The native training runner (`ortmod-train`, csrc/runner/): training from shards,
gradient accumulation, SIGKILL + resume, the saved ONNX in onnxruntime, TensorBoard
events, the profile, loss scaling, and clear errors on bad input.

The binary is built by `make build` (incremental, seconds when done)."""
import json
import os
import re
import signal
import struct
import subprocess
import sys
import time
import warnings

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import buildpaths

from ortmod.runner import read_shards, write_shards

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BINARY = buildpaths.RUNNER
D, H, C = 12, 32, 4


@pytest.fixture(scope="module")
def binary():
    r = buildpaths.build()
    assert r.returncode == 0, r.stdout + r.stderr
    return BINARY


def export_mlp(path, hidden=H, seed=0):
    import torch

    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(D, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, C))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, (torch.zeros(2, D),), path, dynamo=False, input_names=["x"], output_names=["logits"],
                          dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}}, opset_version=20)
    return path


def make_data(n, rng, centers):
    y = rng.integers(0, C, n)
    x = (centers[y] + 1.2 * rng.standard_normal((n, D))).astype(np.float32)
    return x, y.astype(np.int64)


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    """An MLP exported from torch and a synthetic 4-class task: 1024 training samples in
    4 shards, 512 held out."""
    d = tmp_path_factory.mktemp("runner_task")
    rng = np.random.default_rng(0)
    centers = rng.standard_normal((C, D)) * 1.0
    x, y = make_data(1024, rng, centers)
    write_shards(d / "train", {"x": x, "labels": y}, num_shards=4)
    x, y = make_data(512, rng, centers)
    write_shards(d / "test", {"x": x, "labels": y})
    export_mlp(str(d / "mlp.onnx"))
    export_mlp(str(d / "mlp_wide.onnx"), hidden=H + 8)
    return d


def run_cli(binary, *args, env=None, via_entry_point=False):
    cmd = ([sys.executable, "-m", "ortmod.runner.cli"] if via_entry_point else [binary]) + [str(a) for a in args]
    e = dict(os.environ, ORTMOD_TRAIN_BINARY=binary, PYTHONPATH=ROOT)
    e.update(env or {})
    return subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=120)


def weights(path):
    m = onnx.load(str(path))
    return {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}


def common(task, out, *extra):
    return ["--model", task / "mlp.onnx", "--train_data_dir", task / "train", "--output_dir", out, *extra]


# ---- training, onnxruntime -----------------------------------------------------------

def test_train_mlp_to_accuracy_and_onnxruntime_matches_ours(binary, task, tmp_path):
    out = tmp_path / "out"
    r = run_cli(binary, *common(task, out, "--test_data_dir", task / "test", "--optimizer", "AdamW",
                                "--learning_rate", "0.01", "--num_train_steps", "200", "--train_batch_size", "32",
                                "--evaluation_period", "100", "--display_loss_steps", "50", "--shuffle"),
                via_entry_point=True)
    assert r.returncode == 0, r.stderr
    steps = [ln for ln in r.stdout.splitlines() if ln.startswith("step ")]
    assert len(steps) == 4 and "samples/s" in steps[0] and " ms" in steps[0], r.stdout
    evals = [ln for ln in r.stdout.splitlines() if ln.startswith("eval ")]
    assert len(evals) == 2 and "accuracy" in evals[-1], r.stdout
    assert "throughput" in r.stdout and "peak memory" in r.stdout
    summary = json.loads((out / "summary.json").read_text())
    print("summary:", summary)
    # the Bayes rate of this task is about 0.9; an untrained model is at 0.25
    assert summary["eval_accuracy"] >= 0.80, summary
    assert summary["updates"] == 200 and summary["throughput"] > 0 and summary["stabilized_throughput"] > 0
    assert summary["peak_memory_mb"] > 0

    ort = pytest.importorskip("onnxruntime")
    test = read_shards(task / "test")
    model_bytes = (out / "trained_model.onnx").read_bytes()
    onnx.checker.check_model(onnx.load_from_string(model_bytes))
    theirs = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"]).run(None, {"x": test["x"]})[0]

    from ortmod import _C

    class Cap:
        def __init__(self, c): self.c = c
        def __dlpack__(self, **kw): return self.c
        def __dlpack_device__(self): return (1, 0)

    outs, _ = _C.Engine(model_bytes, None).forward([test["x"]], False)
    ours = np.from_dlpack(Cap(outs[0]))
    print("max |onnxruntime - ortmod| logits:", np.abs(theirs - ours).max())
    np.testing.assert_allclose(theirs, ours, rtol=1e-4, atol=1e-4)
    acc = (theirs.argmax(1) == test["labels"]).mean()
    assert abs(acc - summary["eval_accuracy"]) < 1e-6
    # the untouched structure: same nodes, same initializer names, new values
    before, after = weights(task / "mlp.onnx"), weights(out / "trained_model.onnx")
    assert before.keys() == after.keys()
    assert all(not np.array_equal(before[k], after[k]) for k in before)


def test_gradient_accumulation_equals_larger_batch(binary, task, tmp_path):
    big = run_cli(binary, *common(task, tmp_path / "big", "--train_batch_size", "32", "--num_train_steps", "10"))
    acc = run_cli(binary, *common(task, tmp_path / "acc", "--train_batch_size", "8", "--num_train_steps", "40",
                                  "--gradient_accumulation_steps", "4"))
    assert big.returncode == 0 and acc.returncode == 0, big.stderr + acc.stderr
    wb, wa = weights(tmp_path / "big" / "trained_model.onnx"), weights(tmp_path / "acc" / "trained_model.onnx")
    diff = max(np.abs(wb[k] - wa[k]).max() for k in wb)
    moved = min(np.abs(wb[k] - weights(task / "mlp.onnx")[k]).max() for k in wb)
    print(f"max |w(batch 32) - w(batch 8 x 4)| = {diff:.3g}; the weights moved by >= {moved:.3g}")
    assert diff < 2e-6 and moved > 1e-3


def ckpts(d):
    return sorted(int(n.split("_")[1]) for n in os.listdir(d) if n.startswith("checkpoint_")) if d.exists() else []


def test_sigkill_then_resume_ends_with_the_same_weights(binary, task, tmp_path):
    args = ["--train_batch_size", "16", "--num_train_steps", "120", "--gradient_accumulation_steps", "2",
            "--checkpoint_period", "5", "--max_num_checkpoints", "2", "--shuffle", "--warmup_mode", "Linear",
            "--warmup_ratio", "0.1", "--learning_rate", "0.005"]
    ref = run_cli(binary, *common(task, tmp_path / "ref", *args))
    assert ref.returncode == 0, ref.stderr

    ck = tmp_path / "ck"
    cmd = [binary, *map(str, common(task, tmp_path / "killed", "--checkpoints_dir", ck, *args))]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=dict(os.environ, ORTMOD_RUNNER_DEBUG_STEP_DELAY_MS="25"))
    deadline = time.time() + 60
    while time.time() < deadline and not any(c >= 20 for c in ckpts(ck)):
        time.sleep(0.01)
    p.send_signal(signal.SIGKILL)
    p.communicate()
    assert p.returncode == -signal.SIGKILL
    seen = ckpts(ck)
    assert seen and max(seen) < 60, seen          # killed mid-run
    assert len(seen) <= 3                         # the newest 2 (+1 when killed between rename and pruning)
    assert not (tmp_path / "killed" / "trained_model.onnx").exists()

    res = run_cli(binary, *common(task, tmp_path / "resumed", "--checkpoints_dir", ck, *args))
    assert res.returncode == 0, res.stderr
    assert "resumed from" in res.stdout
    summary = json.loads((tmp_path / "resumed" / "summary.json").read_text())
    assert summary["start_update"] == max(seen) and summary["global_update"] == 60
    wr, wk = weights(tmp_path / "ref" / "trained_model.onnx"), weights(tmp_path / "resumed" / "trained_model.onnx")
    for k in wr:
        np.testing.assert_array_equal(wr[k], wk[k], err_msg=k)   # bit for bit
    assert ckpts(ck)[-2:] == [55, 60] and len(ckpts(ck)) == 2
    assert not [n for n in os.listdir(ck) if n.startswith(".tmp")]


# ---- records: TensorBoard, profile -----------------------------------------------------

def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_varint(b, i):
    v = shift = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return v, i


def parse_fields(b):
    """protobuf wire format -> list of (field, value); length-delimited values as bytes."""
    out, i = [], 0
    while i < len(b):
        key, i = read_varint(b, i)
        field, wt = key >> 3, key & 7
        if wt == 0:
            v, i = read_varint(b, i)
        elif wt == 1:
            v, i = b[i:i + 8], i + 8
        elif wt == 5:
            v, i = b[i:i + 4], i + 4
        elif wt == 2:
            n, i = read_varint(b, i)
            v, i = b[i:i + n], i + n
        else:
            raise AssertionError(f"wire type {wt}")
        out.append((field, v))
    return out


def read_events(path):
    """TFRecord framing (checking both masked crc32c) + tensorflow.Event protos."""
    data, i, events = open(path, "rb").read(), 0, []
    while i < len(data):
        header = data[i:i + 8]
        (n,) = struct.unpack("<Q", header)
        (lcrc,) = struct.unpack("<I", data[i + 8:i + 12])
        assert lcrc == masked(crc32c(header))
        body = data[i + 12:i + 12 + n]
        (dcrc,) = struct.unpack("<I", data[i + 12 + n:i + 16 + n])
        assert dcrc == masked(crc32c(body))
        i += 16 + n
        ev = {"scalars": {}}
        for f, v in parse_fields(body):
            if f == 1:
                ev["wall_time"] = struct.unpack("<d", v)[0]
            elif f == 2:
                ev["step"] = v
            elif f == 3:
                ev["file_version"] = v.decode()
            elif f == 5:
                for sf, sv in parse_fields(v):
                    assert sf == 1
                    val = dict(parse_fields(sv))
                    ev["scalars"][val[1].decode()] = struct.unpack("<f", val[2])[0]
        events.append(ev)
    return events


def test_tensorboard_events_profile_and_lr_schedule(binary, task, tmp_path):
    logs, out = tmp_path / "logs", tmp_path / "out"
    r = run_cli(binary, *common(task, out, "--num_train_steps", "20", "--log_dir", logs, "--use_profiler",
                                "--test_data_dir", task / "test", "--evaluation_period", "10",
                                "--warmup_mode", "Linear", "--warmup_ratio", "0.25", "--learning_rate", "0.02"))
    assert r.returncode == 0, r.stderr
    (name,) = os.listdir(logs)
    assert name.startswith("events.out.tfevents.")
    events = read_events(logs / name)
    assert events[0]["file_version"] == "brain.Event:2"
    loss = {e["step"]: e["scalars"]["train/loss"] for e in events if "train/loss" in e["scalars"]}
    lr = {e["step"]: e["scalars"]["train/learning_rate"] for e in events if "train/learning_rate" in e["scalars"]}
    acc = {e["step"]: e["scalars"]["eval/accuracy"] for e in events if "eval/accuracy" in e["scalars"]}
    assert sorted(loss) == list(range(1, 21)) and sorted(acc) == [10, 20]
    assert loss[20] < loss[1]
    # Linear: warm up over the first 25% of the 20 updates, then decay linearly to 0
    for u, v in lr.items():
        p = (u - 1) / 20
        want = 0.02 * (p / 0.25 if p < 0.25 else (1 - p) / 0.75)
        assert abs(v - want) < 1e-7, (u, v, want)
    trace = json.loads((out / "profile.json").read_text())
    names = {e["name"] for e in trace["traceEvents"] if e.get("ph") == "X"}
    assert {"forward", "backward", "optimizer", "evaluate", "data"} <= names
    assert all(e["dur"] >= 0 for e in trace["traceEvents"] if e.get("ph") == "X")


# ---- optimizers, losses, mixed precision -------------------------------------------------

@pytest.mark.parametrize("opt,extra", [
    ("sgd", ["--learning_rate", "0.1", "--momentum", "0.9"]),
    ("Lamb", ["--learning_rate", "0.01", "--warmup_mode", "Cosine", "--warmup_ratio", "0.1"]),
    ("ADAMW", ["--adam_mode", "2", "--weight_decay", "0.01", "--warmup_mode", "Poly", "--warmup_ratio", "0.1"]),
    ("Adam", ["--warmup_mode", "Constant", "--warmup_ratio", "0.2", "--no_grad_clipping"]),
])
def test_optimizers_and_schedules_train(binary, task, tmp_path, opt, extra):
    r = run_cli(binary, *common(task, tmp_path, "--optimizer", opt, "--num_train_steps", "60",
                                "--display_loss_steps", "1", *extra))
    assert r.returncode == 0, r.stderr
    losses = [float(ln.split("loss ")[1].split(",")[0]) for ln in r.stdout.splitlines() if ln.startswith("step ")]
    assert len(losses) == 60 and np.mean(losses[-10:]) < 0.8 * np.mean(losses[:5]), losses


def test_onehot_labels_and_mse(binary, task, tmp_path):
    data = read_shards(task / "train")
    onehot = np.eye(C, dtype=np.float32)[data["labels"]]
    write_shards(tmp_path / "onehot", {"x": data["x"], "labels": onehot})
    r = run_cli(binary, "--model", task / "mlp.onnx", "--train_data_dir", tmp_path / "onehot", "--output_dir",
                tmp_path / "a", "--num_train_steps", "60", "--learning_rate", "0.01", "--test_data_dir",
                tmp_path / "onehot")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["eval_accuracy"] > 0.7
    write_shards(tmp_path / "reg", {"x": data["x"], "target": onehot * 2 - 1})
    r = run_cli(binary, "--model", task / "mlp.onnx", "--train_data_dir", tmp_path / "reg", "--loss", "mse",
                "--label_name", "target", "--num_train_steps", "60", "--display_loss_steps", "1",
                "--learning_rate", "0.01")
    assert r.returncode == 0, r.stderr
    losses = [float(ln.split("loss ")[1].split(",")[0]) for ln in r.stdout.splitlines() if ln.startswith("step ")]
    assert losses[-1] < 0.7 * losses[0]


def test_mixed_precision_dynamic_loss_scale_skips_overflow(binary, task, tmp_path):
    r = run_cli(binary, *common(task, tmp_path, "--use_mixed_precision", "--initial_loss_scale", str(2.0 ** 40),
                                "--loss_scale_window", "10", "--num_train_steps", "60", "--learning_rate", "0.01",
                                "--log_dir", tmp_path / "logs"))
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "summary.json").read_text())
    print("skipped", s["skipped_updates"], "final scale", s["loss_scale"])
    # halves from 2^40 until the scaled gradients fit fp16's range, then doubles every 10 good updates
    assert 5 <= s["skipped_updates"] < 40 and s["loss_scale"] < 2.0 ** 40
    assert "update skipped, scale halved" in r.stdout
    (name,) = os.listdir(tmp_path / "logs")
    scales = [e["scalars"]["train/loss_scale"] for e in read_events(tmp_path / "logs" / name)
              if "train/loss_scale" in e["scalars"]]
    assert scales[0] == 2.0 ** 39 and min(scales) < 2.0 ** 30
    assert any(b == 2 * a for a, b in zip(scales, scales[1:]))   # a doubling after a good window
    assert s["last_loss"] < 1.0


@pytest.mark.parametrize("flag,dtype", [("--use_bfloat16", "bfloat16"), ("--use_mixed_precision", "float16")])
def test_mixed_precision_computes_in_half(binary, task, tmp_path, flag, dtype):
    """The graph computes in the half type (fp32 master weights): every loss it reports is a value of
    that type (the loss is computed in it, then cast to float32), and it trains like float32."""
    import torch

    r = run_cli(binary, *common(task, tmp_path, flag, "--test_data_dir", task / "test", "--num_train_steps", "100",
                                "--display_loss_steps", "1", "--learning_rate", "0.01"))
    assert r.returncode == 0, r.stderr
    losses = [float(m.group(1)) for m in re.finditer(r"^step .*\): loss ([0-9.]+),", r.stdout, re.M)]
    assert len(losses) == 100
    t = torch.tensor(losses, dtype=torch.float64)
    rounded = t.to(getattr(torch, dtype)).double()
    assert torch.allclose(t, rounded, rtol=0, atol=6e-7), (t - rounded).abs().max()   # printed with 6 decimals
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["mixed_precision"] == {"bfloat16": "bf16", "float16": "fp16"}[dtype]
    assert s["eval_accuracy"] > 0.85 and np.mean(losses[-10:]) < 0.5 * np.mean(losses[:5])


# ---- bad input: a message and a non-zero exit, never a crash ------------------------------

def fails(r, *fragments):
    assert r.returncode in (1, 2), (r.returncode, r.stderr)
    for f in fragments:
        assert f in r.stderr, (f, r.stderr)
    assert r.stderr.startswith("ortmod-train: error:")


def test_bad_model_files(binary, task, tmp_path):
    fails(run_cli(binary, "--model", tmp_path / "missing.onnx", "--train_data_dir", task / "train"),
          "missing.onnx", "No such file")
    bad = tmp_path / "corrupt.onnx"
    bad.write_bytes(b"\x08\x07garbage-that-is-not-protobuf\xff\xff\x00")
    fails(run_cli(binary, "--model", bad, "--train_data_dir", task / "train"), "not a valid ONNX model")
    cut = tmp_path / "truncated.onnx"
    cut.write_bytes((task / "mlp.onnx").read_bytes()[:300])
    fails(run_cli(binary, "--model", cut, "--train_data_dir", task / "train"), "truncated.onnx")


def external_copy(src, dst_dir, location="weights.data"):
    """src's model with every initializer's bytes in one external file beside it."""
    dst_dir.mkdir(parents=True, exist_ok=True)
    m = onnx.load(str(src))
    onnx.save_model(m, str(dst_dir / "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=location, size_threshold=0)
    return dst_dir / "model.onnx"


def test_external_data_trains_as_the_same_model_inline(binary, task, tmp_path):
    ext = external_copy(task / "mlp.onnx", tmp_path / "ext")
    assert all(t.data_location == onnx.TensorProto.EXTERNAL
               for t in onnx.load(str(ext), load_external_data=False).graph.initializer)
    args = ["--train_data_dir", task / "train", "--num_train_steps", "8", "--train_batch_size", "16"]
    inline = run_cli(binary, "--model", task / "mlp.onnx", "--output_dir", tmp_path / "a", *args)
    external = run_cli(binary, "--model", ext, "--output_dir", tmp_path / "b", *args)
    assert inline.returncode == 0 and external.returncode == 0, inline.stderr + external.stderr
    wa, wb = weights(tmp_path / "a" / "trained_model.onnx"), weights(tmp_path / "b" / "trained_model.onnx")
    assert wa.keys() == wb.keys() and all(np.array_equal(wa[k], wb[k]) for k in wa)


def test_torch_default_export_trains(binary, task, tmp_path):
    """torch.onnx.export's defaults on torch 2.13 (the torch.export path, weights as external data)."""
    import torch

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(D, H), torch.nn.ReLU(), torch.nn.Linear(H, C))
    path = tmp_path / "m.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, (torch.zeros(2, D),), str(path), input_names=["x"], output_names=["logits"],
                          dynamic_shapes=({0: torch.export.Dim("batch")},))
    if not any(t.data_location == onnx.TensorProto.EXTERNAL
               for t in onnx.load(str(path), load_external_data=False).graph.initializer):
        pytest.skip("this torch's default export wrote no external data")
    r = run_cli(binary, "--model", path, "--train_data_dir", task / "train", "--output_dir", tmp_path / "out",
                "--num_train_steps", "30", "--train_batch_size", "32", "--learning_rate", "0.05")
    assert r.returncode == 0, r.stderr
    trained = weights(tmp_path / "out" / "trained_model.onnx")
    start = {k: v.detach().numpy() for k, v in m.state_dict().items()}
    assert set(start) <= set(trained) and max(np.abs(trained[k] - start[k]).max() for k in start) > 1e-3


def test_external_data_stays_inside_the_model_directory(binary, task, tmp_path):
    """The locations, offsets and lengths come from the file: each way out is refused by name."""
    ext = external_copy(task / "mlp.onnx", tmp_path / "good")
    data = (tmp_path / "good" / "weights.data").read_bytes()
    (tmp_path / "secret.data").write_bytes(data)
    os.symlink(tmp_path / "secret.data", tmp_path / "good" / "link.data")

    def crafted(name, **entries):
        m = onnx.load(str(ext), load_external_data=False)
        t = m.graph.initializer[0]
        kv = {e.key: e.value for e in t.external_data}
        kv.update(entries)
        del t.external_data[:]
        for k, v in kv.items():
            if v is not None:
                t.external_data.add(key=k, value=v)
        path = tmp_path / "good" / f"{name}.onnx"
        path.write_bytes(m.SerializeToString())
        return run_cli(binary, "--model", path, "--train_data_dir", task / "train", "--num_train_steps", "1")

    fails(crafted("up", location="../secret.data"), "leaves the model's directory")
    fails(crafted("abs", location=str(tmp_path / "secret.data")), "absolute path")
    fails(crafted("link", location="link.data"), "outside the model's directory")
    fails(crafted("missing", location="nothing.data"), "nothing.data", "No such file")
    fails(crafted("past", offset=str(len(data) - 4)), "past its end")
    fails(crafted("long", length=str(len(data) + 1)), "past its end")
    fails(crafted("huge", offset="99999999999999999999"), "not a size")
    fails(crafted("neg", offset="-4"), "not a size")
    fails(crafted("key", basepath="/"), "basepath")
    fails(crafted("noloc", location=None), "names no location")
    fails(crafted("short", length="8"), "holds 8 bytes of raw data")


def test_mismatched_shards(binary, task, tmp_path):
    data = read_shards(task / "train")
    write_shards(tmp_path / "names", {"inputs": data["x"], "labels": data["labels"]})
    fails(run_cli(binary, "--model", task / "mlp.onnx", "--train_data_dir", tmp_path / "names"),
          "feature 'inputs' matches no graph input", "'x'")
    write_shards(tmp_path / "shape", {"x": data["x"][:, :D - 2], "labels": data["labels"]})
    fails(run_cli(binary, "--model", task / "mlp.onnx", "--train_data_dir", tmp_path / "shape"),
          "feature 'x'", f"dim 1 = {D}")
    write_shards(tmp_path / "nolabel", {"x": data["x"]})
    fails(run_cli(binary, "--model", task / "mlp.onnx", "--train_data_dir", tmp_path / "nolabel"),
          "no feature 'labels'")
    write_shards(tmp_path / "dtype", {"x": data["x"].astype(np.float64), "labels": data["labels"]})
    fails(run_cli(binary, "--model", task / "mlp.onnx", "--train_data_dir", tmp_path / "dtype"), "float64")
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "shard_0.pb").write_bytes(b"\xff\xff\xff\x7fnot a shard")
    fails(run_cli(binary, "--model", task / "mlp.onnx", "--train_data_dir", junk), "truncated or not a shard file")
    fails(run_cli(binary, "--model", task / "mlp.onnx", "--train_data_dir", tmp_path / "nowhere"),
          "cannot open data directory")


def test_checkpoint_from_another_model(binary, task, tmp_path):
    ck = tmp_path / "ck"
    r = run_cli(binary, "--model", task / "mlp_wide.onnx", "--train_data_dir", task / "train", "--checkpoints_dir", ck,
                "--num_train_steps", "4", "--checkpoint_period", "2")
    assert r.returncode == 0, r.stderr
    fails(run_cli(binary, "--model", task / "mlp.onnx", "--train_data_dir", task / "train", "--checkpoints_dir", ck),
          "written for another model", "weight '")
    # a checkpoint cut short (not through the runner: its writes are atomic): named, and the
    # run resumes from the one before it; with every one cut short, it stops naming them
    assert ckpts(ck) == [2, 4]
    for c in (4, 2):
        state = ck / f"checkpoint_{c}" / "state.pb"
        state.write_bytes(state.read_bytes()[:-40])
        if c == 4:
            r = run_cli(binary, "--model", task / "mlp_wide.onnx", "--train_data_dir", task / "train",
                        "--checkpoints_dir", ck, "--num_train_steps", "4", "--checkpoint_period", "100")
            assert r.returncode == 0, r.stderr
            assert "checkpoint_4/state.pb' is damaged" in r.stderr and "resuming from the previous" in r.stderr
            assert "resumed from" in r.stdout and "checkpoint_2" in r.stdout
            state.write_bytes(state.read_bytes()[:-40])   # the run saved update 4 again
    fails(run_cli(binary, "--model", task / "mlp_wide.onnx", "--train_data_dir", task / "train", "--checkpoints_dir",
                  ck), "checkpoint_4/state.pb", "no older checkpoint", "intact either")


@pytest.mark.parametrize("args,message", [
    (["--num_train_steps", "10", "--gradient_accumulation_steps", "3"], "num_train_steps: 10 is not a multiple"),
    (["--checkpoint_period", "0"], "checkpoint_period: must be > 0"),
    (["--evaluation_period", "0"], "evaluation_period"),
    (["--display_loss_steps", "0"], "display_loss_steps"),
    (["--optimizer", ""], "optimizer: empty optimizer name"),
    (["--optimizer", "adagrad"], "unknown optimizer 'adagrad'"),
    (["--weights_to_train", "0.weight", "--weights_not_to_train", "2.bias"], "not both"),
    (["--weights_to_train", "nope"], "weights_to_train: 'nope' is not an initializer"),
    (["--warmup_mode", "sideways"], "unknown mode 'sideways'"),
    (["--learning_rate", "fast"], "--learning_rate: 'fast' is not a valid number"),
    (["--bogus"], "unknown option"),
])
def test_parameter_errors_name_the_field(binary, task, args, message):
    fails(run_cli(binary, "--model", task / "mlp.onnx", "--train_data_dir", task / "train", *args), message)


def test_empty_model_path_and_help(binary, task):
    fails(run_cli(binary, "--model", "", "--train_data_dir", task / "train"), "model_path: empty model path")
    r = run_cli(binary, "--help")
    assert r.returncode == 0
    for flag in ("--model", "--train_data_dir", "--test_data_dir", "--output_dir", "--optimizer", "--learning_rate",
                 "--warmup_ratio", "--warmup_mode", "--num_train_steps", "--train_batch_size", "--eval_batch_size",
                 "--gradient_accumulation_steps", "--use_mixed_precision", "--loss_scale", "--checkpoints_dir",
                 "--checkpoint_period", "--max_num_checkpoints", "--evaluation_period", "--display_loss_steps",
                 "--use_profiler", "--log_dir", "--seed", "--loss", "--loss_input", "--label_name"):
        assert flag in r.stdout, flag


def test_weight_lists_freeze_what_they_say(binary, task, tmp_path):
    r = run_cli(binary, *common(task, tmp_path, "--num_train_steps", "5", "--weights_not_to_train", "0.weight,0.bias"))
    assert r.returncode == 0, r.stderr
    before, after = weights(task / "mlp.onnx"), weights(tmp_path / "trained_model.onnx")
    np.testing.assert_array_equal(before["0.weight"], after["0.weight"])
    np.testing.assert_array_equal(before["0.bias"], after["0.bias"])
    assert not np.array_equal(before["2.weight"], after["2.weight"])


def test_loss_none_trains_a_graph_that_outputs_its_loss(binary, task, tmp_path):
    """A model that computes its own scalar loss: --loss none, labels are a plain graph input."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(3)
    w = numpy_helper.from_array((0.1 * rng.standard_normal((C, D))).astype(np.float32), "w")
    b = numpy_helper.from_array(np.zeros(C, np.float32), "b")
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["logits"], transB=1),
             helper.make_node("SoftmaxCrossEntropyLoss", ["logits", "y"], ["loss"], reduction="mean")]
    g = helper.make_graph(nodes, "linear_with_loss",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", D]),
                           helper.make_tensor_value_info("y", TensorProto.INT64, ["N"])],
                          [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], [w, b])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)]), str(tmp_path / "m.onnx"))
    data = read_shards(task / "train")
    write_shards(tmp_path / "d", {"x": data["x"], "y": data["labels"]})
    r = run_cli(binary, "--model", tmp_path / "m.onnx", "--train_data_dir", tmp_path / "d", "--loss", "none",
                "--num_train_steps", "40", "--display_loss_steps", "1", "--learning_rate", "0.02",
                "--output_dir", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    losses = [float(ln.split("loss ")[1].split(",")[0]) for ln in r.stdout.splitlines() if ln.startswith("step ")]
    assert losses[-1] < 0.8 * losses[0]
    assert not np.array_equal(weights(tmp_path / "m.onnx")["w"], weights(tmp_path / "out" / "trained_model.onnx")["w"])
    # a non-scalar loss_input is refused with --loss none
    fails(run_cli(binary, "--model", tmp_path / "m.onnx", "--train_data_dir", tmp_path / "d", "--loss", "none",
                  "--loss_input", "logits"), "loss_input: 'logits'", "scalar")


C_API_PROGRAM = r"""
#include <stdio.h>
#include <string.h>
#include "ortmod_runner.h"

static int lines;
static void on_print(void *user, om_log_level lvl, const char *msg) { lines++; }

static int expect_error(om_runner_params *p, const char *fragment) {
    om_runner *r = NULL;
    om_status *st = om_runner_create(p, &r);
    int ok = st && strstr(om_status_message(st), fragment) && !r;
    if (!ok) printf("expected an error with '%s', got '%s'\n", fragment, st ? om_status_message(st) : "success");
    om_status_free(st);
    om_runner_params_init(p);
    return ok ? 0 : 1;
}

int main(int argc, char **argv) {
    om_runner_params p;
    int bad = 0;
    om_runner_params_init(&p);
    bad += expect_error(&p, "model_path: empty model path");
    p.model_path = argv[1]; p.optimizer = "";
    bad += expect_error(&p, "optimizer: empty optimizer name");
    p.model_path = argv[1]; p.num_train_steps = 10; p.gradient_accumulation_steps = 4;
    bad += expect_error(&p, "num_train_steps: 10 is not a multiple of gradient_accumulation_steps (4)");
    const char *a[] = {"0.weight"}, *b[] = {"2.weight"};
    p.model_path = argv[1]; p.weights_to_train = a; p.n_weights_to_train = 1;
    p.weights_not_to_train = b; p.n_weights_not_to_train = 1;
    bad += expect_error(&p, "not both");
    p.model_path = argv[1]; p.checkpoint_period = 0;
    bad += expect_error(&p, "checkpoint_period");

    p.model_path = argv[1]; p.train_data_dir = argv[2]; p.test_data_dir = argv[3];
    p.optimizer = "lamb"; p.learning_rate = 0.01f; p.num_train_steps = 40; p.print = on_print;
    om_runner *r = NULL;
    om_status *st = om_runner_create(&p, &r);
    if (!st) st = om_runner_initialize(r);
    om_runner_eval_result before = {0}, after = {0};
    if (!st) st = om_runner_evaluate(r, &before);
    if (!st) st = om_runner_run(r);
    if (!st) st = om_runner_evaluate(r, &after);
    if (st) { printf("error: %s\n", om_status_message(st)); om_status_free(st); om_runner_free(r); return 1; }
    om_runner_summary s;
    om_runner_get_summary(r, &s);
    printf("updates %lld, eval loss %.4f -> %.4f, accuracy %.3f -> %.3f, %d lines\n", (long long)s.updates,
           before.loss, after.loss, before.accuracy, after.accuracy, lines);
    bad += !(s.updates == 40 && after.loss < before.loss && after.accuracy > before.accuracy && lines > 0);
    om_runner_free(r);
    return bad;
}
"""


def test_c_api(binary, task, tmp_path):
    """The runner as a C library: validation messages name the field; create/initialize/evaluate/run."""
    src = tmp_path / "use_runner.c"
    src.write_text(C_API_PROGRAM)
    exe = tmp_path / "use_runner"
    cc = subprocess.run(["gcc", "-std=c11", "-I", os.path.join(ROOT, "csrc", "include"), "-o", str(exe), str(src),
                         *buildpaths.ENGINE_LINK], capture_output=True, text=True)
    assert cc.returncode == 0, cc.stderr
    r = subprocess.run([str(exe), str(task / "mlp.onnx"), str(task / "train"), str(task / "test")],
                       capture_output=True, text=True, timeout=60)
    print(r.stdout)
    assert r.returncode == 0, r.stdout + r.stderr


HEADER_EXAMPLE_HARNESS = r"""
#include <stdio.h>
#include "ortmod.h"
#define N_IN 1
#define N_OUT 1
/* the example's free names: path, needs_grad, inputs, n_inputs, dout */
static int example(const char *path, const bool *needs_grad, const om_tensor *inputs, int n_inputs,
                   const om_tensor *dout, om_tensor *grad_x) {
%s
    grad_x[0] = grads[0];
    for (int i = 0; i < N_OUT; i++) om_free(out[i].data);
    return 0;
}
int main(int argc, char **argv) {
    float x[2 * 12], ones[2 * 4];
    for (int i = 0; i < 2 * 12; i++) x[i] = (float)((i * 7) %% 11) / 5.0f - 1.0f;
    for (int i = 0; i < 2 * 4; i++) ones[i] = 1.0f;
    om_tensor in = {OM_F32, 2, {2, 12}, x, OM_CPU, 0}, dout = {OM_F32, 2, {2, 4}, ones, OM_CPU, 0}, g;
    bool needs_grad[1] = {true};
    if (example(argv[1], needs_grad, &in, 1, &dout, &g)) return 1;
    for (int i = 0; i < 2 * 12; i++) printf("%%.9g\n", ((float *)g.data)[i]);
    om_free(g.data);
    return 0;
}
"""


def test_header_example(binary, task, tmp_path):
    """ortmod.h's worked example, as written there, compiles, links and takes a correct step."""
    import torch

    header = open(os.path.join(ROOT, "csrc", "include", "ortmod.h")).read()
    body = header[header.index(" * example begin\n") + len(" * example begin\n"):header.index(" * example end")]
    body = "\n".join(line[3:] if line.startswith(" * ") else line[2:] for line in body.splitlines())
    src = tmp_path / "example.c"
    src.write_text(HEADER_EXAMPLE_HARNESS % body)
    exe = tmp_path / "example"
    cc = subprocess.run(["gcc", "-std=c11", "-Wall", "-Werror", "-I", os.path.join(ROOT, "csrc", "include"), "-o",
                         str(exe), str(src), *buildpaths.ENGINE_LINK], capture_output=True, text=True)
    assert cc.returncode == 0, cc.stderr
    ext = external_copy(task / "mlp.onnx", tmp_path / "ext")   # om_onnx_read_model_file reads its data too
    r = subprocess.run([str(exe), str(ext)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    got = np.array([float(v) for v in r.stdout.split()], dtype=np.float32).reshape(2, D)
    w = weights(task / "mlp.onnx")
    m = torch.nn.Sequential(torch.nn.Linear(D, H), torch.nn.ReLU(), torch.nn.Linear(H, C))
    m.load_state_dict({k: torch.tensor(v) for k, v in w.items()})
    x = ((torch.arange(2 * D) * 7 % 11).float() / 5 - 1).reshape(2, D).requires_grad_()
    m(x).sum().backward()
    np.testing.assert_allclose(got, x.grad.numpy(), rtol=1e-5, atol=1e-6)

"""The CUDA provider, run without a GPU: the real cuda/*.cu, compiled by g++ as C++ against the CPU
emulator in tests/cuda_emu (kernel launches as fibers with real barriers and warp shuffles, guarded
device memory, a reference cuBLAS/cuBLASLt; see emu.cpp for what it checks and what it cannot),
loaded by the engine in place of ortmod/libortmod_cuda.so (ORTMOD_CUDA_LIBRARY) and fed kDLCUDA
tensors in emulated device memory. Every result is compared with the CPU provider.

Each group runs in its own child process (the library must be chosen before the engine loads a
provider), all groups at once; a group's test fails on any mismatch, exception, emulator report or
crash in its cases, and names them:

- selftest: the emulator's 16-bit conversions against numpy/torch over every bit pattern; broken
  kernels (write past the end, barrier after an early return, full shuffle mask in a partial warp,
  use after free, copy past an allocation; a WMMA call by half a warp, misaligned or with a bad
  ldm, or with lane-dependent fragments) are each reported and a correct one is not (a WMMA
  product in every layout matches numpy); a perturbed reference fails the op, half and model
  comparisons.
- ops-fp32: tests/gpu/test_ops_cuda.py's cases, imported from it (CASES, NEW_CASES, cross entropy,
  dropout masks, MaxPool NaN, and last the Llama fusions' LLAMA_CASES), its GatherElements
  out-of-range case, and its constant indices out of range (Gather, GatherElements, ScatterElements,
  GatherND, ScatterND: refused at plan time). Not run:
  test_conv_large_batch_takes_several_im2col_chunks (5x128^3 images are too slow to emulate; the
  emulated build's 4 KiB im2col chunk makes the parity convolutions take several chunks instead)
  and test_matmul_half_precision (the half group's MatMul cases cover it).
- ops-fp64: its F64_CASES, and every CASES op in float64 too.
- half: tests/gpu/test_half_cuda.py's op cases and single-op tests in bf16 and fp16 against the CPU
  in fp32, NEW_CASES in bf16/fp16 as well (no GPU test runs those in half; conv and pools
  included, whose constant weights are stored in the half type too), its flash-attention cases
  (cuda/flash.cu's WMMA kernels, run on include/mma.h's emulation of the warp matrix functions)
  and flash against the materialized cuBLAS path, its scatter-adds summed in fp32, and LSTM/GRU/RNN's
  recurrent-weight gradient over 1024 steps (summed in fp32, not in a half running sum). Not run: its two whole-model tests (they compare
  with eager torch on a GPU).
- models: one training step each of TinyResNet, a tiny GPT-2 (with and without attention_mask),
  BERT and LSTM/GRU/RNN classifiers against the CPU (loss, logits, BatchNorm's running statistics and
  every parameter's gradient), and of the GPT-2 in bf16 and in fp16 against the CPU in fp32 from
  the same rounded weights (loss, and each gradient's direction and size).
- zoo: issue 14's model zoo (tests/test_model_zoo.py's CASES) on the CUDA provider: each case's
  model built as the zoo builds it, exported once through ortmod's capture on its first batch
  (the whole output: the loss, logits, caches), one training step on the CPU and on the
  emulated GPU from the same weights, every output and parameter gradient compared as in
  "models" (cuda_emu/models.py's run_zoo_case). A torch.autograd.Function kept as a PythonOp
  (Bloom's GELU) runs through ORTModule's FunctionRunner, on host copies of the device
  tensors. By default one architecture per family kind (models.ZOO_DEFAULT: llama, gpt2,
  bert, t5, whisper, vit, resnet, wav2vec2-ctc, nn.Transformer-bf, falcon; ~70 s of the group's time
  on 2 cores); ORTMOD_EMU_ZOO=all runs all 38 (~5 min, MobileNetV2 alone ~105 s; past this
  file's per-group timeout of 300 s on 2 shared cores, so run it alone:
  `ORTMOD_EMU_ZOO=all ORTMOD_EMU_TIMEOUT=900 pytest tests/test_cuda_emulated.py -k zoo`), or
  a comma-separated list of names. models.ZOO_KNOWN lists the known CUDA failures
  (mobilenet-v2's ill-conditioned BatchNorm), each a strict expected failure: it must fail with
  that message, and fails the group once it passes. (t5's and swin's trained attention bias, a
  mask whose gradient is wanted, and falcon's multi-query K/V run since attention.cu takes them.)
- streams: issue 8's "no CPU<->GPU synchronization inside a step, kernels on torch's current
  stream". An MLP, TinyResNet and the tiny GPT-2 each take a warm-up training step on the
  default stream (planning: constant uploads, cuBLAS handles), whose blocking calls the
  provider's own om_cuda_sync_count (what tests/gpu/bench_gpt2.py reports) must match the
  emulator's count of; then two steps on a stream from cudaStreamCreate, passed as torch's
  current stream would be: forward, backward and freeing the outputs, gradients and stash must
  make no call that blocks the host on a GPU (synchronizations, cudaMalloc/cudaFree, cudaMemcpy,
  async copies to or from host memory, cuBLAS handle creation) and must enqueue every kernel,
  copy, memset, GEMM and pool allocation/free on that stream, with the warm-up's results. The
  selftest group shows a synchronization or a memset on the default stream inside a step fails
  this check, and work on a stream nobody created is reported.

- optim: the optimizer passes on CUDA tensors (cuda/optim.cu: the Adam step in its three modes
  and four dtype mixes, scaling, the inf/NaN check and norm), through ortmod._C as ortmod.optim
  calls them, against the same calls on CPU tensors: 30 tensors (two launches), chunk edges, an
  empty tensor; all work on the caller's stream, the norm's read-back the only blocking calls
  (two, counted by the provider too); a call mixing CPU and CUDA tensors is refused.

Skipped where there is no C++ compiler; a compile error in cuda/*.cu fails. The build (in
build/cuda-emu, -O1, parallel) is incremental: ~45 s from scratch on 2 cores, then only what a
changed .cu or header needs. The groups take ~4.5 min of wall time together on 2 shared cores
(measured with the zoo group added; half is the longest).
"""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
EMU = os.path.join(HERE, "cuda_emu")


def _load(name, path):   # by path: tests/cuda_emu stays off this process's sys.path
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


emu_build = _load("cuda_emu_build", os.path.join(EMU, "build.py"))

GROUPS = ["selftest", "ops-fp32", "ops-fp64", "half", "models", "zoo", "streams", "optim"]
TIMEOUT = int(os.environ.get("ORTMOD_EMU_TIMEOUT", "300"))   # seconds per group


@pytest.fixture(scope="module")
def library():
    try:
        return emu_build.build()
    except emu_build.CompilerMissing as e:
        skipped = f"cannot build the emulated CUDA provider: {e}"
    except emu_build.BuildError as e:
        failed = f"the CUDA provider does not compile for the emulator:\n{str(e)[-6000:]}"
    if "skipped" in locals():
        pytest.skip(skipped)
    pytest.fail(failed, pytrace=False)


@pytest.fixture(scope="module")
def children(library, tmp_path_factory):
    """Starts every group's child process; each test waits for its own."""
    out = tmp_path_factory.mktemp("cuda_emu")
    env = dict(os.environ, ORTMOD_CUDA_LIBRARY=library, OMP_NUM_THREADS="1", ORTMOD_NUM_THREADS="1")
    procs = {}
    for group in GROUPS:
        results, log = out / f"{group}.jsonl", out / f"{group}.stderr"
        with open(log, "w") as err:
            p = subprocess.Popen([sys.executable, os.path.join(EMU, "harness.py"), group, str(results)],
                                 stdout=err, stderr=subprocess.STDOUT, env=env)
        procs[group] = (p, results, log)
    yield procs
    for p, _, _ in procs.values():
        if p.poll() is None:
            p.kill()
            p.wait()


def _tail(path, n=4000):
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:]
    except FileNotFoundError:
        return ""


def group_results(children, group):
    """(results, problems): one dict per finished case, and what went wrong with the process."""
    p, results_path, log = children[group]
    try:
        rc = p.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = "timeout"
    lines = [json.loads(line) for line in _tail(results_path, 10 ** 8).splitlines() if line.strip()]
    results = [r for r in lines if "ok" in r]
    problems = []
    if rc != 0 or not any(r.get("done") for r in lines):
        running = [r["running"] for r in lines if "running" in r]
        where = f" while running {running[-1]!r}" if running and len(running) > len(results) else ""
        problems.append(f"the {group} process ended with {rc}{where}; its output:\n{_tail(log)}")
    return results, problems


@pytest.mark.parametrize("group", GROUPS)
def test_cuda_provider_emulated(children, group):
    results, problems = group_results(children, group)
    failed = [r for r in results if not r["ok"]]
    report = [f"--- {r['id']}:\n{r['message'].strip()}" for r in failed[:12]] + problems
    assert results and not failed and not problems, (
        f"{group}: {len(failed)} of {len(results)} emulated cases failed\n" + "\n".join(report))

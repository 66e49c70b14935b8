"""The fuzz targets' committed corpus (tests/fuzz/corpus/, written by tests/fuzz/make_corpus.py)
replayed through the targets themselves (tests/fuzz/replay.c, no libFuzzer needed): the
crashing inputs of issue 15 and what the fuzzers found since, as regression tests. Each input
must get its clean answer, the same one the Python tests expect; `make test-asan` replays the
same corpus under ASan, UBSan and LeakSanitizer, `make fuzz` starts from it."""
import os
import subprocess

import pytest

import buildpaths

from test_hostile_input import CASES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")


@pytest.fixture(scope="module")
def replay():
    r = subprocess.run(["make", "-s", "--no-print-directory", "fuzz-replay"], cwd=ROOT, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for target in ("onnx", "checkpoint"):
        assert f"replay: {len(os.listdir(os.path.join(CORPUS, target)))} inputs ran" in r.stdout, r.stdout

    def run(target, name):
        p = subprocess.run([os.path.join(buildpaths.BUILD_DIR, f"replay_{target}"), os.path.join(CORPUS, target, name)],
                           capture_output=True, text=True, timeout=300, cwd=ROOT,
                           env=dict(os.environ, FUZZ_VERBOSE="1", FUZZ_RUNNER_DIR="tests/fuzz/runner"))
        assert p.returncode == 0, (name, p.returncode, p.stdout[-2000:], p.stderr[-3000:])
        return p.stdout
    return run


def test_corpus_is_complete():
    """Every crafted model of test_hostile_input has its corpus file (make_corpus.py writes them)."""
    have = set(os.listdir(os.path.join(CORPUS, "onnx")))
    missing = [n for n in CASES if f"hostile_{n}.onnx" not in have]
    assert not missing, f"run tests/fuzz/make_corpus.py: {missing}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_onnx_corpus_gets_its_clean_answer(replay, name):
    out = replay("onnx", f"hostile_{name}.onnx")
    case = CASES[name]
    if "error" in case:
        # the target tries without gradients, then with every float input differentiated, then a
        # forward and a backward on inputs of the declared shapes: one of them gives the error
        assert any(case["fragments"][0] in line for line in out.splitlines() if not line.endswith(": ok")), out
    else:
        assert "create: " not in out and "create with gradients: " not in out, out


CHECKPOINT_ANSWERS = {
    "intact": ["checkpoint: ok", "train: ok"],
    "format_1": ["checkpoint: ok", "train: ok"],
    "truncated": ["checkpoint (damaged):", "is damaged"],
    "bit_flip_0": ["checkpoint (damaged):", "is damaged"],
    "bit_flip_1": ["checkpoint (damaged):", "is damaged"],
    "bit_flip_2": ["checkpoint (damaged):", "is damaged"],
    "header_cursor_negative": ["checkpoint (damaged):", "its data cursor counter is -5"],
    "header_cursor_huge": ["its data cursor counter is 9223372036854775804"],
    "header_step_negative": ["its step counter is -1"],
    "header_update_negative": ["its update counter is -3"],
    "header_weights_count": ["it counts 9 weights but holds 2"],
    "header_optimizer_kind": ["its optimizer kind is 7"],
    "shard_intact": ["shard: ok"],
    "shard_truncated": ["shard: 'fuzz/shard_0.pb' is truncated"],
    "shard_length_lies": ["says 2147483632 bytes but 60 remain"],
    "shard_huge_dims": ["tensor 'x': the size of its dims overflows"],
    # found by make fuzz: a feature whose samples hold no bytes (a zero dim) was batched from a
    # NULL buffer (UBSan: zero offset applied to a null pointer)
    "found_shard_zero_size_feature": ["shard: ok"],
}


def test_checkpoint_corpus_is_complete():
    assert sorted(os.listdir(os.path.join(CORPUS, "checkpoint"))) == sorted(CHECKPOINT_ANSWERS)


@pytest.mark.parametrize("name", sorted(CHECKPOINT_ANSWERS))
def test_checkpoint_corpus_gets_its_clean_answer(replay, name):
    out = replay("checkpoint", name)
    for fragment in CHECKPOINT_ANSWERS[name]:
        assert fragment in out, (fragment, out)

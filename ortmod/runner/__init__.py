"""The native training runner's Python side.

``write_shards`` writes the data directories that ``ortmod-train`` (the C runner,
``csrc/runner/``) reads; ``read_shards`` reads them back. ``ortmod-train`` itself is the
console script :func:`ortmod.runner.cli.main`, which runs the compiled binary.

Shard format: every regular file of a data directory (sorted by name, hidden files
skipped) is a sequence of records ``[uint32 little-endian length][serialized
onnx.TensorProto]``. A sample is one record per feature, each named after the graph input
(or the label) it feeds, with one sample's dims (the runner adds the batch dim); a new
sample starts where the first feature's name comes again.
"""
import os
import struct

__all__ = ["write_shards", "read_shards", "find_binary"]


def _as_numpy(x):
    import numpy as np

    if hasattr(x, "detach"):          # a torch tensor, without importing torch here
        x = x.detach().cpu().numpy()
    return np.ascontiguousarray(np.asarray(x))


def write_shards(directory, features, samples_per_shard=None, num_shards=None, prefix="shard"):
    """Writes ``features`` as shard files into ``directory`` (created if missing).

    features: a mapping name -> array-like (numpy array or torch tensor) whose first dim
    is the sample index; every feature has the same number of samples. Names must be the
    model's graph input names, plus the label feature (``labels`` by default).
    samples_per_shard / num_shards: how to split (default: one shard). Returns the list of
    paths written. Existing files named ``<prefix>_*.pb`` in the directory are replaced.
    """
    from onnx import numpy_helper

    if not features:
        raise ValueError("write_shards: no features")
    arrays = {name: _as_numpy(v) for name, v in features.items()}
    counts = {name: (a.shape[0] if a.ndim else None) for name, a in arrays.items()}
    if any(c is None for c in counts.values()):
        raise ValueError(f"write_shards: every feature needs a leading sample dim, got shapes "
                         f"{ {n: a.shape for n, a in arrays.items()} }")
    n = next(iter(counts.values()))
    if any(c != n for c in counts.values()):
        raise ValueError(f"write_shards: features have different sample counts: {counts}")
    if n == 0:
        raise ValueError("write_shards: no samples")
    if samples_per_shard is None:
        samples_per_shard = -(-n // num_shards) if num_shards else n
    if samples_per_shard <= 0:
        raise ValueError("write_shards: samples_per_shard must be > 0")
    os.makedirs(directory, exist_ok=True)
    for old in os.listdir(directory):
        if old.startswith(prefix + "_") and old.endswith(".pb"):
            os.remove(os.path.join(directory, old))
    names = list(arrays)
    paths = []
    for s, start in enumerate(range(0, n, samples_per_shard)):
        path = os.path.join(directory, f"{prefix}_{s:05d}.pb")
        with open(path, "wb") as f:
            for i in range(start, min(n, start + samples_per_shard)):
                for name in names:
                    data = numpy_helper.from_array(arrays[name][i], name=name).SerializeToString()
                    f.write(struct.pack("<I", len(data)))
                    f.write(data)
        paths.append(path)
    return paths


def read_shards(directory):
    """Reads a data directory back: a dict name -> numpy array with a leading sample dim."""
    import numpy as np
    from onnx import TensorProto, numpy_helper

    out = {}
    files = sorted(f for f in os.listdir(directory)
                   if not f.startswith(".") and os.path.isfile(os.path.join(directory, f)))
    for fname in files:
        with open(os.path.join(directory, fname), "rb") as f:
            buf = f.read()
        pos = 0
        while pos < len(buf):
            (length,) = struct.unpack_from("<I", buf, pos)
            tp = TensorProto()
            tp.ParseFromString(buf[pos + 4:pos + 4 + length])
            pos += 4 + length
            out.setdefault(tp.name, []).append(numpy_helper.to_array(tp))
    return {k: np.stack(v) for k, v in out.items()}


def find_binary():
    """The path of the compiled ortmod-train: ortmod.options.train_binary (ORTMOD_TRAIN_BINARY)
    when set (ValueError when that is no executable file), else ortmod/bin/ (where the build
    installs it: a wheel, or ``make build`` into the source tree). None when missing."""
    from ortmod._options import options
    chosen = options.train_binary
    if chosen is not None:
        if not (os.path.isfile(chosen) and os.access(chosen, os.X_OK)):
            raise ValueError(f"ORTMOD_TRAIN_BINARY: {chosen!r} is not an executable file")
        return chosen
    here = os.path.dirname(os.path.abspath(__file__))
    for cand in (os.path.join(os.path.dirname(here), "bin", "ortmod-train"),):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None

"""Shrink a failing spec to a minimal one with the same classification.

Greedy, delta-debugging style: from the current spec, try candidates in order — drop a layer
(anywhere in the nesting), splice a residual's body or a concat's branch in its place, drop a
concat branch, the plainest head, fewer steps, no eval forward, no input gradient, smaller
input dims, smaller layer parameters, flags off — and take the first candidate whose record
has the same signature (oracle.signature: the status, plus the error type for an error). A
candidate eager cannot run is "invalid" and so never taken. Candidates run in the pool's
worker processes, so a crash shrinks like anything else. Repeats until no candidate is taken
or ``budget`` candidates have run.
"""
import copy
import json

from . import oracle as O

_INT_PARAMS = ("out", "k", "hidden", "heads", "kv_heads", "head_dim", "groups", "stride", "dilation", "padding",
               "output_padding", "scale", "channels", "h", "divisor_override", "dim", "start", "stop", "step")
_DEFAULTS = {"padding_mode": "zeros", "mask": "none", "gqa": "repeat", "how": None, "fn": "relu",
             "key_padding": False, "add_bias_kv": False, "add_zero_attn": False, "need_weights": False,
             "batch_first": True, "ceil_mode": False, "affine": False, "bias": False, "track": True,
             "return_output": False, "class_weight": False, "pos_weight": False, "label_smoothing": 0.0,
             "reduction": "mean", "log_target": False, "per_channel": False, "pos": False}


def _lists(spec):
    """Every layer list in the spec, as (getter path) pairs: the top list, residual bodies,
    concat branches."""
    out = []

    def walk(layers, path):
        out.append(path)
        for i, p in enumerate(layers):
            if p.get("op") == "residual":
                walk(p["body"], path + [i, "body"])
            elif p.get("op") == "concat":
                for j, br in enumerate(p["branches"]):
                    walk(br, path + [i, "branches", j])
    walk(spec["layers"], ["layers"])
    return out


def _get(spec, path):
    x = spec
    for k in path:
        x = x[k]
    return x


def candidates(spec):
    # structure first: it removes the most
    for path in _lists(spec):
        layers = _get(spec, path)
        for i in range(len(layers) - 1, -1, -1):
            c = copy.deepcopy(spec)
            lst = _get(c, path)
            p = lst.pop(i)
            yield c
            if p.get("op") == "residual":
                c = copy.deepcopy(spec)
                lst = _get(c, path)
                lst[i:i + 1] = p["body"]
                yield c
            if p.get("op") == "concat":
                for j in range(len(p["branches"])):
                    c = copy.deepcopy(spec)
                    lst = _get(c, path)
                    lst[i:i + 1] = p["branches"][j]
                    yield c
                    if len(p["branches"]) > 1:
                        c = copy.deepcopy(spec)
                        _get(c, path)[i]["branches"].pop(j)
                        yield c
    head = spec["head"]
    # plainer heads only (none < mse < the rest), so that two candidates never undo each other
    plainer = [] if head["op"] == "none" else [{"op": "none"}] if head["op"] == "mse" else \
        [{"op": "none"}, {"op": "mse", "reduction": "mean"}]
    for plain in plainer:
        if head != plain:
            c = copy.deepcopy(spec)
            c["head"] = plain
            yield c
    for key, val in (("steps", 1), ("eval_after", False)):
        if spec.get(key) != val:
            c = copy.deepcopy(spec)
            c[key] = val
            yield c
    if spec["input"].get("grad"):
        c = copy.deepcopy(spec)
        c["input"]["grad"] = False
        yield c
    # sizes
    shape = spec["input"]["shape"]
    for d in range(len(shape)):
        for v in sorted({1, shape[d] // 2, shape[d] - 1}):
            if 1 <= v < shape[d]:
                c = copy.deepcopy(spec)
                c["input"]["shape"][d] = v
                yield c
    emb = spec["input"].get("embedding")
    if emb:
        for key in ("vocab", "dim"):
            for v in sorted({2, emb[key] // 2, emb[key] - 1}):
                if 2 <= v < emb[key]:
                    c = copy.deepcopy(spec)
                    c["input"]["embedding"][key] = v
                    yield c
        for key, v in (("pos", False), ("padding_idx", None)):
            if emb.get(key) != v:
                c = copy.deepcopy(spec)
                c["input"]["embedding"][key] = v
                yield c
    # parameters of each layer and of the head
    for path in _lists(spec):
        for i, p in enumerate(_get(spec, path)):
            yield from _param_candidates(spec, path + [i], p)
    yield from _param_candidates(spec, ["head"], head)


def _param_candidates(spec, path, p):
    for key, val in p.items():
        if key in ("op", "body", "branches"):
            continue
        options = []
        if key in _INT_PARAMS and isinstance(val, int) and not isinstance(val, bool):
            options = sorted({v for v in (0, 1, val // 2, val - 1) if 0 <= v < val})
        elif key in _INT_PARAMS and isinstance(val, list):
            options = [[1] * len(val)] if any(v > 1 for v in val) else []
        elif key in _DEFAULTS and _DEFAULTS[key] is not None and val != _DEFAULTS[key]:
            options = [_DEFAULTS[key]]
        for v in options:
            c = copy.deepcopy(spec)
            _get(c, path)[key] = v
            yield c


def shrink(pool, rec, budget=250, log=None):
    """The smallest record with ``rec``'s signature that the candidates reach (its "spec" is
    the shrunk spec)."""
    want = O.signature(rec)
    best = rec
    tried = 0
    seen = {json.dumps(rec["spec"], sort_keys=True)}
    progress = True
    while progress and tried < budget:
        progress = False
        for c in candidates(best["spec"]):
            key = json.dumps(c, sort_keys=True)
            if key in seen:
                continue
            seen.add(key)
            tried += 1
            r = pool.run_one({"spec": c})
            if r["status"] not in ("invalid", "harness-error") and O.signature(r) == want:
                r["spec"] = c
                best = r
                progress = True
                if log:
                    from . import spec as S
                    log(f"[{tried}] {S.describe(c)}")
                break
            if tried >= budget:
                break
    return best

"""Bugs the fuzzer found that are reported and not fixed yet, so that a long run counts them
apart instead of shrinking the same finding again and again.

A failing record is attributed to a known bug only by *substitution*: the spec is run again
with the bug's trigger replaced by a harmless equivalent (an activation by tanh); if that run
passes, the failure was the known bug's ("known" status, counted by name); if it still fails,
the substituted record is a finding of its own (and is what gets shrunk). Each known bug has a
regression case with "expect": "open" in tests/modelfuzz/regressions/.
"""
import copy

# none open: ts-fp64-float32-activation-constants (the first, seeds 24, 50, 1008, 1030) is fixed
# (selu, leaky_relu, elu exact) or refused by name (celu, hardsigmoid); its cases say which
KNOWN = []


def _acts(layers):
    for p in layers:
        if p.get("op") == "act":
            yield p
        for body in [p.get("body") or []] + list(p.get("branches") or []):
            yield from _acts(body)


def neutralized(spec, bug):
    s = copy.deepcopy(spec)
    for p in _acts(s["layers"]):
        if p["fn"] in bug["acts"]:
            p["fn"] = "tanh"
    return s


def candidates(rec):
    spec = rec.get("spec")
    if not spec:
        return []
    return [b for b in KNOWN if rec["status"] in b["status"] and spec.get("capture") == b["capture"]
            and any(p["fn"] in b["acts"] for p in _acts(spec["layers"]))]


def attribute(pool, rec):
    """``rec``, or "known" (with the bug's name) when substitution clears it, or the record of
    the substituted spec when that still fails."""
    from .oracle import FAILURES
    for bug in candidates(rec):
        again = pool.run_one({"spec": neutralized(rec["spec"], bug)})
        if again["status"] not in FAILURES:
            return dict(rec, status="known", known=bug["name"], was=rec["status"])
        again["note"] = f"still {again['status']} with {bug['name']}'s trigger replaced"
        return again
    return rec

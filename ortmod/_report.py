"""The engine's reports as text: ``Report`` (what ``ortmod.explain`` returns), ``summarize`` (one
engine's report in a few lines, which ORTModule also logs) and ``engine_reports``.

A leaf: it imports nothing of ortmod, so ORTModule (which logs a summary) and ``explain`` (which
builds an ORTModule) both import it without a circle (they were one, _module <-> _explain)."""
import json



class Report:
    """The engine's report for each compiled graph of a module (train/eval, grad patterns).

    ``report.graphs`` is a list of dicts (one per engine) as the engine's JSON report gives
    them; ``str(report)`` is the human summary that ``explain`` prints."""

    def __init__(self, graphs):
        self.graphs = graphs

    def __getitem__(self, i):
        return self.graphs[i]

    def __len__(self):
        return len(self.graphs)

    def __str__(self):
        return "\n\n".join(summarize(g) for g in self.graphs)

    __repr__ = __str__


def _mib(n):
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def summarize(r):
    """A few lines of text from one engine report."""
    lines = [f"nodes: {r['exported_nodes']} exported -> {r['optimized_nodes']} after forward passes"
             f" ({_pct(r['exported_nodes'], r['optimized_nodes'])}); "
             f"{r['forward_nodes']} forward + {r['backward_nodes']} backward in the training graph"]
    for p in r["passes"]:
        sites = ", ".join(p["sites"][:4]) + (" ..." if len(p["sites"]) > 4 else "")
        lines.append(f"  {p['stage']:>7} {p['pass']:<24} {p['before']:>5} -> {p['after']:<5} fired {p['fired']}"
                     + (f" at {sites}" if p["fired"] else ""))
    fw = ", ".join(f"{k} {v}" for k, v in sorted(r["forward_ops"].items(), key=lambda kv: -kv[1]))
    lines.append(f"forward ops: {fw}")
    if r["backward_ops"]:
        bw = ", ".join(f"{k} {v}" for k, v in sorted(r["backward_ops"].items(), key=lambda kv: -kv[1]))
        lines.append(f"backward ops: {bw}")
    for p in r["plans"]:
        shapes = " ".join("x".join(map(str, s)) or "()" for s in p["input_shapes"])
        if p.get("counts"):     # a segment of a data-dependent graph (csrc/plan/plan.h)
            shapes += f"; segment {p['segment']} after counts {p['counts']}"
        elif p.get("segment") == 0 and r.get("data_dependent_nodes"):
            shapes += "; segment 0"
        lines.append(f"plan for inputs [{shapes}]: {p['forward_kernels']} forward + {p['backward_kernels']} backward "
                     f"kernels; peak {_mib(p['peak_bytes'])} (frame {_mib(p['frame_bytes'])} holding scratch and "
                     f"a stash of {_mib(p['stash_bytes'])})")
        big = ", ".join(f"{b['name']} {_mib(b['bytes'])} ({b['where']})" for b in p["largest_buffers"][:5])
        lines.append(f"  largest buffers: {big}")
    prof = r.get("profile")
    if prof and prof["ops"]:
        total = prof["forward_ms"] + prof["backward_ms"]
        lines.append(f"profile (ORTMOD_PROFILE, CPU kernels): forward {prof['forward_ms']:.1f} ms, "
                     f"backward {prof['backward_ms']:.1f} ms in all")
        for o in prof["ops"][:12]:
            lines.append(f"  {o['op']:<28} {o['phase']:<8} {o['calls']:>7} calls {o['ms']:>10.1f} ms "
                         f"({100 * o['ms'] / total:.0f}%)" if total else "")
    return "\n".join(lines)


def _pct(before, after):
    return f"-{100 * (before - after) / before:.0f}%" if before else "n/a"


def engine_reports(ortmodule):
    """The JSON reports of every engine an ORTModule has built so far."""
    out = []
    for entry in getattr(ortmodule, "_ortmod_cache", {}).values():
        engine = getattr(entry, "engine", None)
        if engine is not None:
            out.append(json.loads(engine.report()))
    return out

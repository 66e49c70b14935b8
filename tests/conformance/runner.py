"""Runs conformance cases in worker processes and prints the scoreboard.

A worker (``python -m tests.conformance.runner --worker PLAN OUT``) runs the cases of a plan
one after another and appends JSON lines to OUT: ``{"start": id}`` before a case, its record
after it. The parent watches OUT: a worker that dies, or goes silent for --timeout seconds,
leaves a started case without a record; that case is a CRASH (or HANG), the worker is started
again and skips every case that already has a record. One worker runs many cases because
importing torch's module database costs ~15 s a process; after a crash the crashed case is run
once more alone, in a fresh process, to tell a crash of its own from one an earlier case set up.

The workers never see ORTMODULE_FALLBACK_POLICY: with it unset ORTModule raises instead of
running the module in PyTorch, and the harness checks that every wrapped call ran the engine.
"""
import argparse
import collections
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PASS, MISMATCH, CLEAN_ERROR, CRASH, SKIP = "PASS", "MISMATCH", "CLEAN-ERROR", "CRASH", "SKIP"
STATUSES = (PASS, MISMATCH, CLEAN_ERROR, CRASH, SKIP)
HARNESS_ERROR = "HARNESS-ERROR"     # a bug in tests/conformance itself: says nothing about ortmod
SOURCES = {"db:": "module_db", "pat:": "patterns"}


def _source(case_id):
    import importlib
    for prefix, name in SOURCES.items():
        if case_id.startswith(prefix):
            return importlib.import_module(f"tests.conformance.{name}")
    raise ValueError(f"unknown case id {case_id!r}")


def expand(plan):
    """Case ids of a plan: {"cases": [...]} and/or {"module_db": {...}, "patterns": {...}} selections."""
    ids = list(plan.get("cases", ()))
    if "module_db" in plan:
        from . import module_db
        sel = dict(plan["module_db"])
        ids += module_db.case_ids(sel.pop("names", None) or module_db.module_names(), **sel)
    if "patterns" in plan:
        from . import patterns
        sel = dict(plan["patterns"])
        ids += patterns.case_ids(sel.pop("names", None) or patterns.names(), **sel)
    return ids


def run_one(case_id):
    """Build and run one case in this process (raises if the harness itself breaks)."""
    from . import harness
    try:
        case = _source(case_id).build(case_id)
    except Exception as e:
        # the sample could not even be constructed eagerly: not ortmod's to answer for
        return {"id": case_id, "status": SKIP, "note": f"eager construction fails: {type(e).__name__}: {e}"[:300]}
    return harness.run_case(case)


# --------------------------------------------------------------------------- worker side

def worker(plan_path, out_path):
    import faulthandler
    faulthandler.enable()               # a segfault prints the Python stack to stderr
    with open(plan_path) as f:
        plan = json.load(f)
    done = set(_read(out_path)[0])
    ids = expand(plan)
    with open(out_path, "a") as out:
        def emit(obj):
            out.write(json.dumps(obj) + "\n")
            out.flush()
        emit({"planned": ids})
        for case_id in ids:
            if case_id in done:
                continue
            emit({"start": case_id})
            try:
                rec = run_one(case_id)
            except Exception as e:      # ortmod's own exceptions are caught inside run_case
                import traceback
                rec = {"id": case_id, "status": HARNESS_ERROR, "note": f"{type(e).__name__}: {e}"[:300],
                       "where": traceback.format_exc().strip().splitlines()[-3][:200]}
            emit(rec)
        emit({"finished": True})


def _read(path):
    """(records by id, planned ids, started-but-unfinished id, finished flag) from a worker's OUT."""
    records, planned, started, finished = {}, [], None, False
    if not os.path.exists(path):
        return records, planned, started, finished
    with open(path) as f:
        for line in f:
            if not line.endswith("\n"):
                break                   # a line cut short by a kill
            obj = json.loads(line)
            if "planned" in obj:
                planned = obj["planned"]
            elif "start" in obj:
                started = obj["start"]
            elif "finished" in obj:
                finished = True
            else:
                records[obj["id"]] = obj
                started = None if started == obj["id"] else started
    return records, planned, started, finished


# --------------------------------------------------------------------------- parent side

def child_env():
    env = dict(os.environ)
    env.pop("ORTMODULE_FALLBACK_POLICY", None)
    # one capture path per scoreboard: ORTModule's default ("auto") would retry every failed
    # TorchScript export on torch.export, tens of seconds per case; ORTMOD_CAPTURE=export
    # scores the torch.export path
    env.setdefault("ORTMOD_CAPTURE", "torchscript")
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _spawn(plan_path, out_path, err_path):
    err = open(err_path, "ab")
    cmd = [sys.executable, "-m", "tests.conformance.runner", "--worker", plan_path, out_path]
    return subprocess.Popen(cmd, cwd=ROOT, env=child_env(), stdout=err, stderr=err, start_new_session=True), err


def _crash_text(path):
    """What a dead worker said last: the C library's message, Python's fatal error and the top
    frames faulthandler printed (its list of extension modules is left out)."""
    try:
        with open(path, errors="replace") as f:
            lines = [ln.rstrip() for ln in f if ln.strip()]
    except OSError:
        return ""
    fatal = max((i for i, ln in enumerate(lines) if ln.startswith("Fatal Python error")), default=None)
    if fatal is None:
        return " | ".join(lines[-4:])[-600:]
    frames = [re.sub(r'"[^"]*/site-packages/', '"', ln.strip().replace(ROOT + os.sep, ""))
              for ln in lines[fatal + 1:] if ln.strip().startswith("File ")][:3]
    said = [ln for ln in lines[max(0, fatal - 3):fatal] if not ln[:1].isspace()][-2:]   # not the IR dump
    return " | ".join(said + [lines[fatal]] + frames)[-800:]


def _kill(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)     # the worker's own process group only
    except ProcessLookupError:
        pass
    proc.wait()


def _exit_text(rc):
    return f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit status {rc}"


def run(plan, timeout=180, progress=None, isolate=True):
    """Run ``plan`` in workers; returns the records in planned order."""
    with tempfile.TemporaryDirectory(prefix="ortmod-conf-") as tmp:
        plan_path, out_path = os.path.join(tmp, "plan.json"), os.path.join(tmp, "out.jsonl")
        with open(plan_path, "w") as f:
            json.dump(plan, f)
        crashes, shown, attempts = {}, set(), 0
        while True:
            err_path = os.path.join(tmp, f"stderr{attempts}.txt")
            attempts += 1
            proc, err = _spawn(plan_path, out_path, err_path)
            size, last = -1, time.time()
            hung = False
            while proc.poll() is None:
                time.sleep(0.5)
                now_size = os.path.getsize(out_path) if os.path.exists(out_path) else 0
                if now_size != size:
                    size, last = now_size, time.time()
                    if progress:
                        _progress(out_path, shown, progress)
                elif time.time() - last > timeout:
                    hung = True
                    _kill(proc)
            err.close()
            records, planned, started, finished = _read(out_path)
            if progress:
                _progress(out_path, shown, progress)
            if proc.returncode == 0 and finished:
                break
            if started is None:
                raise RuntimeError(f"conformance worker failed outside any case ({_exit_text(proc.returncode)}): "
                                   f"{_crash_text(err_path)}")
            why = f"no progress for {timeout} s (HANG)" if hung else _exit_text(proc.returncode)
            rec = {"id": started, "status": CRASH, "note": why, "stderr": _crash_text(err_path)}
            crashes[started] = rec
            _truncate_partial(out_path)
            with open(out_path, "a") as f:
                f.write(json.dumps(rec) + "\n")
            if progress:
                progress(f"  CRASH  {started}: {why}")
        if isolate:
            for case_id, rec in crashes.items():
                alone = run({"cases": [case_id]}, timeout=timeout, isolate=False)[0]
                rec["alone"] = alone["status"] if alone["status"] != CRASH else "CRASH (reproduces alone)"
                records[case_id] = rec
        return [records[i] for i in planned if i in records]


def _truncate_partial(path):
    with open(path, "rb+") as f:
        data = f.read()
        f.truncate(data.rfind(b"\n") + 1)


def _progress(out_path, shown, progress):
    records = _read(out_path)[0]
    for case_id, rec in records.items():
        if case_id not in shown:
            shown.add(case_id)
            progress(f"  {rec['status']:<11} {case_id}  ({rec.get('secs', 0):.1f} s)")


class _ModuleLines:
    """Quiet progress: one line per module (or pattern) once its cases are done."""

    def __init__(self):
        self.name, self.counts = None, collections.Counter()

    def __call__(self, line):
        parts = line.split()
        if len(parts) < 2 or ":" not in parts[1]:
            return print(line)
        status, name = parts[0], parts[1].split("|")[0]
        if name != self.name:
            self.flush()
            self.name = name
        self.counts[status] += 1

    def flush(self):
        if self.name is not None:
            print(f"  {self.name:<40} " + " ".join(f"{s} {n}" for s, n in sorted(self.counts.items())), flush=True)
        self.counts.clear()


# --------------------------------------------------------------------------- scoreboard

def _where(case_id):
    """'nn.Linear [no_bias] float32 train' from a record id (and its desc)."""
    body = case_id.split(":", 1)[1]
    return " ".join(body.split("|")[:3])


def counts(records):
    c = collections.Counter(r["status"] for r in records)
    out = {s: c.get(s, 0) for s in STATUSES}
    if c.get(HARNESS_ERROR):
        out[HARNESS_ERROR] = c[HARNESS_ERROR]
    return out


def error_key(rec):
    """Group CLEAN-ERRORs by type and first line, with numbers and quoted names blurred."""
    e = rec["error"]
    msg = re.split(r"\s*\[Caused by|\s*\(full error", e["msg"])[0]     # the exporter's IR dump
    msg = re.sub(r"export failed for \w+:", "export failed for <module>:", msg)
    msg = re.sub(r"'[^']*'", lambda m: m.group(0) if len(m.group(0)) < 40 else "'…'", msg)
    msg = re.sub(r"\b(Float|Double)\b", "<dtype>", msg)
    msg = re.sub(r"\b\d+\b", "N", msg)
    return f"{e['type']}: {msg}"[:220]


def scoreboard(title, records, repro, top=20, out=print):
    c = counts(records)
    modules = {r["id"].split("|")[0] for r in records}
    path = os.environ.get("ORTMOD_CAPTURE", "torchscript")
    out(f"\n=== {title}: {len(records)} cases, {len(modules)} modules (capture: {path}) ===")
    out("  " + "  ".join(f"{s} {n}" for s, n in c.items()))
    bad = [r for r in records if r["status"] in (MISMATCH, CRASH, HARNESS_ERROR)]
    if bad:
        out(f"\n{MISMATCH} / {CRASH} cases:")
    for r in bad:
        desc = f" [{r['desc']}]" if r.get("desc") else ""
        if r["status"] == MISMATCH:
            from .harness import describe_diff
            more = f" (+{r['n_diffs'] - 1} more differing values)" if r["n_diffs"] > 1 else ""
            what = describe_diff(r["diffs"][0]) + more
        elif r["status"] == CRASH:
            what = f"{r['note']}; alone: {r.get('alone', '?')}; stderr: {r.get('stderr', '')}"
        else:
            what = f"{r['note']} ({r.get('where', '')})"
        out(f"  {r['status']:<8} {_where(r['id'])}{desc}: {what}")
        out(f"           repro: {repro} --case '{r['id']}'")
    errors = [r for r in records if r["status"] == CLEAN_ERROR]
    if errors:
        groups = collections.defaultdict(list)
        for r in errors:
            groups[error_key(r)].append(r)
        ranked = sorted(groups.items(), key=lambda kv: -len(kv[1]))
        out(f"\n{CLEAN_ERROR} causes ({len(groups)} distinct; top {min(top, len(groups))}):")
        for key, rs in ranked[:top]:
            names = sorted({r["id"].split("|")[0].split(":", 1)[1] for r in rs})
            shown = ", ".join(names[:5]) + (f", +{len(names) - 5}" if len(names) > 5 else "")
            out(f"  {len(rs):4d}  {key}\n        in {shown}")
    skips = [r for r in records if r["status"] == SKIP]
    if skips:
        out(f"\n{SKIP}: {len(skips)} cases where eager PyTorch itself fails (e.g. {skips[0]['id']}: "
            f"{skips[0].get('note', '')[:150]})")


# --------------------------------------------------------------------------- command line

def main(argv=None, source="module_db"):
    p = argparse.ArgumentParser(prog=f"python -m tests.conformance.{source}")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--all", action="store_true", help="every module/pattern (the default)")
    g.add_argument("--fast", action="store_true", help="the fast subset tests/test_conformance.py runs")
    g.add_argument("--case", action="append", help="run this case id in-process and print everything")
    p.add_argument("--samples", type=int, default=5, help="samples per module, dtype and mode (0: all)")
    p.add_argument("--dtypes", default="float32,float64")
    p.add_argument("--json", help="write the records here")
    p.add_argument("--timeout", type=int, default=180, help="seconds without progress that make a HANG")
    p.add_argument("-q", "--quiet", action="store_true", help="no line per case")
    p.add_argument("names", nargs="*", help="only these modules (module_db) or patterns")
    args = p.parse_args(argv)
    repro = f"python -m tests.conformance.{source}"
    if args.case:
        return _run_in_process(args.case)
    if source == "module_db":
        from . import module_db as src
        if args.fast:
            plan = {"cases": src.fast_case_ids()}
        else:
            plan = {"module_db": {"names": args.names or None, "dtypes": args.dtypes.split(","),
                                  "samples": args.samples}}
        title = "torch module_db through ORTModule"
    else:
        from . import patterns as src
        if args.fast:
            plan = {"cases": src.fast_case_ids()}
        else:
            plan = {"patterns": {"names": args.names or None, "dtypes": args.dtypes.split(",")}}
        title = "training-code patterns through ORTModule"
    t0 = time.time()
    progress = _ModuleLines() if args.quiet else print
    records = run(plan, timeout=args.timeout, progress=progress)
    if args.quiet:
        progress.flush()
    scoreboard(title, records, repro)
    print(f"\n({time.time() - t0:.0f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)
    return 0


def _run_in_process(case_ids):
    from . import harness
    for case_id in case_ids:
        rec = run_one(case_id)
        print(f"{rec['status']}  {case_id}  [{rec.get('desc', '')}]  ({rec.get('secs', 0):.1f} s)")
        for d in rec.get("diffs", ()):
            print("   ", harness.describe_diff(d))
        for k in ("error", "note"):
            if k in rec:
                print("   ", k, rec[k])
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit(main())

"""Run generated models in worker processes, shrink what fails, print the counts.

    python -m tests.modelfuzz.runner --models 200 --seed 0 [--jobs 2] [--timeout 120]
    python -m tests.modelfuzz.runner --spec FILE.json      # replay one spec (or a regression case)

A worker (``--worker``) reads one JSON request a line on stdin — {"seed": N} (generate and
run) or {"spec": {...}} — and answers one record a line. The parent watches each answer with
a timeout: a worker that dies leaves its case a *crash* (with what it said last on stderr:
faulthandler's stack), one that goes silent past --timeout a *hang*; the worker is started
again and the run goes on. Workers are restarted every --recycle cases (caches of a long run
stay out of the picture).

A failing case (mismatch, error, crash, hang) is shrunk (tests/modelfuzz/shrink.py) and
written to --findings (default build/modelfuzz/findings/) as a regression case; copy it into
tests/modelfuzz/regressions/ to have tests/test_model_fuzz.py replay it.

ORTMODULE_FALLBACK_POLICY is removed from the workers' environment: ORTModule raises
instead of quietly running PyTorch (and oracle.py checks every wrapped call ran the engine).
"""
import argparse
import collections
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tests.modelfuzz import known  # noqa: E402
from tests.modelfuzz import oracle as O  # noqa: E402

MARK = "=== modelfuzz case "


# --------------------------------------------------------------------------- worker side

def worker():
    import faulthandler
    faulthandler.enable()
    # the protocol owns the real stdout; anything torch or the engine prints goes to stderr
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    from tests.modelfuzz import spec as S
    for line in sys.stdin:
        req = json.loads(line)
        try:
            spec = req["spec"] if "spec" in req else S.generate(req["seed"])
        except Exception as e:
            proto.write(json.dumps({"seed": req.get("seed"), "status": "harness-error",
                                    "note": f"generate: {type(e).__name__}: {e}"[:400]}) + "\n")
            continue
        sys.stderr.write(f"{MARK}{spec.get('seed')}\n")
        sys.stderr.flush()
        try:
            rec = O.run_spec(spec)
        except Exception as e:
            import traceback
            rec = {"seed": spec.get("seed"), "status": "harness-error", "note": f"{type(e).__name__}: {e}"[:400],
                   "where": traceback.format_exc().strip().splitlines()[-3][:300]}
        rec["spec"] = spec
        proto.write(json.dumps(rec) + "\n")


# --------------------------------------------------------------------------- parent side

def child_env(threads=None):
    env = dict(os.environ)
    env.pop("ORTMODULE_FALLBACK_POLICY", None)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


class Worker:
    def __init__(self, tmp, idx, timeout, recycle, threads=None):
        self.tmp, self.idx, self.timeout, self.recycle, self.threads = tmp, idx, timeout, recycle, threads
        self.proc = None
        self.n = 0
        self.starts = 0

    def _start(self):
        self.err_path = os.path.join(self.tmp, f"worker{self.idx}-{self.starts}.err")
        self.starts += 1
        self.err = open(self.err_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.modelfuzz.runner", "--worker"], cwd=ROOT,
                                     env=child_env(self.threads), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.err, start_new_session=True)
        self.n = 0

    def stop(self):
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)   # this worker's own process group
            except ProcessLookupError:
                pass
            self.proc.wait()
            self.err.close()
            self.proc = None

    def send(self, req):
        if self.proc is None or self.n >= self.recycle:
            self.stop()
            self._start()
        self.n += 1
        self.req = req
        self.sent_at = time.time()
        self.buf = b""
        self.proc.stdin.write((json.dumps(req) + "\n").encode())
        self.proc.stdin.flush()

    def poll(self):
        """The record when the answer is in (or the worker died or hung), else None."""
        fd = self.proc.stdout.fileno()
        r, _, _ = select.select([fd], [], [], 0)
        if r:
            chunk = os.read(fd, 1 << 20)
            if chunk:
                self.buf += chunk
                if self.buf.endswith(b"\n"):
                    return json.loads(self.buf)
                return None
            self.proc.wait()
            return self._dead(O.CRASH, _exit_text(self.proc.returncode))
        if self.proc.poll() is not None and not select.select([fd], [], [], 0)[0]:
            return self._dead(O.CRASH, _exit_text(self.proc.returncode))
        if time.time() - self.sent_at > self.timeout:
            return self._dead(O.HANG, f"no answer in {self.timeout} s")
        return None

    def _dead(self, status, why):
        self.stop()
        req = self.req
        spec = req.get("spec")
        if spec is None:        # the worker drew it from the seed: draw it again, to shrink it
            from tests.modelfuzz import spec as S
            try:
                spec = S.generate(req["seed"])
            except Exception:
                spec = None
        where = _last_phase(self.err_path)
        if where and where.startswith("eager"):
            status = O.EAGER_CRASH
        return {"seed": spec.get("seed") if spec else req.get("seed"), "status": status, "note": f"{why} in {where}",
                "stderr": _crash_text(self.err_path), "spec": spec}


def _exit_text(rc):
    return f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit status {rc}"


def _last_phase(path):
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    text = text[text.rfind(MARK):] if MARK in text else text
    i = text.rfind(O.PHASE_MARK)
    return text[i + len(O.PHASE_MARK):].split("\n", 1)[0] if i >= 0 else None


def _crash_text(path):
    """What the worker said after the last case mark: the C library's message, Python's fatal
    error and the top frames faulthandler printed."""
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError:
        return ""
    text = text[text.rfind(MARK):] if MARK in text else text
    lines = [ln.rstrip() for ln in text.splitlines()[1:] if ln.strip() and not ln.startswith(O.PHASE_MARK)]
    fatal = next((i for i, ln in enumerate(lines) if ln.startswith("Fatal Python error")), None)
    if fatal is None:
        return " | ".join(lines[-4:])[-600:]
    cur = next((i for i in range(fatal, len(lines)) if lines[i].startswith("Current thread")), fatal)
    frames = [ln.strip().replace(ROOT + os.sep, "") for ln in lines[cur + 1:] if ln.strip().startswith("File ")][:4]
    return " | ".join(lines[max(0, fatal - 2):fatal + 1] + frames)[-900:]


class Pool:
    """``jobs`` workers; ``run(requests)`` yields records as they come in."""

    def __init__(self, jobs=1, timeout=120, recycle=300, threads=None):
        self.tmp = tempfile.mkdtemp(prefix="ortmod-modelfuzz-")
        self.workers = [Worker(self.tmp, i, timeout, recycle, threads) for i in range(jobs)]

    def run(self, requests):
        pending = list(requests)[::-1]
        busy = []
        idle = list(self.workers)
        while pending or busy:
            while idle and pending:
                w = idle.pop()
                w.send(pending.pop())
                busy.append(w)
            fds = [w.proc.stdout.fileno() for w in busy if w.proc is not None]
            select.select(fds, [], [], 0.5)
            for w in list(busy):
                rec = w.poll()
                if rec is not None:
                    busy.remove(w)
                    idle.append(w)
                    yield rec

    def run_one(self, req):
        return next(iter(self.run([req])))

    def close(self):
        for w in self.workers:
            w.stop()
        import shutil
        shutil.rmtree(self.tmp, ignore_errors=True)


# --------------------------------------------------------------------------- reporting

def one_line(rec):
    st = rec["status"]
    if st in (O.MISMATCH64, O.MISMATCH32):
        d = rec["diffs"][0]
        more = f" (+{rec['n_diffs'] - 1} more)" if rec.get("n_diffs", 1) > 1 else ""
        return f"{d['key']}: error {d['err']:.2e}, eager's band {d['band']:.2e}{more}"
    if st == O.ERROR:
        return "; ".join(f"{k}: {v} [{rec.get('where', {}).get(k, '')}]" for k, v in rec["errors"].items())
    if st in (O.CRASH, O.HANG, O.EAGER_CRASH):
        return f"{rec['note']}; {rec.get('stderr', '')}"
    if st == O.REFUSED:
        return "; ".join(f"{k}: {v}" for k, v in rec["refused"].items())
    return rec.get("note", "")


def report(records, secs, out=print):
    c = collections.Counter(r["status"] for r in records)
    n = len(records)
    out(f"\n=== modelfuzz: {n} models in {secs:.0f} s ({n / max(secs, 1e-9):.2f} models/s) ===")
    order = ["ok", "refused", "known", "mismatch64", "mismatch32", "error", "crash", "hang", "eager-crash", "invalid",
             "harness-error"]
    out("  " + "  ".join(f"{s} {c.get(s, 0)}" for s in order if s in c or s in ("ok", "refused", "mismatch64",
                                                                                "mismatch32", "error", "crash", "hang")))
    by_path = collections.Counter((r.get("capture"), r["status"]) for r in records)
    for path in sorted({r.get("capture") for r in records if r.get("capture")}):
        out(f"  {path:<12} " + "  ".join(f"{s} {by_path[path, s]}" for s in order if by_path[path, s]))
    kn = collections.Counter(r["known"] for r in records if r["status"] == "known")
    if kn:
        out("\nknown bugs (reported, not fixed; tests/modelfuzz/known.py):")
        for name, v in kn.most_common():
            out(f"  {v:5d}  {name}")
    refusals = collections.Counter()
    example = {}
    for r in records:
        for which, key in (r.get("refused") or {}).items():
            k = f"[{r.get('capture')}] {key}"
            refusals[k] += 1
            example.setdefault(k, r.get("seed"))
    if refusals:
        out(f"\nrefused by cause ({len(refusals)} distinct; a case counts once per refused dtype):")
        for k, v in refusals.most_common():
            out(f"  {v:5d}  {k}  (e.g. seed {example[k]})")
    bad = [r for r in records if r["status"] in O.FAILURES or r["status"] == "harness-error"]
    if bad:
        out("\nfailures:")
        for r in bad:
            out(f"  {r['status']:<10} seed {r.get('seed')}: {one_line(r)}"[:700])
    ec = [r for r in records if r["status"] == O.EAGER_CRASH]
    if ec:
        out("\neager PyTorch itself crashed (not ortmod's; ortmod ran after or not at all):")
        for r in ec:
            out(f"  seed {r.get('seed')}: {one_line(r)}"[:500])
    inv = [r for r in records if r["status"] == O.INVALID]
    if inv:
        out(f"\ninvalid (eager itself cannot run the spec): {len(inv)}, e.g. seed {inv[0].get('seed')}: "
            f"{inv[0].get('note', '')[:200]}")
    e32 = sorted((r["err32"]["err"] for r in records if r.get("err32")), reverse=True)
    if e32:
        out(f"\nfloat32: ortmod's worst error per model against fp64, median {e32[len(e32) // 2]:.1e}, max {e32[0]:.1e}; "
            f"{sum(1 for r in records if r.get('note64'))} float64 errors above {O.TOL64:g} inside eager float64's spread")


def save_finding(rec, shrunk, findings_dir):
    os.makedirs(findings_dir, exist_ok=True)
    from tests.modelfuzz import spec as S
    name = f"{shrunk['status']}-seed{rec.get('seed')}.json"
    path = os.path.join(findings_dir, name)
    case = {"describe": S.describe(shrunk["spec"]), "found": {k: v for k, v in shrunk.items() if k != "spec"},
            "original_seed": rec.get("seed"), "spec": shrunk["spec"]}
    with open(path, "w") as f:
        json.dump(case, f, indent=1, sort_keys=True)
    return path


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m tests.modelfuzz.runner")
    p.add_argument("--models", type=int, default=100)
    p.add_argument("--seed", type=int, default=0, help="the first seed; models take seed, seed+1, ...")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of each worker")
    p.add_argument("--timeout", type=int, default=180, help="seconds one model may take (a hang past it)")
    p.add_argument("--recycle", type=int, default=300, help="cases per worker process before a fresh one")
    p.add_argument("--no-shrink", action="store_true")
    p.add_argument("--findings", default=os.path.join(ROOT, "build", "modelfuzz", "findings"))
    p.add_argument("--json", help="write every record (without specs) here, one a line")
    p.add_argument("--spec", action="append", help="replay these spec / regression files instead")
    p.add_argument("-q", "--quiet", action="store_true")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))    # a kill still stops the workers (finally)
    pool = Pool(args.jobs, args.timeout, args.recycle, args.threads)
    t0 = time.time()
    records = []
    try:
        if args.spec:
            reqs = []
            for path in args.spec:
                with open(path) as f:
                    obj = json.load(f)
                reqs.append({"spec": obj.get("spec", obj)})
        else:
            reqs = [{"seed": s} for s in range(args.seed, args.seed + args.models)]
        jl = open(args.json, "a") if args.json else None
        for rec in pool.run(reqs):
            if rec["status"] in O.FAILURES:
                rec = known.attribute(pool, rec)
            records.append(rec)
            if jl:
                jl.write(json.dumps({k: v for k, v in rec.items() if k != "spec"}) + "\n")
                jl.flush()
            if not args.quiet or rec["status"] in O.FAILURES:
                print(f"  {rec['status']:<10} seed {rec.get('seed')} ({rec.get('secs', 0):.1f} s) {one_line(rec)}"[:400],
                      flush=True)
            elif len(records) % 50 == 0:
                c = collections.Counter(r["status"] for r in records)
                print(f"  {len(records)} models, {time.time() - t0:.0f} s: " +
                      " ".join(f"{k} {v}" for k, v in sorted(c.items())), flush=True)
        secs = time.time() - t0
        report(records, secs)
        bad = [r for r in records if r["status"] in O.FAILURES and r.get("spec")]
        if bad and not args.no_shrink and not args.spec:
            from tests.modelfuzz import shrink
            print(f"\nshrinking {len(bad)} failing case(s):")
            for r in bad:
                shrunk = shrink.shrink(pool, r, log=lambda s: print("   ", s, flush=True))
                path = save_finding(r, shrunk, args.findings)
                print(f"  seed {r['seed']} -> {os.path.relpath(path, ROOT)}: {shrunk['status']}, "
                      f"{one_line(shrunk)}"[:500])
        if jl:
            jl.close()
    finally:
        pool.close()
    return 1 if any(r["status"] in O.FAILURES for r in records) else 0


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1] == "--worker":
        worker()
    else:
        raise SystemExit(main())

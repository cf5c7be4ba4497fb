"""Perf verdicts a CI can gate on: A/A false alarms, power, cost, with the
defaults a user gets (no perf options; builds as registered, prefork off).

    bench_perf_verdicts.py --capd BIN [--python PY] [--aa N] [--quick] [--out FILE]
                           [--keep-db PATH]

- A/A: N (default 10) comparisons of a 12-cell zoo matrix (mlp, cnn,
  transformer x the widths the host runs, narrowed to 12 cells, forward and
  backward), each head job the same build as its control, through the API:
  paired (the head names its control: the control build's timing processes
  interleaved) and unpaired (a head job naming no control, compared by job
  id). Targets: 0 cells `regression` or `improvement`; the share of `same`
  (>= 90% on a quiet host; the load is reported).
- Power: heads in which one module, the model itself (the root module of
  mlp and transformer; cnn is left alone), takes 10% and 25% longer, in
  each of three kinds (a generated sitecustomize, after each root forward
  and each backward() of such a model, for that fraction of the call's own
  measured time): `cpu` spins, `sleep` sleeps, `lock` waits for a lock that
  another thread of the process holds for that long. The share of affected
  cells detected as `regression` (targets >= 95% at 10%, 100% at 25%), and
  the cells flagged elsewhere (target 0).
- Which op: of the detected cells, those whose profiled pair (run when
  the pairs say regression) names the time outside the modules first, where
  the slowdown was added (``profiled``, ``named``).
- Cost: wall time of the paired head jobs against the same job unpaired
  (no control: the head's timing_processes only), each A/A head followed
  by its unpaired twin so both see the same load: the ratio of the sums.
  Target: <= 1.5x.

Writes a JSON object (stdout, or --out) with the figures and
/proc/loadavg before and after.
"""

import argparse
import os
import signal
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_e2e  # noqa: E402  (Capd, wait_job, emit)

SLOW = '''
import os, time
_f = float(os.environ.get("CAPD_SLOW_FRACTION", "0"))
_roots = set(os.environ.get("CAPD_SLOW_ROOTS", "").split(","))
if _f > 0:
    import torch
    _call = torch.nn.Module.__call__
    _bwd = torch.Tensor.backward
    _state = {"depth": 0, "slowed": False}

    _kind = os.environ.get("CAPD_SLOW_KIND", "cpu")
    _lock = None

    def _hold(req, ready):
        while True:
            d = req.get()
            with _lock:
                ready.set()
                time.sleep(d)

    def _spin(t0):
        global _lock
        d = (time.perf_counter() - t0) * _f
        if _kind == "sleep":
            time.sleep(d)
        elif _kind == "lock":
            # Another thread of this process holds the lock for d seconds.
            import queue, threading
            if _lock is None:
                _lock = threading.Lock()
                _state["req"], _state["ready"] = queue.Queue(), threading.Event()
                threading.Thread(target=_hold, args=(_state["req"], _state["ready"]),
                                 daemon=True).start()
            _state["ready"].clear()
            _state["req"].put(d)
            _state["ready"].wait()
            with _lock:
                pass
        else:
            end = time.perf_counter() + d
            while time.perf_counter() < end:
                pass

    def _slow_call(self, *args, **kwargs):
        if _state["depth"] or type(self).__name__ not in _roots:
            return _call(self, *args, **kwargs)
        _state["depth"] += 1
        t0 = time.perf_counter()
        try:
            y = _call(self, *args, **kwargs)
        finally:
            _state["depth"] -= 1
        _spin(t0)
        _state["slowed"] = True
        return y

    def _slow_backward(self, *args, **kwargs):
        t0 = time.perf_counter()
        r = _bwd(self, *args, **kwargs)
        if _state["slowed"]:
            _spin(t0)
        return r

    torch.nn.Module.__call__ = _slow_call
    torch.Tensor.backward = _slow_backward
'''
# The models whose root module the power heads slow down, by class name.
AFFECTED = {"mlp": "MLP", "transformer": "Transformer"}


def loadavg():
    with open("/proc/loadavg") as f:
        return f.read().strip()


def job(capd, build, commit, matrix, options, control=None):
    body = {"project": "pv", "commit": commit, "build": build, "matrix": matrix,
            "options": options}
    if control:
        body["control_commit"] = control
    t0 = time.time()
    st, j = capd.req("POST", "/v1/jobs", body)
    if st != 201:
        raise SystemExit("bench_perf_verdicts: POST /v1/jobs: %d %s" % (st, j))
    done = bench_e2e.wait_job(capd, j["id"])
    return time.time() - t0, done["id"]


def verdicts(capd, control_job, head_job):
    st, r = capd.req("GET", "/v1/compare?control=%s&head=%s" % (control_job, head_job))
    if st != 200:
        raise SystemExit("bench_perf_verdicts: compare: %d %s" % (st, r))
    return [(c["model"], c["pass"], (c.get("perf") or {}).get("verdict"),
             where((c.get("perf") or {}).get("profile")), alarm(c)) for c in r["cells"]
            if c["status"] != "not_run"]


def alarm(c):
    """What an A/A alarm looked like (the cell, its design, ratio, interval
    and spread), for telling host drift from the verdict's rule."""
    p = c.get("perf") or {}
    return {"cell": "%s/%s/%s" % (c["model"], c["width"], c["pass"]), "design": p.get("design"),
            "ratio": p.get("ratio"), "ci99": p.get("ci99"), "spread": p.get("spread"),
            "n": [p.get("n_control"), p.get("n_head")]}


def where(profile):
    """What a cell's profiled pair names first (docs/compare.md, "Which op
    got slower"): "outside" where the time outside the modules grew the
    most, else the path of the module that did; None without a profile."""
    if not profile:
        return None
    mods = profile.get("modules") or []
    out = (profile.get("outside") or {}).get("delta_ns") or 0
    if not mods or out >= (mods[0].get("delta_ns") or 0):
        return "outside"
    return mods[0]["path"]


KINDS = ("cpu", "sleep", "lock")


def count(vs):
    return dict((k, sum(1 for v in vs if v[2] == k)) for k in set(v[2] for v in vs))


def aa_figures(vs):
    """Alarms, verdict counts and the share of `same` of A/A cell verdicts."""
    return {"cell_verdicts": len(vs),
            "alarms": sum(1 for v in vs if v[2] in ("regression", "improvement")),
            "alarm_cells": [v[4] for v in vs if v[2] in ("regression", "improvement")],
            "verdicts": count(vs),
            "same_share": (sum(1 for v in vs if v[2] == "same") / float(len(vs))) if vs else None}


def register(capd, site, fractions):
    builds = [{"name": "aa", "python": capd.python}]
    for kind in KINDS:
        for frac in fractions:
            builds.append({"name": "%s%d" % (kind, int(frac * 100)), "python": capd.python,
                           "env": {"PYTHONPATH": site, "CAPD_SLOW_FRACTION": str(frac),
                                   "CAPD_SLOW_KIND": kind,
                                   "CAPD_SLOW_ROOTS": ",".join(AFFECTED.values())}})
    for b in builds:
        st, j = capd.req("POST", "/v1/builds", b)
        if st != 201:
            raise SystemExit("bench_perf_verdicts: register %s: %d %s" % (b["name"], st, j))


def power(capd, ctl, matrix, opts, fractions, out):
    """The power cases into OUT as each finishes. The slowdown is added
    around the root module's call, outside its forward hooks, so a
    profiled pair that finds it names the time outside the modules
    (``named``)."""
    for kind in KINDS:
        for frac in fractions:
            name = "%s%d" % (kind, int(frac * 100))
            _, head = job(capd, name, "%040x" % (0xf000 + len(out)), matrix, opts, "a" * 40)
            v = verdicts(capd, ctl, head)
            hit = [x for x in v if x[0] in AFFECTED]
            rest = [x for x in v if x[0] not in AFFECTED]
            out["%s %d%%" % (kind, int(frac * 100))] = {
                "kind": kind, "fraction": frac, "affected_cells": len(hit),
                "detected": sum(1 for x in hit if x[2] == "regression"),
                "affected_verdicts": count(hit), "other_cells": len(rest),
                "other_alarms": sum(1 for x in rest if x[2] in ("regression", "improvement")),
                "profiled": sum(1 for x in hit if x[2] == "regression" and x[3]),
                "named": sum(1 for x in hit if x[2] == "regression" and x[3] == "outside"),
            }


def keep_db(db, dest):
    """A consistent copy of the database DB at DEST (capd has stopped; the
    backup API folds in any write-ahead log)."""
    import sqlite3
    src, dst = sqlite3.connect(db), sqlite3.connect(dest)
    with dst:
        src.backup(dst)
    src.close()
    dst.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--capd", required=True)
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--runner-dir", default=os.path.join(os.path.dirname(HERE), "runner"))
    ap.add_argument("--aa", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="2 A/A comparisons, 25%% power only")
    ap.add_argument("--models", default="mlp,cnn,transformer")
    ap.add_argument("--out")
    ap.add_argument("--keep-db", metavar="PATH",
                    help="copy capd's database here at the end (every observation, so "
                         "its comparisons can be judged again under another rule)")
    args = ap.parse_args()
    # Stopped from outside, it still stops the capd it started (finally below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    n_aa = 2 if args.quick else args.aa
    fractions = [0.25] if args.quick else [0.10, 0.25]
    work = tempfile.mkdtemp(prefix="capd-bench-pv-")
    os.chmod(work, 0o755)
    site = os.path.join(work, "slow")
    os.makedirs(site)
    with open(os.path.join(site, "sitecustomize.py"), "w") as f:
        f.write(SLOW)
    # capd's own defaults: max_parallel, CPU placement.
    capd = bench_e2e.Capd(args.capd, os.path.join(work, "data"), args.runner_dir,
                          max_parallel=None)
    capd.python = args.python
    res = {"load_before": loadavg(), "options": "defaults (none given)"}
    try:
        st, table = capd.req("GET", "/v1/widths")
        widths = [w["name"] for w in table["widths"] if w["runnable_here"]][:2]
        models = args.models.split(",")
        matrix = {"models": models, "widths": widths, "passes": ["forward", "backward"]}
        res["matrix"] = matrix
        res["cells"] = len(models) * len(widths) * 2
        opts = {}
        register(capd, site, fractions)
        _, ctl = job(capd, "aa", "a" * 40, matrix, opts)
        paired, unpaired, walls, twins = [], [], [], []
        for i in range(n_aa):
            t, head = job(capd, "aa", "%040x" % (i + 1), matrix, opts, "a" * 40)
            walls.append(t)
            paired += verdicts(capd, ctl, head)
            t, twin = job(capd, "aa", "%040x" % (0xb00 + i), matrix, opts)
            twins.append(t)
            unpaired += verdicts(capd, ctl, twin)
            # What was measured so far stays in the result if stopped.
            res["aa_comparisons"] = i + 1
            res["aa_paired"] = aa_figures(paired)
            res["aa_unpaired"] = aa_figures(unpaired)
            res["cost"] = {"head_job_s_paired": walls, "head_job_s_unpaired": twins,
                           "ratio": sum(walls) / sum(twins)}
        res["power"] = {}
        power(capd, ctl, matrix, opts, fractions, res["power"])
        res["complete"] = True
    finally:
        # Stopped from outside (a time limit), the figures so far are
        # written all the same, with "complete": false.
        capd.stop()
        if args.keep_db:
            keep_db(os.path.join(work, "data", "capd.db"), args.keep_db)
        res.setdefault("complete", False)
        res["load_after"] = loadavg()
        bench_e2e.emit(res, args.out)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The cost of a compiled cell (docs/api.md, "Compiled cells"), as ratios
to the eager cell of the same model, width and pass, all from one job run
with capd's defaults on the official build (torch.compile; Debian's torch
has none).

One job: the zoo's mlp and transformer (mlp alone with --quick), forward
and backward, at the first width this host runs above default (avx2), in
modes eager, aot_eager and inductor; capd started with its defaults
(max_parallel, CPU placement) and the job with no options. Per compiled
cell, against its eager cell:

* cell wall: the cell's duration (what a user pays for it: interpreter,
  capture runs, compile, timing processes);
* compile: the runner's cold compile in the capture process (its
  ``compile_s`` note) over the eager cell's duration;
* capture: the cell's duration less its cold compile, over the eager
  cell's duration (what a compiled cell costs besides that compile: its
  capture runs and timing processes, each of which compiles again from
  the cell's warm cache before its warmup);
* steady state: the median of the timing processes' medians over the eager
  cell's (the compiled code's speed; < 1 is faster).

Each figure's geometric mean over the cells is printed with the per-cell
table, the load, and the mode self-check's verdict (GET
/v1/jobs/{id}/modes: compiled against eager at the same width).

    bench/bench_compile.py --capd build-bench/capd \\
        --python /var/cache/capd/official-torch/bin/python [--quick] [--out F]
"""

import argparse
import math
import os
import signal
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_e2e  # noqa: E402  (Capd, wait_job, emit)

MODES = ["eager", "aot_eager", "inductor"]


def loadavg():
    with open("/proc/loadavg") as f:
        return f.read().strip()


def records(capd, job, cell, kind):
    """Every record of KIND of one cell, walking the pages."""
    out, cursor = [], None
    while True:
        path = "/v1/jobs/%s/cells/%s/records?kind=%s&limit=500" % (job, cell, kind)
        if cursor:
            path += "&cursor=" + cursor
        st, r = capd.req("GET", path)
        if st != 200:
            raise SystemExit("bench_compile: GET %s: %d %s" % (path, st, r))
        out += r.get("records") or []
        cursor = r.get("next_cursor")
        if not cursor:
            return out


def compile_s(capd, job, cell):
    """The cell's cold compile (the runner's compile_s note), or None."""
    for n in records(capd, job, cell, "note"):
        m = n.get("message") or ""
        if m.startswith("compile_s="):
            return float(m.split()[0].split("=", 1)[1])
    return None


def steady_ns(capd, job, cell):
    """The median of the timing processes' median samples, or None."""
    meds = []
    for t in records(capd, job, cell, "timing"):
        s = t.get("samples_ns") or []
        if s:
            meds.append(statistics.median(s))
    return statistics.median(meds) if meds else None


def geomean(xs):
    xs = [x for x in xs if x is not None and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def measure(capd, job):
    """Per cell of JOB: its mode, duration, compile and steady state."""
    st, j = capd.req("GET", "/v1/jobs/%s" % job)
    cells = {}
    for c in j["cells"]:
        key = (c["model"], c["width"], c["pass"])
        row = {"state": c["state"], "duration_s": (c.get("duration_ms") or 0) / 1000.0}
        if c["state"] == "ok":
            row["steady_ns"] = steady_ns(capd, job, c["id"])
            row["compile_s"] = compile_s(capd, job, c["id"]) if c["mode"] != "eager" else None
        cells.setdefault(key, {})[c["mode"]] = row
    return cells


def ratios(cells):
    """Per compiled cell, its figures against the eager cell; and their
    geometric means per mode."""
    rows, means = [], {}
    for (model, width, pass_), by_mode in sorted(cells.items()):
        e = by_mode.get("eager") or {}
        for mode in MODES[1:]:
            c = by_mode.get(mode) or {}
            if e.get("state") != "ok" or c.get("state") != "ok" or not e.get("duration_s"):
                rows.append({"model": model, "width": width, "pass": pass_, "mode": mode,
                             "state": c.get("state"), "eager_state": e.get("state")})
                continue
            comp = c.get("compile_s")
            r = {"model": model, "width": width, "pass": pass_, "mode": mode, "state": "ok",
                 "eager_s": e["duration_s"], "cell_s": c["duration_s"], "compile_s": comp,
                 "cell_wall": c["duration_s"] / e["duration_s"],
                 "compile": comp / e["duration_s"] if comp is not None else None,
                 "capture": ((c["duration_s"] - comp) / e["duration_s"]
                             if comp is not None else None),
                 "steady_state": (c["steady_ns"] / e["steady_ns"]
                                  if c.get("steady_ns") and e.get("steady_ns") else None)}
            rows.append(r)
    for mode in MODES[1:]:
        mine = [r for r in rows if r["mode"] == mode and r.get("state") == "ok"]
        means[mode] = dict((k, geomean([r.get(k) for r in mine]))
                           for k in ("cell_wall", "compile", "capture", "steady_state"))
        means[mode]["cells"] = len(mine)
    return rows, means


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--capd", required=True)
    ap.add_argument("--python", default=os.environ.get(
        "CAPD_OFFICIAL_PYTHON", "/var/cache/capd/official-torch/bin/python"))
    ap.add_argument("--runner-dir", default=os.path.join(os.path.dirname(HERE), "runner"))
    ap.add_argument("--quick", action="store_true", help="mlp only")
    ap.add_argument("--out")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = tempfile.mkdtemp(prefix="capd-bench-compile-")
    os.chmod(work, 0o755)
    capd = bench_e2e.Capd(args.capd, os.path.join(work, "data"), args.runner_dir,
                          max_parallel=None)
    res = {"load_before": loadavg(), "options": "defaults (none given)",
           "python": args.python}
    try:
        st, b = capd.req("POST", "/v1/builds", {"name": "official", "python": args.python})
        if st != 201:
            raise SystemExit("bench_compile: register: %d %s" % (st, b))
        st, table = capd.req("GET", "/v1/widths")
        width = [w["name"] for w in table["widths"]
                 if w["runnable_here"] and w["name"] not in ("default", "native")][:1]
        models = ["mlp"] if args.quick else ["mlp", "transformer"]
        matrix = {"models": models, "widths": width or ["default"],
                  "passes": ["forward", "backward"], "modes": MODES}
        res["matrix"] = matrix
        t0 = time.time()
        st, j = capd.req("POST", "/v1/jobs", {"project": "bc", "commit": "c" * 40,
                                              "build": "official", "matrix": matrix})
        if st != 201:
            raise SystemExit("bench_compile: POST /v1/jobs: %d %s" % (st, j))
        bench_e2e.wait_job(capd, j["id"])
        res["job_s"] = time.time() - t0
        res["rows"], res["means"] = ratios(measure(capd, j["id"]))
        st, mc = capd.req("GET", "/v1/jobs/%s/modes" % j["id"])
        res["mode_check"] = {"status": st, "verdict": (mc or {}).get("verdict"),
                             "reference": (mc or {}).get("reference")}
        res["complete"] = True
    finally:
        capd.stop()
        res.setdefault("complete", False)
        res["load_after"] = loadavg()
        bench_e2e.emit(res, args.out)
    for mode, m in res.get("means", {}).items():
        print("%-9s %d cells: cell wall x%s, compile x%s, capture x%s, steady state x%s "
              "(geometric means against eager)" % (
                  mode, m["cells"], *["%.2f" % m[k] if m[k] else "n/a"
                                      for k in ("cell_wall", "compile", "capture",
                                                "steady_state")]))


if __name__ == "__main__":
    main()

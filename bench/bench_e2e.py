#!/usr/bin/env python3
"""End-to-end matrix time: capd against a shell loop, in the same run.

The job is mlp,cnn,transformer,lstm x default,avx2,avx512 x forward,backward
(24 cells; on a host without AVX-512 the avx512 width is left out, 16 cells:
the widths are those GET /v1/widths says the host runs, and the result
names them) under the cells' interpreter (Debian's torch by default). Measured
side by side, interleaved:

  loop          a /bin/sh loop running the same 24 runner invocations one
                after another: the same environment per width as
                schema/widths.json, the same cell spec files, fd 3 to
                /dev/null. The floor for running the cells at all.
  capd          POST /v1/jobs (max_parallel=1, fresh exec) to a finished
                comparison against the control: the job is waited for with
                the long-poll GET /v1/jobs/{id}?wait=60, then GET
                /v1/commits/{sha}/diff answers 200 with the comparison.
  prefork       the same on a build registered with "prefork": true, zygote
                running. The control job is that build's first use (zygote
                start, import, equivalence check), timed too (no comparison).
  numerics      options.iterations 0 (no timing): capd runs cells in
                parallel up to the core count; against the same loop with
                iterations 0 (full mode only, or --numerics).

Equivalence: every prefork cell's tensor records are compared with the
fresh-exec head's, key for key and hash for hash, and both comparisons
against the control must say every cell is identical.

Prints one JSON object (also written to --out). Standard library only.
    bench_e2e.py --capd build/capd [--python /usr/bin/python3] [--repeats N]
                 [--quick] [--out FILE]
"""

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODELS = ["mlp", "cnn", "transformer", "lstm"]
WIDTHS = ["default", "avx2", "avx512"]  # narrowed to what the host runs in main()
PASSES = ["forward", "backward"]


class Capd(object):
    def __init__(self, binary, data_dir, runner_dir, max_parallel=1):
        self.log = open(os.path.join(os.path.dirname(data_dir), "capd-%d.log" % time.time_ns()),
                        "w")
        self.proc = subprocess.Popen(
            [binary, "--listen", "127.0.0.1:0", "--data-dir", data_dir, "--runner-dir",
             runner_dir, "--log-level", "info"]
            # max_parallel None: capd's defaults; else numerics-only jobs as
            # the performance table measures them
            + ([] if max_parallel is None else
               ["--max-parallel", str(max_parallel),
                "--max-parallel-numerics", str(os.cpu_count() or 1)])
            # a host's own settings, e.g. who runs the cells where capd is root
            + (["--config", os.environ["CAPD_BENCH_CONFIG"]]
               if os.environ.get("CAPD_BENCH_CONFIG") else []),
            stdout=subprocess.PIPE, stderr=self.log)
        line = self.proc.stdout.readline().decode()
        if "listening on" not in line:
            raise SystemExit("bench_e2e: capd did not start: %r" % line)
        self.base = "http://127.0.0.1:%s" % line.strip().rsplit(":", 1)[1]
        # Tokens are on by default: the admin token capd wrote at its first start.
        with open(os.path.join(data_dir, "admin.token")) as f:
            self.token = f.read().strip()

    def req(self, method, path, body=None, headers=None):
        data = json.dumps(body).encode() if body is not None else None
        h = {"Content-Type": "application/json", "Authorization": "Bearer " + self.token}
        h.update(headers or {})
        r = urllib.request.Request(self.base + path, data=data, method=method, headers=h)
        try:
            with urllib.request.urlopen(r, timeout=180) as resp:
                self.headers = resp.headers
                return resp.status, json.loads(resp.read().decode() or "null")
        except urllib.error.HTTPError as e:
            self.headers = e.headers
            body = e.read().decode()
            return e.code, json.loads(body) if body.strip() else None

    def stop(self):
        self.proc.terminate()
        self.proc.wait(60)
        self.log.close()


def submit(capd, build, commit, options, control=None, models=None, widths=None,
           branch=None, who="bench_e2e"):
    """POST /v1/jobs of MODELS (default MODELS) x WIDTHS x PASSES; the job's
    id. WHO names the bench in the error that ends it when capd refuses.
    CAPD is any object with req(method, path, body) like Capd's."""
    body = {"project": "bench", "commit": commit, "build": build,
            "matrix": {"models": models or MODELS, "widths": widths or WIDTHS,
                       "passes": PASSES},
            "options": options}
    if branch:
        body["branch"] = branch
    if control:
        body["control_commit"] = control
    st, j = capd.req("POST", "/v1/jobs", body)
    if st != 201:
        raise SystemExit("%s: POST /v1/jobs: %d %s" % (who, st, j))
    return j["id"]


def wait_job(capd, job_id, who="bench_e2e"):
    """Waits with the long-poll (GET /v1/jobs/{id}?wait=N, answered at each
    change of the job), as a CI client would: no polling load on capd."""
    etag = None
    while True:
        st, j = capd.req("GET", "/v1/jobs/%s?wait=60" % job_id,
                         headers={"If-None-Match": etag} if etag else None)
        if st == 200:
            etag = capd.headers.get("ETag")
            if j["state"] in ("done", "cancelled"):
                return j
        elif st != 304:
            raise SystemExit("%s: GET job: %d %s" % (who, st, j))


def emit(res, out):
    """Prints the result RES as JSON, and writes it to the file OUT too
    when one is named."""
    text = json.dumps(res, indent=1)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")
    print(text)


def check_cells(job):
    bad = [(c["model"], c["width"], c["pass"], c["state"], c.get("reason"))
           for c in job["cells"] if c["state"] != "ok"]
    if bad:
        raise SystemExit("bench_e2e: cells did not end ok: %s" % bad)


TICK = os.sysconf("SC_CLK_TCK")


def cpu_tree(root):
    """CPU seconds of ROOT and its live descendants, the reaped ones
    included (utime+stime+cutime+cstime from /proc)."""
    procs = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as fh:
                st = fh.read()
        except OSError:
            continue
        fields = st[st.rindex(")") + 2:].split()
        procs[int(d)] = (int(fields[1]), sum(int(x) for x in fields[11:15]))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        if pid in procs:
            total += procs[pid][1]
            todo.extend(p for p, (pp, _) in procs.items() if pp == pid)
    return total / float(TICK)


def timed_job(capd, build, commit, options, control=None):
    """Seconds from POST to the finished comparison (or to the job's end
    when there is no control), the job, the comparison, and the CPU seconds
    capd and its children (cells, zygotes) used meanwhile."""
    c0 = cpu_tree(capd.proc.pid)
    t0 = time.monotonic()
    job_id = submit(capd, build, commit, options, control)
    job = wait_job(capd, job_id)
    diff = None
    if control:
        st, diff = capd.req("GET", "/v1/commits/%s/diff" % commit)
        if st != 200:
            raise SystemExit("bench_e2e: diff: %d %s" % (st, diff))
    t = time.monotonic() - t0
    check_cells(job)
    capd.cpu = cpu_tree(capd.proc.pid) - c0
    return t, job, diff


def tensor_hashes(capd, job):
    out = {}
    for c in job["cells"]:
        recs, cursor = [], None
        while True:
            path = "/v1/jobs/%s/cells/%s/records?kind=tensor&limit=1000" % (job["id"], c["id"])
            if cursor:
                path += "&cursor=" + cursor
            st, page = capd.req("GET", path)
            if st != 200:
                raise SystemExit("bench_e2e: records: %d %s" % (st, page))
            for r in page["records"]:
                h = r.get("header") or r
                recs.append((h.get("key"), h.get("hash")))
            cursor = page.get("next_cursor")
            if not cursor:
                break
        out[(c["model"], c["width"], c["pass"])] = recs
    return out


def identical_cells(diff):
    """(identical, compared) from a comparison result."""
    cells = diff.get("cells") or []
    same = sum(1 for c in cells if c.get("status") == "identical")
    return same, len(cells)


def stored_bytes(data_dir):
    """(database bytes, blob bytes): the database's pages in use (WAL
    included: what a checkpoint would leave) and the payload blobs' bytes on
    disk."""
    import sqlite3
    db = sqlite3.connect("file:%s?mode=ro" % os.path.join(data_dir, "capd.db"), uri=True)
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    free = db.execute("PRAGMA freelist_count").fetchone()[0]
    size = db.execute("PRAGMA page_size").fetchone()[0]
    db.close()
    db_bytes = (pages - free) * size
    total = 0
    for base, _dirs, files in os.walk(os.path.join(data_dir, "blobs")):
        for fn in files:
            try:
                total += os.stat(os.path.join(base, fn)).st_blocks * 512
            except OSError:
                pass
    return db_bytes, total


def width_env():
    with open(os.path.join(ROOT, "schema", "widths.json")) as f:
        table = json.load(f)
    return dict((w["name"], w["env"]) for w in table["widths"])


def make_loop(work, python, runner_dir, options, job):
    """The shell loop and its 24 cell specs, in the job's cell order."""
    wenv = width_env()
    specs = os.path.join(work, "loop")
    os.makedirs(specs, exist_ok=True)
    lines = []
    opts = dict(options)
    opts.setdefault("sample_size", 256)
    opts.setdefault("max_payload_bytes", 8 << 30)
    for i, c in enumerate(job["cells"]):
        scratch = os.path.join(specs, "c%02d" % i)
        os.makedirs(scratch, exist_ok=True)
        if os.geteuid() == 0:
            os.chown(scratch, 65534, 65534)  # the cells' user, as capd does
        spec = {"protocol": 1, "job": job["id"], "cell": c["id"], "attempt": 1,
                "model": c["model"], "width": c["width"], "pass": c["pass"], "device": "cpu",
                "frame_fd": 3, "scratch": scratch, "model_roots": [], "options": opts}
        path = os.path.join(scratch, "cell.json")
        with open(path, "w") as f:
            json.dump(spec, f, indent=2)
        env = wenv[c["width"]]
        lines.append("%s %s %s %s" % (env["ATEN_CPU_CAPABILITY"], env["ONEDNN_MAX_CPU_ISA"],
                                      env["DNNL_MAX_CPU_ISA"], path))
    cells = os.path.join(specs, "cells.txt")
    with open(cells, "w") as f:
        f.write("\n".join(lines) + "\n")
    script = os.path.join(specs, "loop.sh")
    threads = str(options.get("threads", 1))
    # What capd passes through from its own environment (its default
    # env_allow list), so both sides run the cells under the same variables.
    keep = " ".join("%s=%s" % (k, shquote(v)) for k, v in sorted(os.environ.items())
                    if k in ("PATH", "LANG", "TZ") or k.startswith("LC_")
                    or k.startswith("OPENBLAS_"))
    # capd running as root runs cells as run_as_user (nobody): so does the
    # loop then.
    user = ""
    if os.geteuid() == 0 and shutil.which("setpriv"):
        user = "setpriv --reuid=65534 --regid=65534 --clear-groups"
    with open(script, "w") as f:
        f.write("""#!/bin/sh
# The reference: the same runner invocations capd makes, one after another,
# under the same environment (capd's allow-list, the width's variables, the
# spec, HOME = the cell's scratch dir as for capd's run_as_user), in the
# cell's scratch dir, as the same user.
fail=0
while read -r aten onednn dnnl spec; do
    cd "${spec%%/cell.json}" || fail=1
    %s env -i %s HOME="${spec%%/cell.json}" PYTHONPATH="%s" OMP_NUM_THREADS=%s \\
        PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 ATEN_CPU_CAPABILITY="$aten" \\
        ONEDNN_MAX_CPU_ISA="$onednn" DNNL_MAX_CPU_ISA="$dnnl" CAPD_CELL_SPEC="$spec" \\
        "%s" -m capd_runner 3>/dev/null >/dev/null 2>&1 || fail=1
done < "%s"
exit $fail
""" % (user, keep, runner_dir, threads, python, cells))
    os.chmod(script, 0o755)
    return script


def shquote(v):
    return "'" + v.replace("'", "'\\''") + "'"


def run_loop(script):
    """Wall seconds and CPU seconds (the shell and every cell it waited for)."""
    t0 = time.monotonic()
    p = subprocess.Popen(["/bin/sh", script])
    _pid, status, ru = os.wait4(p.pid, 0)
    p.returncode = 0
    t = time.monotonic() - t0
    if status != 0:
        raise SystemExit("bench_e2e: the shell loop had a failing cell (%s)" % script)
    run_loop.cpu = ru.ru_utime + ru.ru_stime
    return t


def machine():
    model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "machine": platform.machine(),
            "loadavg": list(os.getloadavg())}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--capd", required=True)
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--runner-dir", default=os.path.join(ROOT, "runner"))
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--numerics", action="store_true", help="also the numerics-only figure")
    ap.add_argument("--out", default=None)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    repeats = args.repeats or (1 if args.quick else 3)
    numerics = args.numerics or not args.quick
    # timing_pairs 0: the shell loop runs each cell's own timing processes
    # only, so capd's heads must not also time the control build
    # (bench_perf_verdicts.py measures what pairing costs).
    options = {"iterations": 20, "warmup": 3, "threads": 1, "timing_pairs": 0}

    work = tempfile.mkdtemp(prefix="capd-bench-e2e-")
    os.chmod(work, 0o755)
    capd = Capd(args.capd, os.path.join(work, "data"), args.runner_dir)
    st, table = capd.req("GET", "/v1/widths")
    here = set(w["name"] for w in table["widths"] if w["runnable_here"])
    WIDTHS[:] = [w for w in WIDTHS if w in here]
    ncells = len(MODELS) * len(WIDTHS) * len(PASSES)
    res = {"machine_before": machine(), "repeats": repeats, "options": options,
           "matrix": {"models": MODELS, "widths": WIDTHS, "passes": PASSES}, "cells": ncells}
    try:
        for name, pf in (("fresh", False), ("prefork", True)):
            st, j = capd.req("POST", "/v1/builds", {"name": name, "python": args.python,
                                                    "prefork": pf})
            if st != 201:
                raise SystemExit("bench_e2e: register build %s: %d %s" % (name, st, j))
        # The control, on the prefork build: its first use (zygote start,
        # import, equivalence check), which also warms the page cache.
        t_control, control_job, _ = timed_job(capd, "prefork", "c0" * 20, options)
        res["prefork_first_use_s"] = t_control
        res["cpu_prefork_first_use_s"] = capd.cpu
        script = make_loop(work, args.python, args.runner_dir, options, control_job)

        # Loops sandwich the capd runs (L C P L C P L ...), and each capd
        # run is compared with the mean of the loops on either side, so a
        # load that drifts during the run cancels to first order.
        loops, capds, warm = [], [], []
        cpu = {"loop": [], "capd": [], "prefork": []}
        fresh_job = prefork_job = None
        diffs = {}

        def one_loop():
            loops.append(run_loop(script))
            cpu["loop"].append(run_loop.cpu)

        one_loop()
        for i in range(repeats):
            t, fresh_job, diffs["fresh"] = timed_job(capd, "fresh", "%040x" % (0xa0 + i),
                                                     options, "c0" * 20)
            capds.append(t)
            cpu["capd"].append(capd.cpu)
            t, prefork_job, diffs["prefork"] = timed_job(capd, "prefork", "%040x" % (0xc0 + i),
                                                         options, "c0" * 20)
            warm.append(t)
            cpu["prefork"].append(capd.cpu)
            one_loop()
        st, build = capd.req("GET", "/v1/builds/prefork")
        res["prefork_build"] = dict((k, build.get(k)) for k in
                                    ("prefork", "prefork_state", "prefork_reason"))
        res["loop_s"] = loops
        res["capd_s"] = capds
        res["prefork_warm_s"] = warm
        around = [(loops[i] + loops[i + 1]) / 2.0 for i in range(repeats)]
        res["capd_over_loop_pairs"] = [c / l for c, l in zip(capds, around)]
        res["capd_over_loop"] = statistics.median(res["capd_over_loop_pairs"])
        res["loop_over_prefork_pairs"] = [l / p for p, l in zip(warm, around)]
        res["loop_over_prefork_warm"] = statistics.median(res["loop_over_prefork_pairs"])
        loop_m = statistics.median(loops)
        res["loop_over_prefork_first_use"] = loop_m / res["prefork_first_use_s"]
        # CPU seconds: what each side costs the machine, which contention
        # from other work stretches far less than wall time.
        res["cpu_s"] = cpu
        res["cpu_capd_over_loop"] = statistics.median(cpu["capd"]) / statistics.median(
            cpu["loop"])
        res["cpu_loop_over_prefork"] = statistics.median(cpu["loop"]) / statistics.median(
            cpu["prefork"])

        # Equivalence, hash for hash, prefork against fresh exec.
        a = tensor_hashes(capd, fresh_job)
        b = tensor_hashes(capd, prefork_job)
        c = tensor_hashes(capd, control_job)
        records = sum(len(v) for v in a.values())
        same = sum(1 for k in a for x, y in zip(a[k], b.get(k, [])) if x == y)
        same_first = sum(1 for k in a for x, y in zip(a[k], c.get(k, [])) if x == y)
        res["equivalence"] = {
            "records": records,
            "identical_prefork_warm": same if all(len(a[k]) == len(b.get(k, [])) for k in a)
            else -1,
            "identical_prefork_first_use": same_first
            if all(len(a[k]) == len(c.get(k, [])) for k in a) else -1,
            "cells_identical_to_control": dict((k, identical_cells(v)) for k, v in diffs.items()),
            "control": "the prefork build's first job (prefork first use)",
            "verdicts": dict((k, v.get("verdict")) for k, v in diffs.items()),
        }

        # Storage growth: a stats-level job's bytes per record, and what a
        # full-capture head identical to its full-capture control adds
        # (payloads are content-addressed, so it should be the rows only).
        data = os.path.join(work, "data")
        fopt = dict(options, iterations=1, warmup=0, capture="full")
        b0 = stored_bytes(data)
        _, full_ctl, _ = timed_job(capd, "prefork", "f0" * 20, fopt)
        b1 = stored_bytes(data)
        _, full_head, fdiff = timed_job(capd, "prefork", "f1" * 20, fopt, "f0" * 20)
        b2 = stored_bytes(data)
        st, jobs = capd.req("GET", "/v1/jobs?limit=100")
        stats_jobs = [j for j in (jobs.get("jobs") or []) if j.get("commit") not in
                      ("f0" * 20, "f1" * 20)]
        res["storage"] = {
            "stats_jobs": len(stats_jobs),
            "bytes_before_full": sum(b0),
            "full_control_bytes": sum(b1) - sum(b0),
            "full_control_blob_bytes": b1[1] - b0[1],
            "full_identical_head_bytes": sum(b2) - sum(b1),
            "full_identical_head_blob_bytes": b2[1] - b1[1],
            "full_identical_cells": identical_cells(fdiff),
        }
        try:
            import sqlite3
            db = sqlite3.connect("file:%s?mode=ro" % os.path.join(data, "capd.db"), uri=True)
            n = db.execute("SELECT count(*) FROM records r JOIN attempts a ON a.id = r.attempt_id "
                           "JOIN cells c ON c.seq = a.cell_seq JOIN jobs j ON j.seq = c.job_seq "
                           "WHERE j.commit_sha NOT IN (?, ?)", ("f0" * 20, "f1" * 20)).fetchone()[0]
            nt = db.execute("SELECT count(*) FROM records").fetchone()[0]
            db.close()
            res["storage"]["stats_records"] = n
            res["storage"]["all_records"] = nt
            res["storage"]["bytes_per_stats_record"] = b0[0] / float(n) if n else None
        except Exception as e:  # the schema is storage's business; say so
            res["storage"]["error"] = "%s: %s" % (type(e).__name__, e)

        if numerics:
            nopt = dict(options, iterations=0, warmup=0)
            nscript = make_loop(os.path.join(work, "n"), args.python, args.runner_dir, nopt,
                                control_job)
            nl = run_loop(nscript)
            t_fresh, _, _ = timed_job(capd, "fresh", "%040x" % 0xd0, nopt)
            t_pf, _, _ = timed_job(capd, "prefork", "%040x" % 0xd1, nopt)
            res["numerics"] = {"loop_s": nl, "capd_s": t_fresh, "capd_prefork_s": t_pf,
                               "loop_over_capd": nl / t_fresh,
                               "loop_over_capd_prefork": nl / t_pf}
    finally:
        capd.stop()
        res["machine_after"] = machine()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    emit(res, args.out)


if __name__ == "__main__":
    sys.exit(main())

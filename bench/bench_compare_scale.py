#!/usr/bin/env python3
"""Comparison latency with 10 jobs in the database against 10,000 jobs.

Captures, through capd's real API and the fake runner (tests/helpers/
fake_runner, which speaks the real protocol), 10 jobs of 24 cells each:
4 fake models (fake:ok__N, N tensors each) x default,avx2,native x
forward,backward, with timing iterations so the comparison computes perf.
Five control/head pairs; the heads run on a build that perturbs one tensor,
so comparisons find a divergence in the data. Then it measures

  GET /v1/compare?control=<commit>&head=<commit>   (JSON)
  GET /v1/commits/<head commit>/diff               (JSON)

as the median (and p90) of --requests requests after 3 warm-ups, over one
keep-alive connection, with 10 jobs in the database.

Growth: capd is stopped (SIGTERM, waited for); the 10 jobs are bulk-copied
in SQLite (one transaction, the sqlite3 module) 999 times with new unique
job/cell ids, seqs, attempt ids and commits (commit and control_commit are
remapped per copy, so every copy is a consistent control/head pair), their
cells, attempts and records with them; the schema's triggers publish the
new jobs' events as capd's own inserts do. PRAGMA foreign_key_check and
integrity_check must then be clean. capd restarts on the same data dir, a
few copied jobs are fetched to check it serves them, and the same latencies
are measured again: the same control/head pair, and a pair among the copies.

Prints one JSON object (also written to --out) and a human line last.
Standard library only; builds nothing.

    bench_compare_scale.py --capd build-bench/capd
                           [--fake-runner build-bench/tests/fake_runner]
                           [--requests 30] [--quick] [--out FILE] [--keep]
"""

import argparse
import http.client
import json
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import bench_e2e  # noqa: E402  (submit, wait_job)

# Fake-runner cells: the widths are labels, so ones every x86 host with AVX2
# runs (an avx512 cell would end unsupported, recordless, on a host without
# AVX-512 and change what is measured).
WIDTHS = ["default", "avx2", "native"]
PASSES = ["forward", "backward"]
PERTURB = "layer1.0.forward.output.0"
TARGET_JOBS = 10000
WARMUPS = 3


class Capd(object):
    def __init__(self, binary, data_dir, work):
        self.log = open(os.path.join(work, "capd-%d.log" % time.time_ns()), "w")
        self.proc = subprocess.Popen(
            [binary, "--listen", "127.0.0.1:0", "--data-dir", data_dir, "--runner-dir",
             os.path.join(ROOT, "runner"), "--max-parallel", "2", "--log-level", "info"],
            stdout=subprocess.PIPE, stderr=self.log)
        line = self.proc.stdout.readline().decode()
        if "listening on" not in line:
            self.proc.kill()
            self.proc.wait()
            raise SystemExit("bench_compare_scale: capd did not start: %r" % line)
        self.port = int(line.strip().rsplit(":", 1)[1])
        # Tokens are on by default: the admin token capd wrote at its first start.
        with open(os.path.join(data_dir, "admin.token")) as f:
            self.token = f.read().strip()
        self.conn = None
        self.headers = None

    def req(self, method, path, body=None, headers=None):
        """(status, parsed JSON body) over a kept-alive connection."""
        data = json.dumps(body).encode() if body is not None else None
        h = {"Content-Type": "application/json", "Accept": "application/json",
             "Authorization": "Bearer " + self.token}
        h.update(headers or {})
        for attempt in (1, 2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=180)
            try:
                self.conn.request(method, path, body=data, headers=h)
                resp = self.conn.getresponse()
                raw = resp.read()
                break
            except (http.client.HTTPException, OSError):
                self.conn.close()
                self.conn = None
                if attempt == 2:
                    raise
        self.headers = resp.headers
        text = raw.decode()
        return resp.status, (json.loads(text) if text.strip() else None)

    def stop(self):
        if self.conn:
            self.conn.close()
            self.conn = None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def commit_of(copy, i, kind):
    """40 hex digits: 6 of copy number (0 = the captured jobs), then the
    pair and the side, so remapping a copy only rewrites the first 6."""
    return "%06x%02x%032x" % (copy, i, 0xc0 if kind == "control" else 0xa0)


def submit(capd, build, commit, models, options, control=None):
    return bench_e2e.submit(capd, build, commit, options, control, models=models, widths=WIDTHS,
                            branch="main" if control is None else "feature",
                            who="bench_compare_scale")


def wait_job(capd, job_id):
    """The long-poll GET /v1/jobs/{id}?wait=60, as a CI client waits; every
    cell must have ended ok."""
    j = bench_e2e.wait_job(capd, job_id, who="bench_compare_scale")
    bad = [(c["model"], c["width"], c["pass"], c["state"], c.get("reason"))
           for c in j["cells"] if c["state"] != "ok"]
    if bad:
        raise SystemExit("bench_compare_scale: cells not ok: %s" % bad)
    return j


def pct(values, p):
    s = sorted(values)
    k = (len(s) - 1) * p
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def latency(capd, path, n):
    """Median and p90 in ms of N GETs of PATH after WARMUPS warm-ups; the
    answer must be 200 with a verdict and 24 cells."""
    for _ in range(WARMUPS):
        st, body = capd.req("GET", path)
        if st != 200 or not body or "verdict" not in body or len(body.get("cells") or []) != 24:
            raise SystemExit("bench_compare_scale: %s: %d %s" % (path, st, str(body)[:300]))
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        st, body = capd.req("GET", path)
        ts.append((time.perf_counter() - t0) * 1000.0)
        if st != 200:
            raise SystemExit("bench_compare_scale: %s: %d" % (path, st))
    return {"median_ms": statistics.median(ts), "p90_ms": pct(ts, 0.9), "min_ms": min(ts),
            "n": n, "verdict": body.get("verdict"),
            "diverged": (body.get("counts") or {}).get("diverged")}


def measure(capd, control, head, n):
    return {
        "compare": latency(capd, "/v1/compare?control=%s&head=%s" % (control, head), n),
        "diff": latency(capd, "/v1/commits/%s/diff" % head, n),
    }


def counts(db_path):
    db = sqlite3.connect("file:%s?mode=ro" % db_path, uri=True)
    try:
        r = dict((t, db.execute("SELECT count(*) FROM %s" % t).fetchone()[0])
                 for t in ("jobs", "cells", "attempts", "records", "events"))
        r["db_bytes"] = (db.execute("PRAGMA page_count").fetchone()[0] *
                         db.execute("PRAGMA page_size").fetchone()[0])
        return r
    finally:
        db.close()


def columns(db, table):
    return [r[1] for r in db.execute("PRAGMA table_info(%s)" % table)]


def copy_sql(db, table, overrides, source, order):
    """INSERT INTO TABLE (every column) SELECT ... FROM copies k, SOURCE,
    each column taken as is unless OVERRIDES gives an expression: new
    columns added by later migrations are copied without changes here."""
    cols = columns(db, table)
    unknown = set(overrides) - set(cols)
    if unknown:
        raise SystemExit("bench_compare_scale: %s has no column %s" % (table, sorted(unknown)))
    exprs = [overrides.get(c, "t.%s" % c) for c in cols]
    return ("WITH RECURSIVE copies(k) AS (SELECT 1 UNION ALL SELECT k + 1 FROM copies "
            "WHERE k < :n) INSERT INTO %s (%s) SELECT %s FROM copies, %s t ORDER BY k, %s"
            % (table, ", ".join(cols), ", ".join(exprs), source, order))


def grow(db_path, target):
    """Copies the database's jobs (with their cells, attempts and records)
    until it holds TARGET jobs, in one transaction. Returns a summary."""
    db = sqlite3.connect(db_path, isolation_level=None)
    db.execute("PRAGMA foreign_keys = ON")
    db.execute("PRAGMA synchronous = NORMAL")
    db.execute("PRAGMA cache_size = -262144")
    js, njobs = db.execute("SELECT max(seq), count(*) FROM jobs").fetchone()
    cs = db.execute("SELECT max(seq) FROM cells").fetchone()[0]
    ats = db.execute("SELECT max(id) FROM attempts").fetchone()[0]
    if target % njobs:
        raise SystemExit("bench_compare_scale: %d jobs do not divide %d" % (njobs, target))
    n = target // njobs - 1
    # The first 6 hex digits of a commit are the copy number (commit_of).
    newc = "CASE WHEN %s IS NULL THEN NULL ELSE printf('%%06x', k) || substr(%s, 7) END"
    jobs = copy_sql(db, "jobs", {
        "seq": "t.seq + k * :js",
        "id": "'j' || lower(hex(randomblob(6)))",
        "commit_sha": newc % ("t.commit_sha", "t.commit_sha"),
        "control_commit": newc % ("t.control_commit", "t.control_commit"),
        "request_json": "json_replace(t.request_json, '$.commit', %s, '$.control_commit', %s)"
                        % (newc % ("t.commit_sha", "t.commit_sha"),
                           newc % ("t.control_commit", "t.control_commit")),
        "idem_key": "CASE WHEN t.idem_key IS NULL THEN NULL ELSE t.idem_key || '.' || k END",
        "created_at": "t.created_at + k",
        "updated_at": "t.updated_at + k",
        "finished_at": "t.finished_at + k",
    }, "jobs", "t.seq")
    cells = copy_sql(db, "cells", {
        "seq": "t.seq + k * :cs",
        "id": "'c' || lower(hex(randomblob(6)))",
        "job_seq": "t.job_seq + k * :js",
        "committed_attempt": "t.committed_attempt + k * :as",
    }, "cells", "t.seq")
    attempts = copy_sql(db, "attempts", {
        "id": "t.id + k * :as",
        "cell_seq": "t.cell_seq + k * :cs",
    }, "attempts", "t.id")
    records = copy_sql(db, "records", {
        "attempt_id": "t.attempt_id + k * :as",
    }, "records", "t.attempt_id, t.seq")
    p = {"n": n, "js": js, "cs": cs, "as": ats}
    t0 = time.monotonic()
    db.execute("BEGIN IMMEDIATE")
    try:
        steps = {}
        for name, sql in (("jobs", jobs), ("cells", cells), ("attempts", attempts),
                          ("records", records)):
            t = time.monotonic()
            db.execute(sql, dict((k, v) for k, v in p.items() if ":" + k in sql))
            steps[name] = time.monotonic() - t
        fk = db.execute("PRAGMA foreign_key_check").fetchall()
        if fk:
            raise SystemExit("bench_compare_scale: foreign_key_check: %s" % fk[:10])
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    t_tx = time.monotonic() - t0
    t = time.monotonic()
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    t_ckpt = time.monotonic() - t
    t = time.monotonic()
    ic = db.execute("PRAGMA integrity_check").fetchall()
    t_ic = time.monotonic() - t
    db.close()
    if ic != [("ok",)]:
        raise SystemExit("bench_compare_scale: integrity_check: %s" % ic[:10])
    return {"copies": n, "transaction_s": t_tx, "steps_s": steps, "checkpoint_s": t_ckpt,
            "integrity_check_s": t_ic, "foreign_key_check": "ok", "integrity_check": "ok"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--capd", required=True)
    ap.add_argument("--fake-runner", default=None,
                    help="default: tests/fake_runner next to --capd")
    ap.add_argument("--requests", type=int, default=None, help="default 30 (--quick 15)")
    ap.add_argument("--tensors", default="4,8,12,16",
                    help="tensors per cell of the 4 fake models (fake:ok__N)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    nreq = args.requests or (15 if args.quick else 30)
    capd_bin = os.path.abspath(args.capd)
    fake = os.path.abspath(args.fake_runner or os.path.join(os.path.dirname(capd_bin), "tests",
                                                             "fake_runner"))
    if not os.access(fake, os.X_OK):
        raise SystemExit("bench_compare_scale: no fake runner at %s" % fake)
    models = ["fake:ok__%d" % int(x) for x in args.tensors.split(",")]
    if len(models) != 4:
        raise SystemExit("bench_compare_scale: --tensors needs 4 numbers (24 cells)")
    options = {"iterations": 20, "warmup": 3, "threads": 1}

    work = tempfile.mkdtemp(prefix="capd-bench-cmpscale-")
    os.chmod(work, 0o755)  # capd running as root runs cells as nobody
    data = os.path.join(work, "data")
    db_path = os.path.join(data, "capd.db")
    roots = os.path.join(work, "models")
    os.makedirs(roots)
    res = {"cells_per_job": 24, "models": models, "widths": WIDTHS, "passes": PASSES,
           "options": options, "requests": nreq, "warmups": WARMUPS,
           "loadavg_before": list(os.getloadavg())}
    capd = None
    try:
        capd = Capd(capd_bin, data, work)
        for name, env in (("ctl", {}), ("head", {"FAKE_PERTURB_KEY": PERTURB})):
            st, j = capd.req("POST", "/v1/builds", {"name": name, "python": fake, "env": env,
                                                    "model_roots": [roots]})
            if st != 201:
                raise SystemExit("bench_compare_scale: register build %s: %d %s" % (name, st, j))
        t0 = time.monotonic()
        ids = []
        for i in range(5):
            c, h = commit_of(0, i, "control"), commit_of(0, i, "head")
            wait_job(capd, submit(capd, "ctl", c, models, options))
            ids.append(wait_job(capd, submit(capd, "head", h, models, options, c))["id"])
        res["capture_s"] = time.monotonic() - t0
        pair = (commit_of(0, 0, "control"), commit_of(0, 0, "head"))
        res["pair"] = {"control": pair[0], "head": pair[1]}
        res["small"] = {"counts": counts(db_path), "same_pair": measure(capd, pair[0], pair[1],
                                                                        nreq)}
        rc = capd.stop()
        if rc != 0:
            raise SystemExit("bench_compare_scale: capd exited %s on SIGTERM" % rc)

        t0 = time.monotonic()
        res["growth"] = grow(db_path, TARGET_JOBS)
        res["growth"]["seconds"] = time.monotonic() - t0

        capd = None
        capd = Capd(capd_bin, data, work)
        # capd serves the copies: a few jobs by id, done, 24 ok cells, and
        # a copy's head diff against its own (copied) control.
        db = sqlite3.connect("file:%s?mode=ro" % db_path, uri=True)
        sample = [r[0] for r in db.execute(
            "SELECT id FROM jobs WHERE seq > (SELECT min(seq) + 9 FROM jobs) "
            "ORDER BY random() LIMIT 5")]
        db.close()
        for jid in sample:
            st, j = capd.req("GET", "/v1/jobs/%s" % jid)
            if st != 200 or j.get("state") != "done" or len(j.get("cells") or []) != 24 or \
                    any(c["state"] != "ok" for c in j["cells"]):
                raise SystemExit("bench_compare_scale: copied job %s: %d %s"
                                 % (jid, st, str(j)[:300]))
        res["checked_copies"] = sample
        copy = res["growth"]["copies"] // 2
        new_pair = (commit_of(copy, 2, "control"), commit_of(copy, 2, "head"))
        res["new_pair"] = {"control": new_pair[0], "head": new_pair[1]}
        res["large"] = {"counts": counts(db_path),
                        "same_pair": measure(capd, pair[0], pair[1], nreq),
                        "new_pair": measure(capd, new_pair[0], new_pair[1], nreq)}
        for k in ("compare", "diff"):
            for side in ("same_pair", "new_pair"):
                a = res["small"]["same_pair"][k]
                b = res["large"][side][k]
                if (a["verdict"], a["diverged"]) != (b["verdict"], b["diverged"]):
                    raise SystemExit("bench_compare_scale: %s %s answers differently after "
                                     "growth: %s against %s" % (side, k, b, a))
    finally:
        if capd:
            capd.stop()
        res["loadavg_after"] = list(os.getloadavg())
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            res["work"] = work

    s, l = res["small"]["same_pair"], res["large"]["same_pair"]
    res["ratio_compare"] = l["compare"]["median_ms"] / s["compare"]["median_ms"]
    res["ratio_diff"] = l["diff"]["median_ms"] / s["diff"]["median_ms"]
    res["ratio_compare_new_pair"] = (res["large"]["new_pair"]["compare"]["median_ms"] /
                                     s["compare"]["median_ms"])
    res["target_ratio"] = 1.5
    res["met"] = max(res["ratio_compare"], res["ratio_diff"]) <= 1.5
    text = json.dumps(res, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    print("compare: %.2f ms with %d jobs, %.2f ms with %d jobs (ratio %.2f; new pair %.2f ms); "
          "diff: %.2f ms, %.2f ms (ratio %.2f); %d -> %d records; growth %.1f s; target <= 1.5 %s"
          % (s["compare"]["median_ms"], res["small"]["counts"]["jobs"], l["compare"]["median_ms"],
             res["large"]["counts"]["jobs"], res["ratio_compare"],
             res["large"]["new_pair"]["compare"]["median_ms"], s["diff"]["median_ms"],
             l["diff"]["median_ms"], res["ratio_diff"], res["small"]["counts"]["records"],
             res["large"]["counts"]["records"], res["growth"]["seconds"],
             "met" if res["met"] else "NOT MET"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

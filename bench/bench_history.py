#!/usr/bin/env python3
"""History query latency: one cell's series at 10,000 commits against the
same cell's series at 100 commits, in the same run.

Captures, through capd's real API and the fake runner, one job of one cell
on each of two branches (b100, b10k), so capd makes both series and their
first point itself. capd is then stopped and each series is grown in SQLite
(one transaction, the sqlite3 module) to 100 and to 10,000 points, copies
of its first point with new commits one minute apart, as the history
drain would store them (storage/history.c). capd restarts on the same data
dir and serves

  GET /v1/history?project=&branch=&model=&width=&pass=&limit=100

for each branch: the same 100 newest points in the reply, so what differs
is only how long the series is. The figure is the median of --requests
requests (after 3 warm-ups, one keep-alive connection) at 10,000 over the
median at 100; the target is at most 1.5.

Prints one JSON object (also written to --out) and a human line last.

    bench_history.py --capd build-bench/capd --fake-runner build-bench/tests/fake_runner
                     [--requests 200] [--quick] [--out FILE]
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

SIZES = {"b100": 100, "b10k": 10000}
WARMUPS = 3


def start(capd, data, extra=()):
    """capd on DATA (EXTRA flags after the defaults): (process, port, admin token).
    bench_remote.py starts its capds with this too."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    log = open(os.path.join(os.path.dirname(data), "capd.log"), "a")
    p = subprocess.Popen([capd, "--listen", "127.0.0.1:0", "--data-dir", data, "--runner-dir",
                          os.path.join(root, "runner")] + list(extra),
                         stdout=subprocess.PIPE, stderr=log, text=True)
    line = p.stdout.readline()
    if "listening on" not in line:
        p.kill()
        p.wait()
        log.close()
        sys.exit("bench: capd did not start: %r: %s" % (line, open(log.name).read()[-600:]))
    port = int(line.strip().rsplit(":", 1)[1])
    with open(os.path.join(data, "admin.token")) as f:
        token = f.read().strip()
    return p, port, token


def stop(p):
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=60)


def req(conn, token, method, path, body=None):
    h = {"Authorization": "Bearer " + token}
    if body is not None:
        h["Content-Type"] = "application/json"
        body = json.dumps(body)
    conn.request(method, path, body, h)
    r = conn.getresponse()
    data = r.read()
    return r.status, data


def capture(port, token, fake, root):
    conn = http.client.HTTPConnection("127.0.0.1", port)
    st, _ = req(conn, token, "POST", "/v1/builds",
                {"name": "fake", "python": fake, "model_roots": [root]})
    assert st == 201, st
    ids = []
    for i, branch in enumerate(SIZES):
        st, body = req(conn, token, "POST", "/v1/jobs", {
            "project": "bench", "commit": "%040x" % (i + 1), "branch": branch, "build": "fake",
            "commit_time": "2024-01-01T00:00:00Z",
            "matrix": {"models": ["fake:ok"], "widths": ["default"], "passes": ["forward"]},
            "options": {"iterations": 5}})
        assert st == 201, body
        ids.append(json.loads(body)["id"])
    for jid in ids:
        for _ in range(600):
            st, body = req(conn, token, "GET", "/v1/jobs/" + jid)
            if json.loads(body)["state"] in ("done", "cancelled"):
                break
            time.sleep(0.1)
    # A history read drains the queue: both series exist once it answered.
    for branch in SIZES:
        st, _ = req(conn, token, "GET", path_of(branch))
        assert st == 200, st
    conn.close()


def path_of(branch):
    return ("/v1/history?project=bench&branch=%s&model=fake:ok&width=default&pass=forward"
            "&limit=100" % branch)


def grow(data):
    db = sqlite3.connect(os.path.join(data, "capd.db"))
    db.execute("BEGIN IMMEDIATE")
    for branch, n in SIZES.items():
        sid = db.execute("SELECT id FROM history_series WHERE branch = ?", (branch,)).fetchone()[0]
        db.execute(
            "WITH RECURSIVE k(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM k WHERE i < ?) "
            "INSERT INTO history_points(series_id, commit_sha, order_ms, order_seq, ordered_by, "
            "commit_time, job_id, cell_id, attempt_id, outcome, perf_ns, perf_samples, "
            "peak_rss_bytes, digest, n_tensors, numerics, first_divergent_key, created_at) "
            "SELECT p.series_id, printf('%040x', 1000000 + k.i), p.order_ms + k.i * 60000, "
            "p.order_seq, p.ordered_by, p.commit_time, p.job_id, p.cell_id, p.attempt_id, "
            "p.outcome, p.perf_ns * (1 + (k.i % 7) * 0.001), p.perf_samples, p.peak_rss_bytes, "
            "p.digest, p.n_tensors, 'identical', NULL, p.created_at "
            "FROM history_points p, k WHERE p.series_id = ?", (n - 1, sid))
        got = db.execute("SELECT count(*) FROM history_points WHERE series_id = ?",
                         (sid,)).fetchone()[0]
        assert got == n, (branch, got)
    db.commit()
    db.close()


def measure(port, token, branch, n):
    conn = http.client.HTTPConnection("127.0.0.1", port)
    times = []
    for i in range(WARMUPS + n):
        t0 = time.perf_counter()
        st, body = req(conn, token, "GET", path_of(branch))
        dt = time.perf_counter() - t0
        assert st == 200, (st, body[:200])
        assert len(json.loads(body)["points"]) == 100
        if i >= WARMUPS:
            times.append(dt)
    conn.close()
    times.sort()
    return {"median_ms": statistics.median(times) * 1e3,
            "p90_ms": times[int(len(times) * 0.9) - 1] * 1e3, "requests": n}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--capd", required=True)
    ap.add_argument("--fake-runner", required=True)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out")
    a = ap.parse_args()
    n = 60 if a.quick else a.requests
    root = tempfile.mkdtemp(prefix="capd-bench-history-")
    # Cells run as run_as_user (nobody) when capd is root: it must reach them.
    os.chmod(root, 0o755)
    data = os.path.join(root, "data")
    try:
        p, port, token = start(a.capd, data)
        try:
            capture(port, token, os.path.abspath(a.fake_runner), root)
        finally:
            stop(p)
        grow(data)
        p, port, token = start(a.capd, data)
        try:
            # Interleaved halves, so a change of the host's load meanwhile
            # falls on both sides alike.
            r = {b: [] for b in SIZES}
            for _ in range(2):
                for b in SIZES:
                    r[b].append(measure(port, token, b, n // 2))
        finally:
            stop(p)
        res = {b: {"points": SIZES[b],
                   "median_ms": statistics.median([x["median_ms"] for x in r[b]]),
                   "p90_ms": max(x["p90_ms"] for x in r[b]), "requests": n}
               for b in SIZES}
        ratio = res["b10k"]["median_ms"] / res["b100"]["median_ms"]
        out = {"series": res, "ratio_10000_over_100": ratio, "target": 1.5,
               "uptime": subprocess.run(["uptime"], capture_output=True,
                                        text=True).stdout.strip()}
        if a.out:
            with open(a.out, "w") as f:
                json.dump(out, f, indent=1)
        print(json.dumps(out))
        print("history query, 100 newest points: %.2f ms at 10,000 commits, %.2f ms at 100 "
              "(ratio %.2f, target <= 1.5)" % (res["b10k"]["median_ms"], res["b100"]["median_ms"],
                                              ratio))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Remote attempts against local cells, in the same run (issue 21).

Three capds on this host, each with the fake runner's build:

  local   executor "local": cells are capd's children;
  remote  executor "remote": remote_launch execs capd-cell, which fetches
          the spec and streams frames and log back over HTTP;
  slurm   executor "slurm" on a one-node Slurm (tests/slurm/cluster.sh):
          every attempt an sbatch job running capd-cell on the node
          (skipped, with the reason, where the host cannot run one).

Figures:
  per-cell time   --cells one-cell jobs of fake:ok, one after another, each
                  from POST /v1/jobs to the job done; the mean per cell of
                  remote and slurm against local. Target for slurm: at most
                  1.2 x local + 1 s a cell (the second is Slurm's own
                  scheduling tick and sbatch's round trip).
  batch           one job of --cells fake:ok cells (max_parallel 4): its time
                  from POST to done per cell, slurm (one sbatch array for
                  the cells started together) against local.
  ingest rate     one cell of fake:payload (--mib MiB of 1 MiB full
                  payloads) each; bytes stored over the cell's duration,
                  remote against local. Target: at least 0.5.

Prints one JSON object (also written to --out) and a human line last.

    bench_remote.py --capd build-bench/capd --capd-cell build-bench/capd-cell
                    --fake-runner build-bench/tests/fake_runner [--cells 10] [--mib 64]
                    [--quick] [--out FILE]
"""

import argparse
import http.client
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import bench_history  # noqa: E402  (its start(): one way to start a capd)


def start(capd, dirpath, config):
    """capd on DIRPATH/data with the config file CONFIG (a dict)."""
    cfg = os.path.join(dirpath, "capd.json")
    with open(cfg, "w") as f:
        json.dump(config, f)
    return bench_history.start(capd, os.path.join(dirpath, "data"), ["--config", cfg])


def stop(p):
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


class Api:
    def __init__(self, port, token):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self.token = token

    def call(self, method, path, body=None):
        h = {"Authorization": "Bearer " + self.token}
        if body is not None:
            h["Content-Type"] = "application/json"
            body = json.dumps(body)
        self.conn.request(method, path, body, h)
        r = self.conn.getresponse()
        data = r.read()
        return r.status, json.loads(data) if data else None


def run_job(api, model, commit, options=None, timeout=300, models=None):
    """POSTs a job of MODEL (or of every one of MODELS) and waits for it:
    (seconds, its first cell), or (seconds, every cell) for MODELS."""
    t0 = time.monotonic()
    st, j = api.call("POST", "/v1/jobs", {
        "project": "bench", "commit": commit, "build": "fake",
        "matrix": {"models": models or [model], "widths": ["avx2"], "passes": ["forward"]},
        "options": options or {}})
    if st != 201:
        sys.exit("bench_remote: POST /v1/jobs: %s %s" % (st, j))
    while True:
        st, job = api.call("GET", "/v1/jobs/" + j["id"])
        if job["state"] in ("done", "failed", "cancelled"):
            if all(c["state"] != "running" for c in job["cells"]):
                return time.monotonic() - t0, job["cells"] if models else job["cells"][0]
        if time.monotonic() - t0 > timeout:
            sys.exit("bench_remote: job %s still %s after %d s" % (j["id"], job["state"], timeout))
        time.sleep(0.02)


def per_cell(apis, n):
    """Seconds each one-cell fake:ok job takes, N per executor (after one
    warm-up each), interleaved job by job so drift hits every one alike."""
    times = {name: [] for name in apis}
    for name, api in apis.items():
        run_job(api, "fake:ok", "%040x" % 0)
    for i in range(n):
        for name, api in apis.items():
            s, cell = run_job(api, "fake:ok", "%040x" % (i + 1))
            if cell["state"] != "ok":
                sys.exit("bench_remote: %s cell %s: %s" % (name, cell["state"],
                                                          cell.get("reason")))
            times[name].append(s)
    return times


def batch(apis, n):
    """Seconds per cell of one job of N fake:ok cells, each executor."""
    models = ["fake:ok__%d" % (i + 2) for i in range(n)]
    per = {}
    for name, api in apis.items():
        s, cells = run_job(api, None, "%040x" % 99, models=models)
        bad = [c for c in cells if c["state"] != "ok"]
        if bad:
            sys.exit("bench_remote: %s batch cell %s: %s" % (name, bad[0]["state"],
                                                            bad[0].get("reason")))
        per[name] = s / n
    return per


def ingest(api, mib, tag):
    """MiB/s of a fake:payload cell of MIB MiB: stored bytes over its duration."""
    s, cell = run_job(api, "fake:payload__%d" % mib, "f" * 40)
    if cell["state"] != "ok":
        sys.exit("bench_remote: %s payload cell %s: %s" % (tag, cell["state"], cell.get("reason")))
    return mib / (cell["duration_ms"] / 1000.0), cell["duration_ms"], s


def slurm_up(dirpath):
    """(config additions, None) with a one-node cluster up, or (None, why)."""
    cdir = os.path.join(dirpath, "cluster")
    r = subprocess.run([os.path.join(ROOT, "tests/slurm/cluster.sh"), "up", cdir],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode == 77:
        return None, r.stdout.strip().splitlines()[-1] if r.stdout.strip() else "cannot run"
    if r.returncode != 0:
        return None, "cluster.sh up exited %d: %s" % (r.returncode, r.stdout[-400:])
    return {"slurm_conf": os.path.join(cdir, "slurm.conf"), "slurm_poll_ms": 200}, None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--capd", required=True)
    ap.add_argument("--capd-cell", required=True)
    ap.add_argument("--fake-runner", required=True)
    ap.add_argument("--cells", type=int, default=10)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.quick:
        args.cells, args.mib = 4, 32
    top = tempfile.mkdtemp(prefix="capd-bench-remote-")
    os.chmod(top, 0o755)  # run_as_user must reach the data dirs
    out = {"cells": args.cells, "mib": args.mib, "load_before": open("/proc/loadavg").read().strip()}
    procs, cluster = [], None
    try:
        cell = os.path.abspath(args.capd_cell)
        base = {"max_parallel": 4}
        configs = {
            "local": dict(base),
            "remote": dict(base, executor="remote",
                           remote_launch="exec '%s' --quiet --scratch %s/w-$CAPD_ATTEMPT"
                           % (cell, top)),
        }
        extra, why = slurm_up(top)
        if extra:
            cluster = os.path.join(top, "cluster")
            configs["slurm"] = dict(base, executor="slurm", slurm_worker=cell,
                                    slurm_workdir=top, **extra)
        else:
            out["slurm_skipped"] = why
        apis = {}
        for name, cfg in configs.items():
            d = os.path.join(top, name)
            os.makedirs(d)
            p, port, token = start(args.capd, d, cfg)
            procs.append(p)
            apis[name] = Api(port, token)
            st, _ = apis[name].call("POST", "/v1/builds", {
                "name": "fake", "python": os.path.abspath(args.fake_runner),
                "model_roots": [top]})
            if st != 201:
                sys.exit("bench_remote: POST /v1/builds on %s: %s" % (name, st))
        times = per_cell(apis, args.cells)
        means = {k: statistics.mean(v) for k, v in times.items()}
        out["per_cell_s"] = means
        out["per_cell_runs_s"] = times
        loc = means["local"]
        out["remote_over_local"] = means["remote"] / loc
        if "slurm" in means:
            out["slurm_over_local"] = means["slurm"] / loc
            out["slurm_excess_s"] = means["slurm"] - 1.2 * loc
            out["slurm_target_met"] = out["slurm_excess_s"] <= 1.0
        if "slurm" in apis:
            b = batch({k: apis[k] for k in ("local", "slurm")}, args.cells)
            out["batch_per_cell_s"] = b
            out["batch_slurm_over_local"] = b["slurm"] / b["local"]
            out["batch_slurm_excess_s"] = b["slurm"] - 1.2 * b["local"]
        rates = {}
        for name in ("local", "remote"):
            rates[name] = ingest(apis[name], args.mib, name)
        out["ingest_mib_s"] = {k: v[0] for k, v in rates.items()}
        out["ingest_cell_ms"] = {k: v[1] for k, v in rates.items()}
        out["remote_ingest_over_local"] = rates["remote"][0] / rates["local"][0]
        out["ingest_target_met"] = out["remote_ingest_over_local"] >= 0.5
    finally:
        for p in procs:
            stop(p)
        if cluster:
            subprocess.run([os.path.join(ROOT, "tests/slurm/cluster.sh"), "down", cluster],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(top, ignore_errors=True)
    out["load_after"] = open("/proc/loadavg").read().strip()
    text = json.dumps(out, indent=2, sort_keys=True)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print("per cell: local %.2f s, remote %.2f s (%.2fx)%s; ingest: local %.0f MiB/s, remote "
          "%.0f MiB/s (%.2fx)"
          % (out["per_cell_s"]["local"], out["per_cell_s"]["remote"], out["remote_over_local"],
             ", slurm %.2f s (%.2fx, %.2f s over 1.2x local)" % (
                 out["per_cell_s"]["slurm"], out["slurm_over_local"], out["slurm_excess_s"])
             + (", a batch of %d: slurm %.2f s a cell against local %.2f s" % (
                 args.cells, out["batch_per_cell_s"]["slurm"], out["batch_per_cell_s"]["local"]))
             if "slurm" in out["per_cell_s"] else ", slurm skipped: " + out["slurm_skipped"],
             out["ingest_mib_s"]["local"], out["ingest_mib_s"]["remote"],
             out["remote_ingest_over_local"]))


if __name__ == "__main__":
    main()

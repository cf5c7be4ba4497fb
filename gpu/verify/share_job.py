#!/usr/bin/env python3
"""GPU cells sharing one device (issue 39, docs/gpu.md "Sharing a device").

Against a running capd: registers the build "gpu-share" on PY and runs two
numerics-only GPU jobs at once (the zoo's mlp, cnn, transformer and lstm x
native x forward,backward, batch 2 and batch 8: 16 cells; options.iterations 0, so nothing is
timed and the cells may share the device), samples GET /v1/devices for the
most cells holding one device at once, and writes TAG.json into OUTDIR:
the wall time from the first POST to both jobs done, the cells and their
states, that peak, and the job ids by batch.

    share_job.py --python PY [--url URL] [--data-dir DATA] --tag TAG OUTDIR
    share_job.py --python PY --judge SERIAL PARALLEL OUTDIR

--judge reads SERIAL.json and PARALLEL.json (two runs on the same data dir,
e.g. gpu_cells_per_device 1, today's serial placement, and the default 4),
compares each batch's two jobs (GET /v1/compare: every cell must be
identical, the records bit for bit) and prints the wall-time ratio. Exit
status 0 when every cell ran ok (and, judging, every pair is identical).
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from capd_job import arguments, call, connect, save, wait_jobs  # noqa: E402

MODELS = ["mlp", "cnn", "transformer", "lstm"]
BATCHES = (2, 8)


def run(args):
    base = args.url
    env = {}
    if os.environ.get("LD_LIBRARY_PATH_FOR_CELLS"):
        env["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH_FOR_CELLS"]
    st, b = call(base, "PUT", "/v1/builds/gpu-share", {"python": args.python, "env": env})
    if st not in (200, 201):
        print("PUT /v1/builds/gpu-share -> %d %s" % (st, b))
        return 1
    matrix = {"models": MODELS, "widths": ["native"], "passes": ["forward", "backward"]}
    t0 = time.time()
    jobs = {}
    for batch in BATCHES:
        body = {"project": "gpu-share", "commit": "%040x" % batch, "build": "gpu-share",
                "matrix": matrix,
                "options": {"device": "gpu", "iterations": 0, "batch": batch,
                            "capture": "sample"}}
        st, j = call(base, "POST", "/v1/jobs", body)
        if st != 201:
            print("POST /v1/jobs -> %d %s" % (st, j))
            return 1
        jobs[batch] = j["id"]
    peak = [0]

    def watch(devices):
        for x in devices:
            peak[0] = max(peak[0], len(x.get("holders") or ([1] if x.get("in_use") else [])))

    done = wait_jobs(base, jobs, t0 + args.timeout, watch)
    wall = time.time() - t0
    cells = [c for j in done.values() for c in j["cells"]]
    states = {}
    for c in cells:
        states[c["state"]] = states.get(c["state"], 0) + 1
        if c["state"] != "ok":
            print("  %s %s %s: %s" % (c["model"], c["pass"], c["state"], c["reason"]))
    out = {"tag": args.tag, "wall_s": wall, "jobs": {str(k): v for k, v in jobs.items()},
           "cells": len(cells), "states": states, "peak_holders": peak[0],
           "complete": len(done) == len(jobs)}
    save(args.outdir, args.tag + ".json", out)
    print(json.dumps(out))
    return 0 if out["complete"] and states.get("ok") == len(MODELS) * 2 * len(BATCHES) else 1


def judge(args):
    serial, parallel = (json.load(open(os.path.join(args.outdir, t + ".json")))
                        for t in args.judge)
    ok = True
    res = {"serial_s": serial["wall_s"], "parallel_s": parallel["wall_s"],
           "speedup": serial["wall_s"] / parallel["wall_s"],
           "peak_holders": [serial["peak_holders"], parallel["peak_holders"]], "pairs": {}}
    for batch in serial["jobs"]:
        st, r = call(args.url, "GET", "/v1/compare?control=%s&head=%s" % (
            serial["jobs"][batch], parallel["jobs"][batch]))
        by = {}
        for c in r.get("cells", []):
            by[c["status"]] = by.get(c["status"], 0) + 1
        res["pairs"][batch] = by
        ok = ok and st == 200 and set(by) == {"identical"}
    res["identical"] = ok
    save(args.outdir, "judged.json", res)
    print(json.dumps(res))
    return 0 if ok else 1


def main():
    args = connect(arguments(900, tag={"default": "share"},
                             judge={"nargs": 2, "metavar": ("SERIAL", "PARALLEL")}))
    return judge(args) if args.judge else run(args)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""A GPU job through a running capd, control against a TF32 head (docs/gpu.md).

Registers two builds on the same interpreter, "gpu-control" and "gpu-tf32"
(the latter with TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 in its environment),
runs MODELS x native x forward,backward with options.device "gpu" on each,
and fetches the comparison (JSON and markdown). Standard library only.

    python3 gpu/verify/capd_job.py --url http://127.0.0.1:8470 --python PY \
        [--data-dir DATA] OUTDIR

The token is $CAPD_TOKEN, else DATA/admin.token (the admin token capd writes
at its first start; DATA defaults to $CAPD_DATA_DIR, else /var/lib/capd).

Exit status 0 when both jobs ran every cell ok and the comparison flags the
TF32 side as diverged.
"""
import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request


TOKEN = ""


def find_token(data_dir):
    if os.environ.get("CAPD_TOKEN"):
        return os.environ["CAPD_TOKEN"]
    try:
        with open(os.path.join(data_dir, "admin.token")) as f:
            return f.read().strip()
    except OSError:
        return ""


def call(base, method, path, body=None, accept="application/json"):
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json", "Accept": accept}
    if TOKEN:
        headers["Authorization"] = "Bearer " + TOKEN
    req = urllib.request.Request(base + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            raw = r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        raw, status = e.read(), e.code
    if accept == "application/json":
        return status, json.loads(raw.decode() or "null")
    return status, raw.decode()


def arguments(timeout, **extra):
    """The verify scripts' command line: OUTDIR, --url, --python,
    --timeout (default TIMEOUT), --data-dir, and EXTRA's options (name:
    add_argument's keywords)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--url", default="http://127.0.0.1:8470")
    ap.add_argument("--python", required=True, help="the interpreter that has torch")
    ap.add_argument("--timeout", type=int, default=timeout)
    ap.add_argument("--data-dir", default=os.environ.get("CAPD_DATA_DIR", "/var/lib/capd"),
                    help="capd's data dir, whose admin.token is used without $CAPD_TOKEN")
    for name, kw in extra.items():
        ap.add_argument("--" + name.replace("_", "-"), **kw)
    return ap


def connect(ap):
    """The parsed arguments of AP, the token found, OUTDIR made."""
    global TOKEN
    args = ap.parse_args()
    TOKEN = find_token(args.data_dir)
    os.makedirs(args.outdir, exist_ok=True)
    return args


def save(outdir, name, obj):
    with open(os.path.join(outdir, name), "w") as f:
        if isinstance(obj, str):
            f.write(obj)
        else:
            json.dump(obj, f, indent=1)


def wait_jobs(base, jobs, deadline, watch):
    """JOBS (key: job id) polled until each is done or cancelled, or until
    DEADLINE (time.time()); WATCH is handed GET /v1/devices' list at every
    poll. The jobs that ended, by key."""
    done = {}
    while len(done) < len(jobs) and time.time() < deadline:
        st, d = call(base, "GET", "/v1/devices")
        watch(d.get("devices", []))
        for key, jid in jobs.items():
            if key not in done:
                st, j = call(base, "GET", "/v1/jobs/" + jid)
                if j.get("state") in ("done", "cancelled"):
                    done[key] = j
        time.sleep(0.2)
    return done


def main():
    args = connect(arguments(600, models={"default": "mlp,transformer"}))
    base = args.url

    st, dev = call(base, "GET", "/v1/devices")
    save(args.outdir, "devices.json", dev)
    print("GET /v1/devices -> %d: count=%s reason=%s" % (st, dev.get("count"), dev.get("reason")))

    env = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
           "NVSHMEM_DISABLE_NVLS": "1"}
    if os.environ.get("LD_LIBRARY_PATH_FOR_CELLS"):
        env["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH_FOR_CELLS"]
    head_env = dict(env, TORCH_ALLOW_TF32_CUBLAS_OVERRIDE="1")
    for name, e in (("gpu-control", env), ("gpu-tf32", head_env)):
        st, b = call(base, "PUT", "/v1/builds/" + name, {"python": args.python, "env": e})
        print("PUT /v1/builds/%s -> %d" % (name, st))
        if st not in (200, 201):
            print(json.dumps(b))
            return 1

    matrix = {"models": args.models.split(","), "widths": ["native"],
              "passes": ["forward", "backward"]}
    options = {"device": "gpu", "capture": "sample", "iterations": 20, "warmup": 3}
    jobs = {}
    for side, build, commit, control in (("control", "gpu-control", "c0ffee1", None),
                                         ("head", "gpu-tf32", "7f32a11", "c0ffee1")):
        body = {"project": "gpu-verify", "commit": commit, "branch": "tf32", "build": build,
                "matrix": matrix, "options": options}
        if control:
            body["control_commit"] = control
        st, j = call(base, "POST", "/v1/jobs", body)
        print("POST /v1/jobs (%s) -> %d %s" % (side, st, j.get("id") if st == 201 else j))
        if st != 201:
            return 1
        jobs[side] = j["id"]

    # While the control job runs, its GPU cells hold the one device in turn.
    t0 = time.time()
    busy_seen = []

    def watch(devices):
        for x in devices:
            if x.get("in_use") and (not busy_seen or busy_seen[-1] != x.get("cell")):
                busy_seen.append(x.get("cell"))

    done = wait_jobs(base, jobs, t0 + args.timeout, watch)
    ok = len(done) == 2
    for side, j in done.items():
        save(args.outdir, "job-%s.json" % side, j)
        for c in j["cells"]:
            print("%-7s %-11s %-6s %-8s %-8s %6sms %s" % (
                side, c["model"], c["width"], c["pass"], c["state"], c["duration_ms"],
                c["reason"] or ""))
            ok = ok and c["state"] == "ok"
            st, cd = call(base, "GET", "/v1/jobs/%s/cells/%s" % (j["id"], c["id"]))
            save(args.outdir, "cell-%s-%s-%s.json" % (side, c["model"], c["pass"]), cd)
    print("device held by %d successive cells (sampled)" % len(busy_seen))

    q = "/v1/compare?control=%s&head=%s" % (jobs["control"], jobs["head"])
    st, cmp_json = call(base, "GET", q)
    save(args.outdir, "compare.json", cmp_json)
    st2, md = call(base, "GET", q + "&format=md", accept="text/markdown")
    save(args.outdir, "compare.md", md)
    print("GET %s -> %d verdict=%s" % (q, st, cmp_json.get("verdict")))
    for c in cmp_json.get("cells", []):
        fd = c.get("first_divergence") or {}
        fi = c.get("first_introduced") or {}
        print("  %-11s %-8s %-17s device=%s/%s first_divergence=%s first_introduced=%s "
              "diverged=%s/%s perf=%s" % (
                  c["model"], c["pass"], c["status"], c.get("control_device"),
                  c.get("head_device"), fd.get("key"), fi.get("key"),
                  c.get("tensors_diverged"), c.get("tensors_compared"),
                  (c.get("perf") or {}).get("verdict")))
    print(md)
    # The control against itself must be identical: the same build twice.
    st, self_cmp = call(base, "GET", "/v1/compare?control=%s&head=%s" % (jobs["control"],
                                                                           jobs["control"]))
    print("control vs itself: verdict=%s" % self_cmp.get("verdict"))
    ok = ok and cmp_json.get("verdict") == "regression"
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

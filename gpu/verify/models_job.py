#!/usr/bin/env python3
"""Third-party model code through a running capd under its default limits,
twice, and the A/A comparison (issue "Real builds"; docs/gpu.md).

Registers one build with examples/models in its model_roots, runs every
model of MODELS (examples/models factories; the timm and transformers ones
only where the interpreter has those libraries) at each CPU width the host
runs and on the GPU, forward and backward, as a control job and a head job
of the same build, then compares them. Standard library only.

    python3 gpu/verify/models_job.py --python PY --model-root DIR [--url URL]
        [--data-dir DATA] OUTDIR

Prints every cell (state, peak resident memory, CPU time, reason), the
host's memory-limit mechanism, and the comparison's counts. Exit status 0
when every cell of both jobs is ok and the A/A comparison has only
identical or nondeterministic cells and no outcome change.
"""
import json
import os
import subprocess
import sys
import time

import capd_job
from capd_job import call, save

BASE = ["capd_examples.vision:squeezenet1_1", "capd_examples.vision:shufflenet_v2_x0_5",
        "capd_examples.vision:mnasnet0_5", "capd_examples.audio:conv_tasnet",
        "capd_examples.audio:deepspeech", "capd_examples.audio:conformer"]
HUB = {"timm": ["capd_examples.hub:timm_resnet10t", "capd_examples.hub:timm_vit_micro"],
       "transformers": ["capd_examples.hub:bert_encoder"]}


def has_module(python, name):
    return subprocess.run([python, "-c", "import " + name], capture_output=True).returncode == 0


def wait(base, ids, timeout):
    t0, done = time.time(), {}
    while len(done) < len(ids) and time.time() - t0 < timeout:
        for jid in ids:
            if jid not in done:
                st, j = call(base, "GET", "/v1/jobs/" + jid)
                if j.get("state") in ("done", "cancelled"):
                    done[jid] = j
        time.sleep(1)
    return done


def submit(base, build, commit, control, matrix, options):
    body = {"project": "models-verify", "commit": commit, "build": build, "matrix": matrix,
            "options": options}
    if control:
        body["control_commit"] = control
    st, j = call(base, "POST", "/v1/jobs", body)
    print("POST /v1/jobs %s %s -> %d %s" % (commit, options.get("device", "cpu"), st,
                                            j.get("id") if st == 201 else j))
    return j["id"] if st == 201 else None


def report_cells(base, outdir, side, job):
    ok = True
    for c in job["cells"]:
        st, cd = call(base, "GET", "/v1/jobs/%s/cells/%s" % (job["id"], c["id"]))
        rss = (cd.get("peak_rss_bytes") or 0) / 1048576.0
        print("%-5s %-40s %-7s %-8s %-8s rss %7.1f MiB cpu %6s ms limit %s %s" % (
            side, c["model"], c["width"], c["pass"], c["state"], rss, cd.get("cpu_time_ms"),
            cd.get("memory_limit_bytes"), c.get("reason") or ""))
        ok = ok and c["state"] == "ok"
    save(outdir, "job-%s-%s.json" % (side.replace("/", "-"), job["id"]), job)
    return ok


def main():
    args = capd_job.connect(capd_job.arguments(
        400, model_root={"required": True, "help": "examples/models, absolute"},
        widths={"default": "default,avx2,avx512"}))
    base = args.url
    st, host = call(base, "GET", "/v1/host")
    save(args.outdir, "host.json", host)
    print("memory limits: %s" % json.dumps(host.get("memory")))

    models = list(BASE)
    for lib, names in HUB.items():
        if has_module(args.python, lib):
            models += names
        else:
            print("no %s in %s: its models left out" % (lib, args.python))
    env = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
           "NVSHMEM_DISABLE_NVLS": "1"}
    if os.environ.get("LD_LIBRARY_PATH_FOR_CELLS"):
        env["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH_FOR_CELLS"]
    st, b = call(base, "PUT", "/v1/builds/models", {"python": args.python, "env": env,
                                                     "model_roots": [args.model_root]})
    print("PUT /v1/builds/models -> %d" % st)
    if st not in (200, 201):
        print(json.dumps(b))
        return 1
    # Few timing processes: this checks outcomes and numerics, not speed.
    timing = {"iterations": 3, "warmup": 1, "timing_processes": 2, "timing_pairs": 2,
              "max_timing_rounds": 1}
    runs = [("cpu", {"models": models, "widths": args.widths.split(","),
                     "passes": ["forward", "backward"]}, dict(timing)),
            ("gpu", {"models": models, "widths": ["native"], "passes": ["forward", "backward"]},
             dict(timing, device="gpu"))]
    st, devs = call(base, "GET", "/v1/devices")
    if not devs.get("count"):
        print("no GPU (%s): GPU cells left out" % devs.get("reason"))
        runs = runs[:1]
    ids = {}
    for n, (dev, matrix, options) in enumerate(runs):
        # Compared by job id: no control_commit, so the head is unpaired.
        c = submit(base, "models", "a11ce0%d" % n, None, matrix, options)
        h = submit(base, "models", "b0b000%d" % n, None, matrix, options)
        if not c or not h:
            return 1
        ids[dev] = (c, h)
    done = wait(base, [j for pair in ids.values() for j in pair], args.timeout)
    ok = len(done) == 2 * len(runs)
    for dev, (c, h) in ids.items():
        for side, jid in (("ctl", c), ("head", h)):
            if jid in done:
                ok = report_cells(base, args.outdir, side + "/" + dev, done[jid]) and ok
            else:
                print("%s %s job %s did not finish in %d s" % (dev, side, jid, args.timeout))
        st, cmp_json = call(base, "GET", "/v1/compare?control=%s&head=%s" % (c, h))
        save(args.outdir, "compare-%s.json" % dev, cmp_json)
        counts = cmp_json.get("counts") or {}
        print("%s A/A: verdict %s counts %s" % (dev, cmp_json.get("verdict"),
                                                json.dumps(counts, sort_keys=True)))
        same = counts.get("identical", 0) + counts.get("nondeterministic", 0)
        ok = ok and same == len(cmp_json.get("cells", [])) and same > 0
    print("result: %s" % ("ok" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

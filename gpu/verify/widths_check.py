#!/usr/bin/env python3
"""What each width of capd's width table runs on this host, without capd
(docs/widths.md, "Reading back what ran").

For every width of schema/widths.json this CPU offers (its "requires" among
the /proc/cpuinfo flags), starts the interpreter in a fresh process with
the width's variables, as capd starts a cell, and prints per width: the
ATen capability read back, what capd_runner/libs.py reads of the BLAS
(library, branch or core, level) and of oneDNN, whether a library ran past
the width's ceiling, and a digest of float32 matrix products that reduce
over 320 values drawn outside torch (equal inputs at every width), so that
two widths whose GEMM kernels differ show different digests.

    python3 gpu/verify/widths_check.py [--python PATH] [--json OUT]

Exit status 0 when every width read back its ATen capability and no
library ran past its ceiling; 1 otherwise.
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Runs in the child: one width, read back, one digest.
CHILD = r"""
import hashlib, json, os, sys
import torch
from capd_runner import libs, width
cfg = torch.__config__.show()
eff = width.effective(torch, cfg)
lib = libs.read(torch, cfg)
wider = libs.ceiling(lib, os.environ.get("CHECK_ISA") or None)
g = torch.Generator().manual_seed(7)
ints = torch.randint(0, 1 << 24, (2, 64, 320), generator=g, dtype=torch.int64)
x = ((ints.to(torch.float64) + 0.5) / float(1 << 24) - 0.5).to(torch.float32)
y = torch.nn.functional.linear(x[0], x[1])
print(json.dumps({"effective": eff, "libraries": lib, "wider": wider,
                  "gemm": hashlib.sha256(y.numpy().tobytes()).hexdigest()[:16]}))
"""


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features", "features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def probe(python, row):
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LD_LIBRARY_PATH")}
    env.update(row["env"])
    env.update({"PYTHONPATH": os.path.join(ROOT, "runner"), "OMP_NUM_THREADS": "1",
                "CAPD_WIDTH": row["name"], "CHECK_ISA": row.get("isa") or ""})
    p = subprocess.run([python, "-c", CHILD], env=env, capture_output=True, text=True,
                       timeout=300)
    if p.returncode != 0:
        return {"error": (p.stderr or p.stdout).strip().splitlines()[-1:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def line(row, r):
    if "error" in r:
        return "%-8s error: %s" % (row["name"], r["error"])
    blas, dnn = r["libraries"].get("blas", {}), r["libraries"].get("onednn", {})
    ok = r["effective"] == (row.get("effective") or r["effective"]) and not r["wider"]
    return ("%-8s %-4s aten %-8s blas %s %s/%s  onednn %s  gemm %s%s"
            % (row["name"], "ok" if ok else "BAD", r["effective"], blas.get("library"),
               blas.get("branch"), blas.get("isa"), dnn.get("isa"), r["gemm"],
               "" if not r["wider"] else "  wider: %s" % r["wider"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--json")
    a = ap.parse_args()
    with open(os.path.join(ROOT, "schema", "widths.json")) as f:
        rows = json.load(f)["widths"]
    flags, arch = cpu_flags(), os.uname().machine
    out, bad = {}, 0
    for row in rows:
        if row["arch"] not in ("any", arch) or not set(row["requires"]) <= flags:
            continue
        if row["name"] == "native":
            continue
        r = out[row["name"]] = probe(a.python, row)
        print(line(row, r), flush=True)
        bad += "error" in r or r["effective"] != row.get("effective") or bool(r["wider"])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

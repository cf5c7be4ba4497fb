#!/usr/bin/env python3
"""The runner's GPU path on a real GPU, without capd (docs/gpu.md).

Runs `python -m capd_runner` cells the way capd starts them (fd 3 a pipe,
a clean environment with the device visibility variables a GPU cell gets),
reads every frame strictly with runner/tests/framereader.py, and prints a
summary per cell: status, device fingerprint, records, timing, device peak.

Then the TF32 check: the same cells again with
TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 (cuBLAS may then use TF32 for float32
matrix products). For each (model, pass) it reports the first record whose
hash differs and the module types that differ, which should be the matrix
products and what follows them, and nothing before.

    python3 gpu/verify/runner_check.py OUTDIR [--models mlp,transformer]

Writes OUTDIR/runner_summary.json and OUTDIR/frames-<model>-<pass>-<side>.bin
(the raw frames, for replaying into the comparison engine). Exit status 0
when every control cell ended ok on a CUDA device.
"""
import argparse
import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "runner"))

from tests.framereader import make_spec, run_runner  # noqa: E402

# What capd puts in a GPU cell's environment (daemon/host/devices.c), plus what
# this host needs to find its driver and what the H200 machines ask for.
CELL_ENV = {
    "CUDA_VISIBLE_DEVICES": "0", "HIP_VISIBLE_DEVICES": "0", "ROCR_VISIBLE_DEVICES": "0",
    "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "OMP_NUM_THREADS": "1",
    "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
}
if os.environ.get("LD_LIBRARY_PATH"):
    CELL_ENV["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH"]
TF32 = {"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1"}


def encode(frames):
    out = bytearray()
    for f in frames:
        out += json.dumps(f.header, separators=(",", ":")).encode() + b"\n" + f.payload
    return bytes(out)


def module_types(model_name):
    """fqn -> class name, from the runner's own zoo (the root is 'model')."""
    import torch  # noqa: F401
    from capd_runner import zoo
    model, _ = zoo.build(model_name, 0, 2)
    types = {"model": type(model).__name__}
    for name, m in model.named_modules():
        if name:
            types[name] = type(m).__name__
    return types


def summarize(res):
    env = res.kinds("env")
    fp = env[0]["fingerprint"] if env else {}
    timing = res.kinds("timing")
    mem = res.kinds("memory")
    samples = timing[0]["samples_ns"] if timing else []
    nondet = sum(len(f["keys"]) for f in res.kinds("nondeterministic"))
    return {
        "status": res.status, "reason": res.end.get("reason") if res.end else None,
        "returncode": res.returncode,
        "device": fp.get("device"), "torch": (fp.get("torch") or {}).get("version"),
        "torch_cuda": (fp.get("torch") or {}).get("cuda"),
        "effective_width": env[0]["effective_width"] if env else None,
        "fingerprint_env": fp.get("env"),
        "tensors": len(res.tensors), "nondeterministic_keys": nondet,
        "timing_samples": len(samples),
        "timing_median_us": round(statistics.median(samples) / 1000.0, 1) if samples else None,
        "device_peak_bytes": mem[0].get("device_peak_bytes") if mem else None,
        "peak_rss_bytes": mem[0].get("peak_rss_bytes") if mem else None,
    }


def first_divergence(ctl, head, types):
    """Walks the control's records in order; reports the first key whose
    hash differs in the head, and which module types differ at all."""
    h = {f["key"]: f for f in head.tensors}
    first, identical_before, differing = None, 0, {}
    for f in ctl.tensors:
        g = h.get(f["key"])
        same = g is not None and g["hash"] == f["hash"]
        if not same:
            t = types.get(f["module"], "?")
            differing.setdefault(t, 0)
            differing[t] += 1
            if first is None:
                first = {"key": f["key"], "module_type": t}
                if g is not None and f["capture"] == "sample" and f["dtype"] == "float32":
                    import struct
                    a = struct.unpack("<%df" % (len(f.payload) // 4), f.payload)
                    b = struct.unpack("<%df" % (len(g.payload) // 4), g.payload)
                    d = [abs(x - y) for x, y in zip(a, b)]
                    first["max_abs_diff_sample"] = max(d) if d else 0.0
                    first["max_rel_diff_sample"] = max(
                        (abs(x - y) / max(abs(x), 2.22e-16) for x, y in zip(a, b)), default=0.0)
        elif first is None:
            identical_before += 1
    return {"first_divergence": first, "identical_records_before_it": identical_before,
            "records": len(ctl.tensors), "differing_records_by_module_type": differing}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--models", default="mlp,transformer")
    ap.add_argument("--passes", default="forward,backward")
    ap.add_argument("--device", default="gpu", help="cpu: a dry run of this script")
    args = ap.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    out = {"cells": [], "tf32": []}
    ok = True
    for model in args.models.split(","):
        types = module_types(model)
        for pass_ in args.passes.split(","):
            spec = make_spec(model=model, width="native", pass_=pass_, device=args.device,
                             capture="sample", iterations=20, warmup=3)
            res = {}
            for side, extra in (("control", {}), ("tf32", TF32)):
                env = dict(CELL_ENV)
                env.update(extra)
                r = run_runner(spec, env=env, python=sys.executable, timeout=300)
                res[side] = r
                s = summarize(r)
                s.update({"model": model, "pass": pass_, "side": side})
                out["cells"].append(s)
                with open(os.path.join(args.outdir, "frames-%s-%s-%s.bin" % (model, pass_, side)),
                          "wb") as f:
                    f.write(encode(r.frames or []))
                dev = s["device"] or {}
                print("%-11s %-8s %-7s status=%s device=%s/%s tensors=%d nondet=%d "
                      "timing_median=%sus n=%d device_peak=%s" % (
                          model, pass_, side, s["status"], dev.get("type"), dev.get("name"),
                          s["tensors"], s["nondeterministic_keys"], s["timing_median_us"],
                          s["timing_samples"], s["device_peak_bytes"]), flush=True)
                if side == "control" and (s["status"] != "ok" or
                                          (args.device == "gpu" and dev.get("type") != "cuda")):
                    ok = False
                    print(r.describe(), flush=True)
            d = first_divergence(res["control"], res["tf32"], types)
            d.update({"model": model, "pass": pass_})
            out["tf32"].append(d)
            print("  tf32 vs control: first divergence %s after %d identical records; "
                  "differing by module type %s" % (
                      json.dumps(d["first_divergence"]), d["identical_records_before_it"],
                      json.dumps(d["differing_records_by_module_type"])), flush=True)
    with open(os.path.join(args.outdir, "runner_summary.json"), "w") as f:
        json.dump(out, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

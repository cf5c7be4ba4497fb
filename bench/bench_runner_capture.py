#!/usr/bin/env python3
"""Cost of capd_runner's capture hooks on a forward pass.

Builds resnet18 from the runner's zoo (cnn when torchvision is missing) and
times, interleaved in the same process, a hook-free eval forward and capture
forwards (hooks computing stats + the record hash, XXH3-128 on the native
pipe and BLAKE2b-128 on the Python path, for every module's inputs and
outputs, frames encoded and written to /dev/null) at capture levels ``stats``
and ``sample``, plus the hash-only run used for the determinism check, and
``stats`` with the native analysis on the pipe's threads instead of in the
hooks (``stats_threaded``, CAPD_RUNNER_NATIVE_INLINE=0: a snapshot copy per
tensor and a hand-off), and ``stats`` through the Python analysis workers (the path without the native
library), and ``stats`` with the analysis done inline in the hooks
(CAPD_RUNNER_SYNC=1), and ``op_stats``: stats at granularity op (one record
per ATen op inside each module call too, capd_runner/opcapture.py). The capture levels use the native capture pipe when
CAPD_RUNNER_NATIVE names the library (bench/run sets it), as a CPU cell does.
Prints the median of each and its ratio to the plain forward. Targets:
stats capture <= 1.15x a plain forward, op_stats <= 2x.

Run with the interpreter that has torch, e.g.:
    /usr/bin/python3 bench/bench_runner_capture.py [--model resnet18] [--iters 20]
"""

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "runner"))

import torch  # noqa: E402

from capd_runner import native, zoo  # noqa: E402
from capd_runner.capture import Capture, PayloadBudget, Recorder  # noqa: E402
from capd_runner.frames import FrameWriter  # noqa: E402
from capd_runner.pipeline import Pipeline, default_native_threads, default_workers  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="zoo model (default resnet18, else cnn)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--workers", type=int, default=None,
                    help="analysis worker threads (default: the runner's, one per spare core, <= 2)")
    ap.add_argument("--switch-interval", type=float, default=None,
                    help="sys.setswitchinterval() value in seconds (experiments)")
    ap.add_argument("--stats-in-hook", action="store_true",
                    help="compute CPU stats in the hooks, only hashes in the workers (experiments)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()

    name = args.model
    if name is None:
        try:
            import torchvision  # noqa: F401
            name = "resnet18"
        except Exception:
            name = "cnn"
    torch.set_num_threads(args.threads)
    model, inputs = zoo.build(name, 0, args.batch)
    model.eval()
    devnull = os.open(os.devnull, os.O_WRONLY)
    writer = FrameWriter(devnull)
    nworkers = args.workers or default_workers(args.threads)
    # "async" is what a CPU cell runs: the native pipe when the library is
    # there (CAPD_RUNNER_NATIVE), else the Python workers; "python" is the
    # Python workers alone, for reference.
    pipelines = {"async": Pipeline(writer, sync=False, workers=nworkers, native=True,
                                   native_threads=default_native_threads(args.threads)),
                 "threaded": Pipeline(writer, sync=False, workers=nworkers, native=True,
                                      native_threads=default_native_threads(args.threads)),
                 "python": Pipeline(writer, sync=False, workers=nworkers),
                 "sync": Pipeline(writer, sync=True)}
    workers = len(pipelines["async"]._threads)
    pipelines["async"].stats_in_hook = args.stats_in_hook
    pipelines["threaded"].native_inline = False
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)

    def plain():
        with torch.no_grad():
            model(*inputs)

    def capture(level, emit=True, mode="async", granularity="module"):
        pipeline = pipelines[mode]

        def run():
            rec = Recorder(writer, pipeline, level, 256, PayloadBudget(1 << 62), emit=emit)
            with torch.no_grad():
                with Capture(model, rec, granularity=granularity):
                    model(*inputs)
            rec.sync()
            writer.flush()
            rec.clear_cache()
            run.records = len(rec.order)
        return run

    variants = [("plain", plain), ("stats", capture("stats")), ("sample", capture("sample")),
                ("hash_only", capture("stats", emit=False)),
                ("stats_threaded", capture("stats", mode="threaded")),
                ("stats_python", capture("stats", mode="python")),
                ("stats_sync", capture("stats", mode="sync")),
                ("op_stats", capture("stats", granularity="op"))]
    times = dict((k, []) for k, _ in variants)
    for i in range(args.warmup + args.iters):
        for k, fn in variants:
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            if i >= args.warmup:
                times[k].append(dt)
    med = dict((k, statistics.median(v)) for k, v in times.items())
    result = {
        "model": name, "batch": args.batch, "threads": args.threads, "iters": args.iters,
        "torch": torch.__version__, "workers": workers,
        "stats_engine": native.describe(),
        "native_pipe": pipelines["async"]._pipe is not None,
        "fastrec": native.fastrec() is not None,
        "native_threads": default_native_threads(args.threads),
        "records_per_capture": variants[1][1].records,
        "median_ms": dict((k, round(v * 1e3, 3)) for k, v in med.items()),
        "ratio_to_plain": dict((k, round(med[k] / med["plain"], 3)) for k in med if k != "plain"),
    }
    for p in pipelines.values():
        p.stop()
    if args.json:
        print(json.dumps(result))
    else:
        print("model %s  batch %d  threads %d  analysis workers %d  torch %s  (%d records per "
              "capture, %d iterations)" % (name, args.batch, args.threads, workers,
                                           torch.__version__, result["records_per_capture"],
                                           args.iters))
        print("  stats/sample/hash_only: %s" % (
            "native capture pipe, %d analysis threads, hooks in %s" % (
                result["native_threads"], "C (capd_fastrec)" if result["fastrec"] else "Python")
            if result["native_pipe"] else "Python workers (%s)" % result["stats_engine"]))
        for k in med:
            extra = "" if k == "plain" else "   ratio %.2fx" % result["ratio_to_plain"][k]
            print("  %-10s median %8.2f ms%s" % (k, med[k] * 1e3, extra))
        for k, lim in (("stats", 1.15), ("op_stats", 2.0)):
            print("  target: %s <= %.2fx  -> %s" % (
                k, lim, "met" if result["ratio_to_plain"][k] <= lim else "NOT met"))


if __name__ == "__main__":
    main()

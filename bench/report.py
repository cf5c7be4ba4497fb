#!/usr/bin/env python3
"""Writes docs/performance.md from the raw results bench/run collected.

    bench/report.py --results DIR [--out docs/performance.md]

DIR holds meta.json, meta_after.json, cells.txt (bench_cells), compare.txt
(bench_compare), runner.json (bench_runner_capture.py --json), e2e.json
(bench_e2e.py) and compare_scale.json (bench_compare_scale.py). Every figure is a ratio against a reference measured in the
same run; the raw outputs are appended so nothing is lost in the parsing.
"""

import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "runner"))
from capd_runner.cpuinfo import first_processor  # noqa: E402


def read(path, default=None):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return default


def read_json(path):
    text = read(path)
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        # bench_runner_capture prints only its JSON line with --json, but be
        # lenient about anything before it.
        for line in reversed(text.splitlines()):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def num(pattern, text, cast=float):
    m = re.search(pattern, text or "")
    return cast(m.group(1)) if m else None


def f(v, fmt="%.2f"):
    return "n/a" if v is None else fmt % v


def cpu_model():
    return first_processor().get("model name", "?")


def verdict(ok):
    return "n/a" if ok is None else ("met" if ok else "**not met**")


def section(w, title, results, skipped=None):
    """A section's heading; False, having said so, when it was not run
    (SKIPPED: why, when it was skipped)."""
    w("## " + title)
    w("")
    if skipped:
        w("Skipped: %s" % skipped.strip())
        w("")
        return False
    if not results:
        w("Not run.")
        w("")
    return bool(results)


def axes(results, *names):
    """The lists NAMES of RESULTS' matrix, each as its items joined by commas."""
    mx = results.get("matrix") or {}
    return tuple(",".join(mx.get(n) or []) for n in names)


def figures(w, intro):
    """A section's paragraph INTRO and the head of its table of figures."""
    w(intro)
    w("")
    w("| figure | what it measures | value | reference (same run) | target |")
    w("| --- | --- | --- | --- | --- |")


def load_and_reproduce(w, results, command, quick):
    """A section's last line: the load around its run, and the COMMAND that
    runs it again (with --quick when this run was quick)."""
    w("Load: before `%s`, after `%s`. Reproduce: `/usr/bin/python3 %s%s`."
      % (results.get("load_before"), results.get("load_after"), command,
         " --quick" if quick else ""))
    w("")


def perf_verdicts(w, pv, quick):
    """The perf-verdict section: A/A false alarms, power, cost of pairing."""
    if not section(w, "Perf verdicts a CI can gate on (`bench_perf_verdicts.py`)", pv):
        return
    figures(w, "Matrix: `%s` × `%s` × `%s` (%s cells), capd's defaults (no perf options, "
           "builds as registered, `max_parallel` and CPU placement as configured by default). "
           "Paired: the head job names the control's commit, so its cells time the control "
           "build's processes interleaved with their own; unpaired: a head naming no control, "
           "compared by job id. Power heads: a sitecustomize makes the root module of mlp and "
           "transformer (the model itself) take that fraction of the call's own measured time "
           "longer after each forward and each backward() of such a model, by spinning (`cpu`), "
           "sleeping (`sleep`) or waiting for a lock another thread holds (`lock`); cnn is left "
           "alone (false alarms there count as such)."
           % (*axes(pv, "models", "widths", "passes"), pv.get("cells")))
    for design in ("paired", "unpaired"):
        aa = pv.get("aa_" + design) or {}
        n = aa.get("cell_verdicts") or 0
        al = aa.get("alarms")
        same = aa.get("same_share")
        w("| A/A %s | cells `regression` or `improvement` when the head is the control's "
          "build, over %s comparisons; the share judged `same` | **%s of %s** alarms; "
          "**%s** `same` (%s) | — | 0 alarms, ≥ 90%% `same` on a quiet host (%s) |"
          % (design, pv.get("aa_comparisons"), al, n,
             "%.0f%%" % (100 * same) if same is not None else "?",
             json.dumps(aa.get("verdicts"), sort_keys=True),
             verdict(al == 0 and same >= 0.9 if al is not None and same is not None
                     and n >= 120 else None)
             if not quick else "n/a: --quick runs 2 comparisons"))
    want = {0.10: 0.95, 0.25: 1.0}
    for k, pw in sorted((pv.get("power") or {}).items()):
        tot = pw.get("affected_cells") or 0
        reg = pw.get("detected") or 0
        other = pw.get("other_alarms")
        need = want.get(pw.get("fraction"), 1.0)
        ok = tot > 0 and reg / tot >= need and other == 0
        w("| power, %s slower | affected cells `regression`; alarms in the other "
          "cells | **%d of %d** (%s); **%s of %s** elsewhere | the same cells' A/A "
          "verdicts above | ≥ %d%%, 0 elsewhere (%s) |"
          % (k, reg, tot, json.dumps(pw.get("affected_verdicts"), sort_keys=True), other,
             pw.get("other_cells"), int(need * 100), verdict(ok)))
    pw_all = (pv.get("power") or {}).values()
    det = sum(p.get("detected") or 0 for p in pw_all)
    if any("named" in p for p in pw_all):
        w("| which op got slower | of the detected power cells, those whose profiled pair "
          "(run when the pairs say regression) names first the time outside the modules, "
          "where the slowdown was added (docs/compare.md, \"Which op got slower\") | **%d of "
          "%d** (%d profiled) | — | all |"
          % (sum(p.get("named") or 0 for p in pw_all), det,
             sum(p.get("profiled") or 0 for p in pw_all)))
    c = pv.get("cost") or {}
    paired = c.get("head_job_s_paired") or []
    twins = c.get("head_job_s_unpaired") or []
    twins = twins if isinstance(twins, list) else [twins]
    w("| cost of pairing | wall time of a paired head job | %s s (mean of %d) | the same job "
      "unpaired, run right after each: %s s (mean of %d) | ≤ 1.5× (**%s×**, %s) |"
      % (f(sum(paired) / len(paired), "%.1f") if paired else "?", len(paired),
         f(sum(twins) / len(twins), "%.1f") if twins else "?", len(twins), f(c.get("ratio")),
         verdict(c.get("ratio") <= 1.5 if c.get("ratio") is not None else None)))
    w("")
    if pv.get("complete") is False:
        w("")
        w("**Incomplete**: the benchmark was stopped before its end; the figures are those "
          "measured until then.")
    load_and_reproduce(w, pv, "bench/bench_perf_verdicts.py --capd build-bench/capd", quick)


def remote_section(w, r, quick):
    """Remote attempts and the Slurm executor against local cells."""
    if not section(w, "Remote attempts and the Slurm executor (`bench_remote.py`)", r):
        return
    figures(w, "Three capds on this host with the fake runner's build, `max_parallel` 4: `local` "
           "(cells are capd's children), `remote` (`remote_launch` execs `capd-cell`, which "
           "streams back over HTTP), `slurm` (each attempt a task of an `sbatch` array on a "
           "one-node Slurm, tests/slurm/cluster.sh, running `capd-cell`). Per-cell time: %s "
           "one-cell `fake:ok` jobs each, interleaved job by job, POST to done. Batch: one job of "
           "%s `fake:ok` cells each, POST to done, over the cells. Ingest: one `fake:payload` cell "
           "of %s MiB of 1 MiB full payloads each, stored bytes over the cell's duration."
           % (r.get("cells"), r.get("cells"), r.get("mib")))
    pc = r.get("per_cell_s") or {}
    w("| remote per cell | a one-cell job through capd-cell | %s s | local: %s s | — (**%s×**) |"
      % (f(pc.get("remote"), "%.3f"), f(pc.get("local"), "%.3f"), f(r.get("remote_over_local"))))
    if "slurm" in pc:
        w("| Slurm per cell | a one-cell job as an sbatch job | %s s (**%s×**) | local: %s s | "
          "≤ 1.2× local + 1 s (%s s over 1.2× local: %s) |"
          % (f(pc.get("slurm"), "%.3f"), f(r.get("slurm_over_local")), f(pc.get("local"), "%.3f"),
             f(r.get("slurm_excess_s"), "%.2f"), verdict(r.get("slurm_target_met"))))
        b = r.get("batch_per_cell_s") or {}
        w("| Slurm batch, per cell | one job of %s cells, the cells started together one sbatch "
          "array | %s s (**%s×**) | local: %s s | — (%s s over 1.2× local) |"
          % (r.get("cells"), f(b.get("slurm"), "%.3f"), f(r.get("batch_slurm_over_local")),
             f(b.get("local"), "%.3f"), f(r.get("batch_slurm_excess_s"), "%.2f")))
    else:
        w("| Slurm per cell | — | skipped: %s | — | ≤ 1.2× local + 1 s (n/a) |"
          % r.get("slurm_skipped"))
    ing = r.get("ingest_mib_s") or {}
    w("| remote ingest | MiB/s of a payload cell through capd-cell | %s MiB/s | local: %s MiB/s "
      "| ≥ 0.5× (**%s×**, %s) |"
      % (f(ing.get("remote"), "%.0f"), f(ing.get("local"), "%.0f"),
         f(r.get("remote_ingest_over_local")), verdict(r.get("ingest_target_met"))))
    w("")
    load_and_reproduce(w, r, "bench/bench_remote.py --capd build-bench/capd --capd-cell "
                       "build-bench/capd-cell --fake-runner build-bench/tests/fake_runner", quick)


def compile_section(w, c, skipped, quick):
    """The cost of a compiled cell against the eager cell of the same job."""
    if not section(w, "Compiled cells (`bench_compile.py`)", c, skipped):
        return
    figures(w, "One job on the official build (%s), capd's defaults (no options): `%s` × `%s` × "
            "`%s` × modes `%s`. Each compiled cell against the eager cell of the same model, "
            "width and pass, geometric means over the cells: **cell wall** (the cell's duration: "
            "interpreter, capture runs, compile, timing processes), "
            "**compile** (the runner's cold compile in the capture process, its `compile_s` "
            "note, over the eager cell's duration), **capture** (the cell's duration less that "
            "compile, over the eager cell's: capture runs and timing processes, each of which "
            "compiles again from the warm cache), **steady state** (the median of the timing "
            "processes' medians: the compiled code's speed, below 1 is faster). The mode "
            "self-check of the same job said `%s` (reference %s). The job took %s s."
            % (c.get("python"), *axes(c, "models", "widths", "passes", "modes"),
               (c.get("mode_check") or {}).get("verdict"),
               (c.get("mode_check") or {}).get("reference") or "none: the tolerance rule",
               f(c.get("job_s"), "%.0f")))
    for mode, m in sorted((c.get("means") or {}).items()):
        for key, what in (("cell_wall", "cell duration"), ("compile", "cold compile"),
                          ("capture", "duration less the compile"),
                          ("steady_state", "timing median")):
            w("| %s %s | %s, %s cells | **%s×** | the eager cells' %s | — |"
              % (mode, key.replace("_", " "), what, m.get("cells"), f(m.get(key)),
                 "duration" if key != "steady_state" else "timing median"))
    w("")
    load_and_reproduce(w, c, "bench/bench_compile.py --capd build-bench/capd --python "
                       "/var/cache/capd/official-torch/bin/python", quick)


def by_hand(w):
    """bench/by-hand.md, the figures measured outside bench/run, as they are."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "by-hand.md")
    text = read(path, "")
    body = re.sub(r"<!--.*?-->", "", text, flags=re.S).strip()
    if not body:
        return
    w("## Measured by hand (outside `bench/run`)")
    w("")
    w("Copied from `bench/by-hand.md`: each with its date, commit, load and how it was run.")
    w("")
    w(body)
    w("")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", required=True)
    ap.add_argument("--out", default="docs/performance.md")
    args = ap.parse_args()
    d = args.results
    meta = read_json(os.path.join(d, "meta.json")) or {}
    after = read_json(os.path.join(d, "meta_after.json")) or {}
    cells = read(os.path.join(d, "cells.txt"), "")
    compare = read(os.path.join(d, "compare.txt"), "")
    runner = read_json(os.path.join(d, "runner.json")) or {}
    e2e = read_json(os.path.join(d, "e2e.json")) or {}
    scale = read_json(os.path.join(d, "compare_scale.json")) or {}
    pv = read_json(os.path.join(d, "perf_verdicts.json")) or {}
    rm = read_json(os.path.join(d, "remote.json")) or {}
    quick = "--quick" in meta.get("command", "")
    cmd = meta.get("command", "bench/run")

    out = []
    w = out.append
    w("# Performance")
    w("")
    w("Generated by `%s` (%s, %d s); do not edit by hand, run `bench/run` again. "
      "Every figure is a ratio against a reference measured side by side in the same run, "
      "never against an old number. The benchmarks run on any x86 host: the real-torch job "
      "uses the widths `GET /v1/widths` says this host runs (named below), the fake-runner "
      "benchmarks use widths every AVX2 host runs (`default,avx2,native`)."
      % (cmd, meta.get("started", "?"), after.get("seconds", 0)))
    w("")
    w("## Machine")
    w("")
    w("| | |")
    w("| --- | --- |")
    w("| CPU | %s, %d logical CPUs (`nproc`), %s |" % (
        cpu_model(), os.cpu_count() or 0, (e2e.get("machine_before") or {}).get("machine", "?")))
    w("| kernel | %s |" % meta.get("kernel", "?"))
    w("| cells' interpreter | %s (`/usr/bin/python3`, Debian's `python3-torch`) |"
      % meta.get("python", "?"))
    w("| capd | commit %s%s, Release build (`-O3`), `max_parallel` 1 |" % (
        meta.get("commit", "?"), " + uncommitted changes" if meta.get("dirty") else ""))
    w("| load before | `%s` |" % meta.get("uptime_before", "?"))
    w("| load after | `%s` |" % after.get("uptime_after", "?"))
    w("")
    w("The machine is shared: a load average above the CPU count means other work ran "
      "beside the benchmarks, which stretches both sides of each ratio but not always "
      "equally. Side-by-side ratios and interleaved repetitions are what keeps the "
      "figures meaningful; re-run on an idle machine for clean ones.")
    w("")

    # ---- headline ----
    w("## Headline: the 24-cell matrix, from POST to a finished comparison")
    w("")
    if e2e:
        n = e2e.get("repeats", 1)
        loop = e2e.get("loop_s") or []
        capd = e2e.get("capd_s") or []
        warm = e2e.get("prefork_warm_s") or []
        eq = e2e.get("equivalence") or {}
        r1 = e2e.get("capd_over_loop")
        r2 = e2e.get("loop_over_prefork_warm")
        r3 = e2e.get("loop_over_prefork_first_use")
        num_ = e2e.get("numerics")
        mx = e2e.get("matrix") or {}
        ncells = e2e.get("cells") or 24
        w("Job: `%s` × `%s` × `%s` "
          "(%d cells: the widths this host runs), options `%s`, Debian's torch. **Reference**: "
          "a `/bin/sh` loop running the same %d `python3 -m capd_runner` invocations one after "
          "another (the same width variables as `schema/widths.json`, the same cell spec files, "
          "fd 3 to `/dev/null`, capd's allow-listed variables). The loops sandwich the capd "
          "runs (loop, capd, prefork, loop, ...); each capd run is compared with the mean of "
          "the two loops around it, which cancels a load that drifts during the run; %d "
          "repetition%s, medians of the ratios. Waiting is done as a CI client would, with "
          "the job long-poll, so the client puts no polling load on capd."
          % (",".join(mx.get("models") or []), ",".join(mx.get("widths") or []),
             ",".join(mx.get("passes") or []), ncells, json.dumps(e2e.get("options")), ncells,
             n, "" if n == 1 else "s"))
        w("")
        w("| figure | what it measures | value | reference (same run) | ratio | target |")
        w("| --- | --- | --- | --- | --- | --- |")
        if capd and loop:
            w("| **capd, fresh exec** | POST `/v1/jobs` (max_parallel 1), the job waited for "
              "with the long-poll `GET /v1/jobs/{id}?wait=60`, then `GET /v1/commits/{sha}/diff` "
              "answering 200 with the comparison against the control | %s s | shell loop "
              "%s s | **%s** capd/loop | ≤ 1.05 (%s) |" % (
                  f(sorted(capd)[len(capd) // 2], "%.1f"), f(sorted(loop)[len(loop) // 2], "%.1f"),
                  f(r1, "%.3f"), verdict(r1 <= 1.05 if r1 else None)))
        if warm:
            w("| **capd, prefork** (zygote running) | the same job on a build registered with "
              "`\"prefork\": true` | %s s | shell loop %s s | **%s×** faster (loop/prefork) | "
              "≥ 2× (%s) |" % (f(sorted(warm)[len(warm) // 2], "%.1f"),
                               f(sorted(loop)[len(loop) // 2], "%.1f"), f(r2),
                               verdict(r2 >= 2 if r2 else None)))
        if e2e.get("prefork_first_use_s"):
            w("| capd, prefork first use | the prefork build's first job (the control, so no "
              "comparison): zygote start, framework import and the equivalence check (once "
              "per registration) included | %s s | shell loop %s s | %s× (loop/first use) | — |"
              % (f(e2e["prefork_first_use_s"], "%.1f"), f(sorted(loop)[len(loop) // 2], "%.1f"),
                 f(r3)))
        cpu = e2e.get("cpu_s") or {}
        if cpu.get("loop") and cpu.get("capd"):
            med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
            rc = e2e.get("cpu_capd_over_loop")
            w("| CPU time, capd | CPU seconds of capd and everything under it (its cells) "
              "for the fresh job, comparison included: what capd adds, little affected by "
              "other load | %s s | the loop's cells: %s s | %s capd/loop | ≤ 1.05 (%s) |" % (
                  f(med(cpu["capd"]), "%.1f"), f(med(cpu["loop"]), "%.1f"), f(rc, "%.3f"),
                  verdict(rc <= 1.05 if rc else None)))
            if cpu.get("prefork"):
                w("| CPU time, prefork | the same for the prefork job (zygote and its children "
                  "included) | %s s | the loop's cells: %s s | %s× less | — |" % (
                      f(med(cpu["prefork"]), "%.1f"), f(med(cpu["loop"]), "%.1f"),
                      f(e2e.get("cpu_loop_over_prefork"))))
        if eq:
            rec = eq.get("records")
            w("| prefork equivalence | tensor records of the prefork head equal to the "
              "fresh-exec head's, key and BLAKE2b hash | %s / %s (warm), %s / %s (first use) | "
              "fresh-exec head | %s | all |" % (
                  eq.get("identical_prefork_warm"), rec, eq.get("identical_prefork_first_use"),
                  rec, "identical" if eq.get("identical_prefork_warm") == rec and
                  eq.get("identical_prefork_first_use") == rec else "**DIFFERENT**"))
            cmpd = eq.get("cells_identical_to_control") or {}
            w("| comparison results | cells the comparison against the control (the prefork "
              "build's first job) calls identical: fresh head / prefork head | %s | — | "
              "verdicts %s | 24/24 each |" % (" / ".join("%s/%s" % tuple(cmpd.get(k, ("?", "?")))
                                                          for k in ("fresh", "prefork")),
                                ", ".join("%s %s" % kv for kv in sorted(
                                    (eq.get("verdicts") or {}).items()))))
        if num_:
            w("| numerics-only job (options.iterations 0) | fresh exec: cells run in parallel "
              "up to the core count at max_parallel 1 | %s s | shell loop (iterations 0) %s s | "
              "%s× faster | — |" % (f(num_["capd_s"], "%.1f"), f(num_["loop_s"], "%.1f"),
                                    f(num_["loop_over_capd"])))
            w("| numerics-only job, prefork | the same on the prefork build | %s s | shell loop "
              "%s s | %s× faster | — |" % (f(num_["capd_prefork_s"], "%.1f"),
                                           f(num_["loop_s"], "%.1f"),
                                           f(num_["loop_over_capd_prefork"])))
        w("")
        w("Per repetition (seconds, in run order): loop %s; capd %s (ratios %s); prefork %s. "
          "CPU seconds: loop %s; capd %s; prefork %s." % (
              ", ".join("%.1f" % x for x in loop), ", ".join("%.1f" % x for x in capd),
              ", ".join("%.3f" % x for x in e2e.get("capd_over_loop_pairs") or []),
              ", ".join("%.1f" % x for x in warm),
              ", ".join("%.1f" % x for x in (e2e.get("cpu_s") or {}).get("loop", [])),
              ", ".join("%.1f" % x for x in (e2e.get("cpu_s") or {}).get("capd", [])),
              ", ".join("%.1f" % x for x in (e2e.get("cpu_s") or {}).get("prefork", []))))
        w("")
        w("Verdicts of the comparisons are about numerics *and* timing. Both heads are "
          "compared with the timing samples of one control run; on this shared 2-core machine "
          "run-to-run timing differences (other tenants, frequency, caches) exceed the default "
          "5%% threshold for some cells, so a verdict can be `regression` from timing alone. "
          "The numeric result is the identical-cell count, and it is the same for the "
          "fresh-exec and the prefork head.")
        pb = e2e.get("prefork_build") or {}
        w("")
        w("The prefork build's state after the run: `%s`%s." % (
            pb.get("prefork_state"),
            (" (%s)" % pb.get("prefork_reason")) if pb.get("prefork_reason") else ""))
        w("")
        w("Reproduce: `/usr/bin/python3 bench/bench_e2e.py --capd build-bench/capd%s`." % (
            " --quick" if quick else ""))
    else:
        w("Not run (see %s/e2e.log)." % d)
    w("")

    # ---- storage ----
    stg = e2e.get("storage") if e2e else None
    w("## Storage growth")
    w("")
    if stg or scale:
        w("| figure | what it measures | value | reference (same run) | ratio | target |")
        w("| --- | --- | --- | --- | --- | --- |")
    if stg:
        bpr = stg.get("bytes_per_stats_record")
        ctl = stg.get("full_control_bytes")
        head = stg.get("full_identical_head_bytes")
        w("| bytes per stats-level record | database pages in use after the %s stats-level jobs "
          "above, divided by their %s records (every kind: tensor, env, timing...; jobs, cells, "
          "events and indexes included) | %s bytes | — | — | — |" % (
              stg.get("stats_jobs"), stg.get("stats_records"), f(bpr, "%.0f")))
        hb = stg.get("full_identical_head_blob_bytes")
        cb = stg.get("full_control_blob_bytes")
        w("| full capture, identical head | what a full-capture (`capture: full`) head whose "
          "records are identical to its control adds to the database and blobs | %s bytes (%s "
          "of them payload blobs) | the control's full capture: %s bytes (%s of them blobs) | "
          "%s%% (blobs: %s%%) | payloads near zero (content-addressed); the rest is one row "
          "per record |" % (head, "n/a" if hb is None else hb, ctl, "n/a" if cb is None else cb,
                            f(100.0 * head / ctl if ctl else None, "%.1f"),
                            f(100.0 * hb / cb if cb and hb is not None else None, "%.1f")))
    if scale:
        small = (scale.get("small") or {}).get("same_pair") or {}
        large = scale.get("large") or {}
        lc = large.get("counts") or {}
        sc = (scale.get("small") or {}).get("counts") or {}
        g = scale.get("growth") or {}
        for k, what in (("compare", "`GET /v1/compare?control=<commit>&head=<commit>` (JSON)"),
                        ("diff", "`GET /v1/commits/<head>/diff` (JSON)")):
            a = small.get(k) or {}
            b = (large.get("same_pair") or {}).get(k) or {}
            nb = (large.get("new_pair") or {}).get(k) or {}
            r = scale.get("ratio_" + k)
            w("| comparison latency, 10,000 jobs%s | %s for a 24-cell control/head pair, median "
              "of %s requests after %s warm-ups (p90 %s ms), with %s jobs and %s records in the "
              "database; a pair among the copied jobs: %s ms | %s ms | the same pair with %s "
              "jobs (%s records): %s ms (p90 %s ms) | **%s** (10,000/10) | ≤ 1.5 (%s) |" % (
                  "" if k == "compare" else " (commit diff)", what, a.get("n"),
                  scale.get("warmups"), f(b.get("p90_ms"), "%.1f"), lc.get("jobs"),
                  lc.get("records"), f(nb.get("median_ms"), "%.1f"),
                  f(b.get("median_ms"), "%.1f"), sc.get("jobs"), sc.get("records"),
                  f(a.get("median_ms"), "%.1f"), f(a.get("p90_ms"), "%.1f"), f(r),
                  verdict(r <= 1.5 if r is not None else None)))
    if stg or scale:
        w("")
    if scale:
        g = scale.get("growth") or {}
        w("Comparison latency: the 10 jobs (5 control/head pairs of `%s` × `%s` × `%s`, fake "
          "runner cells speaking the real protocol, options `%s`, the heads perturbing one "
          "tensor) are captured through the API; capd is stopped, and the jobs with their "
          "cells, attempts and records are copied %s times in SQLite in one transaction (new "
          "ids, seqs and commits; `foreign_key_check` and `integrity_check` clean) in %s s "
          "(%s s in all, checks included); capd restarts on the same data directory and "
          "answers the same requests. One keep-alive connection, requests one after another. "
          "Reproduce: `/usr/bin/python3 bench/bench_compare_scale.py --capd build-bench/capd%s`."
          % (",".join(scale.get("models") or []), ",".join(scale.get("widths") or []),
             ",".join(scale.get("passes") or []), json.dumps(scale.get("options")),
             g.get("copies"), f(g.get("transaction_s"), "%.1f"), f(g.get("seconds"), "%.1f"),
             " --quick" if quick else ""))
    elif stg:
        w("The comparison latency with 10 against 10,000 jobs was not measured in this run "
          "(no compare_scale.json).")
    if not stg and not scale:
        w("Not run.")
    w("")

    # ---- change-point accuracy (tests/test_history_cp --verbose) ----
    w("## Change-point accuracy (`tests/test_history_cp.c`)")
    w("")
    cp_lines = []
    try:
        with open(os.path.join(d, "changepoint.log")) as fh:
            cp_lines = [ln.split("] ", 1)[1].strip() for ln in fh
                        if ln.startswith("[----] ") and " series" in ln]
    except OSError:
        pass
    if cp_lines:
        w("Not a timing: the change-point detector (compare/changepoint.c, E-Divisive means "
          "with the t-test check, docs/history.md) on 200 seeded synthetic series a case, 60 "
          "points at level 100, the step at index 30, normal noise. The test asserts the "
          "targets (issue 22: steps of 10% and more at 2% noise at the exact commit in at "
          "least 95% of the series; pure noise and single spikes a change point in at most "
          "1%) and prints these rates; the series are seeded, so every run prints the same.")
        w("")
        w("| case | measured |")
        w("| --- | --- |")
        for ln in cp_lines:
            case, _, got = ln.partition(": ")
            w("| %s | %s |" % (case, got))
    else:
        w("Not run.")
    w("")

    # ---- bench_history ----
    hist = read_json(os.path.join(d, "history.json")) or {}
    w("## History queries (`bench_history.py`)")
    w("")
    if hist:
        hs = hist.get("series") or {}
        big, small = hs.get("b10k") or {}, hs.get("b100") or {}
        r = hist.get("ratio_10000_over_100")
        w("| figure | what it measures | value | reference (same run) | ratio | target |")
        w("| --- | --- | --- | --- | --- | --- |")
        w("| history query, 10,000 commits | `GET /v1/history?...&limit=100` (the 100 newest "
          "points of one cell's series, its change points and events), median of %s requests "
          "after 3 warm-ups (p90 %s ms), the series at %s points | %s ms | the same query on a "
          "series of %s points: %s ms (p90 %s ms) | **%s** (10,000/100) | ≤ 1.5 (%s) |"
          % (big.get("requests"), f(big.get("p90_ms"), "%.2f"), big.get("points"),
             f(big.get("median_ms"), "%.2f"), small.get("points"),
             f(small.get("median_ms"), "%.2f"), f(small.get("p90_ms"), "%.2f"), f(r),
             verdict(r <= 1.5 if r is not None else None)))
        w("")
        w("Both series get their first point from a real job (fake runner); capd is stopped and "
          "each is grown in SQLite to its size with copies of that point, new commits one "
          "minute apart; capd restarts and answers both, interleaved, over one keep-alive "
          "connection. Load: %s. Reproduce: `/usr/bin/python3 bench/bench_history.py --capd "
          "build-bench/capd --fake-runner build-bench/tests/fake_runner%s`."
          % (hist.get("uptime"), " --quick" if quick else ""))
    else:
        w("Not run.")
    w("")

    # ---- bench_cells ----
    w("## capd around a cell: overhead and ingest (`bench_cells`)")
    w("")
    if cells:
        ncell = num(r"overhead: (\d+) cells", cells, int)
        oc = num(r"overhead: \d+ cells: capd ([\d.]+) s", cells)
        ob = num(r"bare fork/exec/wait loop ([\d.]+) s", cells)
        ms = num(r"capd adds (-?[\d.]+) ms per cell", cells)
        ratio = num(r"ratio capd/bare ([\d.]+)", cells)
        nrec = num(r"ingest records: (\d+) stats-only", cells, int)
        rc = num(r"ingest records: .*?capd ([\d.]+) s", cells)
        rps = num(r"capd [\d.]+ s = (\d+) records/s", cells)
        rb = num(r"drain-only reader ([\d.]+) s = \d+ records/s", cells)
        rr = num(r"records/s; ratio ([\d.]+)", cells)
        mb = num(r"ingest payload: (\d+) MB", cells)
        pc = num(r"ingest payload: .*?capd ([\d.]+) s = \d+ MB/s", cells)
        pmbs = num(r"ingest payload: .*?capd [\d.]+ s = (\d+) MB/s", cells)
        pb = num(r"ingest payload: .*?drain-only reader ([\d.]+) s", cells)
        pct = num(r"capd at (\d+)% of the raw pipe rate", cells)
        w("| figure | what it measures | value | reference (same run) | ratio | target |")
        w("| --- | --- | --- | --- | --- | --- |")
        w("| per-cell overhead | %s cells of a runner that writes hello+env+end, POST to the "
          "last cell finished | %s s (%s ms added per cell) | bare posix_spawn/wait loop "
          "draining fd 3: %s s | %s capd/bare | ≤ 5 ms per cell (%s) |" % (
              ncell, f(oc, "%.3f"), f(ms), f(ob, "%.3f"), f(ratio),
              verdict(ms <= 5 if ms is not None else None)))
        w("| record ingest | %s stats-only tensor frames parsed, validated, stored | %s s = "
          "%s records/s | drain-only reader of the same runner: %s s | %s reader/capd | "
          "≥ 200,000 records/s (%s) |" % (
              nrec, f(rc, "%.3f"), f(rps, "%.0f"), f(rb, "%.3f"), f(rr),
              verdict(rps >= 200000 if rps else None)))
        w("| payload ingest | %s MB of 1 MiB full payloads, hashed, deduplicated, stored | "
          "%s s = %s MB/s | drain-only reader: %s s | %s%% of the raw pipe rate | ≥ 25%% (%s) |"
          % (mb, f(pc, "%.3f"), f(pmbs, "%.0f"), f(pb, "%.3f"), f(pct, "%.0f"),
             verdict(pct >= 25 if pct else None)))
        w("")
        reps = re.search(r"repetitions: (\d+) of each.*?overhead (\S+), records (\S+), "
                         r"payload (\S+)", cells)
        if reps:
            w("Each figure is the median of %s runs, each on a fresh capd and data dir, "
              "sandwiched between runs of its reference (reference, capd, reference, ...; each "
              "capd run against the mean of the two around it). Per-run ratios capd/reference, "
              "in run order: overhead %s, records %s, payload %s." % reps.groups())
            w("")
        w("Reproduce: `CAPD_BIN=build-bench/capd CAPD_HELPER_DIR=build-bench/tests "
          "build-bench/bench/bench_cells%s`." % (" --quick" if quick else ""))
    else:
        w("Not run.")
    w("")

    # ---- bench_compare ----
    w("## Comparison engine against numpy (`bench_compare`)")
    w("")
    if compare:
        cargs = (read(os.path.join(d, "compare.args"), "") or "").split()
        n = num(r"C:\s+(\d+) float32 elements", compare, int)
        ct = num(r"C:\s+\d+ float32 elements, best of \d+: ([\d.]+) s", compare)
        nt = num(r"numpy: best of \d+: ([\d.]+) s", compare)
        npv = num(r"\(numpy ([\d.]+)", compare, str)
        sp = num(r"speed-up C/numpy: ([\d.]+)x", compare)
        bad = num(r"(\d+) metrics disagree", compare, int)
        w("| figure | what it measures | value | reference (same run) | ratio | target |")
        w("| --- | --- | --- | --- | --- | --- |")
        w("| full-payload comparison | every metric of one float32 tensor pair (%s elements, "
          "single thread, best of N): max/mean/p99 abs, relative, allclose, cosine, SQNR, "
          "normalized L2, one-sided NaN/Inf | %s s | numpy %s computing the same metrics on the "
          "same arrays: %s s | **%s×** faster | faster than numpy (%s); metrics agree: %s |" % (
              n, f(ct, "%.4f"), npv or "?", f(nt, "%.4f"), f(sp),
              verdict(sp > 1 if sp else None), "no, %d differ" % bad if bad else "yes"))
        for m in re.finditer(r"C:\s+(\d+) (\w+) elements, best of \d+: ([\d.]+) s = ([\d.e+]+) "
                             r"elements/s", compare):
            if m.group(2) != "float32":
                w("| other dtype | the same metrics on %s %s elements | %s s (%s elements/s) | "
                  "— | — | — |" % (m.group(1), m.group(2), m.group(3), m.group(4)))
        w("")
        w("Reproduce: `build-bench/bench/bench_compare %s`." % " ".join(cargs[:2]))
    else:
        w("Not run.")
    w("")

    # ---- runner capture ----
    w("## The runner's capture hooks (`bench_runner_capture.py`)")
    w("")
    if runner:
        med = runner.get("median_ms") or {}
        rat = runner.get("ratio_to_plain") or {}
        w("Model `%s`, batch %s, %s thread(s), %s analysis worker(s), torch %s, %s records per "
          "capture, %s interleaved iterations (medians), analysis by %s. **Reference**: the "
          "same model's hook-free eval forward, in the same process." % (
              runner.get("model"), runner.get("batch"), runner.get("threads"),
              runner.get("workers"), runner.get("torch"), runner.get("records_per_capture"),
              runner.get("iters"),
              "the native capture pipe (`libcapd_analysis.so`, what a CPU cell uses; %s "
              "analysis threads)" % runner.get("native_threads")
              if runner.get("native_pipe") else
              "the Python workers (native library not in use: %s)"
              % (runner.get("stats_engine") or {}).get("reason", "unknown")))
        w("")
        w("| figure | what it measures | value | reference (same run) | ratio | target |")
        w("| --- | --- | --- | --- | --- | --- |")
        what = {"stats": "capture at level `stats`: stats + hash of every module input/output, "
                         "frames encoded and written",
                "sample": "capture at level `sample` (256 elements per tensor)",
                "hash_only": "the determinism run (hashes only, no frames)",
                "stats_threaded": "`stats` with the native analysis on the pipe's threads, a "
                                  "snapshot copy per tensor (CAPD_RUNNER_NATIVE_INLINE=0)",
                "stats_inline": "`stats` with the native analysis in the hooks, no snapshot "
                                "(CAPD_RUNNER_NATIVE_INLINE=1; runs before the default was "
                                "this)",
                "stats_python": "`stats` through the Python analysis workers (the path without "
                                "the native library, and of GPU cells)",
                "stats_sync": "`stats` with the analysis inline in the hooks "
                              "(CAPD_RUNNER_SYNC=1)",
                "op_stats": "`stats` at granularity `op` (a record per ATen op inside each "
                            "module call too)"}
        # The targets of issue 23: module stats <= 1.15x, op-level stats <= 2x.
        limits = {"stats": 1.15, "op_stats": 2.0}
        for k in ("stats", "sample", "hash_only", "stats_threaded", "stats_inline",
                  "stats_python", "stats_sync", "op_stats"):
            if k in med:
                lim = limits.get(k)
                target = ("≤ %g× (%s)" % (lim, verdict(rat.get(k, 99) <= lim))
                          if lim is not None else "—")
                w("| %s | %s | %s ms | plain forward %s ms | %s× | %s |" % (
                    k, what[k], f(med[k]), f(med.get("plain")), f(rat.get(k)), target))
        w("")
        w("Reproduce: `/usr/bin/python3 bench/bench_runner_capture.py --iters %s`." % (
            (read(os.path.join(d, "runner.args"), "20") or "20").strip()))
    else:
        w("Not run.")
    w("")

    perf_verdicts(w, pv, quick)
    remote_section(w, rm, quick)
    compile_section(w, read_json(os.path.join(d, "compile.json")),
                    read(os.path.join(d, "compile.skipped")), quick)
    by_hand(w)

    w("## Reproduce everything")
    w("")
    w("    bench/run            # everything, 3 end-to-end repetitions (7.5 minutes on this")
    w("                         # machine at load 1)")
    w("    bench/run --quick    # one repetition, smaller ingest runs, no numerics-only figure")
    w("                         # (4 minutes on this machine at load 2)")
    w("")
    w("Raw outputs land in `build-bench/bench-results/`.")
    w("")
    w("## Raw output of this run")
    w("")
    for name in ("cells.txt", "compare.txt", "runner.json", "e2e.json", "compare_scale.json",
                 "history.json", "perf_verdicts.json", "compile.json"):
        text = read(os.path.join(d, name))
        if text:
            w("<details><summary>%s</summary>" % name)
            w("")
            w("```")
            w(text.rstrip())
            w("```")
            w("")
            w("</details>")
            w("")
    with open(args.out, "w") as fh:
        fh.write("\n".join(out).rstrip() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The profiled pair: which module, which operator got slower.

The timing pairs (docs/runner.md, "Paired timing") say whether the head
build is slower than the control; they cannot say where, and their
processes must not be slowed to find out. So a paired head cell whose
pairs say ``regression`` (``options.profile`` auto; every paired head cell
with ``always``) runs, after all its timing processes and never between
them, one *profiled process* of the control build and then one of its
own: started as that side's timing processes were (a fork of the side's
template, or a fresh interpreter: capd_runner/timing.py), with the same
time limit. Each builds the model afresh, runs the cell's pass ``warmup``
times (at least once) untimed, then K iterations, enough to add up to
``timing_min_ms`` (MIN_ITERATIONS to MAX_ITERATIONS), under

- forward pre-hooks and hooks on every module (ModuleClock): each call's
  inclusive wall time and its self time, the inclusive time less that of
  the module calls nested directly in it;
- the operator profiler (torch.profiler, or torch.autograd.profiler where
  that is missing): each operator's self CPU time and calls, and on a GPU
  its self device time.

Both sides carry the same hooks and the same profiler, whose overhead is
in every figure: the evidence is the difference between the sides, not
the absolute values. Hooks see forwards only; ``outside_ns`` holds the
rest of an iteration (the loss, the backward, whatever wraps the model's
call), and the operators cover it all.

The cell sends one ``profile`` frame per side, control first
(docs/protocol.md). A profiled process that fails or is killed costs the
cell its profile (a ``warn`` note says why), never its status.
"""

import json
import math
import os
import sys
import time
import warnings

# K, the profiled iterations: enough for timing_min_ms, within these.
MIN_ITERATIONS = 3
MAX_ITERATIONS = 1000
# What one frame keeps of each list (the most self time first), and the
# header size past which it keeps nothing more: well under the protocol's
# 64 KiB header (capd_runner/frames.py MAX_HEADER).
MAX_ENTRIES = 256
MAX_JSON = 48 << 10
MAX_WHY = 1000  # characters of profiler_why
# Events the profiler records of its own work, not the model's: on a GPU
# kineto's CUPTI buffer requests (seen taking 0.5 to 1.5 ms of CPU an
# iteration, torch 2.11 on an H100), which would head every list.
PROFILER_OWN = ("Activity Buffer Request",)


def _now_ns():
    fn = getattr(time, "perf_counter_ns", None)
    return fn() if fn is not None else int(time.perf_counter() * 1e9)


# --- in the profiled process -------------------------------------------------

class ModuleClock(object):
    """Forward pre-hooks and hooks on every module of MODEL, timing each
    call: a stack of the calls under way gives each its inclusive time and
    its self time (inclusive less its direct children's inclusive times,
    at least 0). SYNC runs before each clock read (a CUDA synchronize on a
    GPU, so a call's time is its device work's too). Per module path:
    [type, self ns, inclusive ns, calls], summed over the calls."""

    def __init__(self, model, sync):
        self.sync = sync
        self.stack = []  # [path, start ns, inclusive ns of its direct children]
        self.by_path = {}
        self.handles = []
        for path, m in model.named_modules():
            self.by_path[path] = [type(m).__name__, 0, 0, 0]
            self.handles.append(m.register_forward_pre_hook(self._pre(path)))
            self.handles.append(m.register_forward_hook(self._post(path)))

    def _pre(self, path):
        def hook(module, args):
            self.sync()
            self.stack.append([path, _now_ns(), 0])
        return hook

    def _post(self, path):
        def hook(module, args, out):
            self.sync()
            now = _now_ns()
            # Its own entry, the newest of that path: entries above it are
            # calls that raised inside it (and were caught), whose time
            # stays in its own.
            at = len(self.stack) - 1
            while at >= 0 and self.stack[at][0] != path:
                at -= 1
            if at < 0:
                return
            _, start, nested = self.stack[at]
            del self.stack[at:]
            total = now - start
            row = self.by_path[path]
            row[1] += max(0, total - nested)
            row[2] += total
            row[3] += 1
            if self.stack:
                self.stack[-1][2] += total
        return hook

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles = []

    def modules(self, k):
        """The called modules, per-iteration means over K iterations."""
        out = []
        for path, (kind, own, total, calls) in self.by_path.items():
            if calls:
                out.append({"path": path, "type": kind, "self_ns": own // k,
                            "total_ns": total // k, "calls": round(calls / float(k), 3)})
        out.sort(key=lambda m: -m["self_ns"])
        return out


def _profiler(torch, cuda):
    """(the operator profiler, not yet entered, its name, None), or (None,
    None, why there is none)."""
    try:
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        ap = getattr(getattr(torch, "autograd", None), "profiler", None)
        if ap is None or not hasattr(ap, "profile"):
            return None, None, "this torch has neither torch.profiler nor torch.autograd.profiler"
        try:
            return ap.profile(use_cuda=cuda), "autograd", None
        except Exception as e:
            return None, None, "torch.autograd.profiler.profile: %s: %s" % (type(e).__name__, e)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    try:
        return profile(activities=acts), "torch.profiler", None
    except Exception as e:
        return None, None, "torch.profiler.profile: %s: %s" % (type(e).__name__, e)


def _operators(prof, cuda, k):
    """Per operator (key_averages' key): self CPU ns and calls per
    iteration, and on a GPU self device ns; the operators with any self
    time, the most first (on a GPU, CPU and device self time together)."""
    out = []
    for e in prof.key_averages():
        if e.key in PROFILER_OWN:
            continue
        op = {"name": str(e.key), "self_ns": int(round(float(e.self_cpu_time_total) * 1000 / k)),
              "calls": round(e.count / float(k), 3)}
        if cuda:
            dev = getattr(e, "self_device_time_total", None)
            if dev is None:
                dev = getattr(e, "self_cuda_time_total", 0)
            op["device_self_ns"] = int(round(float(dev or 0) * 1000 / k))
        if op["self_ns"] > 0 or op.get("device_self_ns", 0) > 0:
            out.append(op)
    out.sort(key=lambda o: -(o["self_ns"] + o.get("device_self_ns", 0)))
    return out


def _profiled(torch, cuda, k, iteration):
    """K iterations inside the operator profiler: (their wall times, the
    operators, the profiler's name or None, why none or None). A profiler
    that will not start or stop leaves the operators empty, and says why;
    the iterations run all the same, so the modules still count."""
    with warnings.catch_warnings():
        # torch 2.x warns that a profiler keeps its last cycle's events
        # only: it has one cycle here, all K iterations.
        warnings.filterwarnings("ignore", message=".*Profiler clears events")
        return _profiled_quietly(torch, cuda, k, iteration)


def _profiled_quietly(torch, cuda, k, iteration):
    """_profiled's work, under its warnings filter."""
    prof, name, why = _profiler(torch, cuda)
    if prof is not None:
        try:
            prof.__enter__()
        except Exception as e:
            prof, name, why = None, None, "the profiler would not start: %s: %s" % (
                type(e).__name__, e)
    try:
        walls = [iteration() for _ in range(k)]
    except BaseException:
        if prof is not None:
            try:
                prof.__exit__(*sys.exc_info())
            except Exception:
                pass  # the model's exception is the one to report
        raise
    ops = []
    if prof is not None:
        step = "stopping the profiler"
        try:
            prof.__exit__(None, None, None)
            step = "reading its key_averages"
            ops = _operators(prof, cuda, k)
        except Exception as e:
            name, why = None, "%s failed: %s: %s" % (step, type(e).__name__, e)
    return walls, ops, name, why and why[:MAX_WHY]


def iterations_for(min_ms, fastest_ns):
    """K: enough iterations of FASTEST_NS for MIN_MS, within the bounds."""
    if fastest_ns <= 0:
        return MIN_ITERATIONS
    return max(MIN_ITERATIONS, min(MAX_ITERATIONS, int(math.ceil(min_ms * 1e6 / fastest_ns))))


def measure(torch, model, call, spec, projection, device):
    """The cell's pass as cell.timing_run runs it (eval and no_grad for a
    forward; train, enable_grad, loss and backward, gradients cleared
    before each iteration, for a backward): the warmup, then K iterations
    under ModuleClock and the operator profiler. The profile's
    measurements, per-iteration means (the frame's fields but its own)."""
    cuda = device.type == "cuda"
    backward = spec.pass_ != "forward"

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    def iteration():
        if backward:
            model.zero_grad(set_to_none=True)
        sync()
        t0 = _now_ns()
        out = call(model)
        if backward:
            projection.loss(out).backward()
        del out
        sync()
        return _now_ns() - t0

    model.train() if backward else model.eval()
    with (torch.enable_grad() if backward else torch.no_grad()):
        fastest = min(iteration() for _ in range(max(1, spec.warmup)))
        k = iterations_for(spec.timing_min_ms, fastest)
        clock = ModuleClock(model, sync)
        try:
            walls, ops, name, why = _profiled(torch, cuda, k, iteration)
        finally:
            clock.remove()
    if backward:
        model.zero_grad(set_to_none=True)
    modules = clock.modules(k)
    wall = sum(walls) // k
    root = clock.by_path.get("", [None, 0, 0, 0])[2] // k
    res = {"iterations": k, "total_ns": wall, "outside_ns": max(0, wall - root),
           "modules": modules, "ops": ops, "profiler": name}
    if why is not None:
        res["profiler_why"] = why
    return res


def one_process(spec, index, out_fd):
    """In a profiled process: build and place the model as a timing
    process does (capd_runner/timing.py prepare), measure; one JSON line
    to OUT_FD."""
    from capd_runner import timing
    torch, model, call, projection, device = timing.prepare(spec)
    res = {"process": index}
    res.update(measure(torch, model, call, spec, projection, device))
    os.write(out_fd, (json.dumps(res) + "\n").encode())


# --- in the cell ---------------------------------------------------------------

def _fit(modules, ops, used):
    """The entries of MODULES and OPS the frame keeps: alternately the next
    of each (the most self time first), MAX_ENTRIES of each at most, until
    the next would take the header past MAX_JSON (USED bytes so far)."""
    kept = {"modules": [], "ops": []}
    turns = []
    for i in range(MAX_ENTRIES):
        turns += [("modules", m) for m in modules[i:i + 1]] + [("ops", o) for o in ops[i:i + 1]]
    for name, entry in turns:
        size = len(json.dumps(entry, separators=(",", ":"))) + 1
        if used + size > MAX_JSON:
            break
        kept[name].append(entry)
        used += size
    return kept["modules"], kept["ops"]


def frame(base, res, side, **where):
    """The ``profile`` frame of RES, a profiled process's result, on SIDE
    (``control`` or ``head``); BASE is the timing frames' start (its phase);
    WHERE the pair (or process) whose indices the process reuses."""
    f = {"kind": "profile", "phase": base["phase"], "side": side,
         "iterations": res["iterations"], "total_ns": res["total_ns"],
         "outside_ns": res["outside_ns"], "profiler": res.get("profiler")}
    if "start" in res:  # fork or exec (capd_runner/timing.py)
        f["start"] = res["start"]
    f.update(where)
    modules, ops = res.get("modules") or [], res.get("ops") or []
    keep_m, keep_o = _fit(modules, ops, len(json.dumps(f)) + 256)
    f.update({"modules": keep_m, "modules_left_out": len(modules) - len(keep_m),
              "ops": keep_o, "ops_left_out": len(ops) - len(keep_o)})
    if not keep_o and res.get("profiler_why"):
        f["profiler_why"] = res["profiler_why"]
    return f


def _why_paired(spec, done):
    """Why the cell runs its profiled pair after the pairs DONE, or None."""
    from capd_runner import pairs
    if spec.iterations <= 0 or not done or spec.profile == "off":
        return None
    if spec.profile == "always":
        return "profile=always"
    if pairs.verdict(*pairs.observations(done)) == "regression":
        return "the pairs say regression"
    return None


def _one(writer, forker, index, whose, what):
    """FORKER's profiled process INDEX: its result, or None where it failed
    or was not started (a warn note says why, WHOSE it was and WHAT it
    served; its traceback goes to the cell's log, not to an error note:
    the cell does not fail for it)."""
    from capd_runner import cell
    res = forker.profile(index)
    cell._note_start(writer, forker, res, whose)
    if "error" not in res:
        return res
    if res.get("traceback"):
        sys.stderr.write(res["traceback"])
    cell._say(writer, "warn", "%s %d: %s profiled process failed (%s); the cell goes on "
              "without a profile" % (what, index, whose, res["error"]))
    return None


def after_pairs(spec, writer, forkers, base, done):
    """A paired head cell's profiled pair, after its pairs DONE: the
    control build's profiled process, then this build's, their frames
    (control first) once both have answered; their INDEX is the next
    pair's, len(DONE). FORKERS: (this build's, the control build's)."""
    why = _why_paired(spec, done)
    if why is None:
        return
    from capd_runner import cell
    forker, ref = forkers
    index = len(done)
    cell._say(writer, "info", "profiled pair: ran because %s" % why)
    got = []
    for side, f, whose in (("control", ref, "the control build's"),
                           ("head", forker, "the cell's")):
        res = _one(writer, f, index, whose, "profiled pair")
        if res is None:
            return
        got.append(frame(base, res, side, pair=index))
    for f in got:
        writer.frame(f)
    writer.flush()


def after_processes(spec, writer, forker, base, index):
    """An unpaired cell's profiled process (profile always only: without
    a control there is nothing to set it against), numbered INDEX, after
    its timing processes."""
    if spec.profile != "always" or spec.iterations <= 0:
        return
    from capd_runner import cell
    cell._say(writer, "info", "profiled process: ran because profile=always")
    res = _one(writer, forker, index, "the cell's", "profiled process")
    if res is not None:
        writer.frame(frame(base, res, "head", process=index))
        writer.flush()

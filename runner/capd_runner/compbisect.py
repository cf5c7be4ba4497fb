"""Compiler bisection of a compiled cell that departs from eager beyond the
float64 rule (docs/compare.md, "Reference arbiter"): the compile axis's
follow-up.

The model is built as its cell builds it (capd_runner/cell.py) and its pass
run eagerly, as a float64 copy on float64 inputs (the reference), and under
``torch.compile`` for the spec's mode (capd_runner/compiled.py) after a
fresh ``torch._dynamo.reset()``, compared by the keys a compiled cell
records (run_pass). Where the compiled result fails the rule (judge),
Inductor's ``CompilerBisector.do_bisect`` narrows it in this process:
backends eager, aot_eager, aot_eager_decomp_partition(_crossref), inductor
(it overrides torch.compile's backend), then the failing backend's
subsystems (passes, config changes, lowerings), then the application of the
one whose disabling fixes it. Inductor's FX graph and AOTAutograd caches
are off throughout (their keys do not see the bisector's changes). The time
limit counts from the start, is checked before each trial and interrupts a
running trial (SIGALRM, main thread only, and only where nothing else in
the process set a SIGALRM handler or a real-time timer: the runner sets
neither, and a caller that does keeps its own, the limit then checked
before each trial only).

In a cell (capd_runner/cell.py): a compiled cell whose options.compiler_bisect
is run (schema/options.json; what capd sets on the follow-up job of a mode
self-check that found a compiled cell diverged) runs run_cell in place of
its capture and timing: hello and env as any compiled cell, then one note
(level info) ``compile_bisect=<run()'s object as compact JSON, sorted keys>``,
memory and end ok (docs/runner.md, "Compiler bisection").

``python -m capd_runner.compbisect --model M --pass P --mode MODE`` applies
the width's environment (schema/widths.json) before torch is imported
(run() uses this process's: its caller sets ATEN_CPU_CAPABILITY), prints
run()'s JSON object and exits 0 when it ran, narrowed or not; 2 on bad
arguments or a torch that cannot (no torch.compile, no compiler bisector);
1 on an internal error.
"""

import argparse
import contextlib
import json
import os
import shlex
import signal
import sys
import threading
import time

DEFAULT_TIMEOUT_S = 300
# The rule: k (K_SMALL for tensors of at most SMALL_NUMEL elements or a
# LOW_PRECISION dtype), tol = the comparison's atol for the dtype / 10.
K, K_SMALL, SMALL_NUMEL, LOW_PRECISION = 2.0, 3.0, 10, ("float16", "bfloat16")
ATOL = {"float32": 1e-5, "float16": 1e-5, "bfloat16": 1e-5, "float64": 1e-7}
NOTHING = "compiled passes the float64 rule: nothing to bisect"
# The bisector's variables: set, they override its own state.
BISECT_ENV = ("TORCH_BISECT_BACKEND", "TORCH_BISECT_SUBSYSTEM", "TORCH_BISECT_MAX")
EXIT_RAN, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
RUNNER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class TimeLimit(BaseException):
    """The time limit expired (not an Exception: torch must not catch it)."""


class Unusable(Exception):
    """Bad arguments, or a torch or host that cannot bisect (exit 2)."""


# --- the model and its three results ------------------------------------------------

def make_spec(model, pass_, mode, width="native", seed=0, batch=2, dtype="float32",
              threads=1, model_roots=(), scratch=None):
    """A checked cell spec (capd_runner/spec.py) of these fields."""
    from capd_runner import spec as specmod
    row = specmod.width_row(width) if width != "native" else {}
    raw = {"protocol": 1, "model": model, "width": width, "pass": pass_, "mode": mode,
           "model_roots": list(model_roots), "scratch": scratch,
           "width_isa": row.get("isa"), "width_effective": row.get("effective"),
           "options": {"seed": seed, "batch": batch, "dtype": dtype, "threads": threads}}
    try:
        spec = specmod.check(raw)
    except specmod.SpecError as e:
        raise Unusable(str(e))
    if spec.mode == "eager":
        raise Unusable("mode eager has no compiler to bisect (aot_eager or inductor)")
    return spec


def build(torch, spec):
    """(model, inputs) as the cell builds them, in the cell's dtype, on the CPU."""
    from capd_runner import cell
    dtype = getattr(torch, spec.dtype)
    try:
        model, inputs = cell._build(torch, spec, dtype)
    except cell.CellFailed as e:
        raise Unusable(str(e))
    return model.to(dtype=dtype), cell._place(torch, inputs, torch.device("cpu"), dtype)


def _leaves(inputs, dtype):
    """Fresh leaf copies of INPUTS' tensors (floating ones in DTYPE),
    requires_grad kept: each run has input gradients of its own."""
    from capd_runner.capture import flatten, rebuild
    new = [(t.detach().to(dtype=dtype) if t.is_floating_point() else t.detach()).clone()
           .requires_grad_(bool(t.is_floating_point() and t.requires_grad))
           for t in flatten(inputs)]
    return rebuild(inputs, iter(new))


def run_pass(torch, target, model, inputs, spec, dtype=None):
    """The cell's pass through TARGET (MODEL, or its compiled form) on fresh
    copies of INPUTS (in DTYPE, default the spec's): {key: float64 copy}.
    MODEL's buffers are restored and its gradients cleared after it."""
    from capd_runner import cell
    from capd_runner.capture import flatten
    from capd_runner.naming import param_owner
    torch.manual_seed(spec.seed)
    call = cell.Call(_leaves(inputs, dtype or getattr(torch, spec.dtype)))
    backward = spec.pass_ != "forward"
    snap = cell._snapshot_buffers(torch, model)
    got = {}
    try:
        target.train() if backward else target.eval()
        model.zero_grad(set_to_none=True)
        with (torch.enable_grad() if backward else torch.no_grad()):
            out = call(target)
            for i, t in enumerate(flatten(out)):
                got["model.0.forward.output.%d" % i] = t.detach().double().clone()
            if backward:
                cell.Projection(torch, spec.seed).loss(out).backward()
        if backward:
            for i, t in enumerate(flatten(call.args)):
                if t.grad is not None:
                    got["model.0.backward.grad_input.%d" % i] = t.grad.double().clone()
            for name, p in model.named_parameters():
                if p.grad is not None:
                    owner, local = param_owner(name)
                    got["%s.0.backward.param_grad.%s" % (owner, local)] = p.grad.double().clone()
    finally:
        model.zero_grad(set_to_none=True)
        cell._restore_buffers(torch, snap)
    return got


def compiled_run(torch, model, inputs, spec):
    """The pass through torch.compile(MODEL) for the spec's mode, compiled
    afresh (torch._dynamo.reset() first)."""
    from capd_runner import compiled
    torch._dynamo.reset()
    return run_pass(torch, compiled.compile_model(torch, model, spec), model, inputs, spec)


@contextlib.contextmanager
def no_caches(torch):
    """Inductor's FX graph cache and AOTAutograd's cache off."""
    import torch._functorch.config as fcfg
    import torch._inductor.config as icfg
    with icfg.patch(fx_graph_cache=False), fcfg.patch(enable_autograd_cache=False):
        yield


# --- the rule -----------------------------------------------------------------------

def _errors(e, c, r):
    """(RMS of E - R, RMS of C - R) over the values finite in all three;
    C's error is inf where C is non-finite where E is not."""
    import torch

    def rms(d, m):
        return float(d[m].pow(2).mean().sqrt()) if bool(m.any()) else 0.0

    fe, fc, fr = torch.isfinite(e), torch.isfinite(c), torch.isfinite(r)
    if bool((fe & ~fc).any()):
        return rms(e - r, fe & fr), float("inf")
    m = fe & fc & fr
    return rms(e - r, m), rms(c - r, m)


def judge(eager, compiled, ref, dtype="float32"):
    """The float64 arbiter over every key of REF: a key passes iff
    err(compiled) <= k * err(eager) + tol. The verdict: passed (every key),
    keys, failed_keys (the first 10), and the worst key's (largest
    err_compiled / (k * err_eager + tol)) worst_key, err_eager,
    err_compiled, k, tol, ratio."""
    tol = float("%g" % (ATOL.get(dtype, 1e-5) / 10))
    worst, failed = None, []
    for key, r in ref.items():
        e, c = eager.get(key), compiled.get(key)
        k = K_SMALL if (r.numel() <= SMALL_NUMEL or dtype in LOW_PRECISION) else K
        if e is None or c is None or e.shape != r.shape or c.shape != r.shape:
            ee, ec = 0.0, float("inf")
        else:
            ee, ec = _errors(e, c, r)
        ratio = ec / (k * ee + tol)
        if ratio > 1:
            failed.append(key)
        if worst is None or ratio > worst["ratio"]:
            worst = {"worst_key": key, "err_eager": ee, "err_compiled": ec, "k": k,
                     "tol": tol, "ratio": ratio}
    out = {"passed": not failed, "keys": len(ref), "failed_keys": failed[:10], "dtype": dtype}
    out.update(worst or {"worst_key": None, "err_eager": 0.0, "err_compiled": 0.0, "k": K,
                         "tol": tol, "ratio": 0.0})
    return out


# --- the bisection ------------------------------------------------------------------

def _alarm(state, seconds):
    """SIGALRM after SECONDS: STATE expired, and TimeLimit raised where a
    trial is running (main thread only); returns what undoes it."""
    if threading.current_thread() is not threading.main_thread() or seconds <= 0 \
            or not hasattr(signal, "setitimer"):
        return lambda: None
    # Someone else's alarm (a handler of its own, a timer running): left be.
    if signal.getsignal(signal.SIGALRM) not in (signal.SIG_DFL, signal.SIG_IGN) \
            or signal.getitimer(signal.ITIMER_REAL)[0] > 0:
        return lambda: None

    def on_alarm(_sig, _frame):
        state["expired"] = True
        if state["in_trial"]:
            raise TimeLimit()

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)

    def undo():
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    return undo


def bisect(trial, deadline):
    """CompilerBisector.do_bisect over TRIAL (True: the result passes) until
    DEADLINE (time.monotonic()); its prints go to stderr. Returns (the
    BisectionResult or None, state: trials, errors, first_error, expired,
    where: the backend and subsystem under test)."""
    import gc
    from torch._inductor.compiler_bisector import CompilerBisector as CB
    state = {"trials": 0, "errors": 0, "first_error": None, "expired": False, "where": None,
             "in_trial": False}

    def test_fn():
        state["where"] = (CB.get_backend(), CB.get_subsystem())
        if state["expired"] or time.monotonic() >= deadline:
            state["expired"] = True
            raise TimeLimit()
        state["trials"] += 1
        state["in_trial"] = True
        try:
            return bool(trial(state["where"][0]))
        except Exception as e:
            if state["expired"]:
                raise TimeLimit()
            state["errors"] += 1
            state["first_error"] = state["first_error"] or "%s: %s" % (type(e).__name__, e)
            return False
        finally:
            state["in_trial"] = False

    result = None
    with contextlib.redirect_stdout(sys.stderr):
        undo = _alarm(state, deadline - time.monotonic())
        try:
            result = CB.do_bisect(test_fn)
        except TimeLimit:
            state["expired"] = True
        finally:
            undo()
        gc.collect()  # the bisector cleans up as its frame goes
        CB.bisection_enabled, CB.in_process_cache = False, None
    return (None if state["expired"] else result), state


def _trial(torch, model, inputs, spec, eager, ref):
    """TRIAL(backend) for bisect: whether the compiled result passes the
    rule; True without compiling for a backend after the cell's own."""
    from torch._inductor.compiler_bisector import BACKENDS
    order, own = list(BACKENDS), spec.mode

    def trial(backend):
        if own in order and backend in order and order.index(backend) > order.index(own):
            return True
        return judge(eager, compiled_run(torch, model, inputs, spec), ref, spec.dtype)["passed"]
    return trial


def _why_not(result, state, timeout_s, spec):
    """Why the bisection did not narrow (None where it did)."""
    from torch._inductor.compiler_bisector import BACKENDS
    if state["expired"]:
        where = state["where"] or (None, None)
        return ("time limit of %gs (timeout_s) reached after %d bisection trial(s), at "
                "backend %s subsystem %s: could not narrow"
                % (timeout_s, state["trials"], where[0], where[1]))
    if result is None:
        return ("no backend up to %s reproduced the departure under the bisector (%d trials, "
                "%d raised): could not narrow" % (spec.mode, state["trials"], state["errors"]))
    if result.subsystem is None and BACKENDS.get(result.backend):
        return ("the departure is in backend %s, but disabling none of its subsystems (%s) "
                "removed it: could not narrow below the backend"
                % (result.backend, ", ".join(s.name for s in BACKENDS[result.backend])))
    return None


def command_line(spec, timeout_s, python=None, scratch=True):
    """The shell command line that repeats this bisection: this interpreter,
    PYTHONPATH the runner's directory then this process's other entries,
    the cell's fields (its scratch dir where SCRATCH)."""
    argv = [python or sys.executable, "-m", "capd_runner.compbisect", "--model", spec.model,
            "--pass", spec.pass_, "--mode", spec.mode, "--width", spec.width,
            "--timeout-s", "%g" % timeout_s, "--seed", str(spec.seed), "--batch",
            str(spec.batch), "--dtype", spec.dtype, "--threads", str(spec.threads)]
    for r in spec.model_roots:
        argv += ["--model-root", r]
    if spec.scratch and scratch:
        argv += ["--scratch", spec.scratch]
    path = [RUNNER_DIR] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                           if p and os.path.abspath(p) != RUNNER_DIR]
    return "PYTHONPATH=%s %s" % (shlex.quote(os.pathsep.join(path)),
                                 " ".join(shlex.quote(a) for a in argv))


def run(spec, timeout_s=DEFAULT_TIMEOUT_S):
    """Judge the compiled result against eager and the float64 reference;
    where it fails, bisect. The JSON object: narrowed, backend, subsystem,
    bisect_number, debug_info (the bisector's), reason (why not narrowed,
    else null), judgement (before bisecting), trials, trial_errors,
    first_trial_error, command, model, pass, mode, timeout_s, elapsed_s."""
    import copy
    import torch
    from capd_runner import compiled
    t0 = time.monotonic()
    compiled.setup(torch, spec)
    out = {"narrowed": False, "backend": None, "subsystem": None, "bisect_number": None,
           "debug_info": None, "reason": None, "judgement": None, "trials": 0,
           "trial_errors": 0, "first_trial_error": None, "command": command_line(spec, timeout_s),
           "model": spec.model, "pass": spec.pass_, "mode": spec.mode,
           "timeout_s": timeout_s}
    model, inputs = build(torch, spec)
    with no_caches(torch):
        eager = run_pass(torch, model, model, inputs, spec)
        f64 = copy.deepcopy(model).to(dtype=torch.float64)  # the reference
        ref = run_pass(torch, f64, f64, inputs, spec, dtype=torch.float64)
        out["judgement"] = judge(eager, compiled_run(torch, model, inputs, spec), ref, spec.dtype)
        if out["judgement"]["passed"]:
            out["reason"] = NOTHING
        else:
            result, state = bisect(_trial(torch, model, inputs, spec, eager, ref),
                                   t0 + timeout_s)
            out.update(trials=state["trials"], trial_errors=state["errors"],
                       first_trial_error=state["first_error"])
            out["reason"] = _why_not(result, state, timeout_s, spec)
            if result is not None:
                out.update(backend=result.backend, subsystem=result.subsystem,
                           bisect_number=result.bisect_number, debug_info=result.debug_info)
            out["narrowed"] = out["reason"] is None
    out["elapsed_s"] = round(time.monotonic() - t0, 3)
    return out


# --- in a cell ------------------------------------------------------------------------

# The option (schema/options.json) and its value that bisects in place of
# the capture and timing.
OPTION, RUN = "compiler_bisect", "run"
EAGER_WHY = "option compiler_bisect run needs a compiled mode (aot_eager or inductor)"
# The note's message: NOTE_PREFIX, then run()'s object (note_message), at
# most NOTE_MAX bytes as its frame carries it (a header is at most 65536).
NOTE_PREFIX = "compile_bisect="
NOTE_MAX = 60000
# What note_message cuts first where the message would not fit.
CUT_FIRST = ("debug_info", "first_trial_error", "judgement")
# A cell's time limit: options.timeout_s less CELL_MARGIN_S (the interpreter,
# torch's import and the compiler check come before run()'s clock starts;
# the memory and end frames after it), within [CELL_MIN_S, CELL_MAX_S].
CELL_MARGIN_S, CELL_MIN_S, CELL_MAX_S = 60, 10, 2 * DEFAULT_TIMEOUT_S


def wanted(spec):
    """Whether SPEC's cell bisects in place of capturing."""
    return spec.options.get(OPTION) == RUN


def cell_timeout_s(spec):
    """run()'s time limit in SPEC's cell (seconds)."""
    t = spec.options.get("timeout_s") or DEFAULT_TIMEOUT_S
    return float(min(max(t - CELL_MARGIN_S, CELL_MIN_S), CELL_MAX_S))


def refusal(torch, spec, why):
    """Why a cell with compiler_bisect run ends unsupported (after its env
    frame), or None. WHY is compiled.prepare's reason (a compiled cell's
    own refusals come first); an eager cell has no compiler to bisect.
    A reason of the bisector's is the fingerprint's compile.unsupported
    too, as compiled.prepare's is."""
    if spec.mode not in ("aot_eager", "inductor"):
        return EAGER_WHY
    if why:
        return why
    why = _bisector_why(torch)
    if why:
        from capd_runner import compiled
        compiled._state["reason"] = why
    return why


def _strict(obj):
    """OBJ with its non-finite floats as the strings "inf", "-inf", "nan"
    (strict JSON: the judgement's err_compiled and ratio are inf where the
    compiled result is non-finite where eager's is not)."""
    if isinstance(obj, float) and obj != obj:
        return "nan"
    if isinstance(obj, float) and obj in (float("inf"), float("-inf")):
        return "inf" if obj > 0 else "-inf"
    if isinstance(obj, dict):
        return dict((k, _strict(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return [_strict(v) for v in obj]
    return obj


def _shrink(obj, n):
    """OBJ with strings cut to N characters (marked ...[truncated]) and
    lists to max(1, N // 64) items."""
    if isinstance(obj, str):
        return obj if len(obj) <= n else obj[:n] + "...[truncated]"
    if isinstance(obj, dict):
        return dict((k, _shrink(v, n)) for k, v in obj.items())
    if isinstance(obj, list):
        return [_shrink(v, n) for v in obj[:max(1, n // 64)]]
    return obj


def note_message(result, limit=NOTE_MAX):
    """NOTE_PREFIX and RESULT as compact JSON, keys sorted, non-finite
    floats as strings; at most LIMIT bytes JSON-escaped (as the note's
    frame header carries it). Past that the fields of CUT_FIRST are cut
    shorter and shorter (then every field), and "truncated" lists the
    fields cut."""
    def text(r):
        return NOTE_PREFIX + json.dumps(r, separators=(",", ":"), sort_keys=True,
                                        allow_nan=False)

    result = _strict(result)
    msg = text(result)
    for fields in (CUT_FIRST, sorted(result)):
        for n in (4096, 1024, 256, 64, 16):
            if len(json.dumps(msg)) <= limit:
                return msg
            r = dict(result)
            for k in fields:
                if k in r and _shrink(r[k], n) != r[k]:
                    r[k] = _shrink(r[k], n)
                    r.setdefault("truncated", []).append(k)
            msg = text(r)
    return msg


def run_cell(torch, spec, writer, pipeline):
    """A compiled cell's model part under options.compiler_bisect run
    (cell._run_model; hello, env and the refusals before it as for any
    compiled cell, end ok after it): run() within cell_timeout_s, one note
    (level info) whose message is note_message(its object), the memory
    frame. No tensor, nondeterministic or timing frame; the command line
    names no scratch dir (the cell's goes with it)."""
    from capd_runner import cell
    pipeline.stop()  # nothing is captured
    timeout_s = cell_timeout_s(spec)
    try:
        result = run(spec, timeout_s)
    except Unusable as e:  # the model could not be built: as a compiled cell would
        raise cell.CellFailed(str(e))
    result["command"] = command_line(spec, timeout_s, scratch=False)
    writer.note("info", note_message(result))
    writer.frame({"kind": "memory", "peak_rss_bytes": cell.peak_rss_bytes()})
    writer.flush()


# --- the command line -----------------------------------------------------------------

def _width_env(width):
    """The environment of WIDTH (capd's width table); Unusable for an
    unknown width or one this host's CPU cannot run."""
    from capd_runner import spec as specmod, width as widthmod
    if width == "native":
        return {}
    row = specmod.width_row(width)
    if not row:
        raise Unusable("unknown width %r (not in %s)" % (width, specmod.WIDTHS_TABLE))
    missing = widthmod.host_missing(row.get("requires") or [])
    if missing:
        raise Unusable("this host's CPU lacks %s (needed by width %s)"
                       % (", ".join(missing), width))
    return dict(row.get("env") or {})


def _bisector_why(torch):
    """Why this torch's compiler bisector cannot run here, or None."""
    try:
        import torch._inductor.compiler_bisector  # noqa: F401
    except Exception as e:
        return "torch %s has no usable torch._inductor.compiler_bisector: %s: %s" % (
            torch.__version__, type(e).__name__, e)
    set_ = [n for n in BISECT_ENV if os.environ.get(n)]
    if set_:
        return "%s set in the environment: the bisector would follow it, not its own state" % (
            ", ".join(set_))
    return None


def usable(torch, spec):
    """Why this torch and process cannot bisect SPEC's cell, or None."""
    from capd_runner import compiled, width as widthmod
    from capd_runner.spec import expected_capability
    why = compiled.prepare(torch, spec) or _bisector_why(torch)
    if why:
        return why
    want, got = expected_capability(spec), widthmod.effective(torch)
    if want is not None and want != got:
        return "width %s: the effective CPU capability is %s, not %s" % (spec.width, got, want)
    return None


def _parser():
    p = argparse.ArgumentParser(prog="python -m capd_runner.compbisect", description=(
        "Bisect the compiler where a compiled cell departs from eager beyond the float64 rule."))
    p.add_argument("--model", required=True)
    p.add_argument("--pass", dest="pass_", required=True, choices=("forward", "backward"))
    p.add_argument("--mode", required=True, choices=("aot_eager", "inductor"))
    p.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S)
    p.add_argument("--model-root", action="append", default=[])
    for name, kind, default in (("width", str, "native"), ("seed", int, 0), ("batch", int, 2),
                                ("dtype", str, "float32"), ("threads", int, 1),
                                ("scratch", str, None)):
        p.add_argument("--" + name, type=kind, default=default)
    return p


def main(argv=None):
    args = _parser().parse_args(argv)
    say = lambda msg: sys.stderr.write("capd_runner.compbisect: %s\n" % msg)  # noqa: E731
    try:
        if not args.timeout_s > 0:
            raise Unusable("--timeout-s must be positive, not %g" % args.timeout_s)
        os.environ.update(_width_env(args.width))
        spec = make_spec(args.model, args.pass_, args.mode, args.width, args.seed, args.batch,
                         args.dtype, args.threads, args.model_root, args.scratch)
        try:
            import torch
        except Exception as e:
            raise Unusable("cannot import torch: %s: %s" % (type(e).__name__, e))
        why = usable(torch, spec)
        if why:
            raise Unusable(why)
        torch.set_num_threads(spec.threads)
        result = run(spec, args.timeout_s)
    except Unusable as e:
        say(e)
        return EXIT_USAGE
    except Exception:
        import traceback
        say("internal error:\n" + traceback.format_exc())
        return EXIT_ERROR
    sys.stdout.write(json.dumps(result) + "\n")
    return EXIT_RAN


if __name__ == "__main__":
    sys.exit(main())

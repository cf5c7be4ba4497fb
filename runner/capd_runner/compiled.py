"""Compiled cells: the spec's ``mode`` aot_eager or inductor (docs/runner.md,
"Compiled cells (mode)").

A compiled cell builds the model as an eager cell does, then runs
``torch.compile(model, backend=mode, dynamic=False)`` in its place: for the
capture runs, the float64 reference's pass excepted, and in every timing
process. Module hooks inside the compiled region would break its graphs and
change what is compiled, so a compiled cell records at a coarser, fixed
granularity, outside the compiled region only:

* ``<owner>.0.init.param.<name>``: the initial parameters, as every cell;
* ``model.0.forward.input.<i>`` and ``model.0.forward.output.<i>``: the
  root module call's positional inputs and its output, the keys, headers
  and recorder an eager cell uses for them;
* backward pass: ``model.0.backward.grad_output.<i>`` (dL/d(output), from a
  tap on the compiled call's output), ``model.0.backward.grad_input.<i>``
  (dL/d(input) for inputs that require grad, from a tap on them before the
  call) and ``<owner>.0.backward.param_grad.<name>`` after backward().

No record of an inner module, nor per op. The compile happens at the first
call of each process; the cell's is timed on its own and sent as a ``note``
(level info) whose message starts ``compile_s=`` (COMPILE_NOTE); a timing
process compiles before its warmup and says how long in its timing frame's
``compile_ns``.

Eager cells never import this module.
"""

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time

COMPILED_MODES = ("aot_eager", "inductor")
# The torch.compile backend of each mode.
BACKENDS = {"aot_eager": "aot_eager", "inductor": "inductor"}
# The cell's scratch subdirectory that holds the compile caches, one
# directory per build below it (cache_dir).
CACHE_SUBDIR = "capd-compile"
# The compile-time note's message (docs/runner.md, "Compiled cells (mode)"):
# key=value words, compile_s first.
COMPILE_NOTE = "compile_s=%.6f mode=%s backend=%s pass=%s"
# The root module's name in record keys (docs/protocol.md).
ROOT = "model"
# How long the compiler check may take (seconds).
CXX_TIMEOUT_S = 60

# What prepare found in this process: the reason a compiled cell cannot run
# ("reason"), the C++ compiler (cxx_info), the cache directory.
_state = {}


def mode_of(spec):
    """The cell's mode: "eager" for a spec without one."""
    m = getattr(spec, "mode", None)
    return "eager" if m is None else m


def is_compiled(spec):
    return mode_of(spec) in COMPILED_MODES


# --- what this torch and host can do -------------------------------------------

def _torch_version(torch):
    return str(getattr(torch, "__version__", "unknown"))


def compile_reason(torch, mode):
    """Why this torch cannot torch.compile at all, or None."""
    if not hasattr(torch, "compile"):
        return ("mode %s needs torch.compile (torch 2.0 or later); this is torch %s"
                % (mode, _torch_version(torch)))
    try:
        from torch._dynamo import eval_frame
        check = getattr(eval_frame, "check_if_dynamo_supported", None)
        if check is not None:
            check()
    except ImportError:
        pass
    except Exception as e:
        return ("mode %s: torch.compile is not supported here (torch %s, Python %s): %s"
                % (mode, _torch_version(torch), sys.version.split()[0], e))
    return None


def _cxx_name(torch):
    """(the C++ compiler Inductor would use, how it was asked); raises
    where Inductor finds none (InvalidCxxCompiler)."""
    try:
        from torch._inductor import cpp_builder  # 2.4+
        fn = getattr(cpp_builder, "get_cpp_compiler", None)
        if fn is not None:
            return fn(), "torch._inductor.cpp_builder.get_cpp_compiler"
    except ImportError:
        pass
    from torch._inductor import codecache  # 2.0 to 2.3
    return codecache.cpp_compiler(), "torch._inductor.codecache.cpp_compiler"


def _first_line(text):
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()
    return ""


def _run(argv, cwd=None):
    env = dict(os.environ, LC_ALL="C")
    p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, env=env, cwd=cwd, timeout=CXX_TIMEOUT_S)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


_TEST_SOURCE = """#include <cmath>
#include <omp.h>
extern "C" double capd_compile_check(double x) { return std::sqrt(x) + omp_get_max_threads(); }
"""


def _cxx_builds(path, workdir):
    """None where PATH builds a shared library with OpenMP (what Inductor's
    CPU kernels are), else why not."""
    d = tempfile.mkdtemp(prefix="cxx-check-", dir=workdir)
    try:
        src = os.path.join(d, "check.cpp")
        with open(src, "w") as f:
            f.write(_TEST_SOURCE)
        argv = [path, "-shared", "-fPIC", "-O1"]
        if sys.platform.startswith("linux"):
            argv.append("-fopenmp")
        argv += [src, "-o", os.path.join(d, "check.so")]
        rc, out, err = _run(argv, cwd=d)
        if rc != 0:
            return "%s exited %d: %s" % (" ".join(argv[:1] + argv[1:5]), rc,
                                         _first_line(err) or _first_line(out))
        return None
    except (OSError, subprocess.SubprocessError) as e:
        return "%s: %s" % (type(e).__name__, e)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def cxx_info(torch, workdir=None):
    """Inductor's C++ compiler: {"compiler" (as Inductor names it), "path",
    "version" (its --version's first line), "source" (how it was found),
    "works" (it built a test library), "error"}; asked once a process."""
    got = _state.get("cxx")
    if got is not None:
        return got
    info = {"compiler": None, "path": None, "version": None, "works": False}
    try:
        name, source = _cxx_name(torch)
        info["compiler"], info["source"] = str(name), source
    except Exception as e:
        info["error"] = "Inductor finds no C++ compiler: %s: %s" % (type(e).__name__, e)
        _state["cxx"] = info
        return info
    path = shutil.which(info["compiler"]) or (info["compiler"] if os.path.isabs(info["compiler"])
                                              else None)
    info["path"] = path
    if path is None:
        info["error"] = "C++ compiler %s not found on PATH" % info["compiler"]
        _state["cxx"] = info
        return info
    try:
        rc, out, err = _run([path, "--version"])
        info["version"] = _first_line(out) or _first_line(err) or None
    except (OSError, subprocess.SubprocessError) as e:
        info["error"] = "%s --version: %s: %s" % (path, type(e).__name__, e)
        _state["cxx"] = info
        return info
    why = _cxx_builds(path, workdir)
    if why is None:
        info["works"] = True
    else:
        info["error"] = "%s cannot build a shared library with OpenMP: %s" % (path, why)
    _state["cxx"] = info
    return info


def unsupported_reason(torch, spec, cxx=True):
    """Why this compiled cell cannot run here (its end ``unsupported``), or
    None. Cheap checks first; the C++ compiler (inductor) last, where CXX."""
    mode = mode_of(spec)
    why = compile_reason(torch, mode)
    if why:
        return why
    if spec.device != "cpu":
        return ("mode %s runs on the CPU only for now; this cell's device is %s"
                % (mode, spec.device))
    if spec.granularity == "op":
        return ("mode %s records the model's inputs and outputs only: per-op capture "
                "(granularity op) is not defined under torch.compile" % mode)
    if spec.options.get("target_op"):
        return ("mode %s records the model's inputs and outputs only: option target_op "
                "(targeted capture) needs hooks inside the model, which would change what "
                "is compiled" % mode)
    from capd_runner import opreplay
    if opreplay.wanted(spec):
        return ("mode %s: option target_inputs (op or module replay on recorded inputs) "
                "replays an eager call; it is not defined for compiled cells" % mode)
    if mode == "inductor" and cxx:
        cxx = cxx_info(torch, _state.get("cache_dir"))
        if not cxx.get("works"):
            return "mode inductor needs a working C++ compiler for Inductor's CPU kernels: %s" % (
                cxx.get("error") or "none found")
    return None


# --- caches and configuration ------------------------------------------------------

def build_key(torch):
    """What tells this build from another: its interpreter, torch's location
    and version (12 hex digits of their SHA-256)."""
    version = getattr(torch, "version", None)
    parts = [sys.executable, os.path.realpath(getattr(torch, "__file__", "") or ""),
             _torch_version(torch), str(getattr(version, "git_version", ""))]
    return hashlib.sha256("\0".join(parts).encode("utf-8", "surrogateescape")).hexdigest()[:12]


def cache_dir(spec, torch):
    """The compile caches' directory: <scratch>/capd-compile/<build key>, so
    nothing is shared between cells or between a paired cell's two builds;
    a fresh temporary directory where the spec names no scratch."""
    if spec.scratch:
        return os.path.join(spec.scratch, CACHE_SUBDIR, build_key(torch))
    got = _state.get("tmp_cache")
    if got is None:
        got = _state["tmp_cache"] = tempfile.mkdtemp(prefix="capd-compile-")
    return got


def setup(torch, spec):
    """Before anything compiles in this process (the cell, a timing
    process): Inductor's and Triton's caches inside the cell's scratch
    (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR: the cell's own variables,
    which the fingerprint lists under env_per_cell), and for inductor one
    compile thread (no pool of compile workers beside the timed iterations)
    unless the build's environment sets TORCHINDUCTOR_COMPILE_THREADS, and
    Inductor held to the width's ISA (hold_isa)."""
    d = cache_dir(spec, torch)
    ind, tri = os.path.join(d, "inductor"), os.path.join(d, "triton")
    for p in (ind, tri):
        try:
            os.makedirs(p, exist_ok=True)
        except OSError:
            pass
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = ind
    os.environ["TRITON_CACHE_DIR"] = tri
    _state["cache_dir"] = d
    if mode_of(spec) == "inductor":
        _state["held_out"] = hold_isa(spec)
    if mode_of(spec) == "inductor" and "TORCHINDUCTOR_COMPILE_THREADS" not in os.environ:
        try:
            import torch._inductor.config as icfg
            if hasattr(icfg, "compile_threads"):
                icfg.compile_threads = 1
        except Exception:
            pass
    return d


# Inductor's vector ISAs capd takes out at a width (hold_isa): at avx512,
# the AMX one Inductor prefers there (AMX is a width of its own, amx).
HELD_OUT = {"avx512": ("VecAMX",)}


def hold_isa(spec):
    """Holds Inductor to the cell's width (docs/widths.md, "Inductor"): for
    ATEN_CPU_CAPABILITY=avx512 Inductor picks the first valid ISA whose name
    holds "avx512", which on an AMX host is VecAMX (AVX-512 code built with
    -mamx-tile, with AMX micro-kernels where it finds a use). At width
    avx512 capd takes the classes of HELD_OUT out of Inductor's list of
    valid ISAs (valid_vec_isa_list: cached a process, the one list every
    pick reads), so it picks VecAVX512VNNI or VecAVX512 there, and VecAMX
    at width amx. Returns the ISAs taken out (their names), [] for none;
    never raises."""
    names = HELD_OUT.get(getattr(spec, "width", None) or "", ())
    mod = _isa_module("valid_vec_isa_list") if names else None
    if mod is None:
        return []
    classes = tuple(getattr(mod, n) for n in names if hasattr(mod, n))
    try:
        isas = mod.valid_vec_isa_list()
        out = [str(i) for i in isas if classes and isinstance(i, classes)]
        isas[:] = [i for i in isas if not (classes and isinstance(i, classes))]
    except Exception:
        return []
    return out


def _isa_module(attr):
    """Inductor's module of its vector ISAs that has ATTR
    (torch._inductor.cpu_vec_isa; codecache before torch 2.4), or None."""
    import importlib
    for name in ("torch._inductor.cpu_vec_isa", "torch._inductor.codecache"):
        try:
            mod = importlib.import_module(name)
        except Exception:
            continue
        if getattr(mod, attr, None) is not None:
            return mod
    return None


def _vec_isa_text():
    """str(pick_vec_isa()): Inductor's vector ISA (probes the CPU and the
    compiler once a process)."""
    mod = _isa_module("pick_vec_isa")
    if mod is None:
        raise RuntimeError("no pick_vec_isa in torch._inductor.cpu_vec_isa or .codecache")
    return str(mod.pick_vec_isa())


def prepare(torch, spec):
    """In the cell, before the libraries are read and the fingerprint is
    made: whether the cell can run (the reason it cannot, or None); where it
    can, the caches set up and, for inductor, Inductor's vector ISA probed,
    so that capd_runner/libs.py reads it (and holds it to the width's
    ceiling) and the fingerprint names it."""
    why = unsupported_reason(torch, spec, cxx=False)
    if why is None:
        setup(torch, spec)
        why = unsupported_reason(torch, spec)
    _state["reason"] = why
    if why is None and mode_of(spec) == "inductor":
        try:
            _state["vec_isa"] = _vec_isa_text()
        except Exception as e:
            _state["vec_isa_error"] = "%s: %s" % (type(e).__name__, e)
    return why


def _config_values(torch):
    """Inductor's settings that change what it generates, where this torch
    has them."""
    out = {}
    try:
        import torch._inductor.config as icfg
    except Exception as e:
        return {"error": "%s: %s" % (type(e).__name__, e)}
    cpp = getattr(icfg, "cpp", None)
    for key, owner, attr in (("cpp.simdlen", cpp, "simdlen"),
                             ("cpp.vec_isa_ok", cpp, "vec_isa_ok"),
                             ("cpp.cxx", cpp, "cxx"),
                             ("fx_graph_cache", icfg, "fx_graph_cache"),
                             ("freezing", icfg, "freezing"),
                             ("cpp_wrapper", icfg, "cpp_wrapper"),
                             ("max_autotune", icfg, "max_autotune"),
                             ("fallback_random", icfg, "fallback_random"),
                             ("compile_threads", icfg, "compile_threads")):
        try:
            if owner is None or not hasattr(owner, attr):
                continue
            v = getattr(owner, attr)
            if isinstance(v, (tuple, list)):
                v = [x if isinstance(x, (str, int, float, bool)) or x is None else str(x)
                     for x in v]
            elif not (isinstance(v, (str, int, float, bool)) or v is None):
                v = str(v)
            out[key] = v
        except Exception:
            continue
    return out


def describe(torch, mode, scratch=None):
    """The fingerprint's ``compile`` object of a compiled cell (never
    raises; a field that cannot be read is left out or says why)."""
    out = {"mode": mode, "backend": BACKENDS.get(mode), "dynamic": False,
           "available": hasattr(torch, "compile"), "records": "model"}
    reason = _state.get("reason")
    if reason:
        out["unsupported"] = reason
    d = _state.get("cache_dir")
    if d:
        # The per-cell part of the path as <scratch>, so two cells of one
        # build agree.
        root = (scratch or "").rstrip("/")
        out["cache_dir"] = ("<scratch>" + d[len(root):] if root and d.startswith(root + "/")
                            else d)
    if mode != "inductor" or not out["available"]:
        return out
    try:
        from capd_runner import libs
        if "vec_isa" in _state:
            text = _state["vec_isa"]
            out["vec_isa"] = text
            out["isa"] = libs.inductor_level(text)
            out["vec_isa_source"] = "pick_vec_isa: %s; ATEN_CPU_CAPABILITY=%s" % (
                text, os.environ.get("ATEN_CPU_CAPABILITY", "<unset>"))
            if _state.get("held_out"):
                out["vec_isa_held_out"] = list(_state["held_out"])
        elif "vec_isa_error" in _state:
            out["vec_isa"] = None
            out["vec_isa_error"] = _state["vec_isa_error"]
    except Exception as e:
        out["vec_isa_error"] = "%s: %s" % (type(e).__name__, e)
    try:
        cxx = _state.get("cxx")
        if cxx is not None:
            out["cxx"] = dict(cxx)
    except Exception:
        pass
    try:
        out["config"] = _config_values(torch)
    except Exception as e:
        out["config"] = {"error": "%s: %s" % (type(e).__name__, e)}
    return out


# --- compiling and the first call ----------------------------------------------------

def compile_model(torch, model, spec):
    """torch.compile of MODEL for the cell's mode, dynamic=False (compiles
    at its first call)."""
    return torch.compile(model, backend=BACKENDS[mode_of(spec)], dynamic=False)


def _now_ns():
    fn = getattr(time, "perf_counter_ns", None)
    return fn() if fn is not None else int(time.perf_counter() * 1e9)


def first_call(torch, target, model, call, spec, projection):
    """One pass through TARGET, the compiled model, as the cell's pass runs
    it (forward: eval, no_grad; backward: train, forward, projection loss,
    backward), so that its graphs (the backward's too) are compiled before
    anything is recorded or timed; the gradients are cleared after it.
    Returns its wall time in ns: tracing, compiling and one run of the pass."""
    backward = spec.pass_ != "forward"
    t0 = _now_ns()
    if backward:
        target.train()
        model.zero_grad(set_to_none=True)
        with torch.enable_grad():
            out = call(target)
            projection.loss(out).backward()
            del out
        model.zero_grad(set_to_none=True)
    else:
        target.eval()
        with torch.no_grad():
            call(target)
    return _now_ns() - t0


def _dynamo_counts():
    """(graphs compiled, graph breaks) in this process, where torch counts
    them; None for what it does not."""
    graphs = breaks = None
    try:
        from torch._dynamo.utils import counters
        stats = counters.get("stats") or {}
        if "unique_graphs" in stats:
            graphs = int(stats["unique_graphs"])
        breaks = int(sum((counters.get("graph_break") or {}).values()))
    except Exception:
        pass
    return graphs, breaks


def compile_note(spec, ns):
    """The compile-time note's message (COMPILE_NOTE, then graphs= and
    graph_breaks= where torch counts them)."""
    mode = mode_of(spec)
    msg = COMPILE_NOTE % (ns / 1e9, mode, BACKENDS[mode], spec.pass_)
    graphs, breaks = _dynamo_counts()
    if graphs is not None:
        msg += " graphs=%d" % graphs
    if breaks is not None:
        msg += " graph_breaks=%d" % breaks
    return msg


def for_timing(torch, model, call, spec, projection):
    """In a timing process (capd_runner/cell.py timing_run): the compiled
    model, compiled at its first call, before the warmup; (compiled model,
    that call's ns)."""
    setup(torch, spec)
    why = compile_reason(torch, mode_of(spec))
    if why:
        raise RuntimeError(why)
    target = compile_model(torch, model, spec)
    return target, first_call(torch, target, model, call, spec, projection)


# --- capture: the root module call only --------------------------------------------

class RootCapture(object):
    """The records of one call of a compiled model: its positional inputs
    and its output as the root module call's (``model.0.forward.input.<i>``,
    ``model.0.forward.output.<i>``), and with taps (backward) the gradients
    reaching them (``grad_output``, then ``grad_input``), through the
    recorder an eager cell's capture uses (capd_runner/capture.py), in the
    same order an eager cell records them for the root."""

    def __init__(self, torch, recorder, taps):
        self.torch = torch
        self.rec = recorder
        self.taps = taps
        self.sync = getattr(getattr(recorder, "pipeline", None), "sync", True)

    def _flush(self):
        if self.sync:
            self.rec.pipeline.hook_done()

    def _record(self, flat, role):
        for i, t in enumerate(flat):
            self.rec.record(ROOT, 0, "forward", role, i, t)
        self._flush()

    def _tap(self, flat, role):
        """FLAT with the tensors that need grad routed through capture.py's
        tap (outside the compiled region); None if none need grad."""
        from capd_runner.capture import tap
        rec = self.rec

        def on_grads(got):
            for pos, g in got:
                rec.record(ROOT, 0, "backward", role, pos, g)
            self._flush()

        return tap(rec, flat, on_grads)

    def _side(self, obj, role):
        """Records the tensors of OBJ (the call's args, or its output) as
        ROLE ("input" or "output"); with taps, OBJ with those that need
        grad tapped for grad_<ROLE>."""
        from capd_runner.capture import flatten, rebuild
        flat = flatten(obj)
        self._record(flat, role)
        if self.taps:
            new = self._tap(flat, "grad_" + role)
            if new is not None:
                return rebuild(obj, iter(new))
        return obj

    def __call__(self, target, call):
        args = self._side(call.args, "input")
        return self._side(target(*args, **call.kwargs), "output")


def capture_run(torch, target, model, call, spec, recorder, projection):
    """One capture run of a compiled cell's pass through TARGET (the
    compiled model; the eager float64 copy for the reference run), records
    at the root only (RootCapture), parameter gradients from MODEL after
    backward() as an eager cell's."""
    from capd_runner import cell
    torch.manual_seed(spec.seed)
    if spec.pass_ == "forward":
        target.eval()
        with torch.no_grad():
            RootCapture(torch, recorder, False)(target, call)
    else:
        target.train()
        model.zero_grad(set_to_none=True)
        with torch.enable_grad():
            out = RootCapture(torch, recorder, True)(target, call)
            loss = projection.loss(out)
            loss.backward()
            del out, loss
    cell._end_run(model, recorder, spec.pass_ != "forward")


def run_model(torch, spec, writer, device, pipeline, forkers):
    """A compiled cell's model, capture, timing and memory (cell._run_model's
    order): build, init records, compile (the compile-time note), capture
    twice, nondeterministic, timing, memory."""
    import gc
    from capd_runner import cell
    from capd_runner.capture import Recorder

    model, inputs, call, projection, budget, first = cell._prepare(torch, spec, device, writer,
                                                                   pipeline)

    # The model is compiled as it is built and timed: inplace flags stay
    # (no hook inside it needs them off; functionalisation makes the values
    # the same).
    snap = cell._snapshot_buffers(torch, model)
    target = compile_model(torch, model, spec)
    ns = first_call(torch, target, model, call, spec, projection)
    cell._restore_buffers(torch, snap)
    writer.note("info", compile_note(spec, ns))
    writer.flush()

    capture_run(torch, target, model, call, spec, first, projection)
    cell._restore_buffers(torch, snap)
    second = Recorder(writer, pipeline, "stats", spec.sample_size, budget, emit=False,
                      like=first)
    capture_run(torch, target, model, call, spec, second, projection)
    cell._restore_buffers(torch, snap)
    if spec.options.get("reference") == "float64":
        # The float64 copy runs eagerly (never compiled: it is the arbiter),
        # with the records of a compiled cell (root and parameter gradients).
        cell._reference_run(torch, spec, writer, pipeline, budget, model, inputs, first.seq,
                            run=lambda m, c, rec, proj: capture_run(torch, m, m, c, spec, rec,
                                                                    proj))
    del snap
    pipeline.stop()
    pipeline.pool.clear()

    cell._emit_nondeterministic(writer, first, second)

    gc.collect()
    cell._timing(torch, spec, writer, forkers,
                 lambda: cell.timing_run(torch, model, call, spec, projection, device,
                                         compiled=target))
    writer.frame({"kind": "memory", "peak_rss_bytes": cell.peak_rss_bytes()})
    writer.flush()


def skip_profile(spec, writer, done=None):
    """Where options.profile would run a profiled process (or pair) after a
    compiled cell's timing: a note that it is not run (the profiled process
    hooks every module of the eager model, which a compiled cell does not
    run), instead of the profile frames."""
    from capd_runner import cell
    if spec.profile == "off" or spec.iterations <= 0:
        return
    if done is None:
        if spec.profile != "always":
            return
    else:
        try:
            from capd_runner import profile
            if profile._why_paired(spec, done) is None:
                return
        except Exception:
            return
    cell._say(writer, "info", "profiled %s: not run: it hooks every module of the eager model, "
              "which a compiled cell (mode %s) does not run"
              % ("pair" if done is not None else "process", mode_of(spec)))

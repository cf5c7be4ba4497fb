"""One cell: width check, model, capture (twice), timing, memory.

Frame order (docs/protocol.md): hello, env, tensor..., nondeterministic,
timing, profile (capd_runner/profile.py), memory, end.
"""

import gc
import os
import resource
import sys
import time
import traceback

from capd_runner import PROTOCOL, RUNNER_NAME

EXIT_OK = 0
EXIT_FAILED = 1


class CellFailed(Exception):
    """A failure with a clear reason and no traceback worth sending."""


# What the frameworks say when an allocation fails (docs/runner.md, "oom"):
# PyTorch's CPU allocator, CUDA's caching allocator and ROCm's. A oneDNN
# primitive that cannot be created is an allocation failure only when one
# came first (it is also what an unsupported shape says).
_ALLOC_FAILURES = (
    "DefaultCPUAllocator: can't allocate memory",
    "CUDA out of memory",
    "HIP out of memory",
    "CUDA error: out of memory",
    "std::bad_alloc",
)
_ONEDNN_PRIMITIVE = "could not create a primitive"


def _alloc_failure(e):
    return (isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError"
            or any(p in str(e) for p in _ALLOC_FAILURES))


def is_out_of_memory(exc):
    """Whether EXC (or an exception it was raised from or while handling)
    is the framework failing to allocate memory."""
    seen, chain = set(), []
    e = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        chain.append(e)
        e = e.__cause__ or e.__context__
    if any(_alloc_failure(x) for x in chain):
        return True
    return _ONEDNN_PRIMITIVE in str(exc) and _alloc_failed_before[0]


# Set once an allocation failure was seen in this process (a cell that
# caught one and went on), so a oneDNN primitive failing after it counts.
_alloc_failed_before = [False]


def _now_ns():
    fn = getattr(time, "perf_counter_ns", None)  # 3.7+
    if fn is not None:
        return fn()
    return int(time.perf_counter() * 1e9)


def _dtype(torch, name):
    return getattr(torch, name)


# --- model preparation -------------------------------------------------------

def _build(torch, spec, dtype):
    from capd_runner import opreplay
    if opreplay.wanted(spec):
        # Recorded inputs: an op call instead of the cell's model, or one
        # module call of the model (modreplay.py) given them.
        return opreplay.build(spec, dtype, lambda: _model(torch, spec, dtype))
    return _model(torch, spec, dtype)


def _model(torch, spec, dtype):
    """(model, inputs) of the cell's model: a user model's or the zoo's."""
    from capd_runner import usermodel, zoo
    name = spec.model
    if usermodel.is_user_model(name):
        try:
            factory = usermodel.load_factory(name, spec.model_roots)
        except usermodel.UserModelError as e:
            raise CellFailed(str(e))
        torch.manual_seed(spec.seed)
        result = factory(spec.seed, spec.batch, dtype)
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            raise CellFailed("user model factory %s returned %s, not (model, inputs)"
                             % (name, type(result).__name__))
        model, inputs = result
        if not isinstance(model, torch.nn.Module):
            raise CellFailed("user model factory %s returned a %s as model, not an nn.Module"
                             % (name, type(model).__name__))
        return model, inputs
    try:
        return zoo.build(name, spec.seed, spec.batch)
    except zoo.ModelError as e:
        raise CellFailed(str(e))


def _place(torch, obj, device, dtype):
    """Move tensors of ``obj`` to ``device``; floating ones to ``dtype``."""
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point():
            return obj.to(device=device, dtype=dtype)
        return obj.to(device=device)
    if isinstance(obj, tuple):
        items = [_place(torch, x, device, dtype) for x in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
    if isinstance(obj, list):
        return [_place(torch, x, device, dtype) for x in obj]
    if isinstance(obj, dict):
        return dict((k, _place(torch, v, device, dtype)) for k, v in obj.items())
    return obj


class Call(object):
    """How to call the model on its inputs."""

    def __init__(self, inputs):
        if isinstance(inputs, dict):
            self.args, self.kwargs = (), inputs
        elif isinstance(inputs, (tuple, list)):
            self.args, self.kwargs = tuple(inputs), {}
        else:
            self.args, self.kwargs = (inputs,), {}

    def __call__(self, model):
        return model(*self.args, **self.kwargs)


def _switch_inplace_off(model):
    saved = []
    for m in model.modules():
        if isinstance(getattr(m, "inplace", None), bool) and m.inplace:
            saved.append(m)
            m.inplace = False
    return saved


def _restore_inplace(saved):
    for m in saved:
        m.inplace = True


def _snapshot_buffers(torch, model):
    with torch.no_grad():
        return [(b, b.detach().clone()) for b in model.buffers()]


def _restore_buffers(torch, snap):
    with torch.no_grad():
        for b, saved in snap:
            b.copy_(saved)


class Projection(object):
    """loss = sum over the output's floating tensors of sum(out * P), with P a
    fixed seeded tensor per output (tensors.det_uniform), made at first use."""

    def __init__(self, torch, seed):
        self.torch = torch
        self.seed = seed
        self.tensors = None

    def loss(self, output):
        from capd_runner import capture
        from capd_runner.tensors import det_uniform, generator
        torch = self.torch
        outs = [t for t in capture.flatten(output) if t.requires_grad]
        if not outs:
            raise CellFailed("backward pass: no output of the model requires grad")
        if self.tensors is None:
            g = generator(self.seed * 1000003 + 2)
            self.tensors = [det_uniform(t.shape, g).to(device=t.device, dtype=t.dtype)
                            for t in outs]
        loss = None
        for t, p in zip(outs, self.tensors):
            term = (t * p).sum()
            loss = term if loss is None else loss + term
        return loss


# --- runs ------------------------------------------------------------------

def capture_run(torch, model, call, spec, recorder, projection):
    """One capture run of the cell's pass; records via ``recorder``."""
    from capd_runner.capture import Capture
    torch.manual_seed(spec.seed)
    gran = spec.granularity
    target = spec.options.get("target_op") or ""  # docs/runner.md, "Targeted capture"
    if spec.pass_ == "forward":
        model.eval()
        with torch.no_grad():
            with Capture(model, recorder, taps=False, granularity=gran, target_op=target):
                call(model)
    else:
        model.train()
        model.zero_grad(set_to_none=True)
        with torch.enable_grad():
            with Capture(model, recorder, taps=True, granularity=gran,
                         target_op=target) as cap:
                out = call(model)
                loss = projection.loss(out)
                loss.backward()
            del out, loss
            cap.remove()
    _end_run(model, recorder, spec.pass_ != "forward")


def _end_run(model, recorder, backward):
    """A capture run's end (eager and compiled cells alike): after BACKWARD,
    the parameters' gradients recorded, then cleared; the recorder synced,
    its cache cleared, its frames flushed."""
    from capd_runner.capture import param_owner
    if backward:
        for name, p in model.named_parameters():
            if p.grad is not None:
                owner, local = param_owner(name)
                recorder.record(owner, 0, "backward", "param_grad", local, p.grad)
        model.zero_grad(set_to_none=True)
    recorder.sync()
    recorder.clear_cache()
    if recorder.emit:
        recorder.writer.flush()


# The most iterations one sample may time back to back.
MAX_LOOPS = 100000


def timing_run(torch, model, call, spec, projection, device, compiled=None):
    """Warmup, then ``iterations`` samples. A sample times ``loops``
    iterations back to back and is their mean: loops is 1 unless the
    iterations would add up to less than ``timing_min_ms``, and then enough
    for that, estimated from the fastest warmup iteration (a model of 40 us
    an iteration gets a stable median without thousands of samples).

    Returns the timing frame's measurements (docs/protocol.md, "timing"):
    ``samples_ns`` (wall), ``loops``, ``own_samples_ns`` (each sample less
    the run-queue delay of this thread, the one that runs the model:
    capd_runner/clocks.py), ``cpu_samples_ns`` (this thread's CPU time,
    only with one intra-op thread on the CPU, where it holds all the work)
    and, over the timed samples, ``runqueue_ns`` (every thread of the
    process; None, and no own samples, where the kernel keeps no such
    count), ``cpu_ns`` (the process's CPU time, every thread) and
    ``steal_ns`` (the host's, context; None where not visible) and, on a
    GPU, ``device_samples_ns``: each sample's span on the device's stream
    between two events recorded around its iterations (docs/runner.md,
    "Device time").

    A compiled cell (spec mode aot_eager, inductor: capd_runner/compiled.py)
    times COMPILED, the cell's compiled model, where it has one (timing in
    the cell itself); a timing process compiles MODEL first, at one untimed
    pass before the warmup, and adds that pass's time as ``compile_ns``."""
    from capd_runner import clocks
    target = model
    compile_ns = None
    if compiled is not None:
        target = compiled
    elif getattr(spec, "mode", None) not in (None, "eager"):
        from capd_runner import compiled as compiledmod
        target, compile_ns = compiledmod.for_timing(torch, model, call, spec, projection)
    cuda = device.type == "cuda"
    backward = spec.pass_ != "forward"
    cpu_clock = not cuda and torch.get_num_threads() == 1 and hasattr(time, "thread_time_ns")
    delay = clocks.ThreadDelay()
    events = clocks.DeviceEvents(torch) if cuda else None
    cpu, own, dev = [], [], []

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    def timed(loops):
        if backward:
            model.zero_grad(set_to_none=True)
        sync()
        # The CPU clock's reads sit next to the wall clock's, inside the
        # run-queue reads: a CPU sample covers the wall sample and two clock
        # reads, never the reads of schedstat (tens of microseconds in a VM).
        ta = _now_ns()
        r0 = delay.now()
        c0 = time.thread_time_ns() if cpu_clock else 0
        t0 = _now_ns()
        if events:
            events.start()
        for i in range(loops):
            if backward and i:
                model.zero_grad(set_to_none=True)
            out = call(target)
            if backward:
                projection.loss(out).backward()
        if events:
            events.stop()
        sync()
        t1 = _now_ns()
        c1 = time.thread_time_ns() if cpu_clock else 0
        r1 = delay.now()
        td = _now_ns()
        wall = t1 - t0
        if cpu_clock:
            cpu.append((c1 - c0) // loops)
        # A wait the two reads count ended after the first and began before
        # the second: inside [t0, t1], or within the reads themselves, so
        # taking their time off the delay never makes own time too small.
        waited = max(0, (r1 - r0) - (t0 - ta) - (td - t1))
        own.append(max(0, wall - waited) // loops)
        if events:
            dev.append(events.elapsed_ns() // loops)
        return wall // loops

    target.train() if backward else target.eval()
    with (torch.enable_grad() if backward else torch.no_grad()):
        fastest = min([timed(1) for _ in range(spec.warmup)] or [0])
        want = spec.timing_min_ms * 1000000 // max(spec.iterations, 1)
        loops = 1 if fastest <= 0 else max(1, min(MAX_LOOPS, -(-want // fastest)))
        del cpu[:], own[:], dev[:]
        before = (clocks.process_delays(), time.process_time_ns(), clocks.steal_ns())
        samples = [timed(loops) for _ in range(spec.iterations)]
        waits = clocks.delay_since(before[0])
        cpu_ns = time.process_time_ns() - before[1]
        steal = clocks.steal_ns()
    if backward:
        model.zero_grad(set_to_none=True)
    delay.close()
    res = {"samples_ns": samples, "loops": loops, "cpu_ns": cpu_ns,
           "runqueue_ns": waits if delay.ok else None,
           "steal_ns": steal - before[2] if steal is not None and before[2] is not None else None}
    if delay.ok:
        res["own_samples_ns"] = own
    if cpu_clock:
        res["cpu_samples_ns"] = cpu
    if events:
        res["device_samples_ns"] = dev
    if compile_ns is not None:
        res["compile_ns"] = compile_ns
    return res


def peak_rss_bytes():
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(r) if sys.platform == "darwin" else int(r) * 1024


# --- the cell ----------------------------------------------------------------

def run(spec, writer):
    """Runs the cell; returns the exit code. ``hello`` is already written."""
    from capd_runner import width as widthmod

    missing = widthmod.host_missing(spec.width_requires)
    if missing:
        writer.end("unsupported", "this host's CPU lacks %s (needed by width %s)"
                   % (", ".join(missing), spec.width))
        return EXIT_OK
    try:
        import torch
    except Exception:
        writer.note("error", traceback.format_exc())
        writer.end("failed", "cannot import torch: %s" % (sys.exc_info()[1],))
        return EXIT_FAILED

    from capd_runner import timing

    # The CPUs the scheduler gave this cell (exclusive for a timing cell);
    # the timing processes inherit them.
    timing.set_affinity(spec.raw.get("cpus"))
    forker, ref = _forkers(spec, timing)
    try:
        return _run_cell(torch, spec, writer, (forker, ref))
    finally:
        for f in (ref, forker):
            if f is not None:
                f.close()


def _forkers(spec, timing):
    """(this build's timing processes, the control build's) before torch
    dispatches anything. A paired head cell starts both sides' templates
    the same way, by exec of each build's interpreter (or its zygote),
    while this process captures: a template forked from this cell would
    carry its heap and mappings, and with layouts fixed (capd_runner/
    layout.py) an A/A pair would time two different layouts. Otherwise
    the timing processes fork from here (docs/runner.md, "Paired timing")."""
    if timing.wanted(spec) <= 0 or spec.options.get("compiler_bisect") == "run":
        return None, None
    head = (spec.reference or {}).get("head") if timing.paired_wanted(spec) else None
    if head is not None:
        own = timing.TemplateForker(spec, head, "head")
        if own.ready:
            return own, timing.TemplateForker(spec, spec.reference, "control")
        sys.stderr.write("capd_runner: %s; the timing processes fork from the cell\n" % own.error)
    forker = timing.Forker(spec)
    ref = None
    if forker.ready and timing.paired_wanted(spec):
        ref = timing.TemplateForker(spec, spec.reference, "control")
    return forker, ref


def _width_mismatch(spec, effective):
    """Why the effective ATen capability is not the width's (the table's
    'effective' where capd sends it: width amx runs ATen at avx512), or
    None; width native accepts any."""
    from capd_runner.spec import expected_capability
    expected = expected_capability(spec)
    if expected is None or expected == effective:
        return None
    aten = os.environ.get("ATEN_CPU_CAPABILITY", "<unset>")
    requested = spec.width.strip().lower()
    if expected == requested:
        return ("requested width %s but the effective CPU capability is %s "
                "(ATEN_CPU_CAPABILITY=%s)" % (requested, effective, aten))
    return ("requested width %s (CPU capability %s) but the effective CPU capability is %s "
            "(ATEN_CPU_CAPABILITY=%s)" % (requested, expected, effective, aten))


def _device(torch, spec):
    """(device, its fingerprint entry, why it cannot be used or None)."""
    device = None
    device_info = {"requested": spec.device}
    device_error = None
    if spec.device == "gpu":
        try:
            ok = torch.cuda.is_available()
        except Exception as e:  # broken driver setups raise here
            ok = False
            device_error = "torch.cuda.is_available() raised %s: %s" % (type(e).__name__, e)
        if ok:
            device = torch.device("cuda", 0)
            props = torch.cuda.get_device_properties(0)
            device_info.update({
                "type": "cuda", "index": 0, "name": torch.cuda.get_device_name(0),
                "capability": list(torch.cuda.get_device_capability(0)),
                "total_memory": int(props.total_memory),
                "count": torch.cuda.device_count(),
            })
            # gcnArchName is the GPU's ISA on ROCm; CUDA builds answer with
            # the device name there, so NVIDIA gets sm_<major><minor>.
            arch = getattr(props, "gcnArchName", None)
            if getattr(torch.version, "hip", None) and arch:
                device_info["arch"] = arch
            elif not getattr(torch.version, "hip", None):
                device_info["arch"] = "sm_%d%d" % tuple(torch.cuda.get_device_capability(0))
            # Whether float32 matrix products may use TF32 (the
            # TORCH_ALLOW_TF32_CUBLAS_OVERRIDE variable turns it on too).
            try:
                device_info["allow_tf32"] = {
                    "matmul": bool(torch.backends.cuda.matmul.allow_tf32),
                    "cudnn": bool(torch.backends.cudnn.allow_tf32)}
                prec = getattr(torch, "get_float32_matmul_precision", None)
                if prec is not None:
                    device_info["float32_matmul_precision"] = prec()
            except Exception:  # informational only; never fail a cell here
                pass
        elif device_error is None:
            device_error = ("device gpu requested but torch.cuda.is_available() is False "
                            "(torch %s, built with CUDA %s / HIP %s)"
                            % (torch.__version__, getattr(torch.version, "cuda", None),
                               getattr(torch.version, "hip", None)))
    else:
        device = torch.device("cpu")
        device_info["type"] = "cpu"
    return device, device_info, device_error


def _run_cell(torch, spec, writer, forkers):
    from capd_runner import fingerprint, libs
    from capd_runner import width as widthmod

    if spec.threads > 0:
        # Intra-op and inter-op pools both follow options.threads (capd set
        # OMP/MKL/OPENBLAS_NUM_THREADS to the same number); the inter-op
        # pool can only be sized before its first use.
        torch.set_num_threads(spec.threads)
        try:
            torch.set_num_interop_threads(spec.threads)
        except RuntimeError:
            pass
    config_text = torch.__config__.show()
    effective = widthmod.effective(torch, config_text) or "unknown"

    device, device_info, device_error = _device(torch, spec)

    # A compiled cell (capd_runner/compiled.py): whether it can run, its
    # caches, and Inductor's ISA probed, before the libraries are read.
    compile_why = None
    if getattr(spec, "mode", "eager") != "eager":
        from capd_runner import compiled
        compile_why = compiled.prepare(torch, spec)
    if spec.options.get("compiler_bisect") == "run":  # capd_runner/compbisect.py
        from capd_runner import compbisect
        compile_why = compbisect.refusal(torch, spec, compile_why)

    # What the libraries under torch ran (capd_runner/libs.py): after the
    # capability is read (the oneDNN probe dispatches an operator), before
    # the model.
    libraries = libs.read(torch, config_text)
    wider = libs.ceiling(libraries, spec.width_isa)
    fp = fingerprint.collect(torch, config_text, effective, device_info,
                             libraries=libraries, scratch=spec.scratch,
                             mode=getattr(spec, "mode", "eager"))
    writer.frame({"kind": "env", "fingerprint": fp, "effective_width": effective})
    writer.flush()

    if compile_why is not None:
        writer.end("unsupported", compile_why)
        return EXIT_OK
    why = _width_mismatch(spec, effective)
    if why is None and wider:
        why = libs.reason(spec.width, spec.width_isa, wider)
    if why is not None:
        writer.end("unsupported", why)
        return EXIT_OK
    if device_error:
        writer.end("failed", device_error)
        return EXIT_FAILED

    from capd_runner.pipeline import (Pipeline, WorkerError, default_native_threads,
                                      default_workers)
    # The native capture pipe for CPU cells (capd_runner/native.py).
    pipeline = Pipeline(writer, workers=default_workers(torch.get_num_threads()),
                        native=device.type == "cpu",
                        native_threads=default_native_threads(torch.get_num_threads()))
    try:
        _run_model(torch, spec, writer, device, pipeline, forkers)
    except CellFailed as e:
        pipeline.abandon()
        writer.end("failed", str(e))
        return EXIT_FAILED
    except WorkerError as e:
        pipeline.abandon()
        writer.note("error", str(e))
        writer.end("failed", "runner error while analysing tensors (see note)")
        return EXIT_FAILED
    except Exception as e:
        tb = traceback.format_exc()
        pipeline.abandon()
        writer.flush()
        writer.note("error", tb)
        if is_out_of_memory(e):
            _alloc_failed_before[0] = True
            writer.end("oom", "the framework could not allocate memory: %s: %s"
                       % (type(e).__name__, str(e).strip().splitlines()[0][:400]
                          if str(e).strip() else ""))
            return EXIT_FAILED
        writer.end("failed", "exception in model code: %s: %s" % (type(e).__name__, e))
        return EXIT_FAILED
    writer.end("ok")
    return EXIT_OK


def _prepare(torch, spec, device, writer, pipeline):
    """The model and inputs built and placed, their Call and Projection,
    the PayloadBudget and the first capture's Recorder, after the initial
    parameters' records (eager and compiled cells alike):
    (model, inputs, call, projection, budget, first)."""
    from capd_runner.capture import PayloadBudget, Recorder, param_owner
    dtype = _dtype(torch, spec.dtype)
    model, inputs = _build(torch, spec, dtype)
    model = model.to(device=device, dtype=dtype)
    inputs = _place(torch, inputs, device, dtype)
    budget = PayloadBudget(spec.max_payload_bytes, spec.max_one_payload_bytes)
    first = Recorder(writer, pipeline, spec.capture, spec.sample_size, budget, emit=True)
    # Initial parameter values, before anything runs.
    for name, p in model.named_parameters():
        owner, local = param_owner(name)
        first.record(owner, 0, "init", "param", local, p)
    first.sync()
    writer.flush()
    first.clear_cache()
    first.hashes, first.order = {}, []  # the determinism check covers the runs only
    return model, inputs, Call(inputs), Projection(torch, spec.seed), budget, first


def _run_model(torch, spec, writer, device, pipeline, forkers):
    from capd_runner.capture import Recorder

    if spec.options.get("compiler_bisect") == "run":  # instead of capture and timing
        from capd_runner import compbisect
        return compbisect.run_cell(torch, spec, writer, pipeline)
    if getattr(spec, "mode", "eager") != "eager":
        from capd_runner import compiled
        return compiled.run_model(torch, spec, writer, device, pipeline, forkers)

    if spec.granularity == "op":
        from capd_runner import opcapture
        why = opcapture.unsupported_reason()
        if why:
            raise CellFailed(why)
    model, inputs, call, projection, budget, first = _prepare(torch, spec, device, writer,
                                                              pipeline)
    inplace = _switch_inplace_off(model)
    snap = _snapshot_buffers(torch, model)
    try:
        capture_run(torch, model, call, spec, first, projection)
        _restore_buffers(torch, snap)
        second = Recorder(writer, pipeline, "stats", spec.sample_size, budget, emit=False,
                          like=first)
        capture_run(torch, model, call, spec, second, projection)
        _restore_buffers(torch, snap)
        if spec.options.get("reference") == "float64":
            _reference_run(torch, spec, writer, pipeline, budget, model, inputs, first.seq)
    finally:
        _restore_inplace(inplace)
    del snap
    pipeline.stop()
    pipeline.pool.clear()

    _emit_nondeterministic(writer, first, second)

    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    _timing(torch, spec, writer, forkers, lambda: timing_run(torch, model, call, spec,
                                                           projection, device))
    mem = {"kind": "memory", "peak_rss_bytes": peak_rss_bytes()}
    if device.type == "cuda":
        mem["device_peak_bytes"] = int(torch.cuda.max_memory_allocated(device))
    writer.frame(mem)
    writer.flush()


# Records of the float64 reference carry this prefix on their module, so
# their keys are ref.float64/<key> (docs/compare.md, "Reference arbiter").
REFERENCE_PREFIX = "ref.float64/"


def _reference_run(torch, spec, writer, pipeline, budget, model, inputs, seq, run=None):
    """The job option reference float64: the same inputs through a float64
    copy of the model on the CPU, captured at the cell's level (RUN(model,
    call, recorder, projection) where given, else capture_run), its records
    under REFERENCE_PREFIX and their seq after the cell's own."""
    import copy
    from capd_runner.capture import Recorder
    cpu = torch.device("cpu")
    ref_model = copy.deepcopy(model).to(device=cpu, dtype=torch.float64)
    ref_call = Call(_place(torch, inputs, cpu, torch.float64))
    rec = Recorder(writer, pipeline, spec.capture, spec.sample_size, budget, emit=True)
    rec.prefix = REFERENCE_PREFIX
    rec.seq = seq
    if run is None:
        capture_run(torch, ref_model, ref_call, spec, rec, Projection(torch, spec.seed))
    else:
        run(ref_model, ref_call, rec, Projection(torch, spec.seed))
    del ref_model, ref_call


def _timing(torch, spec, writer, forkers, in_cell):
    """The timing frames: one per timing process, one after another, while
    this process waits (so a timing process has the cell's CPUs to itself);
    in this process when there is no template (iterations 0, no fork). A
    paired cell alternates the control build's processes with its own
    (_paired); where the control build's template fails before the first
    pair, a note says so and the cell times unpaired. A timing process
    killed past its time, or not started for want of it, is left out with
    a note (capd_runner/timing.py, Budget). After every timing process,
    the profiled pair where options.profile asks for it
    (capd_runner/profile.py)."""
    from capd_runner import profile, timing
    forker, ref = forkers
    frame = {"kind": "timing", "phase": spec.pass_, "warmup": spec.warmup,
             "iterations": spec.iterations}
    if forker is None or not forker.ready:
        frame.update(in_cell())
        frame.update({"threads": torch.get_num_threads(), "process": 0, "processes": 1})
        writer.frame(frame)
        writer.flush()
        return
    done = _paired(spec, writer, forker, ref, frame) if ref is not None else None
    compiled = getattr(spec, "mode", "eager") != "eager"
    if compiled:
        from capd_runner.compiled import skip_profile
    if done is not None:
        if compiled:
            skip_profile(spec, writer, done)
        else:
            profile.after_pairs(spec, writer, (forker, ref), frame, done)
        return
    n = spec.timing_processes
    timed = 0
    for i in range(n):
        res = _run_one(writer, forker, i, n, "timing process")
        if res is not None:
            writer.frame(timing.timing_frame(frame, res, i, n))
            writer.flush()
            timed += 1
    if not timed:
        _say(writer, "warn", "none of the %d timing processes finished: the cell has no timing"
             % n)
    elif compiled:
        skip_profile(spec, writer)
    else:
        profile.after_processes(spec, writer, forker, frame, n)


def _run_one(writer, forker, i, n, what):
    """Timing process I of N; None where it was killed past its time or
    not started for want of it (a note says which), CellFailed where it
    failed."""
    res = forker.run(i)
    _note_start(writer, forker, res, "the cell's")
    if "error" in res:
        if res.get("traceback"):
            writer.note("error", res["traceback"])
        if res.get("killed") or res.get("skipped"):
            _say(writer, "warn", "%s %d of %d: %s; the cell goes on without it"
                 % (what, i, n, res["error"]))
            return None
        raise CellFailed("%s %d of %d failed: %s" % (what, i, n, res["error"]))
    return res


def _say(writer, level, message):
    """A note, and the same line in the cell's log."""
    writer.note(level, message)
    sys.stderr.write("capd_runner: %s\n" % message)
    sys.stderr.flush()


def _note_start(writer, forker, res, side):
    """Says once per reason why SIDE's timing processes were started by
    exec, not forked (capd_runner/timing.py, fork_refusal)."""
    why = res.get("start_why")
    if res.get("start") != "exec" or not why or why in forker.noted:
        return
    forker.noted.add(why)
    _say(writer, "warn", "%s timing processes are fresh interpreters (exec), not forks: %s"
         % (side, why))


def _paired(spec, writer, forker, ref, frame):
    """Rounds of pairs, each pair the control build's process then this
    build's: ``timing_pairs`` first, then half as many (rounded up) a round
    while the pairs so far leave the verdict unknown (capd_runner/pairs.py),
    ``max_timing_rounds`` rounds at most. The pairs timed, as (control's
    result, this build's) each; None when the control build failed before
    any pair (time unpaired then)."""
    from capd_runner import pairs, timing
    done = []
    for rnd in range(spec.max_timing_rounds):
        k = pairs.round_size(spec.timing_pairs, rnd)
        got = []
        for i in range(len(done), len(done) + k):
            c = ref.run(i) if ref.pid is not None else {"error": ref.error}
            _note_start(writer, ref, c, "the control build's")
            if "error" in c:
                if c.get("traceback"):
                    writer.note("error", c["traceback"])
                _say(writer, "warn", "pair %d: the control build's timing process failed (%s); "
                     "%s" % (i, c["error"], "timing unpaired" if not done
                             else "keeping the %d pairs of the rounds before" % len(done)))
                return done or None
            h = _run_one(writer, forker, i, len(done) + k, "timing process")
            if h is not None:  # else the pair is left out, with a note
                got.append((c, h))
        n = len(done) + len(got)
        for i, (c, h) in enumerate(got, len(done)):
            writer.frame(timing.timing_frame(frame, c, i, n, pair=i, reference=True, round=rnd))
            writer.frame(timing.timing_frame(frame, h, i, n, pair=i, round=rnd))
        writer.flush()
        done += got
        if not pairs.wants_more(*pairs.observations(done)):
            break
    if not done:
        _say(writer, "warn", "no pair of timing processes finished: the cell has no timing")
    return done


def _emit_nondeterministic(writer, first, second):
    """The keys whose records differ between the capture runs (Recorders
    FIRST and SECOND, or stand in one only): one frame, or several when
    the list would not fit one header (FrameWriter.nondeterministic)."""
    keys = []
    seen = set()
    for key in first.order:
        if key in seen:
            continue
        seen.add(key)
        if first.hashes.get(key) != second.hashes.get(key):
            keys.append(key)
    for key in second.order:
        if key not in first.hashes and key not in seen:
            seen.add(key)
            keys.append(key)
    writer.nondeterministic(keys)


def start(spec, writer):
    writer.hello(PROTOCOL, RUNNER_NAME)
    return run(spec, writer)

"""Timing processes: each cell's timing is taken in several processes.

The iterations of one process share its memory layout, allocator state and
clock, so they are not independent samples of the build's speed; the process
is the unit of evidence (docs/compare.md, "Perf"). A cell therefore times
its model in ``options.timing_processes`` separate processes, one after
another, each doing its own warmup and iterations and reporting its samples
as one ``timing`` frame with a ``process`` index.

The processes are forks of a *template*: the cell forks it right after
``import torch``, before any operator has been dispatched (PyTorch picks its
CPU capability, oneDNN its ISA and OpenMP its thread pool lazily, which is
what the prefork zygote relies on as well). The template waits while the
cell captures; then, per request, it forks one timing process that builds
the model afresh from the spec, times it and sends its samples back over a
pipe. A fork is far cheaper than a fresh interpreter (importing torch takes
a second here) and still gives each process its own heap, caches and thread
pool. The cell process emits the frames itself, so only it writes to the
frame pipe, and it stays idle while a timing process runs.

The template dies with the cell (parent-death signal) and when its request
pipe closes. Where fork is impossible the cell times in its own process, as
one process.

A paired head cell (the spec has a ``reference``: docs/runner.md, "Paired
timing") has a second template, the control build's, in the environment
capd built for a cell of that build (``python -m capd_runner
--timing-template 0 3``: requests on fd 0, results on fd 3). When the
reference names the control build's prefork zygote, capd-exec hands the
template to that zygote, which forks it with torch already imported, as the
head's own template is a fork of the head's zygote-forked cell; otherwise
(or when the zygote cannot serve it) the interpreter starts afresh and
imports torch itself, a second or more. Either way both sides' timing
processes are forks of a template that did nothing but import torch.
"""

import ctypes
import json
import os
import signal
import sys
import time
import traceback

PR_SET_PDEATHSIG = 1
MAX_RESULT = 64 << 20


def _pdeathsig():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(ctypes.c_int(PR_SET_PDEATHSIG), ctypes.c_ulong(signal.SIGKILL),
                   ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
    except Exception:
        pass


def _readline(fd):
    buf = bytearray()
    while len(buf) < MAX_RESULT:
        b = os.read(fd, 65536)  # one result is outstanding at a time
        if not b:
            break
        buf += b
        if buf.endswith(b"\n"):
            break
    return bytes(buf)


def set_affinity(cpus):
    """Pins this process to ``cpus`` (a list of ints); False where refused."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        return False
    try:
        os.sched_setaffinity(0, set(cpus))
        return True
    except OSError:
        return False


def _monotonic_ns():
    """CLOCK_MONOTONIC: one clock for every process of the host."""
    fn = getattr(time, "monotonic_ns", None)
    return fn() if fn is not None else int(time.monotonic() * 1e9)


def _one_process(spec, index, out_fd):
    """In a timing process: build, place, time; one JSON line to out_fd."""
    from capd_runner import cell
    import torch
    if spec.threads > 0:
        torch.set_num_threads(spec.threads)
    device = torch.device("cuda", 0) if spec.device == "gpu" else torch.device("cpu")
    dtype = getattr(torch, spec.dtype)
    model, inputs = cell._build(torch, spec, dtype)
    model = model.to(device=device, dtype=dtype)
    call = cell.Call(cell._place(torch, inputs, device, dtype))
    projection = cell.Projection(torch, spec.seed)
    started = _monotonic_ns()
    samples, loops, cpu = cell.timing_run(torch, model, call, spec, projection, device)
    res = {"process": index, "samples_ns": samples, "loops": loops,
           "threads": torch.get_num_threads(),
           "started_ns": started, "ended_ns": _monotonic_ns()}
    if cpu is not None:
        res["cpu_samples_ns"] = cpu
    if hasattr(os, "sched_getaffinity"):
        res["cpus"] = sorted(os.sched_getaffinity(0))
    os.write(out_fd, (json.dumps(res) + "\n").encode())


def wanted(spec):
    """How many timing processes the cell takes (0: time in the cell itself)."""
    if spec.iterations <= 0 or not hasattr(os, "fork"):
        return 0
    return spec.timing_processes


def paired_wanted(spec):
    """Whether the cell times pairs with a control build (capd sent one)."""
    return spec.reference is not None and spec.timing_pairs > 0 and spec.iterations > 0


class Forker(object):
    """The template process and the pipes to it (see the module's text)."""

    def __init__(self, spec):
        self.pid = None
        cmd_r, cmd_w = os.pipe()
        res_r, res_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError:
            for fd in (cmd_r, cmd_w, res_r, res_w):
                os.close(fd)
            return
        if pid == 0:
            os.close(cmd_w)
            os.close(res_r)
            code = 0
            try:
                _pdeathsig()
                try:
                    os.close(spec.frame_fd)  # only the cell writes frames
                except OSError:
                    pass
                self._serve(spec, cmd_r, res_w)
            except BaseException:
                code = 1
            os._exit(code)
        os.close(cmd_r)
        os.close(res_w)
        self.pid, self.cmd, self.res = pid, cmd_w, res_r

    @staticmethod
    def _serve(spec, cmd_r, res_w):
        while True:
            line = _readline(cmd_r)
            if not line:
                return
            index = int(line)
            child = os.fork()
            if child == 0:
                code = 0
                try:
                    _pdeathsig()
                    _one_process(spec, index, res_w)
                except BaseException as e:
                    msg = {"process": index, "error": "%s: %s" % (type(e).__name__, e),
                           "traceback": traceback.format_exc()}
                    try:
                        os.write(res_w, (json.dumps(msg) + "\n").encode())
                    except OSError:
                        pass
                    code = 1
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
            _, status = os.waitpid(child, 0)
            if os.WIFSIGNALED(status):
                msg = {"process": index,
                       "error": "timing process killed by signal %d" % os.WTERMSIG(status)}
                os.write(res_w, (json.dumps(msg) + "\n").encode())

    def run(self, index):
        """Times one process; its result dict ({"error": ...} on failure)."""
        if self.pid is None:
            return {"error": "no timing template"}
        try:
            os.write(self.cmd, ("%d\n" % index).encode())
        except OSError:
            pass  # it is gone; what it said before it went is read below
        line = _readline(self.res)
        if not line:
            return {"error": "the timing template exited"}
        try:
            return json.loads(line.decode())
        except ValueError:
            return {"error": "unreadable timing result"}

    def close(self):
        if self.pid is None:
            return
        os.close(self.cmd)
        os.close(self.res)
        try:
            os.waitpid(self.pid, 0)
        except OSError:
            pass
        self.pid = None


def _limit_flags():
    """capd-exec's flags for this cell's own soft limits, which a template
    forked by a zygote (no child of this cell) must get too."""
    import resource
    out = []
    for flag, res in (("--as", resource.RLIMIT_AS), ("--cpu", resource.RLIMIT_CPU),
                      ("--nofile", resource.RLIMIT_NOFILE), ("--nproc", resource.RLIMIT_NPROC)):
        soft = resource.getrlimit(res)[0]
        if soft != resource.RLIM_INFINITY and soft > 0:
            out += [flag, str(soft)]
    return out


def _own_cgroup():
    """This cell's cgroup v2 directory when it may put a process there (its
    memory group), else None: the template then stays in the zygote's."""
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    d = "/sys/fs/cgroup" + line[3:].strip()
                    return d if os.access(os.path.join(d, "cgroup.procs"), os.W_OK) else None
    except OSError:
        pass
    return None


def _template_argv(ref):
    """The control build's template command line: through capd-exec and
    the control build's zygote when the reference names one."""
    prog = [ref["python"], "-m", "capd_runner", "--timing-template", "0", "3"]
    z = ref.get("zygote")
    if not isinstance(z, dict) or not z.get("socket") or not z.get("exec"):
        return prog
    flags = _limit_flags() + ["--zygote", z["socket"]]
    cg = _own_cgroup()
    if cg:
        flags += ["--cgroup", cg]
    return [z["exec"]] + flags + ["--"] + prog


class ReferenceForker(Forker):
    """The control build's template (see the module's text)."""

    def __init__(self, spec):
        self.pid = None
        self.error = None
        ref = spec.reference
        cmd_r, cmd_w = os.pipe()
        res_r, res_w = os.pipe()
        env = dict(ref["env"])
        # The same spec file as this cell's (capd names it in both envs).
        if os.environ.get("CAPD_CELL_SPEC"):
            env["CAPD_CELL_SPEC"] = os.environ["CAPD_CELL_SPEC"]
        argv = _template_argv(ref)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = None
        try:
            # posix_spawn puts the pipes on fds 0 and 3 (3 is this cell's
            # frame pipe, which the template must not get) without running
            # Python in the child, safe beside the capture's threads.
            pid = os.posix_spawn(argv[0], argv, env, file_actions=[
                (os.POSIX_SPAWN_DUP2, cmd_r, 0), (os.POSIX_SPAWN_DUP2, res_w, 3)])
        except (OSError, ValueError) as e:
            self.error = "cannot start the control build's interpreter %s: %s" % (argv[0], e)
        os.close(cmd_r)
        os.close(res_w)
        if pid is None:
            os.close(cmd_w)
            os.close(res_r)
            return
        self.pid, self.cmd, self.res = pid, cmd_w, res_r


def template_main(cmd_fd, res_fd):
    """``--timing-template``: the control build's template in a paired cell."""
    _pdeathsig()
    try:
        from capd_runner import spec as specmod
        spec = specmod.load()
        if spec.reference is not None:  # the control build's user models
            spec.model_roots = spec.reference.get("model_roots") or []
        set_affinity(spec.raw.get("cpus"))
        import torch  # noqa: F401 (the forks inherit it, like the cell's template)
    except BaseException as e:
        line = _readline(cmd_fd)
        msg = {"process": int(line) if line.strip().isdigit() else -1,
               "error": "control build template: %s: %s" % (type(e).__name__, e),
               "traceback": traceback.format_exc()}
        try:
            os.write(res_fd, (json.dumps(msg) + "\n").encode())
        except OSError:
            pass
        return 1
    Forker._serve(spec, cmd_fd, res_fd)
    return 0

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
pipe closes. Where the platform has no fork the cell times in its own
process, as one process; where forking the template fails, the timing
processes are fresh interpreters (below).

A fork copies only the thread that forks: a lock another thread held at
that moment stays held in the child, with no thread left to release it. So
the cell forks its template, and the template each timing process, only
while it has no other thread (``fork_refusal``, counted in /proc/self/task
right before the fork). A build whose code started a thread (its
sitecustomize, its import of torch, a model package it imports) gets fresh
interpreters instead: ``python -m capd_runner --timing-process INDEX 3``,
started by posix_spawn with the cell's environment, CPUs and limits, which
builds and times the model as a forked one does. Each result says how its
process started (``start``: ``fork`` or ``exec``, and ``start_why``).

Each timing process has a time of its own (``Budget``): its share of the
cell's ``timeout_s`` and half again, at least MIN_PROCESS_S, never past
what the cell's timeout leaves. One that has not answered by then is
killed, and its result says so (``killed``); the cell goes on without it
(docs/runner.md, "Timing processes: fork or exec, and their time limit").

A paired head cell (the spec has a ``reference``: docs/runner.md, "Paired
timing") has a second template, the control build's, in the environment
capd built for a cell of that build (``python -m capd_runner
--timing-template 0 3``: requests on fd 0, results on fd 3). When the
reference names the control build's prefork zygote, capd-exec hands the
template to that zygote, which forks it with torch already imported, as the
head's own template is a fork of the head's zygote-forked cell; otherwise
(or when the zygote cannot serve it) the interpreter starts afresh and
imports torch itself, a second or more. Either way both sides' timing
processes are forks of a template that did nothing but import torch, or
fresh interpreters where that side's template has other threads.

After the timing, a request with a fourth word, ``INDEX LIMIT_S SIDE
profile`` (``--profile`` for an exec'd one), starts a *profiled process*
instead (capd_runner/profile.py: the pass under module hooks and the
operator profiler), by the same fork or exec and under the same limit as
a timing process, so that what it measures of each side was started as
that side's timing processes were.
"""

import ctypes
import json
import math
import os
import select
import signal
import sys
import time
import traceback

PR_SET_PDEATHSIG = 1
MAX_RESULT = 64 << 20
# A timing process's own limit: its share of timeout_s, half again as
# margin, at least MIN_PROCESS_S; the cell keeps RESERVE_S of its timeout
# for the frames after timing. A process that answered (or closed its
# pipe) has REAP_S to exit before it is killed; the cell waits for its
# template's answer TEMPLATE_GRACE_S past the process's limit.
MIN_PROCESS_S = 30
RESERVE_S = 5
REAP_S = 10
TEMPLATE_GRACE_S = REAP_S + 10


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


def prepare(spec):
    """In a timing or profiled process: (torch, the model built afresh from
    the spec and placed, its Call, its Projection, the device), as the
    cell builds its own, so both kinds of process run the same model."""
    from capd_runner import cell
    import torch
    if spec.threads > 0:
        torch.set_num_threads(spec.threads)
    device = torch.device("cuda", 0) if spec.device == "gpu" else torch.device("cpu")
    dtype = getattr(torch, spec.dtype)
    model, inputs = cell._build(torch, spec, dtype)
    model = model.to(device=device, dtype=dtype)
    call = cell.Call(cell._place(torch, inputs, device, dtype))
    return torch, model, call, cell.Projection(torch, spec.seed), device


def _one_process(spec, index, out_fd):
    """In a timing process: build, place, time; one JSON line to out_fd."""
    from capd_runner import cell
    torch, model, call, projection, device = prepare(spec)
    started = _monotonic_ns()
    res = {"process": index}
    res.update(cell.timing_run(torch, model, call, spec, projection, device))
    res.update({"threads": torch.get_num_threads(), "started_ns": started,
                "ended_ns": _monotonic_ns()})
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


def thread_count():
    """This process's threads: the kernel's count, Python's where /proc
    cannot be read."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        import threading
        return threading.active_count()


def fork_refusal(who):
    """Why WHO, this process, must start its timing processes by exec and
    not by fork (see the module's text), or None: it has other threads."""
    k = thread_count()
    if k <= 1:
        return None
    return ("%s had %d threads when its timing processes were due: forking would copy "
            "locks they hold, which no thread would release in the copy" % (who, k))


def process_limit_s(spec):
    """The most seconds one timing process may take (see the module's text)."""
    n = 2 * spec.timing_pairs if paired_wanted(spec) else spec.timing_processes
    return max(MIN_PROCESS_S, int(math.ceil(spec.timeout_s * 1.5 / max(n, 1))))


def _age_s():
    """Seconds since this process began: moments after capd's cell
    timeout starts, when capd, capd-exec or the build's zygote starts the
    cell; 0 where /proc cannot tell."""
    try:
        with open("/proc/self/stat") as f:
            start = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            up = float(f.read().split()[0])
        return max(0.0, up - start / float(os.sysconf("SC_CLK_TCK")))
    except (OSError, ValueError, IndexError):
        return 0.0


class Budget(object):
    """The time each of the cell's timing processes may take."""

    def __init__(self, spec):
        self.per_process = process_limit_s(spec)
        self.timeout_s = spec.timeout_s
        self.deadline = time.monotonic() - _age_s() + spec.timeout_s

    def next(self, index, what="timing process"):
        """(seconds process INDEX may take, None), or (None, its result)
        where the cell's timeout leaves it no time; WHAT names it."""
        left = self.deadline - RESERVE_S - time.monotonic()
        if left >= 1:
            return min(self.per_process, left), None
        return None, {"process": index, "skipped": True,
                      "error": "%s %d not started: %.0f s of the cell's timeout_s=%d s are "
                               "left" % (what, index, max(0, left + RESERVE_S), self.timeout_s)}


def _read_result(fd, limit_s):
    """(one line from FD, or what came before EOF; whether LIMIT_S passed
    first)."""
    buf = bytearray()
    end = time.monotonic() + limit_s
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while len(buf) < MAX_RESULT and not buf.endswith(b"\n"):
        left = end - time.monotonic()
        if left <= 0:
            return bytes(buf), True
        if not poller.poll(int(math.ceil(left * 1000))):
            continue
        b = os.read(fd, 65536)
        if not b:
            break
        buf += b
    return bytes(buf), False


def sigkill(pid, group=False):
    """SIGKILL to process PID, or to process group PID where GROUP (the
    zygote's cells); nothing where it is gone already."""
    try:
        (os.killpg if group else os.kill)(pid, signal.SIGKILL)
    except OSError:
        pass


def _reap(pid, kill):
    """PID's wait status: killed first when KILL, else given REAP_S to exit
    and killed then; None where it is not this process's child."""
    try:
        if not kill:
            end = time.monotonic() + REAP_S
            while time.monotonic() < end:
                got, status = os.waitpid(pid, os.WNOHANG)
                if got:
                    return status
                time.sleep(0.01)
        sigkill(pid)
        return os.waitpid(pid, 0)[1]
    except ChildProcessError:
        return None


def _write_error(fd, index, prefix, e):
    msg = {"process": index, "error": "%s%s: %s" % (prefix, type(e).__name__, e),
           "traceback": traceback.format_exc()}
    try:
        os.write(fd, (json.dumps(msg) + "\n").encode())
    except OSError:
        pass


def _what(profiled):
    """What a process is called in its errors and notes."""
    return "profiled process" if profiled else "timing process"


def _timing_child(spec, index, res_w, profiled=False):
    """A timing process's work, forked or exec'd: _one_process (a
    profiled process's: capd_runner/profile.py), or its error as the
    result line; the exit code."""
    try:
        if profiled:
            from capd_runner import profile
            profile.one_process(spec, index, res_w)
        else:
            _one_process(spec, index, res_w)
        return 0
    except BaseException as e:
        _write_error(res_w, index, "", e)
        return 1


def _pipe():
    """A pipe whose write end is not fd 3, where a spawned process gets it
    (a dup2 onto itself would leave it close-on-exec)."""
    r, w = os.pipe()
    if w == 3:
        w2 = os.dup(w)
        os.close(w)
        w = w2
    return r, w


def _fork(spec, index, res_r, res_w, profiled):
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            _pdeathsig()
            os.close(res_r)
            code = _timing_child(spec, index, res_w, profiled)
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
    return pid


def _spawn(index, res_w, control, close_fd, profiled):
    """Timing process INDEX (a profiled one where PROFILED) as a fresh
    interpreter of this build: its result pipe on fd 3, stdin /dev/null,
    this process's environment, CPUs and limits. posix_spawn runs no
    Python in the child: safe beside other threads."""
    argv = [sys.executable, "-m", "capd_runner", "--timing-process", str(index), "3"]
    if control:
        argv.append("--control")
    if profiled:
        argv.append("--profile")
    actions = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)]
    if close_fd is not None and close_fd > 3:
        actions.append((os.POSIX_SPAWN_CLOSE, close_fd))
    actions.append((os.POSIX_SPAWN_DUP2, res_w, 3))
    return os.posix_spawn(sys.executable, argv, dict(os.environ), file_actions=actions)


def _outcome(index, line, late, status, limit_s, was, what):
    """A timing process's result from what it wrote and how it ended; WHAT
    names it."""
    if late:
        return {"process": index, "killed": True,
                "error": "%s %d did not finish in %.0f s (killed); %s"
                         % (what, index, limit_s, was)}
    if line.endswith(b"\n"):
        try:
            res = json.loads(line.decode())
        except ValueError:
            res = None
        if isinstance(res, dict):
            return res
        return {"process": index, "error": "unreadable timing result"}
    if status is not None and os.WIFSIGNALED(status):
        return {"process": index,
                "error": "%s killed by signal %d" % (what, os.WTERMSIG(status))}
    code = os.WEXITSTATUS(status) if status is not None and os.WIFEXITED(status) else None
    return {"process": index, "error": "%s %d exited (status %s) without a result; %s"
                                       % (what, index, code, was)}


def run_one(spec, index, limit_s, exec_why, control=False, close_fd=None, profiled=False):
    """Starts timing process INDEX (a profiled process where PROFILED), by
    exec where EXEC_WHY says why not by fork, and waits LIMIT_S seconds at
    most for its result, killing it past them. Its result, with how it
    started ("start", "start_why")."""
    how = "exec" if exec_why else "fork"
    threads = thread_count()
    r, w = _pipe()
    try:
        pid = (_spawn(index, w, control, close_fd, profiled) if exec_why
               else _fork(spec, index, r, w, profiled))
    except (OSError, ValueError) as e:
        os.close(r)
        os.close(w)
        return {"process": index, "start": how,
                "error": "cannot start %s %d by %s: %s" % (_what(profiled), index, how, e)}
    os.close(w)
    try:
        line, late = _read_result(r, limit_s)
    finally:
        os.close(r)
    status = _reap(pid, late)
    if exec_why:
        was = "it was a fresh interpreter (exec), as %s" % exec_why
    else:
        was = "it was forked from a process with %d thread%s" % (threads,
                                                               "" if threads == 1 else "s")
    res = _outcome(index, line, late, status, limit_s, was, _what(profiled))
    res["start"] = how
    if exec_why:
        res["start_why"] = exec_why
    return res


def _request(line, default, control):
    """A template's request: "INDEX LIMIT_S SIDE [profile]" (LIMIT_S and
    SIDE, ``control`` or ``head``, may be left out: CONTROL says which
    then; ``profile``: a profiled process, capd_runner/profile.py). (index,
    limit, control, profiled)."""
    parts = line.split()
    if len(parts) > 2:
        control = parts[2] in (b"control", "control")
    profiled = len(parts) > 3 and parts[3] in (b"profile", "profile")
    return (int(parts[0]), (float(parts[1]) if len(parts) > 1 else default), control,
            profiled)


def _for_side(spec, control):
    """SPEC for a timing process of the control build (its user models)
    where CONTROL, else SPEC."""
    if not control or spec.reference is None:
        return spec
    import copy
    s = copy.copy(spec)
    s.model_roots = spec.reference.get("model_roots") or []
    return s


class Forker(object):
    """The cell's timing processes: forks of its template process, or fresh
    interpreters where the cell has other threads (see the module's text)."""

    side = ""  # what a request names after INDEX LIMIT_S (TemplateForker)

    def __init__(self, spec):
        self.spec = spec
        self.pid = None
        self.error = None
        self.noted = set()  # the reasons for exec the cell has noted
        self.budget = Budget(spec)
        self.exec_why = fork_refusal("the cell")
        if self.exec_why is None:
            self.exec_why = self._fork_template(spec)

    @property
    def ready(self):
        """Whether it can start timing processes."""
        return self.pid is not None or self.exec_why is not None

    def _fork_template(self, spec):
        """Forks the template; None, or why the cell starts its timing
        processes by exec instead."""
        cmd_r, cmd_w = os.pipe()
        res_r, res_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError as e:
            for fd in (cmd_r, cmd_w, res_r, res_w):
                os.close(fd)
            return "the cell could not fork its timing template: %s" % e
        if pid == 0:
            code = 1
            try:
                os.close(cmd_w)
                os.close(res_r)
                _pdeathsig()
                try:
                    os.close(spec.frame_fd)  # only the cell writes frames
                except OSError:
                    pass
                self._serve(spec, cmd_r, res_w)
                code = 0
            finally:
                os._exit(code)
        os.close(cmd_r)
        os.close(res_w)
        self.pid, self.cmd, self.res = pid, cmd_w, res_r
        return None

    @staticmethod
    def _serve(spec, cmd_r, res_w, who="the cell's timing template", control=False):
        """A template's loop: per request ("INDEX LIMIT_S SIDE [profile]")
        one timing (or profiled) process, forked while the template has no
        other thread and exec'd otherwise, and its result line back. WHO
        names the template in the reason for exec; None: by the side it
        serves."""
        default = process_limit_s(spec)
        while True:
            line = _readline(cmd_r)
            if not line:
                return
            index, limit_s, side, profiled = _request(line, default, control)
            by = who or "the %s build's timing template" % ("control" if side else "head")
            res = run_one(_for_side(spec, side), index, limit_s, fork_refusal(by), side,
                          profiled=profiled)
            os.write(res_w, (json.dumps(res) + "\n").encode())

    def run(self, index):
        """Times one process; its result dict ({"error": ...} on failure,
        with "killed" or "skipped" where the cell goes on without it)."""
        return self._ask(index, False)

    def profile(self, index):
        """One profiled process (capd_runner/profile.py) numbered INDEX,
        started and limited as a timing process is; its result, as run's."""
        return self._ask(index, True)

    def _ask(self, index, profiled):
        """Process INDEX of either kind, from the template where there is
        one, else started here by exec; within the budget's time."""
        what = _what(profiled)
        limit_s, skipped = self.budget.next(index, what)
        if skipped is not None:
            return skipped
        if self.pid is None:
            if self.exec_why is None:  # the template was killed, or never started
                return {"process": index, "skipped": True,
                        "error": self.error or "no timing template"}
            return run_one(self.spec, index, limit_s, self.exec_why, close_fd=self.spec.frame_fd,
                           profiled=profiled)
        # A profiled request names its side (the cell's own template serves
        # the head's), since the word after it says what to start.
        side = (self.side or " head") + " profile" if profiled else self.side
        try:
            os.write(self.cmd, ("%d %.3f%s\n" % (index, limit_s, side)).encode())
        except OSError:
            pass  # it is gone; what it said before it went is read below
        line, late = _read_result(self.res, limit_s + TEMPLATE_GRACE_S)
        if late:
            self.error = ("the timing template did not answer for %s %d within %.0f s "
                          "(killed)" % (what, index, limit_s + TEMPLATE_GRACE_S))
            self._end(kill=True)
            return {"process": index, "killed": True, "error": self.error}
        if not line:
            return {"process": index, "error": "the timing template exited"}
        try:
            return json.loads(line.decode())
        except ValueError:
            return {"process": index, "error": "unreadable timing result"}

    def _end(self, kill):
        os.close(self.cmd)
        os.close(self.res)
        _reap(self.pid, kill)
        self.pid = None

    def close(self):
        """Ends the template: its request pipe closes, it exits."""
        if self.pid is not None:
            self._end(kill=False)


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


def _template_argv(side):
    """A build's template command line: through capd-exec and the build's
    zygote when SIDE (the reference, or its head) names one."""
    prog = [side["python"], "-m", "capd_runner", "--timing-template", "0", "3"]
    z = side.get("zygote")
    if not isinstance(z, dict) or not z.get("socket") or not z.get("exec"):
        return prog
    flags = _limit_flags() + ["--zygote", z["socket"]]
    cg = _own_cgroup()
    if cg:
        flags += ["--cgroup", cg]
    return [z["exec"]] + flags + ["--"] + prog


class TemplateForker(Forker):
    """A paired cell's timing template of one side (see the module's text):
    SIDE is the reference (the control build) or its ``head`` (this
    build), both started the same way, so that identical builds time
    identical processes; WHICH is ``control`` or ``head``."""

    def __init__(self, spec, side, which):
        self.spec = spec
        self.pid = None
        self.error = None
        self.noted = set()
        self.budget = Budget(spec)
        self.exec_why = None  # its template decides, by its own threads
        self.side = " " + which
        cmd_r, cmd_w = os.pipe()
        res_r, res_w = os.pipe()
        env = dict(side["env"])
        # The same spec file as this cell's (capd names it in both envs).
        if os.environ.get("CAPD_CELL_SPEC"):
            env["CAPD_CELL_SPEC"] = os.environ["CAPD_CELL_SPEC"]
        argv = _template_argv(side)
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
            self.error = "cannot start the %s build's interpreter %s: %s" % (which, argv[0], e)
        os.close(cmd_r)
        os.close(res_w)
        if pid is None:
            os.close(cmd_w)
            os.close(res_r)
            return
        self.pid, self.cmd, self.res = pid, cmd_w, res_r


def _load_spec(control):
    """The cell's spec, with the control build's user models for a
    process of the control build, and this process on the cell's CPUs."""
    from capd_runner import spec as specmod
    spec = specmod.load()
    if control and spec.reference is not None:  # the control build's user models
        spec.model_roots = spec.reference.get("model_roots") or []
    set_affinity(spec.raw.get("cpus"))
    return spec


def template_main(cmd_fd, res_fd):
    """``--timing-template``: a side's template in a paired cell (each
    request names the side)."""
    _pdeathsig()
    try:
        spec = _load_spec(False)
        import torch  # noqa: F401 (the forks inherit it, like the cell's template)
    except BaseException as e:
        parts = _readline(cmd_fd).split()
        index = int(parts[0]) if parts and parts[0].isdigit() else -1
        _write_error(res_fd, index, "control build template: ", e)
        return 1
    Forker._serve(spec, cmd_fd, res_fd, None, control=True)
    return 0


def process_main(index, res_fd, control, profiled=False):
    """``--timing-process``: one timing process started by exec (run_one),
    its result line on RES_FD; CONTROL: of the control build; PROFILED
    (``--profile``): a profiled process (capd_runner/profile.py)."""
    _pdeathsig()
    try:
        spec = _load_spec(control)
    except BaseException as e:
        _write_error(res_fd, index, "%s: " % _what(profiled), e)
        return 1
    return _timing_child(spec, index, res_fd, profiled)


def timing_frame(frame, res, i, n, **extra):
    """The timing frame of process I of N: FRAME (the cell's fields) with
    RES's measurements (a timing process's result) and EXTRA."""
    f = dict(frame, samples_ns=res["samples_ns"], threads=res["threads"], process=i,
             processes=n, **extra)
    for k in ("loops", "cpus", "started_ns", "ended_ns", "cpu_samples_ns", "own_samples_ns",
              "runqueue_ns", "cpu_ns", "steal_ns", "device_samples_ns", "compile_ns"):
        if k in res:
            f[k] = res[k]
    if "start" in res:  # fork or exec
        f["start"] = res["start"]
    return f

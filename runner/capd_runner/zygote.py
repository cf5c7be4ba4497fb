"""Prefork zygote: imports the framework once and forks one child per cell.

    python -m capd_runner.zygote --listen-fd 3 --cell-keys K1,K2,... \
        [--verify FILE] [--allow-uid UID] [--idle-exit-s N]

capd starts it (through capd-exec, like a cell: own session, parent-death
signal, the cells' user) for a build registered with ``"prefork": true``,
with a listening unix socket on ``--listen-fd`` that capd bound in a
directory only capd can reach. fd 1 carries one status line of JSON to capd
(``ready`` or ``refused``); fd 2 is the zygote's log.

The zygote imports torch and capd_runner's modules, runs no operator (PyTorch
picks its CPU capability lazily at the first dispatched operator, oneDNN its
ISA at its first kernel), and then serves requests from capd-exec
(docs/prefork.md has the wire format):

    request  4-byte big-endian length + JSON {"v":1,"argv":[...],"env":{...},
             "cwd":..., "rlimits":{...}, "uid":N} with fds 0-3 of the cell
             (SCM_RIGHTS)
    replies  {"pid":N}, later {"exit":{"status":W,"maxrss_kb":..,
             "utime_us":..,"stime_us":..}}; or {"refused":"reason"}, after
             which capd-exec runs the cell by fresh exec itself.

A child becomes the cell: new session, parent-death signal, the cell's fds on
0-3 and every other fd closed, rlimits, the cell's working directory and
environment (width variables included), then it reads back the effective
CPU capability *before anything is written to the frame pipe*. A child
whose capability is not the requested one execs the runner afresh
(``argv``), in place, so it is never captured in prefork mode.

With ``--verify FILE`` the zygote first proves that prefork is equivalent for
this build: each verification cell runs once forked and once by fresh exec,
and their tensor records must be equal hash for hash (and a forked child
must not have needed the fresh-exec fallback where the fresh run worked).
Otherwise it reports ``refused`` and exits with EXIT_REFUSED; capd then runs
that build's cells by fresh exec.
"""

import argparse
import ctypes
import errno
import gc
import json
import os
import resource
import selectors
import signal
import socket
import struct
import sys
import time
import traceback
from capd_runner import layout, timing

EXIT_REFUSED = 78  # EX_CONFIG: the build cannot use prefork
# A paired head cell's control-build timing template (capd_runner.timing:
# commands on fd 0, results on fd 3), the one other program a zygote forks.
TEMPLATE_ARGS = ["--timing-template", "0", "3"]
MAX_REQUEST = 4 << 20
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38
LOG_PREFIX = "capd prefork: "

_libc = None


def _prctl(option, arg):
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg), ctypes.c_ulong(0),
                       ctypes.c_ulong(0), ctypes.c_ulong(0))


def _log(msg):
    try:
        os.write(2, ("capd zygote[%d]: %s\n" % (os.getpid(), msg)).encode("utf-8", "replace"))
    except OSError:
        pass


# --- the wire -----------------------------------------------------------------

def _send(sock, obj):
    data = json.dumps(obj, separators=(",", ":")).encode("utf-8")
    try:
        sock.sendall(struct.pack(">I", len(data)) + data)
        return True
    except OSError:
        return False


def _recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("connection closed")
        buf += chunk
    return buf


def _recv_request(sock):
    """(request dict, [fds]) from capd-exec; the fds ride on the first byte."""
    fds = []
    msg, anc, _flags, _addr = sock.recvmsg(4, socket.CMSG_SPACE(16 * 4))
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            n = len(data) - len(data) % 4
            fds.extend(struct.unpack("%di" % (n // 4), data[:n]))
    for fd in fds:
        os.set_inheritable(fd, False)
    try:
        if not msg:
            raise EOFError("connection closed")
        if len(msg) < 4:
            msg += _recv_exact(sock, 4 - len(msg))
        (n,) = struct.unpack(">I", msg)
        if n > MAX_REQUEST:
            raise ValueError("request of %d bytes (limit %d)" % (n, MAX_REQUEST))
        req = json.loads(_recv_exact(sock, n).decode("utf-8"))
        if not isinstance(req, dict):
            raise ValueError("request is not a JSON object")
    except Exception:
        for fd in fds:
            os.close(fd)
        raise
    return req, fds


# --- the child ----------------------------------------------------------------

_RLIMITS = (("as", resource.RLIMIT_AS), ("cpu", resource.RLIMIT_CPU),
            ("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC))


def _set_limit(res, value):
    try:
        resource.setrlimit(res, (value, value))
    except (ValueError, OSError):
        # Only raising past a lower hard limit fails: keep the lower one,
        # as capd-exec does.
        _soft, hard = resource.getrlimit(res)
        if hard == resource.RLIM_INFINITY or hard >= value:
            raise


def _become_cell(req, fds, zygote_pid, keep_fd=-1):
    """Everything capd-exec does for a fresh cell, in the forked child:
    own session, parent-death signal, the cell's fds on 0-3 and nothing
    else open (but KEEP_FD, the verification's note pipe), rlimits, no new
    privileges, its directory and environment."""
    os.setsid()
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != zygote_pid:
        os._exit(126)
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    high = [fcntl_dup(fd) for fd in fds]
    for target, fd in enumerate(high):
        os.dup2(fd, target, inheritable=True)
    if keep_fd >= 4:
        os.closerange(4, keep_fd)
        os.closerange(keep_fd + 1, _max_fd())
    else:
        os.closerange(4, _max_fd())
    _set_limit(resource.RLIMIT_CORE, 0)
    rl = req.get("rlimits") or {}
    for name, res in _RLIMITS:
        v = rl.get(name)
        if isinstance(v, int) and v > 0:
            _set_limit(res, v)
    if _prctl(PR_SET_NO_NEW_PRIVS, 1) != 0:
        os._exit(126)
    _prctl(PR_SET_DUMPABLE, 1)  # the zygote is not dumpable; a fresh cell is
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])


def fcntl_dup(fd):
    """A close-on-exec copy of FD at 64 or above (out of the way of 0-3)."""
    import fcntl
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 64)


def _max_fd():
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY and soft < (1 << 20) else (1 << 20)


def _flush_std():
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:
            pass


def _exec_fresh(argv, why):
    """Runs the cell by fresh exec, in this very process (same session,
    fds, limits): what capd-exec would have exec'd."""
    sys.stderr.write(LOG_PREFIX + "%s; running the cell by fresh exec\n" % why)
    _flush_std()
    try:
        os.execve(argv[0], argv, dict(os.environ))
    except OSError as e:
        sys.stderr.write(LOG_PREFIX + "cannot execute %s: %s\n" % (argv[0], e))
        _flush_std()
    os._exit(127)


def _run_cell(req, fds, zygote_pid, force_exec=False, note_fd=-1):
    """The forked child: becomes the cell and runs it; never returns."""
    code = 1
    try:
        _become_cell(req, fds, zygote_pid, note_fd)
        argv = req["argv"]
        if force_exec:
            _exec_fresh(argv, "verification twin")
        import torch
        from capd_runner import spec as specmod
        from capd_runner import width as widthmod
        try:
            cell_spec = specmod.load()
            width, requested = cell_spec.width, specmod.expected_capability(cell_spec)
        except Exception:
            requested = None  # the runner itself reports the bad spec
        if requested is not None:
            # The first call that reads the capability fixes it, from the
            # environment just applied: nothing has dispatched an operator
            # in this process before.
            effective = widthmod.effective(torch)
            if effective != requested:
                if note_fd >= 0:
                    os.write(note_fd, b"R")
                _exec_fresh(argv, "requested width %s (CPU capability %s) but the forked "
                                  "child's effective CPU capability is %s"
                            % (width, requested, effective))
        if note_fd >= 0:
            os.write(note_fd, b"P")
            os.close(note_fd)
        what = "cell" if len(argv) == 3 else "timing template"
        sys.stderr.write(LOG_PREFIX + "%s pid %d forked from zygote pid %d (framework "
                         "imported once, before any operator)\n" % (what, os.getpid(), zygote_pid))
        sys.argv = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "__main__.py")]
        from capd_runner import main as mainmod
        code = mainmod.main(argv[3:])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        try:
            traceback.print_exc()
        except Exception:
            pass
        code = 1
    _flush_std()
    os._exit(code)


# --- verification ---------------------------------------------------------------

def _read_frames(fd):
    """(records [(key, hash, dtype, shape)], end status) from a frame pipe."""
    data = bytearray()
    while True:
        try:
            chunk = os.read(fd, 1 << 20)
        except InterruptedError:
            continue
        if not chunk:
            break
        data += chunk
    os.close(fd)
    records, end, pos = [], None, 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        if nl < 0:
            break
        hdr = json.loads(bytes(data[pos:nl]).decode("utf-8"))
        pos = nl + 1 + int(hdr.get("nbytes") or 0)
        if hdr.get("kind") == "tensor":
            records.append((hdr["key"], hdr["hash"], hdr["dtype"], tuple(hdr["shape"])))
        elif hdr.get("kind") == "end":
            end = hdr.get("status")
    return records, end


def _start_verify_cell(conf, base_env, cell, force_exec, zygote_pid):
    model, width, pass_ = cell
    scratch = os.path.join(conf["scratch"], "%s-%s-%s-%s" % (
        model, width, pass_, "exec" if force_exec else "fork"))
    os.makedirs(scratch, exist_ok=True)
    spec_path = os.path.join(scratch, "cell.json")
    from capd_runner import spec as specmod
    row = specmod.width_row(width)
    spec = {"protocol": 1, "job": "jverify", "cell": "cverify", "attempt": 1, "model": model,
            "width": width, "pass": pass_, "device": "cpu", "frame_fd": 3, "scratch": scratch,
            "model_roots": [], "options": dict(conf.get("options") or {}),
            "width_isa": row.get("isa"), "width_effective": row.get("effective")}
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    env = dict(base_env)
    env.update(conf["widths"].get(width) or {})
    env["CAPD_CELL_SPEC"] = spec_path
    env["CAPD_WIDTH"] = width  # as capd sets it for a cell (daemon/child/cellenv.c)
    req = {"argv": [sys.executable, "-m", "capd_runner"], "env": env, "cwd": scratch,
           "rlimits": {}}
    r, w = os.pipe()
    nr, nw = os.pipe()
    devnull = os.open(os.devnull, os.O_RDWR)
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.close(nr)
        _run_cell(req, [devnull, 2, 2, w], zygote_pid, force_exec=force_exec,
                  note_fd=fcntl_dup(nw))
    os.close(w)
    os.close(nw)
    os.close(devnull)
    return pid, r, nr


def verify(conf, zygote_pid):
    """None when every verification cell is equivalent, else the reason."""
    base_env = dict(os.environ)
    cells = [(m, w, p) for m in conf["models"] for w in sorted(conf["widths"])
             for p in conf["passes"]]
    jobs = []
    for cell in cells:
        for force_exec in (True, False):
            jobs.append((cell, force_exec))
    results = {}
    parallel = max(1, int(conf.get("parallel") or os.cpu_count() or 1))
    running = {}
    while jobs or running:
        while jobs and len(running) < parallel:
            cell, force_exec = jobs.pop(0)
            pid, r, nr = _start_verify_cell(conf, base_env, cell, force_exec, zygote_pid)
            running[pid] = (cell, force_exec, r, nr)
        # Read the pipes of the oldest child to the end (its frames), then
        # reap it; the others keep running meanwhile.
        pid = next(iter(running))
        cell, force_exec, r, nr = running.pop(pid)
        records, end = _read_frames(r)
        note = os.read(nr, 16)
        os.close(nr)
        _pid, status = os.waitpid(pid, 0)
        results[(cell, force_exec)] = (records, end, note, status)
    for cell in cells:
        name = "/".join(cell)
        fresh = results[(cell, True)]
        fork = results[(cell, False)]
        if fresh[1] is None:
            return "verification cell %s: the fresh-exec run ended without an end frame " \
                   "(wait status %d); see the zygote log" % (name, fresh[3])
        if fresh[1] == "ok" and fork[2] != b"P":
            return ("verification cell %s: a forked child could not apply the width before "
                    "the first operator (it needed the fresh-exec fallback): the framework "
                    "dispatches an operator at import time" % name)
        if fork[1] != fresh[1]:
            return "verification cell %s: forked child ended %s, fresh exec %s" % (
                name, fork[1], fresh[1])
        a, b = fork[0], fresh[0]
        if len(a) != len(b):
            return "verification cell %s: forked child captured %d tensors, fresh exec %d" % (
                name, len(a), len(b))
        for x, y in zip(a, b):
            if x != y:
                return ("verification cell %s: record %s differs: forked child %s %s %s, "
                        "fresh exec %s %s %s" % (name, y[0], x[1], x[2], list(x[3]),
                                                 y[1], y[2], list(y[3])))
    return None


# --- serving ------------------------------------------------------------------

class Zygote(object):
    def __init__(self, listen_fd, cell_keys, allow_uids, idle_exit_s, env, added_env):
        self.sock = socket.socket(fileno=listen_fd)
        self.sock.setblocking(False)
        self.cell_keys = frozenset(cell_keys)
        self.allow_uids = allow_uids
        self.idle_exit_s = idle_exit_s
        self.pid = os.getpid()
        self.sel = selectors.DefaultSelector()
        self.children = {}  # pid -> connection
        self.conns = {}     # connection -> pid
        self.last_activity = time.monotonic()
        self.base_env = self._comparable(env)
        self.added_env = added_env
        self.argv0 = os.path.realpath(sys.executable)

    def _comparable(self, env):
        return dict((k, v) for k, v in env.items() if k not in self.cell_keys)

    def _check(self, req):
        """None when the request may be served by a fork, else why not."""
        argv = req.get("argv")
        if (not isinstance(argv, list) or argv[1:3] != ["-m", "capd_runner"]
                or argv[3:] not in ([], TEMPLATE_ARGS) or not isinstance(argv[0], str)):
            return "the cell does not run '-m capd_runner' (or its timing template)"
        try:
            same = os.path.realpath(argv[0]) == self.argv0
        except Exception:
            same = False
        if not same:
            return "the cell's interpreter %s is not the zygote's %s" % (argv[0], self.argv0)
        env = req.get("env")
        if not isinstance(env, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            return "bad env"
        if not isinstance(req.get("cwd"), str):
            return "bad cwd"
        mine = self.base_env
        theirs = self._comparable(env)
        if mine != theirs:
            diff = sorted(set(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k)))
            return "the cell's environment differs from the zygote's in %s" % ",".join(diff[:8])
        uid = req.get("uid")
        if isinstance(uid, int) and uid >= 0 and uid != os.getuid():
            return "the cell must run as uid %d, the zygote runs as %d" % (uid, os.getuid())
        # A build whose import started a thread: a forked cell would copy
        # the locks it holds (timing.fork_refusal says the same of a cell).
        return timing.fork_refusal("the zygote")

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            self.last_activity = time.monotonic()
            try:
                creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                        struct.calcsize("3i"))
                _pid, uid, _gid = struct.unpack("3i", creds)
                if self.allow_uids and uid not in self.allow_uids:
                    _log("refused a connection from uid %d" % uid)
                    conn.close()
                    continue
                conn.setblocking(True)
                conn.settimeout(10)
                req, fds = _recv_request(conn)
            except Exception as e:
                _log("bad request: %s" % e)
                conn.close()
                continue
            self._serve(conn, req, fds)

    def _serve(self, conn, req, fds):
        why = self._check(req)
        if why is None and len(fds) != 4:
            why = "expected 4 fds, got %d" % len(fds)
        if why is not None:
            for fd in fds:
                os.close(fd)
            _send(conn, {"refused": why})
            conn.close()
            return
        for k, v in self.added_env.items():
            req["env"].setdefault(k, v)
        _flush_std()
        pid = os.fork()
        if pid == 0:
            _run_cell(req, fds, self.pid)
        for fd in fds:
            os.close(fd)
        conn.settimeout(None)
        if not _send(conn, {"pid": pid}):
            # capd-exec is already gone: so is the cell.
            timing.sigkill(pid, group=True)
        self.children[pid] = conn
        self.conns[conn] = pid
        self.sel.register(conn, selectors.EVENT_READ, "conn")

    def _conn_event(self, conn):
        """capd-exec never writes after its request: readable means it is
        gone (killed with its group), so the cell goes too."""
        try:
            data = conn.recv(64)
        except OSError:
            data = b""
        if data:
            return
        pid = self.conns.pop(conn, None)
        self.sel.unregister(conn)
        conn.close()
        if pid is not None:
            timing.sigkill(pid, group=True)
            self.children[pid] = None

    def _reap(self):
        while True:
            try:
                pid, status, ru = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            except InterruptedError:
                continue
            if pid == 0:
                return
            self.last_activity = time.monotonic()
            # Whatever the cell left in its group goes with it, before
            # capd-exec reports the end (as capd does for a fresh cell).
            timing.sigkill(pid, group=True)
            conn = self.children.pop(pid, None)
            if conn is None:
                continue
            self.conns.pop(conn, None)
            try:
                self.sel.unregister(conn)
            except (KeyError, ValueError):
                pass
            _send(conn, {"exit": {
                "status": status, "maxrss_kb": int(ru.ru_maxrss),
                "utime_us": int(ru.ru_utime * 1e6), "stime_us": int(ru.ru_stime * 1e6)}})
            conn.close()

    def serve(self):
        rpipe, wpipe = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wpipe)
        signal.signal(signal.SIGCHLD, lambda s, f: None)
        self.sel.register(self.sock, selectors.EVENT_READ, "listen")
        self.sel.register(rpipe, selectors.EVENT_READ, "signal")
        while True:
            timeout = None
            if self.idle_exit_s > 0:
                timeout = max(1.0, self.idle_exit_s / 4.0)
            for key, _ in self.sel.select(timeout):
                if key.data == "listen":
                    self._accept()
                elif key.data == "signal":
                    try:
                        while os.read(rpipe, 512):
                            pass
                    except (BlockingIOError, InterruptedError):
                        pass
                    self._reap()
                else:
                    self._conn_event(key.fileobj)
            self._reap()
            if (self.idle_exit_s > 0 and not self.children
                    and time.monotonic() - self.last_activity > self.idle_exit_s):
                _log("idle for %d s: exiting" % self.idle_exit_s)
                return 0


def preload():
    """Imports everything a cell imports before its first operator."""
    import torch  # noqa: F401
    try:
        import torchvision  # noqa: F401
    except Exception:
        pass
    from capd_runner import (capture, catalog, cell, fingerprint, frames, libs,  # noqa: F401
                             main, pipeline, spec, tensors, usermodel, width, zoo)


def main(argv=None):
    layout.fix("capd_runner.zygote", sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m capd_runner.zygote")
    ap.add_argument("--listen-fd", type=int, required=True)
    ap.add_argument("--cell-keys", default="CAPD_CELL_SPEC")
    ap.add_argument("--verify", default=None)
    ap.add_argument("--allow-uid", type=int, action="append", default=[])
    ap.add_argument("--idle-exit-s", type=int, default=600)
    args = ap.parse_args(argv)
    # The environment capd gave us (what a cell's must equal, but for the
    # per-cell keys), and what the interpreter added to it at start-up
    # (PEP 538 sets LC_CTYPE under the C locale): a fresh runner's
    # interpreter adds the same, so a child does too.
    initial_env = layout.exec_environ()
    added_env = dict((k, v) for k, v in os.environ.items() if k not in initial_env)
    # Stray prints of imported code must not reach capd's status pipe.
    status_fd = os.dup(1)
    os.set_inheritable(status_fd, False)
    os.dup2(2, 1)

    def status(obj):
        try:
            os.write(status_fd, (json.dumps(obj, separators=(",", ":")) + "\n").encode("utf-8"))
        except OSError:
            pass

    _prctl(PR_SET_DUMPABLE, 0)  # other processes of the cells' user cannot ptrace it
    t0 = time.monotonic()
    try:
        preload()
    except Exception as e:
        traceback.print_exc()
        status({"event": "refused", "reason": "importing the framework failed: %s: %s"
                % (type(e).__name__, e)})
        return EXIT_REFUSED
    import_s = time.monotonic() - t0
    gc.collect()
    if hasattr(gc, "freeze"):
        gc.freeze()  # fewer copy-on-write faults in the children
    keys = [k for k in args.cell_keys.split(",") if k]
    if "CAPD_CELL_SPEC" not in keys:
        keys.append("CAPD_CELL_SPEC")
    verified = False
    verify_s = 0.0
    if args.verify:
        t1 = time.monotonic()
        try:
            with open(args.verify) as f:
                conf = json.load(f)
            reason = verify(conf, os.getpid())
        except Exception as e:
            traceback.print_exc()
            reason = "verification could not run: %s: %s" % (type(e).__name__, e)
        verify_s = time.monotonic() - t1
        if reason is not None:
            _log("prefork refused: %s" % reason)
            status({"event": "refused", "reason": reason, "verify_s": round(verify_s, 3)})
            return EXIT_REFUSED
        verified = True
    _log("ready: framework imported in %.2f s%s" % (
        import_s, ", verified in %.2f s" % verify_s if verified else ""))
    status({"event": "ready", "verified": verified, "import_s": round(import_s, 3),
            "verify_s": round(verify_s, 3), "pid": os.getpid()})
    z = Zygote(args.listen_fd, keys, set(args.allow_uid), args.idle_exit_s, initial_env,
               added_env)
    return z.serve()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Strict reader of runner frames, and a helper that runs the runner as a
real subprocess with fd 3 a pipe (the way capd starts it)."""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading

RUNNER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_HEADER = 65536
KEY_PARTS = re.compile(r"^(?P<module>.+)\.(?P<call>\d+)\.(?P<phase>init|forward|backward)\."
                       r"(?P<role>input|output|grad_input|grad_output|param_grad|param)\."
                       r"(?P<index>[^.]+)$")
# A per-op record (granularity op): <fqn>.<call>.<phase>/op.<aten name>.<n>.<role>.<i>
# (role arg: the arguments of the target_op call)
OP_KEY_PARTS = re.compile(r"^(?P<module>.+)\.(?P<call>\d+)\.(?P<phase>forward|backward)/op\."
                          r"(?P<op>aten::[^.]+|[^.]+)\.(?P<n>\d+)\."
                          r"(?P<role>output|grad_input|arg)\.(?P<index>\d+)$")

_REQUIRED = {
    "hello": {"protocol": int, "runner": str},
    "env": {"fingerprint": dict, "effective_width": str},
    "tensor": {"seq": int, "key": str, "module": str, "call": int, "phase": str, "role": str,
               "dtype": str, "shape": list, "numel": int, "stats": dict, "hash": str,
               "hash_alg": str, "capture": str},
    "nondeterministic": {"keys": list},
    "timing": {"phase": str, "samples_ns": list, "warmup": int, "iterations": int,
               "threads": int},
    "memory": {"peak_rss_bytes": int},
    "note": {"level": str, "message": str},
    "end": {"status": str},
}
ORDER = ["hello", "env", "tensor", "nondeterministic", "timing", "memory", "end"]


class ProtocolError(AssertionError):
    pass


class Frame(object):
    def __init__(self, header, payload):
        self.header = header
        self.payload = payload
        self.kind = header["kind"]

    def __getitem__(self, k):
        return self.header[k]

    def get(self, k, d=None):
        return self.header.get(k, d)

    def __repr__(self):
        return "Frame(%r, %d bytes)" % (self.header, len(self.payload))


def parse(data, sequence=True):
    """Parse all frames of ``data`` strictly; raises ProtocolError.
    ``sequence``: also check a whole cell's frame order (hello first...)."""
    frames = []
    pos = 0
    n = len(data)
    while pos < n:
        nl = data.find(b"\n", pos, pos + MAX_HEADER)
        if nl < 0:
            raise ProtocolError("header line without newline within %d bytes at offset %d"
                                % (MAX_HEADER, pos))
        try:
            header = json.loads(data[pos:nl].decode("utf-8"))
        except ValueError as e:
            raise ProtocolError("header at offset %d is not JSON: %s" % (pos, e))
        if not isinstance(header, dict):
            raise ProtocolError("header at offset %d is not an object" % pos)
        kind = header.get("kind")
        if not isinstance(kind, str):
            raise ProtocolError("header without kind: %r" % header)
        nbytes = header.get("nbytes", 0)
        if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
            raise ProtocolError("bad nbytes in %r" % header)
        pos = nl + 1
        if pos + nbytes > n:
            raise ProtocolError("payload cut short by EOF in %r" % header)
        payload = data[pos:pos + nbytes]
        pos += nbytes
        for field, typ in _REQUIRED.get(kind, {}).items():
            v = header.get(field)
            if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
                raise ProtocolError("%s frame: field %r missing or not %s: %r"
                                    % (kind, field, typ.__name__, header))
        frames.append(Frame(header, payload))
    if sequence:
        check_sequence(frames)
    return frames


def check_sequence(frames):
    if not frames or frames[0].kind != "hello":
        raise ProtocolError("first frame is not hello")
    if frames[0]["protocol"] != 1:
        raise ProtocolError("hello protocol is not 1")
    ends = [i for i, f in enumerate(frames) if f.kind == "end"]
    if len(ends) > 1 or (ends and ends[0] != len(frames) - 1):
        raise ProtocolError("frames after end, or several ends")
    if ends and frames[-1]["status"] not in ("ok", "unsupported", "failed", "oom"):
        raise ProtocolError("bad end status %r" % frames[-1]["status"])
    last = 0
    seq = -1
    for f in frames:
        if f.kind == "note":
            continue
        if f.kind in ORDER:
            rank = ORDER.index(f.kind)
            if rank < last:
                raise ProtocolError("%s frame out of order" % f.kind)
            if f.kind in ("hello", "env") and rank == last and last != 0:
                raise ProtocolError("repeated %s frame" % f.kind)
            last = rank
        if f.kind == "tensor":
            if f["seq"] <= seq:
                raise ProtocolError("seq not strictly increasing at %r" % f.header)
            seq = f["seq"]
            check_tensor(f)
    if sum(1 for f in frames if f.kind == "hello") != 1:
        raise ProtocolError("hello not exactly once")
    if sum(1 for f in frames if f.kind == "env") > 1:
        raise ProtocolError("env more than once")


def check_tensor(f):
    h = f.header
    if "op" in h:
        m = OP_KEY_PARTS.match(h["key"])
        if not m or not isinstance(h.get("op_index"), int):
            raise ProtocolError("bad op key %r" % h["key"])
        want = "%s.%d.%s/op.%s.%d.%s.%s" % (h["module"], h["call"], h["phase"], h["op"],
                                            h["op_index"], h["role"], h["index"])
    else:
        m = KEY_PARTS.match(h["key"])
        want = "%s.%d.%s.%s.%s" % (h["module"], h["call"], h["phase"], h["role"], h["index"])
    if not m:
        raise ProtocolError("bad key %r" % h["key"])
    if want != h["key"]:
        raise ProtocolError("key %r does not match its fields (%r)" % (h["key"], want))
    if h["role"] in ("param", "param_grad"):
        if not isinstance(h["index"], str):
            raise ProtocolError("param index must be the parameter name: %r" % h)
    elif not isinstance(h["index"], int):
        raise ProtocolError("index must be an integer: %r" % h)
    if not re.match(r"^[0-9a-f]{32}$", h["hash"]):
        raise ProtocolError("hash is not 32 hex digits: %r" % h["hash"])
    if h["hash_alg"] not in ("xxh3-128", "blake2b-128"):
        raise ProtocolError("unknown hash_alg: %r" % h["hash_alg"])
    numel = 1
    for d in h["shape"]:
        numel *= d
    if numel != h["numel"]:
        raise ProtocolError("numel does not match shape: %r" % h)
    for k in ("nan", "pinf", "ninf", "zeros"):
        if not isinstance(h["stats"].get(k), int):
            raise ProtocolError("stats.%s missing: %r" % (k, h))
    for k in ("min", "max", "mean", "std", "l2"):
        if k not in h["stats"]:
            raise ProtocolError("stats.%s missing: %r" % (k, h))
    cap = h["capture"]
    nb = h.get("nbytes", 0)
    if cap == "stats" and nb:
        raise ProtocolError("stats capture with payload")
    if cap == "sample" and h.get("sample_positions") != "stride":
        raise ProtocolError("sample without sample_positions stride")
    if cap not in ("stats", "sample", "full"):
        raise ProtocolError("bad capture %r" % cap)


class Result(object):
    def __init__(self, frames, returncode, stdout, stderr):
        self.frames = frames
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr

    def kinds(self, kind):
        return [f for f in self.frames if f.kind == kind]

    def one(self, kind):
        fs = self.kinds(kind)
        assert len(fs) == 1, "%d %s frames" % (len(fs), kind)
        return fs[0]

    @property
    def tensors(self):
        return self.kinds("tensor")

    @property
    def end(self):
        return self.frames[-1] if self.frames and self.frames[-1].kind == "end" else None

    @property
    def status(self):
        return self.end["status"] if self.end else None

    def notes(self, level=None):
        return [f["message"] for f in self.kinds("note") if level is None or f["level"] == level]

    def describe(self):
        return "rc=%s status=%s reason=%s\nnotes=%s\nstderr tail:\n%s" % (
            self.returncode, self.status, self.end.get("reason") if self.end else None,
            [m[-2000:] for m in self.notes()], self.stderr[-3000:])


def make_spec(model="mlp", width="native", pass_="forward", device="cpu", model_roots=None,
              **options):
    opts = {"iterations": 2, "warmup": 1, "threads": 1, "timeout_s": 600, "capture": "stats",
            "seed": 0, "batch": 2, "dtype": "float32", "sample_size": 256,
            "max_payload_bytes": 268435456, "timing_min_ms": 0}
    opts.update(options)
    return {"protocol": 1, "job": "jtest", "cell": "ctest", "attempt": 1, "model": model,
            "width": width, "pass": pass_, "device": device, "frame_fd": 3,
            "scratch": tempfile.gettempdir(), "model_roots": model_roots or [], "options": opts}


def run_runner(spec=None, env=None, args=(), spec_text=None, timeout=300, python=None,
               close_after=None, expect_frames=True):
    """Run ``python -m capd_runner`` with fd 3 a pipe; parse its frames.

    ``close_after``: close the read end after that many bytes (EPIPE test).
    """
    python = python or sys.executable
    tmpdir = tempfile.mkdtemp(prefix="capd-runner-test-")
    spec_path = os.path.join(tmpdir, "cell.json")
    with open(spec_path, "w") as f:
        f.write(spec_text if spec_text is not None else json.dumps(spec))
    child_env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": RUNNER_DIR, "CAPD_CELL_SPEC": spec_path,
                 "HOME": tmpdir, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    # The native stats library, as capd names it to a cell (env may unset it).
    if os.environ.get("CAPD_RUNNER_NATIVE"):
        child_env["CAPD_RUNNER_NATIVE"] = os.environ["CAPD_RUNNER_NATIVE"]
    if env:
        child_env.update(env)
    r, w = os.pipe()

    def child_setup():
        os.dup2(w, 3)

    out_f = tempfile.TemporaryFile()
    err_f = tempfile.TemporaryFile()
    proc = subprocess.Popen([python, "-m", "capd_runner"] + list(args), env=child_env,
                            stdin=subprocess.DEVNULL, stdout=out_f, stderr=err_f,
                            pass_fds=(3, w), preexec_fn=child_setup, cwd=tmpdir)
    os.close(w)
    chunks = []
    got = 0
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        while True:
            if close_after is not None and got >= close_after:
                break
            b = os.read(r, 1 << 20)
            if not b:
                break
            chunks.append(b)
            got += len(b)
        os.close(r)
        rc = proc.wait()
    finally:
        timer.cancel()
    out_f.seek(0)
    err_f.seek(0)
    stdout = out_f.read().decode("utf-8", "replace")
    stderr = err_f.read().decode("utf-8", "replace")
    out_f.close()
    err_f.close()
    shutil.rmtree(tmpdir, ignore_errors=True)
    data = b"".join(chunks)
    frames = parse(data) if close_after is None and (expect_frames or data) else None
    return Result(frames, rc, stdout, stderr)

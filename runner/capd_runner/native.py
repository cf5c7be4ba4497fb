"""The native statistics library (runner/native/), via ctypes.

capd builds ``libcapd_analysis.so`` beside its exec shim and names it to the
cell in ``CAPD_RUNNER_NATIVE``. It computes a CPU tensor's stats in one
foreign call, which releases the GIL once for the whole tensor, instead of a
handful of torch operators that each release and re-take it (the model's
thread waits for the GIL between its kernels, so every hand-off costs the
capture). Its definitions are those of tensors.StatsEngine; without the
library (variable unset or empty, file missing, another ABI) the runner uses
StatsEngine and the fingerprint says why (``stats_engine``).

Only the standard library: the library needs no Python headers and no torch
ABI, so one build of it serves every interpreter and torch version.
"""

import ctypes
import math
import os

import torch

ABI = 3
OUT_N = 10

# dtype codes of runner/native/capd_analysis.h (CAPD_DT_*)
_CODES = {
    torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3,
    torch.int64: 4, torch.int32: 5, torch.int16: 6, torch.int8: 7, torch.uint8: 8,
    torch.bool: 9,
}
CODES = _CODES

_lib = None
_state = None  # None: not tried yet; else (True, path) or (False, reason)
# The CPython extension beside the library (runner/native/capd_fastrec.c).
FASTREC_ABI = 2
_fastrec = None  # None: not tried yet; False: absent; else the module


def _load():
    global _lib, _state
    path = os.environ.get("CAPD_RUNNER_NATIVE", "")
    if not path:
        _state = (False, "CAPD_RUNNER_NATIVE not set")
        return
    try:
        lib = ctypes.CDLL(path)
        lib.capd_analysis_abi.restype = ctypes.c_int
        lib.capd_analysis_abi.argtypes = []
        abi = lib.capd_analysis_abi()
        if abi != ABI:
            _state = (False, "%s has ABI %d, the runner needs %d" % (path, abi, ABI))
            return
        lib.capd_stats.restype = ctypes.c_int
        lib.capd_stats.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int,
                                   ctypes.POINTER(ctypes.c_double)]
    except (OSError, AttributeError) as e:
        _state = (False, "cannot load %s: %s" % (path, e))
        return
    _lib = lib
    _state = (True, path)


def status():
    """(loaded, path or the reason it is not), loading on first use."""
    if _state is None:
        _load()
    return _state


def available():
    return status()[0]


def describe():
    """The fingerprint's ``stats_engine`` entry."""
    ok, what = status()
    if ok:
        return {"name": "native", "library": what}
    return {"name": "torch", "reason": what}


def fastrec():
    """The optional CPython extension capd_fastrec (a module capture's hooks in
    C, capture.Recorder.fast_hooks), or None: loaded from the library's folder
    when a file of it is there for this interpreter (its suffix, as
    importlib.machinery.EXTENSION_SUFFIXES names it) with FASTREC_ABI. A
    build for another Python has another suffix and is not looked at."""
    global _fastrec
    if _fastrec is None:
        _fastrec = False
        if available():
            import importlib.machinery
            import importlib.util
            folder = os.path.dirname(os.path.abspath(status()[1]))
            for suffix in importlib.machinery.EXTENSION_SUFFIXES:
                path = os.path.join(folder, "capd_fastrec" + suffix)
                if not os.path.isfile(path):
                    continue
                try:
                    spec = importlib.util.spec_from_file_location("capd_fastrec", path)
                    mod = importlib.util.module_from_spec(spec)
                    spec.loader.exec_module(mod)
                except (ImportError, OSError):
                    break
                if getattr(mod, "ABI", None) == FASTREC_ABI:
                    _fastrec = mod
                break
    return _fastrec or None


def supports(t):
    """Whether ``t`` (a prepared tensor) can go through stats()."""
    return (t.device.type == "cpu" and t.dtype in _CODES and t.is_contiguous()
            and available())


def _num(v):
    return v if math.isfinite(v) else None


def stats(t):
    """StatsEngine.stats of a CPU C-contiguous tensor (see supports)."""
    out = (ctypes.c_double * OUT_N)()
    n = t.numel()
    ptr = t.data_ptr() if n else 0
    if _lib.capd_stats(ptr, n, _CODES[t.dtype], out) != 0:
        raise ValueError("capd_stats refused dtype %s" % t.dtype)
    return {
        "min": _num(out[0]), "max": _num(out[1]), "mean": _num(out[2]), "std": _num(out[3]),
        "l2": _num(out[4]), "nan": int(out[5]), "pinf": int(out[6]), "ninf": int(out[7]),
        "zeros": int(out[8]),
    }


CAP_STATS, CAP_SAMPLE = 0, 1
# The equality hash the pipe writes in every record's "hash_alg".
HASH_ALG = "xxh3-128"


class PipeError(OSError):
    pass


class Pipe(object):
    """The library's capture pipe (capd_pipe_* in runner/native/capd_pipe.c): C
    threads (``threads`` analysing, one writing) that analyse snapshots and
    write their tensor frames to ``fd`` in submission order, never taking
    the GIL. Quick calls (queueing, counters)
    go through a PyDLL handle and keep the GIL; waits go through the CDLL
    handle, which releases it."""

    def __init__(self, fd, threads=1):
        if not available():
            raise PipeError(status()[1])
        path = status()[1]
        quick = ctypes.PyDLL(path)
        i64, vp = ctypes.c_int64, ctypes.c_void_p
        for lib in (_lib, quick):
            lib.capd_pipe_new.restype = vp
            lib.capd_pipe_new.argtypes = [ctypes.c_int, ctypes.c_int]
            lib.capd_pipe_analyze.restype = i64
            lib.capd_pipe_analyze.argtypes = [vp, vp, i64, ctypes.c_int, ctypes.c_int, i64]
            lib.capd_pipe_emit.restype = ctypes.c_int
            lib.capd_pipe_emit.argtypes = [vp, i64, ctypes.c_char_p, i64, ctypes.c_int]
            lib.capd_pipe_analyzed.restype = i64
            lib.capd_pipe_analyzed.argtypes = [vp]
            for name in ("capd_pipe_wait_analyzed",):
                getattr(lib, name).restype = ctypes.c_int
                getattr(lib, name).argtypes = [vp, i64]
            for name in ("capd_pipe_drain", "capd_pipe_reset"):
                getattr(lib, name).restype = ctypes.c_int
                getattr(lib, name).argtypes = [vp]
            lib.capd_pipe_hashes.restype = ctypes.c_int
            lib.capd_pipe_hashes.argtypes = [vp, i64, i64, ctypes.c_char_p]
            lib.capd_pipe_counts.restype = None
            lib.capd_pipe_counts.argtypes = [vp, ctypes.POINTER(i64)]
            lib.capd_pipe_free.restype = None
            lib.capd_pipe_free.argtypes = [vp]
        self._q = quick
        self._p = _lib.capd_pipe_new(fd, threads)
        if not self._p:
            raise PipeError("capd_pipe_new failed")
        self.analyze_fn = quick.capd_pipe_analyze
        # On the caller's thread, no snapshot (a library of the same ABI
        # built before it may lack it: then None).
        self.analyze_now_fn = getattr(quick, "capd_pipe_analyze_now", None)
        if self.analyze_now_fn is not None:
            self.analyze_now_fn.restype = i64
            self.analyze_now_fn.argtypes = [vp, vp, i64, ctypes.c_int, ctypes.c_int, i64]
        # One foreign call per record (capd_pipe_record); None in a library
        # of the same ABI built before it.
        self.record_fn = getattr(quick, "capd_pipe_record", None)
        if self.record_fn is not None:
            self.record_fn.restype = i64
            self.record_fn.argtypes = [vp, vp, i64, ctypes.c_int, ctypes.c_int, i64,
                                       ctypes.c_char_p, i64, ctypes.c_int]
        self.emit_fn = quick.capd_pipe_emit
        self.analyzed_fn = quick.capd_pipe_analyzed
        # The addresses capd_fastrec calls (0: none).
        self.analyze_now_addr = (ctypes.cast(self.analyze_now_fn, ctypes.c_void_p).value or 0
                                 if self.analyze_now_fn is not None else 0)
        self.emit_addr = ctypes.cast(self.emit_fn, ctypes.c_void_p).value or 0
        self._counted = (0, 0)

    @staticmethod
    def code(dtype):
        """The library's dtype code, or None (that tensor needs the Python path)."""
        return _CODES.get(dtype)

    def _check(self, rc, what):
        if rc < 0:
            raise PipeError(-rc, "capture pipe %s: %s" % (what, os.strerror(-rc)))
        return rc

    def analyze(self, ptr, numel, code, want_stats, sample_k):
        return self._check(self.analyze_fn(self._p, ptr, numel, code, want_stats, sample_k),
                           "analyze")

    def analyze_now(self, ptr, numel, code, want_stats, sample_k):
        """analyze(), done before it returns: ``ptr`` need not outlive it."""
        return self._check(self.analyze_now_fn(self._p, ptr, numel, code, want_stats, sample_k),
                           "analyze")

    def record(self, ptr, numel, code, want_stats, sample_k, prefix, capture):
        """analyze_now() and, unless ``prefix`` is None, emit() in one call."""
        n = len(prefix) if prefix is not None else 0
        return self._check(self.record_fn(self._p, ptr, numel, code, want_stats, sample_k,
                                          prefix, n, capture), "record")

    def emit(self, aid, prefix, capture):
        self._check(self.emit_fn(self._p, aid, prefix, len(prefix), capture), "emit")

    def analyzed(self):
        return self.analyzed_fn(self._p)

    def wait_analyzed(self, count):
        self._check(_lib.capd_pipe_wait_analyzed(self._p, count), "write")

    def drain(self):
        self._check(_lib.capd_pipe_drain(self._p), "write")

    def reset(self):
        self._check(_lib.capd_pipe_reset(self._p), "write")

    def hashes(self, first, n):
        """Hex hashes of analyses first..first+n-1 (after drain)."""
        if n <= 0:
            return []
        buf = ctypes.create_string_buffer(32 * n)
        self._check(self._q.capd_pipe_hashes(self._p, first, n, buf), "hashes")
        raw = buf.raw.decode("ascii")
        return [raw[32 * i:32 * i + 32] for i in range(n)]

    def take_counts(self):
        """(frames, payload bytes) written since the last call."""
        out = (ctypes.c_int64 * 2)()
        self._q.capd_pipe_counts(self._p, out)
        prev, self._counted = self._counted, (out[0], out[1])
        return out[0] - prev[0], out[1] - prev[1]

    def close(self):
        if self._p:
            _lib.capd_pipe_free(self._p)
            self._p = None

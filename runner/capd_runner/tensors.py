"""Per-tensor facts: dtype name, stats, content hash, raw bytes, samples.

Everything here works without numpy (builds under test often lack it): the
raw bytes of a CPU tensor are read in place through ctypes from its data
pointer, which is the same for every dtype (bfloat16 included) and every
PyTorch version from 1.10 on.
"""

import array
import ctypes
import hashlib
import math
import sys

import torch

from capd_runner import native as nativelib

BIG_ENDIAN = sys.byteorder == "big"
# Elements per float64 pass of the stats; bounds the scratch memory (2 x 8 MiB).
CHUNK = 1 << 20
_HAS_AMINMAX = hasattr(torch, "aminmax")
_INF = float("inf")


_DTYPE_NAMES = {}


def dtype_name(dtype):
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        s = str(dtype)
        name = _DTYPE_NAMES[dtype] = s[6:] if s.startswith("torch.") else s
    return name


PLAIN_DTYPES = _PLAIN = frozenset([torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
                    torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool])


def prepare(t):
    """Detached, plain strided tensor with conj/neg bits resolved."""
    t = t.detach()
    if t.dtype in _PLAIN and t.layout == torch.strided:
        return t
    if t.layout != torch.strided:
        t = t.to_dense()
    if getattr(t, "is_quantized", False):
        t = t.int_repr()
    for name in ("resolve_conj", "resolve_neg"):
        fn = getattr(t, name, None)
        if fn is not None:
            t = fn()
    return t


def cpu_contiguous(t):
    if t.device.type != "cpu":
        t = t.to("cpu")
    return t.contiguous()


def _swap_unit(t):
    size = t.element_size()
    if t.is_complex():
        size //= 2
    return size


_SWAP_CODES = {2: "H", 4: "I" if array.array("I").itemsize == 4 else "L", 8: "Q"}


def raw_bytes(t):
    """Little-endian C-contiguous bytes of a CPU contiguous tensor ``t``.

    Returns a buffer over ``t``'s memory (no copy) on little-endian
    machines; the buffer holds a reference to ``t``, so it stays valid.
    """
    n = t.numel() * t.element_size()
    if n == 0:
        return b""
    arr = (ctypes.c_char * n).from_address(t.data_ptr())
    arr._tensor = t  # keep the memory alive as long as the buffer
    buf = memoryview(arr).cast("B")
    if BIG_ENDIAN:
        unit = _swap_unit(t)
        if unit > 1:
            a = array.array(_SWAP_CODES[unit])
            a.frombytes(buf)
            a.byteswap()
            return a.tobytes()
    return buf


# The Python path's equality hash, named in its records' "hash_alg": the
# standard library has no XXH3, so it keeps BLAKE2b-128 (the native pipe's
# records say "xxh3-128"; capd compares records of different algorithms by
# their statistics and samples, docs/compare.md).
HASH_ALG = "blake2b-128"


def hash_bytes(buf):
    """The content hash (BLAKE2b-128, hex) of little-endian raw bytes."""
    return hashlib.blake2b(buf, digest_size=16).hexdigest()


def content_hash(t_cpu):
    return hash_bytes(raw_bytes(t_cpu))


def sample_positions(numel, sample_size):
    """Flat positions floor(i * numel / k), k = min(sample_size, numel)."""
    k = min(sample_size, numel)
    return [(i * numel) // k for i in range(k)]


def _finite_or_none(v):
    return v if v is not None and math.isfinite(v) else None


_EMPTY_STATS = {"min": None, "max": None, "mean": None, "std": None, "l2": None,
                "nan": 0, "pinf": 0, "ninf": 0, "zeros": 0}


def _probe_float_compare_out():
    """Whether a comparison can write its 0/1 result straight into a float64
    tensor (out= of another dtype; checked rather than assumed per version)."""
    try:
        out = torch.empty(3, dtype=torch.float64)
        torch.ne(torch.tensor([0.0, -0.0, 2.0]), 0, out=out)
        return out.tolist() == [0.0, 0.0, 1.0]
    except Exception:
        return False


# Probed on first use (StatsEngine()), never at import: an operator run
# while the module is imported would fix the CPU capability in a prefork
# zygote before the forked cell can choose its width (docs/prefork.md).
# Tests set them to True/False to force a path.
_NE_FLOAT_OUT = None


def _probe_aminmax_out():
    """Whether aminmax can write into two 0-d views of one 2-element buffer."""
    try:
        buf = torch.empty(2, dtype=torch.float32)
        torch.aminmax(torch.tensor([1.5, -2.0, 3.0]), out=(buf[0], buf[1]))
        return buf.tolist() == [-2.0, 3.0]
    except Exception:
        return False


_AMINMAX_OUT = None


def _probe_features():
    global _NE_FLOAT_OUT, _AMINMAX_OUT
    if _NE_FLOAT_OUT is None:
        _NE_FLOAT_OUT = _probe_float_compare_out()
    if _AMINMAX_OUT is None:
        _AMINMAX_OUT = _HAS_AMINMAX and _probe_aminmax_out()


# Dtypes whose min/max/non-zero count are taken on the tensor itself; the
# others (half, bfloat16, integers, bool: reductions missing or slow on the
# CPU of older builds) use the exact float64 copy.
_NATIVE = frozenset([torch.float32, torch.float64])


class StatsEngine(object):
    """Stats in float64 over finite values, with reusable scratch buffers.

    One pass per chunk of at most CHUNK elements is a handful of torch ops
    whatever the size: the float64 copy ``x``, ``x*x`` and ``x != 0`` (as
    0.0/1.0) go to the three rows of one scratch matrix, and one row-wise
    sum gives the sum, the sum of squares and the non-zero count together;
    min and max come from one aminmax (exact in the tensor's own dtype). The
    row sums are the same reductions as summing each row alone, so the values
    are those of separate sums. Fresh large allocations cost page faults on
    every call, hence the reused scratch (per device); bigger tensors are
    processed chunk by chunk. Any non-finite value (seen in the sums or the
    min/max) sends the tensor to a slower exact path.
    """

    # Cached scratch views per element count (shapes repeat run after run).
    MAX_VIEWS = 512

    def __init__(self, use_native=True):
        _probe_features()
        self.native = use_native and nativelib.available()
        self._ws = {}
        self._view_cache = {}
        self._mm = {}  # CPU min/max out buffers by dtype

    def _scratch(self, device, n):
        """A 3 x n float64 view of this device's scratch matrix."""
        key = (device.type, device.index)
        ws = self._ws.get(key)
        if ws is None or ws.shape[1] < n:
            size = 4096
            while size < n:
                size *= 2
            size = min(size, CHUNK)
            ws = torch.empty((3, size), dtype=torch.float64, device=device)
            self._ws[key] = ws
            self._view_cache.clear()  # views of the old matrix would keep it alive
        return ws[:, :n]

    def _views(self, device, n):
        """(w, w[0], w[1], w[2], sums) for n elements on ``device``: every
        view a pass needs, made once (each torch call is a GIL release and
        re-acquisition, which costs most when another thread wants it)."""
        key = (device.type, device.index, n)
        views = self._view_cache.get(key)
        if views is None:
            if len(self._view_cache) >= self.MAX_VIEWS:
                self._view_cache.clear()
            w = self._scratch(device, n)
            views = (w, w[0], w[1], w[2], torch.empty(3, dtype=torch.float64, device=device))
            self._view_cache[key] = views
        return views

    def _minmax_buf(self, dtype):
        ent = self._mm.get(dtype)
        if ent is None:
            mm = torch.empty(2, dtype=dtype)
            ent = self._mm[dtype] = (mm, mm[0], mm[1])
        return ent

    def stats(self, t):
        """``t``: prepared tensor (see prepare); any device, any real dtype."""
        if t.is_complex():
            t = torch.view_as_real(t)
        flat = t if t.dim() == 1 else t.reshape(-1)
        if self.native and nativelib.supports(flat):
            return nativelib.stats(flat)  # one GIL-free call (capd_runner/native.py)
        n = flat.numel()
        if n == 0:
            return dict(_EMPTY_STATS)
        native = flat.dtype in _NATIVE
        if n <= CHUNK:
            total, sumsq, nonzero, lo, hi = self._pass(flat, native)
        else:
            total = sumsq = 0.0
            nonzero = 0
            lo, hi = _INF, -_INF
            for s in range(0, n, CHUNK):
                c_total, c_sumsq, c_nonzero, c_lo, c_hi = self._pass(flat[s:s + CHUNK], native)
                total += c_total
                sumsq += c_sumsq
                nonzero += c_nonzero
                lo = min(lo, c_lo)
                hi = max(hi, c_hi)
        if not (math.isfinite(total) and math.isfinite(sumsq) and math.isfinite(lo)
                and math.isfinite(hi)):
            return self._stats_nonfinite(flat)
        mean = total / n
        msq = sumsq / n
        var = msq - mean * mean
        if var <= 1e-4 * msq:
            # E[x^2] - mean^2 has lost more than 4 digits: centred second pass.
            css = 0.0
            for s in range(0, n, CHUNK):
                e = min(n, s + CHUNK)
                w = self._scratch(flat.device, e - s)
                a, b = w[0], w[1]
                a.copy_(flat[s:e])
                torch.sub(a, mean, out=b)
                css += float(torch.mul(b, b, out=a).sum())
            var = css / n
        return {
            "min": lo, "max": hi, "mean": _finite_or_none(mean),
            "std": _finite_or_none(math.sqrt(max(var, 0.0))),
            "l2": _finite_or_none(math.sqrt(sumsq)),
            "nan": 0, "pinf": 0, "ninf": 0, "zeros": n - nonzero,
        }

    def _pass(self, part, native):
        """(sum, sum of squares, non-zero count, min, max) of one chunk."""
        w, a, sq, nz, sums = self._views(part.device, part.numel())
        a.copy_(part)
        src = part if native else a
        torch.mul(a, a, out=sq)
        if _NE_FLOAT_OUT:
            torch.ne(src, 0, out=nz)
        else:
            nz.copy_(src != 0)
        torch.sum(w, 1, out=sums)
        if part.device.type == "cpu" and _AMINMAX_OUT:
            # Both into one small buffer: one tolist() instead of two item().
            mm, mn, mx = self._minmax_buf(src.dtype)
            torch.aminmax(src, out=(mn, mx))
            v = sums.tolist()
            lo, hi = mm.tolist()
            return v[0], v[1], int(v[2]), float(lo), float(hi)
        if _HAS_AMINMAX:
            mn, mx = torch.aminmax(src)
        else:
            mn, mx = src.min(), src.max()
        if part.device.type != "cpu":
            # One device-to-host transfer (one synchronisation) for all five.
            v = torch.cat([sums, mn.to(torch.float64).reshape(1),
                           mx.to(torch.float64).reshape(1)]).tolist()
            return v[0], v[1], int(v[2]), v[3], v[4]
        v = sums.tolist()
        return v[0], v[1], int(v[2]), float(mn.item()), float(mx.item())

    def _stats_nonfinite(self, flat):
        x = flat.to(torch.float64)
        counts = torch.stack([torch.isnan(x).sum(), (x == _INF).sum(), (x == -_INF).sum(),
                              (x == 0).sum()]).tolist()
        out = {"nan": int(counts[0]), "pinf": int(counts[1]), "ninf": int(counts[2]),
               "zeros": int(counts[3])}
        fin = x[torch.isfinite(x)]
        nf = fin.numel()
        if nf == 0:
            out.update({"min": None, "max": None, "mean": None, "std": None, "l2": None})
            return out
        total = float(fin.sum())
        mean = total / nf
        d = fin - mean
        out.update({
            "min": float(fin.min()), "max": float(fin.max()),
            "mean": _finite_or_none(mean),
            "std": _finite_or_none(math.sqrt(float(torch.dot(d, d)) / nf)),
            "l2": _finite_or_none(math.sqrt(float(torch.dot(fin, fin)))),
        })
        return out


# --- deterministic numbers -------------------------------------------------
#
# torch's floating-point random kernels (normal_, uniform_, and with them
# nn.init) are compiled once per CPU capability and give different bits under
# ATEN_CPU_CAPABILITY=default and avx2 (seen with torch 1.13: randn and
# nn.Linear's init differ). Integers drawn by randint come straight from the
# mt19937 generator and are the same everywhere, so inputs, projections and
# the zoo's parameters are made from 24-bit integers with exact float64
# arithmetic and one final rounding.

_U24 = float(1 << 24)


def det_uniform(shape, generator, bound=1.0, dtype=torch.float32):
    """Uniform in (-bound, bound), bit-identical across builds and widths."""
    ints = torch.randint(0, 1 << 24, tuple(shape), generator=generator, dtype=torch.int64)
    x = (ints.to(torch.float64) + 0.5) * (2.0 / _U24) - 1.0
    if bound != 1.0:
        x = x * float(bound)
    return x.to(dtype)


def det_normalish(shape, generator, dtype=torch.float32):
    """Mean 0, variance ~1 (sum of 3 uniforms, scaled), deterministic."""
    x = (det_uniform(shape, generator, 1.0, torch.float64)
         + det_uniform(shape, generator, 1.0, torch.float64)
         + det_uniform(shape, generator, 1.0, torch.float64))
    return x.to(dtype)


def generator(seed):
    g = torch.Generator()
    g.manual_seed(int(seed) & ((1 << 63) - 1))
    return g

"""The runner's stats before the fused implementation (kept verbatim as the
reference the fast StatsEngine is checked against)."""

import math

import torch

CHUNK = 1 << 20
_HAS_AMINMAX = hasattr(torch, "aminmax")
_INF = float("inf")


def _finite_or_none(v):
    return v if v is not None and math.isfinite(v) else None


_EMPTY_STATS = {"min": None, "max": None, "mean": None, "std": None, "l2": None,
                "nan": 0, "pinf": 0, "ninf": 0, "zeros": 0}


class ReferenceStats(object):
    """Stats in float64 over finite values, with reusable scratch buffers.

    Fresh large allocations cost page faults on every call, so the float64
    copies go to two scratch buffers per device, at most CHUNK elements each;
    bigger tensors are processed chunk by chunk.
    """

    def __init__(self):
        self._ws = {}

    def _scratch(self, device, n):
        key = str(device)
        ws = self._ws.get(key)
        if ws is None or ws[0].numel() < n:
            size = 4096
            while size < n:
                size *= 2
            size = min(size, CHUNK)
            ws = (torch.empty(size, dtype=torch.float64, device=device),
                  torch.empty(size, dtype=torch.float64, device=device))
            self._ws[key] = ws
        return ws[0][:n], ws[1][:n]

    def stats(self, t):
        """``t``: prepared tensor (see prepare); any device, any real dtype."""
        if t.is_complex():
            t = torch.view_as_real(t)
        flat = t.reshape(-1)
        n = flat.numel()
        if n == 0:
            return dict(_EMPTY_STATS)
        # One pass per chunk: sum, sum of squares (float64), min, max (exact
        # in the tensor's own dtype), non-zeros.
        total = 0.0
        sumsq = 0.0
        nonzero = 0
        lo = _INF
        hi = -_INF
        # float32/float64 reductions work on the tensor itself everywhere; other
        # dtypes (half on the CPU of older builds...) use the float64 copy.
        native = flat.dtype in (torch.float32, torch.float64)
        for s in range(0, n, CHUNK):
            e = min(n, s + CHUNK)
            part = flat[s:e]
            a, b = self._scratch(flat.device, e - s)
            a.copy_(part)
            src = part if native else a
            if _HAS_AMINMAX:
                mn, mx = torch.aminmax(src)
            else:
                mn, mx = src.min(), src.max()
            vals = torch.stack([a.sum(), torch.mul(a, a, out=b).sum(), mn.to(torch.float64),
                                mx.to(torch.float64),
                                torch.count_nonzero(src).to(torch.float64)]).tolist()
            total += vals[0]
            sumsq += vals[1]
            lo = min(lo, vals[2])
            hi = max(hi, vals[3])
            nonzero += int(vals[4])
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
                a, b = self._scratch(flat.device, e - s)
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

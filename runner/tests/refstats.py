"""An independent reference for the runner's tensor statistics
(capd_runner/tensors.py; docs/protocol.md, "stats"), written from their
definitions and sharing no code with what it checks: numpy in float64,
unchunked, with the textbook formulas.

- ``nan``, ``pinf``, ``ninf``, ``zeros``: counts over every element;
- ``min``, ``max``, ``mean``, ``std`` (population), ``l2``: over the finite
  elements only, in float64; None where there is no finite element or the
  value overflows.

A complex tensor counts as its real and imaginary parts. Every real dtype
converts to float64 exactly (integers up to 2**53), so min and max are the
tensor's own values.
"""

import math

import numpy as np
import torch

# The engine processes large tensors in chunks of CHUNK elements; tests
# that shrink its chunk set this too. The reference never chunks.
CHUNK = 1 << 20


def _finite_or_none(v):
    return v if math.isfinite(v) else None


class ReferenceStats(object):
    """``stats(t)``: the statistics of tensor T, any device, any real or
    complex dtype."""

    def stats(self, t):
        if t.is_complex():
            t = torch.view_as_real(t)
        x = t.detach().to("cpu").to(torch.float64).reshape(-1).numpy()
        out = {"nan": int(np.isnan(x).sum()), "pinf": int(np.isposinf(x).sum()),
               "ninf": int(np.isneginf(x).sum()), "zeros": int((x == 0).sum())}
        fin = x[np.isfinite(x)]
        if fin.size == 0:
            out.update({"min": None, "max": None, "mean": None, "std": None, "l2": None})
            return out
        with np.errstate(over="ignore", invalid="ignore"):
            mean = float(np.mean(fin))
            std = float(np.std(fin)) if math.isfinite(mean) else float("inf")
            l2 = math.sqrt(float(np.dot(fin, fin)))
        out.update({"min": float(fin.min()), "max": float(fin.max()),
                    "mean": _finite_or_none(mean), "std": _finite_or_none(std),
                    "l2": _finite_or_none(l2)})
        return out

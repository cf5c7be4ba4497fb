"""A build whose GELU kernel is wrong at one width, for per-op demos and tests.

Put this directory on a build's PYTHONPATH. When the process runs at the
perturbed width (capd's CAPD_WIDTH equals CAPD_PERTURB_WIDTH, avx512 when
unset), aten::gelu's CPU kernel is replaced, through torch.library, by one
that computes GELU from erf and scales it by (1 + 2e-4): the operator keeps
its name and its place in the dispatch, only its result changes, the way a
stale generated Activation.cpp.AVX512.cpp would change it. Every other
width, and every other operator, is left alone, so a comparison at
granularity op must name aten::gelu as the first divergent op.

With CAPD_PERTURB_NAN=1 the kernel computes GELU exactly and writes NaN
into the first element of its result instead: a NaN injected in one op,
which the comparison must trace to aten::gelu (docs/compare.md, "First
non-finite").

With CAPD_PERTURB_WRAP=1 the kernel is left alone and
torch.nn.functional.gelu is wrapped instead, scaling its result by
(1 + 2e-4): the head runs one more operator (an aten::mul) after aten::gelu,
the way a Python-level wrapper in a framework change would, which the
comparison must name as the inserted op (docs/compare.md, "Ops one side has
and the other lacks").
"""
import os

# capd names the width in CAPD_WIDTH (avx512 and amx share ATEN_CPU_CAPABILITY).
_WIDTH = os.environ.get("CAPD_WIDTH") or os.environ.get("ATEN_CPU_CAPABILITY")

_PERTURBED = _WIDTH == os.environ.get("CAPD_PERTURB_WIDTH", "avx512")

if _PERTURBED and os.environ.get("CAPD_PERTURB_WRAP") == "1":
    import torch.nn.functional as _F

    _plain_gelu = _F.gelu

    def _wrapped_gelu(x, approximate="none"):
        return _plain_gelu(x, approximate=approximate) * (1.0 + 2e-4)

    _F.gelu = _wrapped_gelu
elif _PERTURBED:
    import warnings

    import torch

    _lib = torch.library.Library("aten", "IMPL", "CPU")

    def _gelu(x, approximate="none"):
        if approximate == "tanh":
            inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
            y = 0.5 * x * (1.0 + torch.tanh(inner))
        else:
            y = 0.5 * x * (1.0 + torch.erf(x * 0.7071067811865476))
        if os.environ.get("CAPD_PERTURB_NAN") == "1":
            y.view(-1)[0] = float("nan")
            return y
        return y * (1.0 + 2e-4)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "overriding a previously registered kernel"
        _lib.impl("gelu", _gelu)

"""A deliberately broken "build" for demos and end-to-end tests.

Put this directory on a build's PYTHONPATH and Python imports this file at
start-up. When the process runs at the perturbed width (capd names it in
CAPD_WIDTH; the width is CAPD_PERTURB_WIDTH from the
build's env, avx512 when unset), torch.nn.functional.linear is wrapped to
scale its output by (1 + 2e-4): the kind of small, width-specific numeric
drift a stale generated AVX-512 kernel produces. Every other width is left
alone, so a comparison must name the first Linear layer at that width as
the first divergence and find nothing at the others. The demo and the
tests perturb the widest width the host runs (avx512, else avx2).
"""
import os

# capd names the width in CAPD_WIDTH (avx512 and amx share ATEN_CPU_CAPABILITY).
_WIDTH = os.environ.get("CAPD_WIDTH") or os.environ.get("ATEN_CPU_CAPABILITY")

if _WIDTH == os.environ.get("CAPD_PERTURB_WIDTH", "avx512"):
    import torch
    import torch.nn.functional as F

    _linear = F.linear

    def _perturbed_linear(input, weight, bias=None):
        return _linear(input, weight, bias) * (1.0 + 2e-4)

    F.linear = _perturbed_linear

"""A deliberately broken "build" for demos and end-to-end tests.

Put this directory on a build's PYTHONPATH and Python imports this file at
start-up. When the process runs at the avx512 width (capd sets
ATEN_CPU_CAPABILITY per width), torch.nn.functional.linear is wrapped to
scale its output by (1 + 2e-4): the kind of small, width-specific numeric
drift a stale generated AVX-512 kernel produces. Every other width is left
alone, so a comparison must name the first Linear layer at avx512 as the
first divergence and find nothing at the others.
"""
import os

if os.environ.get("ATEN_CPU_CAPABILITY") == "avx512":
    import torch
    import torch.nn.functional as F

    _linear = F.linear

    def _perturbed_linear(input, weight, bias=None):
        return _linear(input, weight, bias) * (1.0 + 2e-4)

    F.linear = _perturbed_linear

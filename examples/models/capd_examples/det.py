"""Deterministic parameters and inputs for user models.

torch's floating-point random kernels (``torch.randn``, ``nn.init``) are
compiled per CPU capability and give different bits at different widths.
Integers drawn with ``torch.randint`` come straight from the generator and
are the same everywhere, so everything here is made from 24-bit integers
with exact float64 arithmetic and one final rounding: the same bits under
every width and every build of the same torch.
"""

import math

import torch
from torch import nn

_U24 = float(1 << 24)
_NORMS = (nn.modules.batchnorm._BatchNorm, nn.LayerNorm, nn.GroupNorm,
          nn.modules.instancenorm._InstanceNorm)


def generator(seed, salt=0):
    g = torch.Generator()
    g.manual_seed((int(seed) * 1000003 + salt) & ((1 << 63) - 1))
    return g


def uniform(shape, g, bound=1.0):
    """Uniform in (-bound, bound), float32, bit-identical everywhere."""
    ints = torch.randint(0, 1 << 24, tuple(shape), generator=g, dtype=torch.int64)
    x = (ints.to(torch.float64) + 0.5) * (2.0 / _U24) - 1.0
    return (x * float(bound)).to(torch.float32)


def normalish(shape, g):
    """Mean 0, variance about 1 (three uniforms, summed)."""
    return uniform(shape, g) + uniform(shape, g) + uniform(shape, g)


def init(model, seed):
    """Every parameter outside normalisation layers from integer draws,
    scaled by its fan-in; normalisation layers keep their constant
    defaults. Returns MODEL."""
    g = generator(seed, 17)
    with torch.no_grad():
        for _, mod in model.named_modules():
            if isinstance(mod, _NORMS):
                continue
            for _, p in mod.named_parameters(recurse=False):
                fan_in = max(1, p[0].numel()) if p.dim() >= 2 else 1
                bound = math.sqrt(6.0 / fan_in) if p.dim() >= 2 else 0.1
                p.copy_(uniform(p.shape, g, bound).to(p.dtype))
    return model

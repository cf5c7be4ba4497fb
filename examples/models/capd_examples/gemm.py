"""A model made of matrix products long enough that the BLAS's code branches
give other bits: what a width must pin in MKL or OpenBLAS.

Measured on the official wheel (MKL 2024.2, an AVX-512 host): float32
``nn.Linear`` products with 24 to 200 input features give the same bits
under MKL's strict AVX2 and AVX-512 branches, and other bits from 300; the
SSE4.2 branch differs at every size. So the layers here reduce over 320 and
640 values.
"""

from torch import nn

from capd_examples import det


def wide_mlp(seed, batch, dtype):
    """Linear 320 -> 640 -> 640 -> 10 with GELUs, input [batch, 320]."""
    model = nn.Sequential(nn.Linear(320, 640), nn.GELU(), nn.Linear(640, 640), nn.GELU(),
                          nn.Linear(640, 10))
    return det.init(model, seed), (det.normalish((batch, 320), det.generator(seed, 1)),)

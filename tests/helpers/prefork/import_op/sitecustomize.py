"""A build that runs a torch operator while it is imported (tests/test_prefork.c).

PyTorch fixes its CPU capability at the first dispatched operator, so a
zygote of this build has its capability fixed before any cell's width
variables exist: a forked child cannot honour its width. Prefork must be
refused for such a build (its cells still run, by fresh exec)."""
import torch

torch.ones(4).add_(1)

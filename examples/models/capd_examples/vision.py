"""torchvision architectures capd's zoo does not have, 10 classes, no
weights, inputs [batch, 3, 64, 64]."""

import torchvision.models as tvm

from capd_examples import det


def _image(fn, seed, batch):
    model = det.init(fn(num_classes=10), seed)
    return model, (det.normalish((batch, 3, 64, 64), det.generator(seed, 1)),)


def squeezenet1_1(seed, batch, dtype):
    """SqueezeNet 1.1: fire modules (1x1 squeeze, 1x1 and 3x3 expand)."""
    return _image(tvm.squeezenet1_1, seed, batch)


def shufflenet_v2_x0_5(seed, batch, dtype):
    """ShuffleNet V2 0.5x: channel split and shuffle, depthwise convs."""
    return _image(tvm.shufflenet_v2_x0_5, seed, batch)


def mnasnet0_5(seed, batch, dtype):
    """MNASNet 0.5: inverted residuals found by architecture search."""
    return _image(tvm.mnasnet0_5, seed, batch)

"""Built-in models, built in code from the seed (no downloads).

build(name, seed, batch) returns (model, inputs) in float32 on the CPU;
the runner casts to the cell's dtype and moves to its device afterwards.

torch.manual_seed(seed) is called before building, and then every parameter
that torch would draw at random is drawn again from an integer-based
generator (tensors.det_uniform) so the initial values are bit-identical
across PyTorch builds, versions and CPU widths; parameters whose default is a
constant (norm weights 1, biases 0) keep it. Inputs come from the same kind of
generator.
"""

import inspect
import math

import torch
from torch import nn

from capd_runner import catalog
from capd_runner.tensors import det_normalish, det_uniform, generator


class ModelError(Exception):
    """A model that cannot be built here (unknown name, missing package)."""


_NORM_TYPES = (nn.modules.batchnorm._BatchNorm, nn.LayerNorm, nn.GroupNorm,
               nn.modules.instancenorm._InstanceNorm)


def deterministic_init(model, seed):
    g = generator(seed * 1000003 + 17)
    with torch.no_grad():
        for mod_name, mod in model.named_modules():
            if isinstance(mod, _NORM_TYPES):
                continue  # constant defaults (weight 1, bias 0)
            for pname, p in mod.named_parameters(recurse=False):
                if p.dim() >= 3:  # convolutions: He-uniform (followed by ReLU-likes)
                    bound = math.sqrt(6.0 / max(1, p[0].numel()))
                elif p.dim() == 2:  # linear maps, embeddings: variance-preserving
                    bound = math.sqrt(3.0 / max(1, p[0].numel()))
                else:  # biases
                    bound = 0.1
                p.copy_(det_uniform(p.shape, g, bound, p.dtype))


# --- the models -------------------------------------------------------------

class MLP(nn.Module):
    def __init__(self):
        super(MLP, self).__init__()
        self.fc1 = nn.Linear(64, 128)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(128, 128)
        self.fc3 = nn.Linear(128, 10)

    def forward(self, x):
        x = self.act(self.fc1(x))
        x = self.act(self.fc2(x))
        return self.fc3(x)


class CNN(nn.Module):
    def __init__(self):
        super(CNN, self).__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        return self.fc(self.flatten(self.pool(self.features(x))))


class Transformer(nn.Module):
    # batch_first=False keeps PyTorch off its fused "fast path" (1.12+), which
    # would skip the submodules' hooks and differ between versions.
    def __init__(self, d_model=32, nhead=4, ffn=64, layers=2):
        super(Transformer, self).__init__()
        kw = {}
        layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward=ffn, dropout=0.0,
                                           activation="gelu")
        if "enable_nested_tensor" in inspect.signature(nn.TransformerEncoder.__init__).parameters:
            kw["enable_nested_tensor"] = False
        self.encoder = nn.TransformerEncoder(layer, layers, **kw)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, 10)

    def forward(self, x):
        h = self.norm(self.encoder(x))
        return self.head(h.mean(dim=0))


class LSTMModel(nn.Module):
    def __init__(self):
        super(LSTMModel, self).__init__()
        self.lstm = nn.LSTM(16, 32, num_layers=2)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        out, _state = self.lstm(x)
        return self.head(out[-1])


class EmbeddingBagModel(nn.Module):
    def __init__(self):
        super(EmbeddingBagModel, self).__init__()
        self.bag = nn.EmbeddingBag(1000, 32, mode="mean")
        self.act = nn.ReLU()
        self.head = nn.Linear(32, 10)

    def forward(self, indices, offsets):
        return self.head(self.act(self.bag(indices, offsets)))


def _torchvision_models(name):
    try:
        import torchvision.models as tvm
    except Exception as e:
        raise ModelError("model %r needs torchvision, which cannot be imported here (%s: %s)"
                         % (name, type(e).__name__, e))
    fn = getattr(tvm, name, None)
    if fn is None:
        raise ModelError("model %r is not in this torchvision (%s)"
                         % (name, getattr(__import__("torchvision"), "__version__", "?")))
    # No weights argument at all: every torchvision version defaults to random
    # init (pretrained=False before 0.13, weights=None after).
    return fn(num_classes=10)


def build(name, seed, batch):
    if name not in catalog.NAMES:
        raise ModelError("unknown model %r (zoo: %s; user models are 'package.module:factory')"
                         % (name, ", ".join(catalog.NAMES)))
    torch.manual_seed(seed)
    g = generator(seed * 1000003 + 1)
    if name == "mlp":
        model = MLP()
        inputs = (det_normalish((batch, 64), g),)
    elif name == "cnn":
        model = CNN()
        inputs = (det_normalish((batch, 3, 32, 32), g),)
    elif name in ("resnet18", "mobilenet_v3_small"):
        model = _torchvision_models(name)
        inputs = (det_normalish((batch, 3, 64, 64), g),)
    elif name == "transformer":
        model = Transformer()
        inputs = (det_normalish((16, batch, 32), g),)
    elif name == "lstm":
        model = LSTMModel()
        inputs = (det_normalish((8, batch, 16), g),)
    elif name == "embedding_bag":
        model = EmbeddingBagModel()
        sizes = torch.randint(1, 9, (batch,), generator=g, dtype=torch.int64)
        total = int(sizes.sum())
        indices = torch.randint(0, 1000, (total,), generator=g, dtype=torch.int64)
        offsets = torch.zeros(batch, dtype=torch.int64)
        if batch > 1:
            offsets[1:] = torch.cumsum(sizes, 0)[:-1]
        inputs = (indices, offsets)
    else:  # pragma: no cover - catalog and build out of step
        raise ModelError("model %r has no builder" % name)
    deterministic_init(model, seed)
    return model, inputs

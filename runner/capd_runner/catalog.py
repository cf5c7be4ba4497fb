"""The built-in model zoo's names and descriptions (no torch import here, so
``--list-models`` is cheap). Builders live in zoo.py."""

MODELS = [
    {"name": "mlp",
     "description": "3-layer perceptron 64-128-128-10 whose one ReLU module is called twice "
                    "(call indices 0 and 1); input [batch, 64]",
     "needs": None},
    {"name": "cnn",
     "description": "2 blocks of Conv2d/BatchNorm2d/ReLU/MaxPool2d, global average pool, "
                    "Linear; input [batch, 3, 32, 32]",
     "needs": None},
    {"name": "resnet18",
     "description": "torchvision ResNet-18, 10 classes, no pretrained weights; "
                    "input [batch, 3, 64, 64]",
     "needs": "torchvision"},
    {"name": "mobilenet_v3_small",
     "description": "torchvision MobileNetV3-Small (depthwise conv, squeeze-excite, hardswish), "
                    "10 classes, no pretrained weights; input [batch, 3, 64, 64]",
     "needs": "torchvision"},
    {"name": "transformer",
     "description": "2 nn.TransformerEncoderLayer (d_model 32, 4 heads, FFN 64, GELU, "
                    "LayerNorm, softmax attention), final LayerNorm, Linear on the mean; "
                    "input [16, batch, 32] (seq first)",
     "needs": None},
    {"name": "lstm",
     "description": "2-layer nn.LSTM 16->32, Linear on the last step; input [8, batch, 16] "
                    "(seq first)",
     "needs": None},
    {"name": "embedding_bag",
     "description": "nn.EmbeddingBag(1000, 32, mode='mean') over bags of 1..8 int64 indices, "
                    "ReLU, Linear; inputs: indices, offsets",
     "needs": None},
]

NAMES = tuple(m["name"] for m in MODELS)


def list_models():
    return [dict(m) for m in MODELS]

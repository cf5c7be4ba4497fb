"""Models from model libraries outside Debian (timm, Hugging Face
transformers), in small configurations, no weights. Debian's torch 1.13
has neither library; a host whose interpreter has them (the GPU host's
image does) runs these the same way as the others. Each factory imports
its library inside, so a missing library fails only the cells that name
it ("exception in model code: ModuleNotFoundError")."""

import torch
from torch import nn

from capd_examples import det


def _image(model, seed, batch, size):
    model = det.init(model, seed)
    return model, (det.normalish((batch, 3, size, size), det.generator(seed, 1)),)


def timm_resnet10t(seed, batch, dtype):
    """timm ResNet-10-T (tiered stem, average-pool downsampling), 10 classes,
    input [batch, 3, 64, 64]."""
    import timm
    return _image(timm.create_model("resnet10t", pretrained=False, num_classes=10), seed,
                  batch, 64)


def timm_vit_micro(seed, batch, dtype):
    """timm VisionTransformer: 32x32 input in 8x8 patches, width 32, 2 blocks of
    2 heads, 10 classes."""
    from timm.models.vision_transformer import VisionTransformer
    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2,
                              num_classes=10)
    return _image(model, seed, batch, 32)


class _LastHidden(nn.Module):
    """An encoder whose output is its last hidden state, a plain tensor."""

    def __init__(self, encoder):
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids, attention_mask):
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def bert_encoder(seed, batch, dtype):
    """A transformers BERT encoder from a small config (vocabulary 128, width 32,
    2 layers of 2 heads, FFN 64); inputs [batch, 16] token ids and their mask."""
    from transformers import BertConfig, BertModel
    cfg = BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=32,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = det.init(_LastHidden(BertModel(cfg)), seed)
    g = det.generator(seed, 1)
    ids = torch.randint(0, 128, (batch, 16), generator=g, dtype=torch.int64)
    mask = torch.ones(batch, 16, dtype=torch.int64)
    return model, (ids, mask)

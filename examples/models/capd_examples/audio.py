"""torchaudio models in small configurations (a few thousand to a few
hundred thousand parameters), no weights."""

import torch
import torchaudio.models as tam

from capd_examples import det


def conv_tasnet(seed, batch, dtype):
    """Conv-TasNet source separation: 1-D conv encoder, a temporal conv
    mask network, transposed-conv decoder; input [batch, 1, 800] samples."""
    model = tam.ConvTasNet(num_sources=2, enc_kernel_size=16, enc_num_feats=32,
                           msk_kernel_size=3, msk_num_feats=16, msk_num_hidden_feats=32,
                           msk_num_layers=2, msk_num_stacks=1)
    return det.init(model, seed), (det.normalish((batch, 1, 800), det.generator(seed, 1)),)


def deepspeech(seed, batch, dtype):
    """DeepSpeech: fully connected layers with clipped ReLU and a
    bidirectional RNN; input [batch, 1, 20 frames, 16 features]."""
    model = tam.DeepSpeech(n_feature=16, n_hidden=32, n_class=10)
    return det.init(model, seed), (det.normalish((batch, 1, 20, 16), det.generator(seed, 1)),)


def conformer(seed, batch, dtype):
    """Conformer encoder: feed-forward, self-attention and depthwise
    convolution blocks; inputs [batch, 24 frames, 16] and their lengths."""
    model = tam.Conformer(input_dim=16, num_heads=2, ffn_dim=32, num_layers=2,
                          depthwise_conv_kernel_size=3)
    x = det.normalish((batch, 24, 16), det.generator(seed, 1))
    lengths = torch.full((batch,), 24, dtype=torch.int64)
    return det.init(model, seed), (x, lengths)

"""A tiny MLP-Mixer with gated (GLU) channel mixing.

Style points: patches cut with reshape + permute instead of a convolution, token mixing
by permuting the token and channel axes, F.layer_norm without affine parameters,
a learnable nn.Parameter layer scale, x.chunk(2, dim=-1) gating with
F.gelu(approximate='tanh'), and torch.clamp as a logit cap.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class MixerBlock(nn.Module):
    def __init__(self, num_tokens, dim, token_hidden, channel_hidden, init_scale=0.1):
        super().__init__()
        self.dim = dim
        self.token_fc1 = nn.Linear(num_tokens, token_hidden)
        self.token_fc2 = nn.Linear(token_hidden, num_tokens)
        # the gate and the value come out of one projection and are split with chunk
        self.channel_fc1 = nn.Linear(dim, 2 * channel_hidden)
        self.channel_fc2 = nn.Linear(channel_hidden, dim)
        self.scale = nn.Parameter(init_scale * torch.ones(dim))

    def forward(self, x):
        # x: (batch, tokens, dim)
        y = F.layer_norm(x, (self.dim,))
        y = y.permute(0, 2, 1)  # (batch, dim, tokens): mix along the token axis
        y = self.token_fc2(F.gelu(self.token_fc1(y), approximate="tanh"))
        x = x + y.permute(0, 2, 1)

        y = F.layer_norm(x, (self.dim,))
        value, gate = self.channel_fc1(y).chunk(2, dim=-1)
        y = self.channel_fc2(value * F.gelu(gate, approximate="tanh"))
        return x + self.scale * y


class TinyMixer(nn.Module):
    def __init__(
        self,
        image_size=16,
        patch_size=4,
        in_channels=3,
        dim=32,
        depth=2,
        num_classes=10,
        logit_cap=30.0,
    ):
        super().__init__()
        self.patch_size = patch_size
        self.logit_cap = logit_cap
        num_tokens = (image_size // patch_size) ** 2
        self.embed = nn.Linear(in_channels * patch_size * patch_size, dim)
        self.blocks = nn.Sequential(
            *[MixerBlock(num_tokens, dim, 2 * num_tokens, 2 * dim) for _ in range(depth)]
        )
        self.head = nn.Linear(dim, num_classes)

    def patchify(self, x):
        b, c, h, w = x.shape
        p = self.patch_size
        x = x.reshape(b, c, h // p, p, w // p, p)
        x = x.permute(0, 2, 4, 1, 3, 5)  # (b, h/p, w/p, c, p, p)
        return x.reshape(b, (h // p) * (w // p), c * p * p)

    def forward(self, x):
        x = self.embed(self.patchify(x))
        x = self.blocks(x)
        x = F.layer_norm(x, (x.shape[-1],))
        logits = self.head(x.mean(dim=1))
        return torch.clamp(logits, min=-self.logit_cap, max=self.logit_cap)


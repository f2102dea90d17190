"""The workshop's models, small by default and scalable by arguments.

* ``SmallCNN``: the digits / MNIST / CIFAR-10 classifier of the data-parallel track.
* ``resnet18_cifar``: torchvision's ResNet-18 adapted to 32x32 images (3x3 stem, no max-pool).
* ``TransformerLM``: a decoder-only language model written out in plain modules (separate
  q/k/v/o and up/down projections) so that FSDP, tensor and pipeline parallelism can cut it
  along the lines the lessons draw.

    python -m source_code.models     # parameter counts of the defaults
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from source_code.errors import LaunchError


class SmallCNN(nn.Module):
    """Two conv blocks and a classifier; any square input size (adaptive pooling)."""

    def __init__(self, in_channels: int = 1, num_classes: int = 10, width: int = 32):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(),
            nn.AdaptiveMaxPool2d(4),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(2 * width * 16, 128), nn.ReLU(), nn.Linear(128, num_classes))

    def forward(self, x):
        return self.classifier(self.features(x))


def resnet18_cifar(num_classes: int = 10) -> nn.Module:
    """ResNet-18 for 32x32 inputs: the ImageNet stem (7x7 stride 2 + max-pool) would leave 1x1 maps."""
    import torchvision
    model = torchvision.models.resnet18(weights=None, num_classes=num_classes)
    model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model


class Attention(nn.Module):
    def __init__(self, dim: int, n_heads: int):
        super().__init__()
        assert dim % n_heads == 0, f"dim {dim} must be divisible by n_heads {n_heads}"
        self.n_heads = n_heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        b, t, _ = x.shape
        # -1 instead of n_heads: under tensor parallelism each rank holds only some of the heads
        q, k, v = (w(x).view(b, t, -1, self.wq.in_features // self.n_heads).transpose(1, 2)
                   for w in (self.wq, self.wk, self.wv))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self, dim: int, n_heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, n_heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim, 4 * dim)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TransformerLM(nn.Module):
    """Token + position embeddings, ``n_layers`` pre-norm blocks, a final norm and LM head."""

    def __init__(self, vocab_size: int = 32, dim: int = 64, n_layers: int = 2, n_heads: int = 4,
                 max_len: int = 64):
        super().__init__()
        self.tok = nn.Embedding(vocab_size, dim)
        self.pos = nn.Embedding(max_len, dim)
        self.layers = nn.ModuleList(Block(dim, n_heads) for _ in range(n_layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab_size, bias=False)
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, tokens):
        t = tokens.shape[1]
        if t > self.pos.num_embeddings:  # the position table would fail with an opaque IndexError
            raise ValueError(f"sequence length {t} exceeds max_len {self.pos.num_embeddings}; "
                             f"build TransformerLM(max_len={t}) or use shorter blocks")
        x = self.tok(tokens) + self.pos(torch.arange(t, device=tokens.device))
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


NAMES = ("smallcnn", "resnet18", "transformer")


def check_name(name: str) -> None:
    if name not in NAMES:
        raise LaunchError(f"error: unknown model {name!r}; choose one of {', '.join(NAMES)}")


def build_model(name: str, **kwargs) -> nn.Module:
    """By name, for command-line flags: smallcnn | resnet18 | transformer."""
    check_name(name)
    builders = {"smallcnn": SmallCNN, "resnet18": resnet18_cifar, "transformer": TransformerLM}
    return builders[name](**kwargs)


if __name__ == "__main__":
    for name, m in [("SmallCNN(digits)", SmallCNN()), ("SmallCNN(cifar)", SmallCNN(3)),
                    ("resnet18_cifar", resnet18_cifar()), ("TransformerLM", TransformerLM())]:
        print(f"{name:18s} {count_parameters(m):>12,d} parameters")

"""The seed models as ``ember.nn`` modules: the seed CNN and the seed text transformer (defined, with the reasons
for them, in docs/models.md, "The seed models").

Both follow PyTorch's layer names and default initialisation, so their ``state_dict`` keys match the torch twins
(``torch.nn`` built the same way) and weights move across by name.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Any

import ember
from ember import Tensor, nn
from ember.errors import ShapeError, ValueRangeError

__all__ = ["SeedCNN", "TextTransformer", "TransformerConfig", "TRANSFORMER_CONFIGS", "seed_cnn", "text_transformer"]


class SeedCNN(nn.Sequential):
    """The seed CNN (input ``(N, 1, 28, 28)``, 10 classes): two conv-BN-ReLU-pool blocks and a 3-layer GELU head.

    Conv2d 1->64 3x3 -> BatchNorm2d -> ReLU -> MaxPool2d 2 -> Conv2d 64->64 3x3 -> BatchNorm2d -> ReLU -> MaxPool2d 2
    -> Flatten (64*5*5 = 1600) -> Linear 1600->128 -> GELU -> Dropout 0.25 -> Linear 128->128 -> GELU -> Dropout 0.25
    -> Linear 128->10. Children are named like ``benchmarks/models.py``'s torch twin (``conv1``, ``bn1``, ...).
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10, channels: int = 64, hidden: int = 128,
                 dropout: float = 0.25, image_size: int = 28) -> None:
        # two (conv 3x3 valid, pool 2) stages: 28 -> 26 -> 13 -> 11 -> 5
        side = ((image_size - 2) // 2 - 2) // 2
        if side < 1:
            raise ValueRangeError(f"SeedCNN: image_size={image_size} is too small (needs at least 10)")
        super().__init__(OrderedDict([
            ("conv1", nn.Conv2d(in_channels, channels, 3)), ("bn1", nn.BatchNorm2d(channels)),
            ("relu1", nn.ReLU()), ("pool1", nn.MaxPool2d(2)),
            ("conv2", nn.Conv2d(channels, channels, 3)), ("bn2", nn.BatchNorm2d(channels)),
            ("relu2", nn.ReLU()), ("pool2", nn.MaxPool2d(2)),
            ("flatten", nn.Flatten()),
            ("fc1", nn.Linear(channels * side * side, hidden)), ("gelu1", nn.GELU()), ("drop1", nn.Dropout(dropout)),
            ("fc2", nn.Linear(hidden, hidden)), ("gelu2", nn.GELU()), ("drop2", nn.Dropout(dropout)),
            ("fc3", nn.Linear(hidden, num_classes)),
        ]))
        self.in_channels, self.image_size, self.num_classes = in_channels, image_size, num_classes

    def forward(self, input: Any) -> Any:
        # name the expected layout here: a flat (N, 784) batch would otherwise fail deep inside conv1
        shape = tuple(getattr(input, "shape", ()))
        want = (self.in_channels, self.image_size, self.image_size)
        if len(shape) != 4 or shape[1:] != want:
            raise ShapeError(f"SeedCNN: expected input of shape (N, {want[0]}, {want[1]}, {want[2]}), got {shape}")
        return super().forward(input)


@dataclass(frozen=True)
class TransformerConfig:
    """Sizes of the seed text transformer."""

    vocab_size: int
    max_len: int
    d_model: int
    nhead: int
    num_layers: int
    dim_feedforward: int
    dropout: float = 0.1


TRANSFORMER_CONFIGS: dict[str, TransformerConfig] = {
    # docs/models.md: the BERT-cased vocabulary size, 6 pre-norm layers of width 512, sequences of 512
    "full": TransformerConfig(vocab_size=28996, max_len=512, d_model=512, nhead=8, num_layers=6, dim_feedforward=2048),
    # the quick configuration: 2 layers of width 128 on sequences of 128 (same vocabulary)
    "small": TransformerConfig(vocab_size=28996, max_len=128, d_model=128, nhead=4, num_layers=2, dim_feedforward=512),
}


class TextTransformer(nn.Module):
    """Seed text classifier: token + learned position embeddings -> pre-norm encoder -> Linear on the first token.

    Input: int64 token ids ``(N, L)`` with ``L <= max_len``; output: logits ``(N, num_classes)``. The encoder is
    ``nn.TransformerEncoder`` of ``TransformerEncoderLayer(norm_first=True, activation="gelu", batch_first=True)``
    with a final ``LayerNorm`` (pre-norm layers leave the residual stream unnormalised, as in torch's
    ``nn.Transformer``).
    """

    def __init__(self, vocab_size: int, num_classes: int, d_model: int = 128, nhead: int = 4, num_layers: int = 2,
                 dim_feedforward: int = 512, max_len: int = 128, dropout: float = 0.1) -> None:
        super().__init__()
        if d_model % nhead:
            raise ValueRangeError(f"TextTransformer: d_model={d_model} is not divisible by nhead={nhead}")
        self.vocab_size, self.max_len, self.num_classes = vocab_size, max_len, num_classes
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        self.position_embedding = nn.Embedding(max_len, d_model)
        self.dropout = nn.Dropout(dropout)
        layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers, norm=nn.LayerNorm(d_model))
        self.head = nn.Linear(d_model, num_classes)

    @classmethod
    def from_config(cls, name: str | TransformerConfig, num_classes: int, **overrides: Any) -> TextTransformer:
        """Build the ``"full"`` or ``"small"`` configuration (``overrides`` replace single sizes)."""
        if isinstance(name, TransformerConfig):
            cfg = name
        elif name in TRANSFORMER_CONFIGS:
            cfg = TRANSFORMER_CONFIGS[name]
        else:
            raise ValueRangeError(f"TextTransformer.from_config: unknown configuration {name!r} "
                                  f"(expected one of {sorted(TRANSFORMER_CONFIGS)})")
        return cls(num_classes=num_classes, **{**asdict(cfg), **overrides})

    def forward(self, tokens: Tensor) -> Tensor:
        shape = tuple(tokens.shape)
        if len(shape) != 2:
            raise ShapeError(f"TextTransformer: expected token ids of shape (N, L), got {shape}")
        if shape[1] > self.max_len:
            raise ShapeError(f"TextTransformer: sequence length {shape[1]} exceeds max_len={self.max_len} "
                             f"(input shape {shape})")
        positions = ember.arange(shape[1], device=tokens.device)
        x = self.dropout(self.token_embedding(tokens) + self.position_embedding(positions))
        x = self.encoder(x)
        return self.head(x[:, 0])


def seed_cnn(**kwargs: Any) -> SeedCNN:
    """The seed CNN (see :class:`SeedCNN`)."""
    return SeedCNN(**kwargs)


def text_transformer(config: str = "small", num_classes: int = 4, **overrides: Any) -> TextTransformer:
    """The seed text transformer in configuration ``"full"`` or ``"small"``."""
    return TextTransformer.from_config(config, num_classes, **overrides)

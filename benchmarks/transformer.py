"""The seed text transformer (docs/models.md) for benchmarks: the ember model of ``ember_train.models``, its
PyTorch twin with the same ``state_dict`` names, weight transfer, and a deterministic token batch.

Run through ``benchmarks/suite.py`` (``ember bench``), which times its training step (AdamW) and inference.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ember_train.models import TRANSFORMER_CONFIGS

NUM_CLASSES = 4


def torch_text_transformer(config: str, num_classes: int = NUM_CLASSES) -> Any:
    """``torch.nn`` twin of ``ember_train.models.TextTransformer`` (same layer names, pre-norm GELU encoder)."""
    import torch
    from torch import nn

    cfg = TRANSFORMER_CONFIGS[config]

    class TorchTextTransformer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.token_embedding = nn.Embedding(cfg.vocab_size, cfg.d_model)
            self.position_embedding = nn.Embedding(cfg.max_len, cfg.d_model)
            self.dropout = nn.Dropout(cfg.dropout)
            layer = nn.TransformerEncoderLayer(cfg.d_model, cfg.nhead, cfg.dim_feedforward, cfg.dropout,
                                               activation="gelu", batch_first=True, norm_first=True)
            # no nested tensors: ember has none, and they would change what is timed in eval mode
            self.encoder = nn.TransformerEncoder(layer, cfg.num_layers, norm=nn.LayerNorm(cfg.d_model),
                                                 enable_nested_tensor=False)
            self.head = nn.Linear(cfg.d_model, num_classes)

        def forward(self, tokens: Any) -> Any:
            positions = torch.arange(tokens.shape[1])
            x = self.dropout(self.token_embedding(tokens) + self.position_embedding(positions))
            return self.head(self.encoder(x)[:, 0])

    return TorchTextTransformer()


def copy_to_torch(ember_model: Any, torch_model: Any) -> None:
    """Copy every parameter and buffer of the ember model into its torch twin, by name."""
    import torch

    state = torch_model.state_dict()
    with torch.no_grad():
        for name, t in ember_model.state_dict().items():
            if name in state:  # torch-only bookkeeping (num_batches_tracked) has no ember counterpart to copy
                state[name].copy_(torch.from_numpy(np.ascontiguousarray(t.detach().numpy())))


def token_batch(config: str, batch: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic int64 token ids ``(batch, max_len)`` and labels ``(batch,)``."""
    cfg = TRANSFORMER_CONFIGS[config]
    rng = np.random.default_rng(seed)
    return (rng.integers(0, cfg.vocab_size, (batch, cfg.max_len)).astype(np.int64),
            rng.integers(0, NUM_CLASSES, batch).astype(np.int64))

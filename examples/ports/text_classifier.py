"""A text classifier built on ``nn.TransformerEncoder``: token + learned position embeddings, 2 post-norm encoder
layers (batch_first, with a key padding mask), masked mean pooling and a linear head; CrossEntropyLoss with label
smoothing, AdamW, a linear warm-up then cosine decay (SequentialLR) and gradient clipping. The data are generated
sentences of four topics, padded with token 0 -- nothing downloads.

This is the ember port of ``examples/ports/torch/text_classifier.py`` (diff the two files): ``torch`` renamed ``ember``,
plus device creation.

    python examples/ports/text_classifier.py [--quick]
"""

from __future__ import annotations

import argparse
import math

import numpy as np

import ember
import ember.nn as nn
from ember.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR

TOPICS = {
    "sports": "match team goal score player coach league season win defeat stadium referee",
    "science": "atom cell energy theory experiment molecule physics biology lab data hypothesis planet",
    "finance": "market stock bank price share trade profit loss investor fund rate currency",
    "travel": "flight hotel beach city museum train ticket passport island tour map luggage",
}
COMMON = "the a of and to in is was on for with that this it at by from as be".split()


def make_dataset(n: int, max_len: int = 32, seed: int = 0) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """``n`` generated sentences as (n, max_len) int64 token ids (0 = padding, 1 = unknown) and their topic labels;
    each sentence mixes common words with words of its topic and a few of another topic."""
    rng = np.random.default_rng(seed)
    topics = [words.split() for words in TOPICS.values()]
    vocab = ["<pad>", "<unk>"] + COMMON + [w for words in topics for w in words]
    index = {w: i for i, w in enumerate(vocab)}
    tokens = np.zeros((n, max_len), dtype=np.int64)
    labels = rng.integers(0, len(topics), size=n)
    for row, label in enumerate(labels):
        length = int(rng.integers(max_len // 4, max_len + 1))
        other = topics[(label + int(rng.integers(1, len(topics)))) % len(topics)]
        pools = [COMMON, topics[label], other]
        picks = rng.choice(3, size=length, p=[0.5, 0.35, 0.15])
        words = [pools[p][int(rng.integers(len(pools[p])))] for p in picks]
        tokens[row, :length] = [index[w] for w in words]
    return tokens, labels.astype(np.int64), vocab


class TextClassifier(nn.Module):
    def __init__(self, vocab_size: int, num_classes: int, d_model: int = 64, nhead: int = 4, num_layers: int = 2,
                 dim_feedforward: int = 128, dropout: float = 0.1, max_len: int = 32) -> None:
        super().__init__()
        self.d_model = d_model
        self.embedding = nn.Embedding(vocab_size, d_model, padding_idx=0)
        self.pos_embedding = nn.Embedding(max_len, d_model)
        layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, batch_first=True)
        # no nested-tensor fast path: it only serves eval-mode inference and warns that it is a prototype
        self.encoder = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
        self.classifier = nn.Linear(d_model, num_classes)

    def forward(self, tokens):
        padding = tokens == 0
        positions = ember.arange(tokens.size(1), device=tokens.device)
        x = self.embedding(tokens) * math.sqrt(self.d_model) + self.pos_embedding(positions)
        x = self.encoder(x, src_key_padding_mask=padding)
        keep = (~padding).unsqueeze(-1).to(x.dtype)
        pooled = (x * keep).sum(dim=1) / keep.sum(dim=1).clamp(min=1.0)
        return self.classifier(pooled)


def build(vocab_size: int, num_classes: int, device, total_steps: int = 100, warmup: int = 10, lr: float = 1e-3,
          **model_kwargs):
    """(model, criterion, optimizer, scheduler): AdamW with decoupled weight decay, warm-up then cosine."""
    model = TextClassifier(vocab_size, num_classes, **model_kwargs).to(device)
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    optimizer = ember.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    scheduler = SequentialLR(optimizer, [LinearLR(optimizer, start_factor=0.1, total_iters=warmup),
                                         CosineAnnealingLR(optimizer, T_max=max(total_steps - warmup, 1))],
                             milestones=[warmup])
    return model, criterion, optimizer, scheduler


def train_step(model, criterion, optimizer, scheduler, tokens, labels) -> float:
    """One optimisation step (clipped at norm 1) and one scheduler step; returns the loss value."""
    optimizer.zero_grad()
    loss = criterion(model(tokens), labels)
    loss.backward()
    ember.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    scheduler.step()
    return loss.item()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="nn.TransformerEncoder text classifier on generated sentences")
    parser.add_argument("--quick", action="store_true", help="a tiny configuration (a few seconds)")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args(argv)
    ember.manual_seed(0)
    device = ember.device("cpu").autodiff()  # port: ember devices record gradients only when asked to
    steps = 3 if args.quick else args.steps
    n_eval = 64 if args.quick else 256
    tokens, labels, vocab = make_dataset(args.batch_size * steps + n_eval)
    x, y = ember.tensor(tokens).to(device), ember.tensor(labels).to(device)
    model, criterion, optimizer, scheduler = build(len(vocab), len(TOPICS), device, total_steps=steps)
    model.train()
    for step in range(steps):
        batch = slice(step * args.batch_size, (step + 1) * args.batch_size)
        loss = train_step(model, criterion, optimizer, scheduler, x[batch], y[batch])
    model.eval()
    with ember.no_grad():
        accuracy = (model(x[-n_eval:]).argmax(dim=1) == y[-n_eval:]).float().mean().item()
    print(f"{steps} steps: final train loss {loss:.4f}, held-out accuracy {accuracy:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Word-level LSTM language model, after pytorch/examples word_language_model (model.py + main.py), trimmed to
what a training step needs: Embedding -> 2-layer LSTM (dropout) -> Linear decoder with tied weights, NLL loss,
truncated BPTT with repackaged hidden state, gradient clipping and plain SGD written by hand on ``p.data``.

The corpus is the reStructuredText descriptions scikit-learn ships with its toy datasets (nothing downloads).
This is the PyTorch original; ``examples/ports/word_lm.py`` is its ember port (diff the two files).

    python examples/ports/torch/word_lm.py [--quick]
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F


class Dictionary:
    """word <-> index, in first-seen order."""

    def __init__(self) -> None:
        self.word2idx: dict[str, int] = {}
        self.idx2word: list[str] = []

    def add_word(self, word: str) -> int:
        if word not in self.word2idx:
            self.idx2word.append(word)
            self.word2idx[word] = len(self.idx2word) - 1
        return self.word2idx[word]

    def __len__(self) -> int:
        return len(self.idx2word)


def corpus_text(max_lines: int | None = None) -> list[str]:
    """Lines of the dataset descriptions scikit-learn ships (sorted files: the same corpus on every machine)."""
    spec = importlib.util.find_spec("sklearn")  # where it is installed; importing it would take seconds
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("word_lm reads its corpus from scikit-learn's dataset descriptions: pip install "
                                  "scikit-learn")
    lines: list[str] = []
    for path in sorted((Path(spec.origin).parent / "datasets" / "descr").glob("*.rst")):
        lines += [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return lines[:max_lines] if max_lines is not None else lines


class Corpus:
    """The word ids of the whole corpus, one ``<eos>`` after each line."""

    def __init__(self, lines: list[str]) -> None:
        self.dictionary = Dictionary()
        ids: list[int] = []
        for line in lines:
            for word in line.split() + ["<eos>"]:
                ids.append(self.dictionary.add_word(word))
        self.train = torch.tensor(ids, dtype=torch.int64)


class RNNModel(nn.Module):
    """Container module with an encoder, a recurrent module, and a decoder."""

    def __init__(self, ntoken: int, ninp: int, nhid: int, nlayers: int, dropout: float = 0.5,
                 tie_weights: bool = False) -> None:
        super().__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        if tie_weights:
            if nhid != ninp:
                raise ValueError("When using the tied flag, nhid must be equal to emsize")
            self.decoder.weight = self.encoder.weight
        self.init_weights()
        self.nhid = nhid
        self.nlayers = nlayers

    def init_weights(self) -> None:
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output)
        decoded = decoded.view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz: int):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid),
                weight.new_zeros(self.nlayers, bsz, self.nhid))


def batchify(data, bsz: int, device):
    """Columns of ``bsz`` independent streams: (len, bsz)."""
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    data = data.view(bsz, -1).t().contiguous()
    return data.to(device)


def repackage_hidden(h):
    """Wraps hidden states in new Tensors, to detach them from their history."""
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


def get_batch(source, i: int, bptt: int):
    seq_len = min(bptt, len(source) - 1 - i)
    data = source[i:i + seq_len]
    target = source[i + 1:i + 1 + seq_len].view(-1)
    return data, target


def build(ntokens: int, device, emsize: int = 200, nhid: int = 200, nlayers: int = 2, dropout: float = 0.2,
          tied: bool = True) -> RNNModel:
    """The model of pytorch/examples' defaults (tied, 2 layers, 200 units) on ``device``."""
    return RNNModel(ntokens, emsize, nhid, nlayers, dropout, tied).to(device)


criterion = nn.NLLLoss()


def train_step(model: RNNModel, data, targets, hidden, lr: float, clip: float = 0.25):
    """One truncated-BPTT step; returns (loss value, the hidden state to carry on)."""
    model.zero_grad()
    hidden = repackage_hidden(hidden)
    output, hidden = model(data, hidden)
    loss = criterion(output, targets)
    loss.backward()
    # `clip_grad_norm` helps prevent the exploding gradient problem in RNNs / LSTMs.
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-lr)
    return loss.item(), hidden


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="word-level LSTM language model (pytorch/examples), few steps")
    parser.add_argument("--quick", action="store_true", help="a tiny configuration (a few seconds)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=20.0)
    args = parser.parse_args(argv)
    torch.manual_seed(1111)
    device = torch.device("cpu")
    corpus = Corpus(corpus_text(400 if args.quick else None))
    bsz, bptt = (4, 10) if args.quick else (20, 35)
    train_data = batchify(corpus.train, bsz, device)
    size = 32 if args.quick else 200
    model = build(len(corpus.dictionary), device, emsize=size, nhid=size)
    model.train()
    hidden = model.init_hidden(bsz)
    steps = 3 if args.quick else args.steps
    start = time.perf_counter()
    total = 0.0
    for batch, i in enumerate(range(0, train_data.size(0) - 1, bptt)):
        if batch == steps:
            break
        data, targets = get_batch(train_data, i, bptt)
        loss, hidden = train_step(model, data, targets, hidden, args.lr)
        total += loss
    ms = (time.perf_counter() - start) * 1000 / steps
    print(f"vocab {len(corpus.dictionary)}, {steps} steps, {ms:.1f} ms/step, "
          f"final train loss {loss:.3f} (ppl {math.exp(total / steps):.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

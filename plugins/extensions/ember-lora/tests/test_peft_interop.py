"""Adapter files cross between ember-lora and Hugging Face PEFT (an optional oracle: skipped without ``peft``).

The same base weights live in an ember model and a torch model with the same module paths; an adapter saved by one
side with PEFT's names is loaded by the other, and both compute the same output.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ember
from ember import nn
from ember_lora import LoraConfig, apply_lora, load_adapter, save_adapter

peft = pytest.importorskip("peft")

DEV = ember.device("cpu").autodiff()


class EmberNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 6)
        self.conv = nn.Conv2d(1, 2, 3, padding=1)
        self.fc1 = nn.Linear(6, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, idx: ember.Tensor, img: ember.Tensor) -> ember.Tensor:
        h = self.fc1(self.emb(idx).mean(1)).relu() + self.conv(img).mean((1, 2, 3)).unsqueeze(1)
        return self.head(h)


class TorchNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(10, 6)
        self.conv = torch.nn.Conv2d(1, 2, 3, padding=1)
        self.fc1 = torch.nn.Linear(6, 8)
        self.head = torch.nn.Linear(8, 3)

    def forward(self, idx: torch.Tensor, img: torch.Tensor) -> torch.Tensor:
        h = self.fc1(self.emb(idx).mean(1)).relu() + self.conv(img).mean((1, 2, 3)).unsqueeze(1)
        return self.head(h)


def _pair() -> tuple[EmberNet, TorchNet]:
    ember.manual_seed(0)
    em = EmberNet().to(DEV)
    tm = TorchNet()
    tm.load_state_dict({k: torch.from_numpy(np.array(v.numpy())) for k, v in em.state_dict().items()})
    return em, tm


def _inputs() -> tuple[tuple[ember.Tensor, ember.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    rng = np.random.default_rng(0)
    idx, img = rng.integers(0, 10, size=(4, 5)), rng.normal(size=(4, 1, 5, 5)).astype(np.float32)
    return ((ember.tensor(idx, dtype=ember.int64, device=DEV), ember.tensor(img, device=DEV)),
            (torch.from_numpy(idx), torch.from_numpy(img)))


def _randomise(model: nn.Module) -> None:
    rng = np.random.default_rng(1)
    with ember.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name or "modules_to_save" in name:
                p.copy_(ember.tensor(rng.normal(0, 0.3, p.shape).astype(np.float32), device=DEV))


def test_peft_reads_an_ember_adapter(tmp_path: object) -> None:
    em, tm = _pair()
    apply_lora(em, LoraConfig(r=2, lora_alpha=4, target_modules=["emb", "conv", "fc1"], modules_to_save=["head"],
                              use_rslora=True))
    _randomise(em)
    save_adapter(em, tmp_path, peft_format=True)
    pm = peft.PeftModel.from_pretrained(tm, str(tmp_path))
    (ei, eimg), (ti, timg) = _inputs()
    with torch.no_grad():
        ref = pm(ti, timg).numpy()
    np.testing.assert_allclose(em(ei, eimg).numpy(), ref, rtol=1e-5, atol=1e-5)


def test_ember_reads_a_peft_adapter(tmp_path: object) -> None:
    em, tm = _pair()
    config = peft.LoraConfig(r=3, lora_alpha=5, target_modules=["emb", "conv", "fc1"], modules_to_save=["head"],
                             init_lora_weights=False, bias="lora_only")
    pm = peft.get_peft_model(tm, config)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "bias" in name and p.requires_grad:
                p.add_(0.5)  # trained biases travel with the adapter
    pm.save_pretrained(str(tmp_path))
    load_adapter(em, tmp_path)
    (ei, eimg), (ti, timg) = _inputs()
    with torch.no_grad():
        ref = pm(ti, timg).numpy()
    np.testing.assert_allclose(em(ei, eimg).numpy(), ref, rtol=1e-5, atol=1e-5)

"""The pytorch/examples VAE (fc 784-400-20 encoder, 20-400-784 decoder, reparameterize with randn_like,
BCE + KLD loss, Adam lr 1e-3), on scikit-learn's 8x8 digits scaled up to 28x28 in [0, 1] -- nothing downloads.

This is the PyTorch original; ``examples/ports/vae.py`` is its ember port (diff the two files).

    python examples/ports/torch/vae.py [--quick]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.utils.data import DataLoader, TensorDataset


class VAE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(784, 400)
        self.fc21 = nn.Linear(400, 20)
        self.fc22 = nn.Linear(400, 20)
        self.fc3 = nn.Linear(20, 400)
        self.fc4 = nn.Linear(400, 784)

    def encode(self, x):
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar):
        std = torch.exp(0.5 * logvar)
        eps = torch.randn_like(std)
        return mu + eps * std

    def decode(self, z):
        h3 = F.relu(self.fc3(z))
        return torch.sigmoid(self.fc4(h3))

    def forward(self, x):
        mu, logvar = self.encode(x.view(-1, 784))
        z = self.reparameterize(mu, logvar)
        return self.decode(z), mu, logvar


# Reconstruction + KL divergence losses summed over all elements and batch
def loss_function(recon_x, x, mu, logvar):
    BCE = F.binary_cross_entropy(recon_x, x.view(-1, 784), reduction="sum")
    # see Appendix B from VAE paper: Kingma and Welling. Auto-Encoding Variational Bayes. ICLR, 2014
    # 0.5 * sum(1 + log(sigma^2) - mu^2 - sigma^2)
    KLD = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return BCE + KLD


def digits_28x28() -> np.ndarray:
    """scikit-learn's digits as (N, 1, 28, 28) float32 images in [0, 1]."""
    from sklearn.datasets import load_digits

    images = np.kron(load_digits().images / 16.0, np.ones((3, 3)))  # 8x8 -> 24x24
    return np.pad(images, ((0, 0), (2, 2), (2, 2)))[:, None].astype(np.float32)  # -> 28x28


def build(device, lr: float = 1e-3):
    """(model, optimizer) as the example makes them."""
    model = VAE().to(device)
    optimizer = optim.Adam(model.parameters(), lr=lr)
    return model, optimizer


def train_step(model, optimizer, data) -> float:
    """One step of the example's train() loop; returns the summed loss of the batch."""
    optimizer.zero_grad()
    recon_batch, mu, logvar = model(data)
    loss = loss_function(recon_batch, data, mu, logvar)
    loss.backward()
    optimizer.step()
    return loss.item()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="pytorch/examples VAE on scikit-learn's digits")
    parser.add_argument("--quick", action="store_true", help="a tiny configuration (a few seconds)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128)
    args = parser.parse_args(argv)
    torch.manual_seed(1)
    device = torch.device("cpu")
    x = digits_28x28()
    n_train = 256 if args.quick else 1500
    train_loader = DataLoader(TensorDataset(torch.tensor(x[:n_train])), batch_size=args.batch_size, shuffle=True)
    model, optimizer = build(device)
    for epoch in range(1, (1 if args.quick else args.epochs) + 1):
        model.train()
        train_loss = 0.0
        for (data,) in train_loader:
            data = data.to(device)
            train_loss += train_step(model, optimizer, data)
        print(f"epoch {epoch}: average loss {train_loss / n_train:.4f}")
    with torch.no_grad():
        sample = model.decode(torch.randn(64, 20).to(device))
    print(f"sampled {tuple(sample.shape)} images, mean intensity {sample.mean().item():.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

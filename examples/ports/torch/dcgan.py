"""A small DCGAN after pytorch/examples dcgan: a ConvTranspose2d generator and a Conv2d discriminator with
BatchNorm and LeakyReLU, BCELoss, two Adam optimizers (lr 2e-4, betas (0.5, 0.999)) and the example's
``weights_init`` (conv weights N(0, 0.02), BatchNorm weights N(1, 0.02)), on scikit-learn's 8x8 digits scaled up to
32x32 grey images in [-1, 1] -- nothing downloads.

This is the PyTorch original; ``examples/ports/dcgan.py`` is its ember port (diff the two files).

    python examples/ports/torch/dcgan.py [--quick]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
from torch.utils.data import DataLoader, TensorDataset

real_label = 1.0
fake_label = 0.0


# custom weights initialization called on netG and netD
def weights_init(m) -> None:
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        m.weight.data.normal_(0.0, 0.02)
    elif classname.find("BatchNorm") != -1:
        m.weight.data.normal_(1.0, 0.02)
        m.bias.data.fill_(0)


class Generator(nn.Module):
    def __init__(self, nz: int, ngf: int, nc: int) -> None:
        super().__init__()
        self.main = nn.Sequential(
            # input is Z, going into a convolution
            nn.ConvTranspose2d(nz, ngf * 4, 4, 1, 0, bias=False),
            nn.BatchNorm2d(ngf * 4),
            nn.ReLU(True),
            # state size. (ngf*4) x 4 x 4
            nn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf * 2),
            nn.ReLU(True),
            # state size. (ngf*2) x 8 x 8
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf),
            nn.ReLU(True),
            # state size. (ngf) x 16 x 16
            nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False),
            nn.Tanh(),
            # state size. (nc) x 32 x 32
        )

    def forward(self, input):
        return self.main(input)


class Discriminator(nn.Module):
    def __init__(self, ndf: int, nc: int) -> None:
        super().__init__()
        self.main = nn.Sequential(
            # input is (nc) x 32 x 32
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False),
            nn.LeakyReLU(0.2, inplace=True),
            # state size. (ndf) x 16 x 16
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ndf * 2),
            nn.LeakyReLU(0.2, inplace=True),
            # state size. (ndf*2) x 8 x 8
            nn.Conv2d(ndf * 2, ndf * 4, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ndf * 4),
            nn.LeakyReLU(0.2, inplace=True),
            # state size. (ndf*4) x 4 x 4
            nn.Conv2d(ndf * 4, 1, 4, 1, 0, bias=False),
            nn.Sigmoid(),
        )

    def forward(self, input):
        output = self.main(input)
        return output.view(-1, 1).squeeze(1)


def digits_32x32() -> np.ndarray:
    """scikit-learn's digits as (N, 1, 32, 32) float32 images in [-1, 1]."""
    from sklearn.datasets import load_digits

    images = np.kron(load_digits().images / 16.0, np.ones((4, 4)))  # 8x8 -> 32x32
    return (images[:, None] * 2.0 - 1.0).astype(np.float32)


def build(device, nz: int = 100, ngf: int = 32, ndf: int = 32, nc: int = 1, lr: float = 0.0002,
          beta1: float = 0.5):
    """(netG, netD, optimizerG, optimizerD, criterion) as the example's script makes them."""
    netG = Generator(nz, ngf, nc).to(device)
    netG.apply(weights_init)
    netD = Discriminator(ndf, nc).to(device)
    netD.apply(weights_init)
    criterion = nn.BCELoss()
    optimizerD = optim.Adam(netD.parameters(), lr=lr, betas=(beta1, 0.999))
    optimizerG = optim.Adam(netG.parameters(), lr=lr, betas=(beta1, 0.999))
    return netG, netD, optimizerG, optimizerD, criterion


def train_step(netG, netD, optimizerG, optimizerD, criterion, real_cpu, noise) -> tuple[float, float]:
    """One iteration of the example's loop, the latent ``noise`` given (the script draws it with randn);
    returns (Loss_D, Loss_G)."""
    ############################
    # (1) Update D network: maximize log(D(x)) + log(1 - D(G(z)))
    ###########################
    # train with real
    netD.zero_grad()
    batch_size = real_cpu.size(0)
    label = torch.full((batch_size,), real_label, dtype=real_cpu.dtype, device=real_cpu.device)
    output = netD(real_cpu)
    errD_real = criterion(output, label)
    errD_real.backward()
    # train with fake
    fake = netG(noise)
    label.fill_(fake_label)
    output = netD(fake.detach())
    errD_fake = criterion(output, label)
    errD_fake.backward()
    errD = errD_real + errD_fake
    optimizerD.step()
    ############################
    # (2) Update G network: maximize log(D(G(z)))
    ###########################
    netG.zero_grad()
    label.fill_(real_label)  # fake labels are real for generator cost
    output = netD(fake)
    errG = criterion(output, label)
    errG.backward()
    optimizerG.step()
    return errD.item(), errG.item()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="a small DCGAN (pytorch/examples) on scikit-learn's digits")
    parser.add_argument("--quick", action="store_true", help="a tiny configuration (a few seconds)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)
    torch.manual_seed(999)
    device = torch.device("cpu")
    nz = 100
    ngf = ndf = 8 if args.quick else 32
    dataloader = DataLoader(TensorDataset(torch.tensor(digits_32x32())), batch_size=args.batch_size, shuffle=True)
    netG, netD, optimizerG, optimizerD, criterion = build(device, nz, ngf, ndf)
    steps = 2 if args.quick else args.steps
    for i, data in enumerate(dataloader):
        if i == steps:
            break
        real_cpu = data[0].to(device)
        noise = torch.randn(real_cpu.size(0), nz, 1, 1, device=device)
        errD, errG = train_step(netG, netD, optimizerG, optimizerD, criterion, real_cpu, noise)
        print(f"[{i}/{steps}] Loss_D: {errD:.4f} Loss_G: {errG:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

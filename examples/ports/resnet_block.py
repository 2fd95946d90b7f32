"""A small ResNet of ResNet-18 ``BasicBlock``s (3x3 conv - BatchNorm - ReLU - 3x3 conv - BatchNorm, plus the
identity or a 1x1 conv + BatchNorm projection shortcut), in the CIFAR layout (3 stages of widths w, 2w, 4w; global
average pooling; a linear head), torchvision's initialisation (Kaiming normal fan_out convs, BatchNorm 1/0), SGD
with Nesterov momentum and weight decay, and CosineAnnealingLR. The data are generated 3x32x32 images whose class
sets a colour and a stripe frequency, plus noise -- nothing downloads.

This is the ember port of ``examples/ports/torch/resnet_block.py`` (diff the two files): ``torch`` renamed ``ember``,
plus device creation.

    python examples/ports/resnet_block.py [--quick]
"""

from __future__ import annotations

import argparse

import numpy as np

import ember
import ember.nn as nn
import ember.nn.functional as F
from ember.optim.lr_scheduler import CosineAnnealingLR


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != self.expansion * planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, self.expansion * planes, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(self.expansion * planes),
            )

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += self.shortcut(x)
        out = F.relu(out)
        return out


class ResNet(nn.Module):
    def __init__(self, block, num_blocks: list[int], num_classes: int = 10, width: int = 16) -> None:
        super().__init__()
        self.in_planes = width
        self.conv1 = nn.Conv2d(3, width, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.layer1 = self._make_layer(block, width, num_blocks[0], stride=1)
        self.layer2 = self._make_layer(block, 2 * width, num_blocks[1], stride=2)
        self.layer3 = self._make_layer(block, 4 * width, num_blocks[2], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(4 * width * block.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def _make_layer(self, block, planes: int, num_blocks: int, stride: int):
        strides = [stride] + [1] * (num_blocks - 1)
        layers = []
        for stride in strides:
            layers.append(block(self.in_planes, planes, stride))
            self.in_planes = planes * block.expansion
        return nn.Sequential(*layers)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer1(out)
        out = self.layer2(out)
        out = self.layer3(out)
        out = self.avgpool(out)
        out = ember.flatten(out, 1)
        return self.fc(out)


def make_images(n: int, num_classes: int = 10, size: int = 32, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` (3, size, size) float32 images and int64 labels: class k has colour k and stripes of frequency k."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, num_classes, size=n)
    colours = rng.uniform(-1.0, 1.0, size=(num_classes, 3, 1, 1))
    grid = np.arange(size) / size
    stripes = np.sin(2 * np.pi * (1 + labels)[:, None, None] * (grid[None, :, None] + grid[None, None, :]))
    images = colours[labels] + 0.5 * stripes[:, None] + rng.standard_normal((n, 3, size, size))
    return images.astype(np.float32), labels.astype(np.int64)


def build(device, width: int = 16, num_blocks: tuple[int, int, int] = (2, 2, 2), num_classes: int = 10,
          lr: float = 0.1, total_steps: int = 100):
    """(model, criterion, optimizer, scheduler): SGD lr 0.1, Nesterov momentum 0.9, weight decay 5e-4, cosine."""
    model = ResNet(BasicBlock, list(num_blocks), num_classes, width).to(device)
    criterion = nn.CrossEntropyLoss()
    optimizer = ember.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=5e-4)
    scheduler = CosineAnnealingLR(optimizer, T_max=total_steps)
    return model, criterion, optimizer, scheduler


def train_step(model, criterion, optimizer, scheduler, inputs, targets) -> float:
    """One SGD step and one scheduler step; returns the loss value."""
    optimizer.zero_grad()
    outputs = model(inputs)
    loss = criterion(outputs, targets)
    loss.backward()
    optimizer.step()
    scheduler.step()
    return loss.item()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="ResNet-18-style BasicBlock model on generated images")
    parser.add_argument("--quick", action="store_true", help="a tiny configuration (a few seconds)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args(argv)
    ember.manual_seed(0)
    device = ember.device("cpu").autodiff()  # port: ember devices record gradients only when asked to
    steps = 2 if args.quick else args.steps
    bsz = 8 if args.quick else args.batch_size
    n_eval = 32 if args.quick else 128
    images, labels = make_images(bsz * steps + n_eval)
    x, y = ember.tensor(images).to(device), ember.tensor(labels).to(device)
    model, criterion, optimizer, scheduler = build(device, width=8 if args.quick else 16, total_steps=steps)
    model.train()
    for step in range(steps):
        batch = slice(step * bsz, (step + 1) * bsz)
        loss = train_step(model, criterion, optimizer, scheduler, x[batch], y[batch])
    model.eval()
    with ember.no_grad():
        accuracy = (model(x[-n_eval:]).argmax(dim=1) == y[-n_eval:]).float().mean().item()
    print(f"{steps} steps: final train loss {loss:.4f}, held-out accuracy {accuracy:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

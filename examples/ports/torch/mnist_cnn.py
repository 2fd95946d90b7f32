"""The pytorch/examples MNIST CNN (conv-conv-maxpool-dropout-fc-dropout-fc, log_softmax, nll_loss) trained with
Adadelta and StepLR, on scikit-learn's 8x8 digits scaled up to MNIST's 28x28 (each pixel a 3x3 block, 2 pixels of
padding) and normalised with MNIST's mean and std -- nothing downloads.

This is the PyTorch original; ``examples/ports/mnist_cnn.py`` is its ember port (diff the two files).

    python examples/ports/torch/mnist_cnn.py [--quick]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.relu(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        output = F.log_softmax(x, dim=1)
        return output


def digits_28x28() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as (N, 1, 28, 28) float32 images, normalised like MNIST, and int64 labels."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.kron(digits.images / 16.0, np.ones((3, 3)))  # 8x8 -> 24x24
    images = np.pad(images, ((0, 0), (2, 2), (2, 2)))  # -> 28x28
    images = (images - 0.1307) / 0.3081
    return images[:, None].astype(np.float32), digits.target.astype(np.int64)


def build(device, lr: float = 1.0, gamma: float = 0.7):
    """(model, optimizer, scheduler) as the example's main() makes them."""
    model = Net().to(device)
    optimizer = optim.Adadelta(model.parameters(), lr=lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=gamma)
    return model, optimizer, scheduler


def train_step(model, optimizer, data, target) -> float:
    """One step of the example's train() loop; returns the loss value."""
    optimizer.zero_grad()
    output = model(data)
    loss = F.nll_loss(output, target)
    loss.backward()
    optimizer.step()
    return loss.item()


def test(model, device, test_loader) -> tuple[float, float]:
    """(mean loss, accuracy) over test_loader, as the example's test()."""
    model.eval()
    test_loss = 0.0
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()  # sum up batch loss
            pred = output.argmax(dim=1, keepdim=True)  # get the index of the max log-probability
            correct += pred.eq(target.view_as(pred)).sum().item()
    n = len(test_loader.dataset)
    return test_loss / n, correct / n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="pytorch/examples MNIST CNN on scikit-learn's digits")
    parser.add_argument("--quick", action="store_true", help="a tiny configuration (a few seconds)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args(argv)
    torch.manual_seed(1)
    device = torch.device("cpu")
    x, y = digits_28x28()
    n_train = 64 if args.quick else 1500
    train_set = TensorDataset(torch.tensor(x[:n_train]), torch.tensor(y[:n_train]))
    n_test = 100 if args.quick else len(x) - 1500
    test_set = TensorDataset(torch.tensor(x[1500:1500 + n_test]), torch.tensor(y[1500:1500 + n_test]))
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True)
    test_loader = DataLoader(test_set, batch_size=1000)
    model, optimizer, scheduler = build(device)
    for epoch in range(1, (1 if args.quick else args.epochs) + 1):
        model.train()
        for data, target in train_loader:
            data, target = data.to(device), target.to(device)
            loss = train_step(model, optimizer, data, target)
        test_loss, accuracy = test(model, device, test_loader)
        print(f"epoch {epoch}: train loss {loss:.4f}, test loss {test_loss:.4f}, test accuracy {accuracy:.3f}")
        scheduler.step()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

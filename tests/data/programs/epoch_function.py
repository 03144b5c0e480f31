"""Training through a function called once per epoch that receives the loss: the step torch2jax
writes for it must be compiled once, not at every call (it closes over the criterion)."""

import torch
import torch.nn as nn


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))

    def forward(self, x):
        return self.net(x)


def train_epoch(model, loader, optimizer, criterion):
    model.train()
    total = 0.0
    for x, y in loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        total += loss.item()
    return total / len(loader)


def main():
    torch.manual_seed(0)
    xs = torch.randn(64, 10)
    ys = torch.randint(0, 3, (64,))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, ys), batch_size=16)
    model = MLP()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    criterion = nn.CrossEntropyLoss()
    for epoch in range(3):
        print(f"epoch {epoch} loss {train_epoch(model, loader, optimizer, criterion):.4f}")


if __name__ == "__main__":
    main()

"""A per-batch step helper over the script's model and optimizer (module globals), called from
the epoch loop, as many published scripts write it; the loss summed and the accuracy printed
per epoch."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 3)
        self.apply(self._init_weights)

    def _init_weights(self, m):
        if isinstance(m, nn.Linear):
            nn.init.constant_(m.weight, 0.05)
            nn.init.constant_(m.bias, 0.01)

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


X = torch.linspace(-1.0, 1.0, 64).reshape(16, 4)
Y = (X.sum(dim=1) > 0).long() * 2
train_loader = DataLoader(TensorDataset(X, Y), batch_size=4)
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)


def train_step(data, target):
    optimizer.zero_grad()
    out = model(data)
    loss = F.nll_loss(out, target)
    loss.backward()
    optimizer.step()
    return loss.item()


def accuracy():
    with torch.no_grad():
        return (model(X).argmax(dim=1) == Y).float().mean().item()


for epoch in range(3):
    total = 0.0
    for data, target in train_loader:
        loss = train_step(data, target)
        total += loss
    print(f"epoch {epoch} loss {total:.6f} acc {accuracy():.4f}")

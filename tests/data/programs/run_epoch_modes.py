"""A classifier trained and evaluated through one run_epoch function (the annotated
Transformer's and many course notebooks' shape): the step is taken only in training mode,
`if train:` after the loss is computed; only the head is optimized while the body still gets
gradients (no freezing); the loaders are kept in a dict by phase."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU())
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.body(x))


def split(n):
    x = torch.randn(n, 6)
    y = (x[:, 0] + x[:, 1] > 0).long() + (x[:, 2] > 1).long()
    return TensorDataset(x, y)


train_loader = DataLoader(split(96), batch_size=16, shuffle=True)
val_loader = DataLoader(split(32), batch_size=16)
loaders = {"train": train_loader, "val": val_loader}


def run_epoch(model, loader, optimizer, train=True):
    model.train() if train else model.eval()
    total, correct, count = 0.0, 0, 0
    for xb, yb in loader:
        optimizer.zero_grad()
        logits = model(xb)
        loss = F.cross_entropy(logits, yb)
        if train:
            loss.backward()
            optimizer.step()
        total += loss.item() * xb.size(0)
        correct += (logits.argmax(1) == yb).sum().item()
        count += xb.size(0)
    return total / count, correct / count


model = Net()
optimizer = torch.optim.Adam(model.head.parameters(), lr=1e-2, weight_decay=1e-3)
for epoch in range(3):
    train_loss, train_acc = run_epoch(model, loaders["train"], optimizer, train=True)
    val_loss, val_acc = run_epoch(model, loaders["val"], optimizer, train=False)
    print(f"epoch {epoch}: train {train_loss:.4f} {train_acc:.3f} val {val_loss:.4f} {val_acc:.3f}")
print(f"{len(loaders['train'])} batches per epoch")

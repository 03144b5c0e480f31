"""A classification script in the shape of the CIFAR training scripts people publish: the
device chosen at run time, OneCycleLR over epochs and len(loader) read from the command line
(cycling SGD's momentum), a GradScaler and autocast switched on by the device, clipping after
unscale_, label smoothing, evaluation under no_grad and the best checkpoint saved."""

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()

torch.manual_seed(args.seed)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class Net(nn.Module):
    def __init__(self, num_classes=4):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
            nn.MaxPool2d(2), nn.AdaptiveAvgPool2d(1),
        )
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.features(x), 1))


X = torch.randn(96, 3, 6, 6)
Y = (X.mean(dim=(1, 2, 3)) > 0).long() + 2 * (X[:, 0].mean(dim=(1, 2)) > 0).long()
train_loader = DataLoader(TensorDataset(X[:64], Y[:64]), batch_size=16, shuffle=True,
                          drop_last=True)
test_loader = DataLoader(TensorDataset(X[64:], Y[64:]), batch_size=32)

model = Net().to(device)
criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, nesterov=True,
                            weight_decay=5e-4)
scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr,
                                                steps_per_epoch=len(train_loader),
                                                epochs=args.epochs)
scaler = torch.cuda.amp.GradScaler(enabled=device.type == "cuda")


def evaluate(model, loader):
    model.eval()
    correct, total = 0, 0
    with torch.no_grad():
        for inputs, targets in loader:
            inputs, targets = inputs.to(device), targets.to(device)
            _, predicted = model(inputs).max(1)
            total += targets.size(0)
            correct += predicted.eq(targets).sum().item()
    return 100.0 * correct / total


best = 0.0
for epoch in range(args.epochs):
    model.train()
    for inputs, targets in train_loader:
        inputs, targets = inputs.to(device), targets.to(device)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device.type, enabled=device.type == "cuda"):
            loss = criterion(model(inputs), targets)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
    acc = evaluate(model, test_loader)
    print(f"epoch {epoch} loss {loss.item():.4f} acc {acc:.2f} "
          f"lr {scheduler.get_last_lr()[0]:.5f}")
    if acc > best:
        best = acc
        torch.save({"model": model.state_dict(), "epoch": epoch}, "best.pt")

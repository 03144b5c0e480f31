"""A training script in the shape many published ones have: everything inside main(), a
set_seed helper seeding random, numpy and torch, a Dataset built with numpy, a train function
per epoch with clipping, an evaluation under @torch.no_grad(), StepLR stepped per epoch, a
metrics dict printed, and a checkpoint of model, optimizer and scheduler that --resume
restores."""

import argparse
import os
import random

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


def set_seed(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


class Spirals(Dataset):
    def __init__(self, n, noise=0.1, seed=0):
        rng = np.random.RandomState(seed)
        t = rng.rand(n) * 4 * np.pi
        label = rng.randint(0, 2, n)
        r = t / (4 * np.pi)
        x = np.stack([r * np.cos(t + np.pi * label), r * np.sin(t + np.pi * label)], 1)
        self.x = torch.tensor(x + noise * rng.randn(n, 2), dtype=torch.float32)
        self.y = torch.tensor(label, dtype=torch.long)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class MLP(nn.Module):
    def __init__(self, hidden=16, depth=2, dropout=0.1):
        super().__init__()
        layers = [nn.Linear(2, hidden), nn.SiLU()]
        for _ in range(depth - 1):
            layers += [nn.Linear(hidden, hidden), nn.LayerNorm(hidden), nn.SiLU(),
                       nn.Dropout(dropout)]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(hidden, 2)

    def forward(self, x):
        return self.head(self.body(x))


def train_one_epoch(model, loader, optimizer, epoch, log_interval=4):
    model.train()
    total, seen = 0.0, 0
    for i, (x, y) in enumerate(loader):
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optimizer.step()
        total += loss.item() * x.size(0)
        seen += x.size(0)
        if i % log_interval == 0:
            print(f"epoch {epoch} batch {i} loss {loss.item():.4f}")
    return total / seen


@torch.no_grad()
def evaluate(model, loader):
    model.eval()
    correct = 0
    for x, y in loader:
        correct += (model(x).argmax(-1) == y).sum().item()
    return correct / len(loader.dataset)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--ckpt", default="ckpt.pt")
    p.add_argument("--resume", action="store_true")
    args = p.parse_args()
    set_seed(0)
    train = DataLoader(Spirals(256, seed=1), batch_size=64, shuffle=True)
    test = DataLoader(Spirals(128, seed=2), batch_size=128)
    model = MLP()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    start = 0
    if args.resume and os.path.exists(args.ckpt):
        ckpt = torch.load(args.ckpt)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        start = ckpt["epoch"] + 1
    for epoch in range(start, args.epochs):
        loss = train_one_epoch(model, train, optimizer, epoch)
        scheduler.step()
        acc = evaluate(model, test)
        metrics = {"epoch": epoch, "loss": round(loss, 4), "acc": round(acc, 4),
                   "lr": scheduler.get_last_lr()[0]}
        print(metrics)
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(), "epoch": epoch}, args.ckpt)


if __name__ == "__main__":
    main()

"""A text classifier trained as transformers' example scripts train: the biases and the
LayerNorm weights in a parameter group without weight decay, selected by name; a warmup
schedule by LambdaLR; the best model saved by its validation loss and loaded at the end."""
import math

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
VOCAB, LENGTH = 40, 12


class Classifier(nn.Module):
    def __init__(self, vocab, dim, classes):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.LayerNorm = nn.LayerNorm(dim)
        self.hidden = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, ids):
        x = self.LayerNorm(self.embed(ids).mean(dim=1))
        return self.head(torch.tanh(self.hidden(x)))


def count_parameters(model):
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def run_epoch(model, loader, optimizer, scheduler, loss_fn):
    model.train()
    total = 0.0
    for ids, labels in loader:
        optimizer.zero_grad()
        loss = loss_fn(model(ids), labels)
        loss.backward()
        optimizer.step()
        scheduler.step()
        total += loss.item()
    return total / len(loader)


@torch.no_grad()
def evaluate(model, loader, loss_fn):
    model.eval()
    total = 0.0
    for ids, labels in loader:
        total += loss_fn(model(ids), labels).item()
    return total / len(loader)


def main():
    ids = torch.randint(0, VOCAB, (96, LENGTH))
    labels = (ids[:, 0] > VOCAB // 2).long()
    train = DataLoader(TensorDataset(ids[:64], labels[:64]), batch_size=16, shuffle=True)
    valid = DataLoader(TensorDataset(ids[64:], labels[64:]), batch_size=16)
    model = Classifier(VOCAB, 16, 2)
    print(f"The model has {count_parameters(model):,} trainable parameters")
    no_decay = ["bias", "LayerNorm.weight"]
    grouped = [
        {"params": [p for n, p in model.named_parameters()
                    if not any(nd in n for nd in no_decay)], "weight_decay": 0.1},
        {"params": [p for n, p in model.named_parameters()
                    if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(grouped, lr=1e-2)
    steps = 3 * len(train)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / 4) * 0.5 * (1 + math.cos(math.pi * step / steps)))
    loss_fn = nn.CrossEntropyLoss()
    best = float("inf")
    for epoch in range(3):
        train_loss = run_epoch(model, train, optimizer, scheduler, loss_fn)
        valid_loss = evaluate(model, valid, loss_fn)
        if valid_loss < best:
            best = valid_loss
            torch.save(model.state_dict(), "best-model.pt")
        print(f"epoch {epoch}: train {train_loss:.4f} valid {valid_loss:.4f}")
    model.load_state_dict(torch.load("best-model.pt"))
    print(f"best {evaluate(model, valid, loss_fn):.4f}")


if __name__ == "__main__":
    main()

"""Fine-tuning with a frozen backbone: the backbone's parameters frozen in a loop, the
trainable ones counted, and the optimizer given them through a filter (the form most
fine-tuning scripts have)."""

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16))
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(F.relu(self.backbone(x)))


def main():
    torch.manual_seed(0)
    model = Net()
    for param in model.backbone.parameters():
        param.requires_grad = False
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    print(f"trainable {trainable} of {total}")
    opt = torch.optim.SGD(filter(lambda p: p.requires_grad, model.parameters()), lr=0.5,
                          momentum=0.9, weight_decay=1e-2)
    rng = np.random.RandomState(0)
    x = torch.from_numpy(rng.randn(32, 8).astype(np.float32))
    y = torch.from_numpy(rng.randint(0, 3, size=32))
    for step in range(6):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()

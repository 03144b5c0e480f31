"""Parameters updated through loops over ``parameters()``: the weights clipped after each
step (WGAN's critic), an exponential moving average of the model kept in a copy made before
the optimizer and evaluated after each step."""

import copy

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


@torch.no_grad()
def update_ema(ema_model, model, decay=0.9):
    for ema_p, p in zip(ema_model.parameters(), model.parameters()):
        ema_p.data = ema_p.data * decay + p.detach() * (1 - decay)


def main():
    torch.manual_seed(0)
    model = Net()
    ema = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    rng = np.random.RandomState(0)
    x = torch.from_numpy(rng.randn(32, 8).astype(np.float32))
    y = torch.from_numpy(rng.randint(0, 3, size=32))
    for step in range(6):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        with torch.no_grad():
            for p in model.parameters():
                p.clamp_(-0.3, 0.3)
        update_ema(ema, model)
        with torch.no_grad():
            ema_loss = F.cross_entropy(ema(x), y)
        print(f"step {step} loss {loss.item():.4f} ema {ema_loss.item():.4f}")


if __name__ == "__main__":
    main()

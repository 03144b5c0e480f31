"""A small regression trained by the optimizer named on the command line (rmsprop: centered,
with momentum; adagrad; adamax): the program ``verify --program`` pairs each optimizer's state
slots with optax's on (tests/test_verify_program_optimizers.py)."""

import sys

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
name = sys.argv[1]
if name == "rmsprop":
    optimizer = torch.optim.RMSprop(model.parameters(), lr=0.01, momentum=0.9, centered=True)
elif name == "adagrad":
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.1)
else:
    optimizer = torch.optim.Adamax(model.parameters(), lr=0.01)
x = torch.randn(16, 4)
y = torch.linspace(-1, 1, 32).reshape(16, 2)  # the same on both sides: it is not replayed
for step in range(5):
    optimizer.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f}")

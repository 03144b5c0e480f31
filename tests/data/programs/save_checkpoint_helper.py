"""A checkpoint saved by a helper as pytorch/examples' ImageNet script saves it: the dict is
built at the call, ``torch.save(state, filename)`` in the helper, the best one copied with
``shutil.copyfile``; then resumed."""
import shutil

import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
probe = torch.arange(8.0).reshape(2, 4) / 8


def save_checkpoint(state, is_best, filename="checkpoint.pth.tar"):
    torch.save(state, filename)
    if is_best:
        shutil.copyfile(filename, "model_best.pth.tar")


best = None
for epoch in range(3):
    x = torch.randn(8, 4)
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    is_best = epoch == 1
    if is_best:
        best = model(probe).detach().clone()
    save_checkpoint({"epoch": epoch + 1, "arch": "linear", "state_dict": model.state_dict(),
                     "optimizer": optimizer.state_dict()}, is_best)

checkpoint = torch.load("model_best.pth.tar")
model.load_state_dict(checkpoint["state_dict"])
optimizer.load_state_dict(checkpoint["optimizer"])
print("resumed at epoch", checkpoint["epoch"], checkpoint["arch"])
print("the best model restored:", bool((model(probe) - best).abs().max() < 1e-6))

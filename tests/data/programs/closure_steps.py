"""A time-series regression trained with closures, as PyTorch's time-sequence-prediction
example writes it: the model cast to float64 with ``.double()``, float64 data from numpy, an
optimizer stepped with ``optimizer.step(closure)``, the closure zeroing the gradients, printing
and returning the loss; a prediction under ``no_grad`` after each step reuses the closure's
local names."""

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim


class Regressor(nn.Module):
    def __init__(self):
        super(Regressor, self).__init__()
        self.hidden = nn.Linear(6, 16)
        self.out = nn.Linear(16, 1)

    def forward(self, x):
        return self.out(torch.tanh(self.hidden(x)))


if __name__ == "__main__":
    np.random.seed(0)
    torch.manual_seed(0)
    t = np.arange(64, dtype="float64")[:, None] + np.arange(7, dtype="float64")[None, :]
    series = np.sin(t / 5.0)
    inputs = torch.from_numpy(series[:48, :6])
    target = torch.from_numpy(series[:48, 6:])
    test_inputs = torch.from_numpy(series[48:, :6])
    test_target = torch.from_numpy(series[48:, 6:])
    seq = Regressor()
    seq.double()
    criterion = nn.MSELoss()
    optimizer = optim.Adam(seq.parameters(), lr=0.05)
    for i in range(6):
        print("STEP:", i)

        def closure():
            optimizer.zero_grad()
            out = seq(inputs)
            loss = criterion(out, target)
            print("loss:", loss.item())
            loss.backward()
            return loss

        optimizer.step(closure)
        with torch.no_grad():
            pred = seq(test_inputs)
            loss = criterion(pred, test_target)
            print("test loss: %.6f" % loss.item())

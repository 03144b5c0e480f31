import copy

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset, random_split

torch.manual_seed(1)
X = torch.ones(256, 1) * torch.linspace(-0.5, 1.0, 8)
y = X.sum(dim=1, keepdim=True) * 0.3 - 0.5
ds = TensorDataset(X, y)
train_ds, val_ds = random_split(ds, [192, 64], generator=torch.Generator().manual_seed(0))
train_loader = DataLoader(train_ds, batch_size=32, shuffle=True)
val_loader = DataLoader(val_ds, batch_size=64)

model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))


def init_weights(m):
    if isinstance(m, nn.Linear):
        nn.init.constant_(m.weight, 0.1)
        nn.init.zeros_(m.bias)


model.apply(init_weights)
optimizer = torch.optim.AdamW(model.parameters(), lr=0.3, weight_decay=1e-2)
criterion = nn.MSELoss()


def evaluate(net, loader):
    net.eval()
    with torch.no_grad():
        return sum(criterion(net(xb), yb).item() for xb, yb in loader) / len(loader)


def train_one_epoch(net, loader, opt):
    net.train()
    total = 0.0
    for xb, yb in loader:
        opt.zero_grad()
        loss = criterion(net(xb), yb)
        loss.backward()
        opt.step()
        total += loss.item()
    return total / len(loader)


best, best_state, patience = float("inf"), None, 0
for epoch in range(8):
    train_loss = train_one_epoch(model, train_loader, optimizer)
    val = evaluate(model, val_loader)
    print(f"epoch {epoch} train {train_loss:.6e} val {val:.6e}")
    if val < best:
        best, best_state, patience = val, copy.deepcopy(model.state_dict()), 0
    else:
        patience += 1
        if patience >= 2:
            break
model.load_state_dict(best_state)
print(f"best {evaluate(model, val_loader):.6e}")

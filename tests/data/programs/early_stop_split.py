import copy

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset, random_split

torch.manual_seed(1)
X = torch.randn(256, 8)
w = torch.randn(8, 1)
y = X @ w + 0.1 * torch.randn(256, 1)
ds = TensorDataset(X, y)
train_ds, val_ds = random_split(ds, [192, 64], generator=torch.Generator().manual_seed(0))
train_loader = DataLoader(train_ds, batch_size=32, shuffle=True)
val_loader = DataLoader(val_ds, batch_size=64)

model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=1e-2)
criterion = nn.MSELoss()

best, best_state, patience = float("inf"), None, 0
for epoch in range(5):
    model.train()
    for xb, yb in train_loader:
        optimizer.zero_grad()
        loss = criterion(model(xb), yb)
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        val = sum(criterion(model(xb), yb).item() for xb, yb in val_loader)
    print(f"epoch {epoch} val {val:.4f}")
    if val < best:
        best, best_state, patience = val, copy.deepcopy(model.state_dict()), 0
    else:
        patience += 1
        if patience >= 2:
            break
model.load_state_dict(best_state)

"""A training script in a common public shape (tests/test_loader_shapes.py): a tqdm progress
bar over the loader, mixed precision with a GradScaler, clipping after unscale_, OneCycleLR over
epochs * len(train_loader) steps, label smoothing, inference_mode evaluation."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from tqdm import tqdm


class MLP(nn.Module):
    def __init__(self, d_in=16, d_hidden=32, n_classes=4, p=0.1):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d_in, d_hidden), nn.GELU(), nn.Dropout(p),
            nn.Linear(d_hidden, d_hidden), nn.GELU(), nn.Dropout(p),
            nn.Linear(d_hidden, n_classes),
        )

    def forward(self, x):
        return self.net(x)


def get_datasets():
    g = torch.Generator().manual_seed(42)
    x = torch.randn(512, 16, generator=g)
    y = (x[:, :4].argmax(dim=1))
    return TensorDataset(x[:384], y[:384]), TensorDataset(x[384:], y[384:])


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train_set, val_set = get_datasets()
    train_loader = DataLoader(train_set, batch_size=64, shuffle=True, drop_last=True)
    val_loader = DataLoader(val_set, batch_size=64)
    model = MLP().to(device)
    epochs = 4
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=3e-3, total_steps=epochs * len(train_loader))
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    scaler = torch.cuda.amp.GradScaler(enabled=device.type == "cuda")
    for epoch in range(epochs):
        model.train()
        pbar = tqdm(train_loader, desc=f"epoch {epoch}", disable=True)
        running = 0.0
        for x, y in pbar:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device_type=device.type, enabled=device.type == "cuda"):
                logits = model(x)
                loss = criterion(logits, y)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            running += loss.item()
            pbar.set_postfix(loss=f"{loss.item():.4f}")
        model.eval()
        correct = total = 0
        with torch.inference_mode():
            for x, y in val_loader:
                x, y = x.to(device), y.to(device)
                pred = model(x).argmax(dim=-1)
                correct += (pred == y).sum().item()
                total += y.numel()
        print(f"epoch {epoch} loss {running / len(train_loader):.4f} "
              f"val_acc {correct / total:.3f} lr {scheduler.get_last_lr()[0]:.6f}")


if __name__ == "__main__":
    main()

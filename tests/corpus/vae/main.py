"""A variational autoencoder in the shape of the classic VAE example script, on synthetic data.

No download: each "image" is a 1x12x12 grid of pixels in [0, 1] drawn from one of a few fixed
blurry blobs, so a small VAE learns to reconstruct them. Prints the average train loss per epoch
and the test loss at the end.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser(description="tiny VAE")
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--seed", type=int, default=1)
parser.add_argument("--log-interval", type=int, default=10)
args = parser.parse_args()

torch.manual_seed(args.seed)
PIXELS = 144


def make_blobs(count, centres):
    which = torch.randint(0, centres.shape[0], (count,))
    images = centres[which] + 0.05 * torch.randn(count, PIXELS)
    return TensorDataset(images.clamp(0.0, 1.0))


centres = torch.rand(4, PIXELS)
train_loader = DataLoader(make_blobs(640, centres), batch_size=args.batch_size, shuffle=True)
test_loader = DataLoader(make_blobs(128, centres), batch_size=args.batch_size, shuffle=False)


class VAE(nn.Module):
    def __init__(self):
        super(VAE, self).__init__()
        self.fc1 = nn.Linear(PIXELS, 64)
        self.fc21 = nn.Linear(64, 8)
        self.fc22 = nn.Linear(64, 8)
        self.fc3 = nn.Linear(8, 64)
        self.fc4 = nn.Linear(64, PIXELS)

    def encode(self, x):
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar):
        std = torch.exp(0.5 * logvar)
        eps = torch.randn_like(std)
        return mu + eps * std

    def decode(self, z):
        h3 = F.relu(self.fc3(z))
        return torch.sigmoid(self.fc4(h3))

    def forward(self, x):
        mu, logvar = self.encode(x.view(-1, PIXELS))
        z = self.reparameterize(mu, logvar)
        return self.decode(z), mu, logvar


model = VAE()
optimizer = optim.Adam(model.parameters(), lr=1e-2)


def loss_function(recon_x, x, mu, logvar):
    bce = F.binary_cross_entropy(recon_x, x.view(-1, PIXELS), reduction="sum")
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return bce + kld


def train(epoch):
    model.train()
    train_loss = 0
    for batch_idx, (data,) in enumerate(train_loader):
        optimizer.zero_grad()
        recon_batch, mu, logvar = model(data)
        loss = loss_function(recon_batch, data, mu, logvar)
        loss.backward()
        train_loss += loss.item()
        optimizer.step()
    print("====> Epoch: {} Average loss: {:.4f}".format(
        epoch, train_loss / len(train_loader.dataset)))


def test():
    model.eval()
    test_loss = 0
    with torch.no_grad():
        for (data,) in test_loader:
            recon_batch, mu, logvar = model(data)
            test_loss += loss_function(recon_batch, data, mu, logvar).item()
    test_loss /= len(test_loader.dataset)
    print("====> Test set loss: {:.4f}".format(test_loss))


for epoch in range(1, args.epochs + 1):
    train(epoch)
test()

"""Super-resolution by sub-pixel convolution, in the shape of the classic example script.

No download: the high-resolution images are smooth synthetic 1x16x16 patterns (sums of a few
random sinusoids); the input is each one downsampled by 2 with average pooling. Prints the
average loss of each epoch and the average PSNR on a held-out set.
"""

import argparse
from math import log10

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.utils.data import DataLoader, Dataset


class Patterns(Dataset):
    def __init__(self, count, upscale_factor, size=16):
        coords = torch.linspace(0.0, 1.0, size)
        yy, xx = torch.meshgrid(coords, coords, indexing="ij")
        freq = torch.rand(count, 2, 1, 1) * 6.0
        phase = torch.rand(count, 1, 1) * 6.28
        target = 0.5 + 0.25 * torch.sin(freq[:, 0] * xx + phase) + 0.25 * torch.cos(freq[:, 1] * yy)
        self.target = target.unsqueeze(1)
        self.input = F.avg_pool2d(self.target, upscale_factor)

    def __len__(self):
        return self.target.shape[0]

    def __getitem__(self, index):
        return self.input[index], self.target[index]


class Net(nn.Module):
    def __init__(self, upscale_factor):
        super(Net, self).__init__()
        self.relu = nn.ReLU()
        self.conv1 = nn.Conv2d(1, 16, (5, 5), (1, 1), (2, 2))
        self.conv2 = nn.Conv2d(16, 16, (3, 3), (1, 1), (1, 1))
        self.conv3 = nn.Conv2d(16, upscale_factor ** 2, (3, 3), (1, 1), (1, 1))
        self.pixel_shuffle = nn.PixelShuffle(upscale_factor)

    def forward(self, x):
        x = self.relu(self.conv1(x))
        x = self.relu(self.conv2(x))
        x = self.pixel_shuffle(self.conv3(x))
        return x


parser = argparse.ArgumentParser(description="tiny super resolution")
parser.add_argument("--upscale_factor", type=int, default=2)
parser.add_argument("--batchSize", type=int, default=16)
parser.add_argument("--testBatchSize", type=int, default=32)
parser.add_argument("--nEpochs", type=int, default=6)
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--seed", type=int, default=123)
opt = parser.parse_args()

torch.manual_seed(opt.seed)
device = torch.device("cpu")

training_data_loader = DataLoader(dataset=Patterns(320, opt.upscale_factor),
                                  batch_size=opt.batchSize, shuffle=True)
testing_data_loader = DataLoader(dataset=Patterns(64, opt.upscale_factor),
                                 batch_size=opt.testBatchSize, shuffle=False)

model = Net(upscale_factor=opt.upscale_factor).to(device)
criterion = nn.MSELoss()
optimizer = optim.Adam(model.parameters(), lr=opt.lr)


def train(epoch):
    epoch_loss = 0
    for iteration, batch in enumerate(training_data_loader, 1):
        input, target = batch[0].to(device), batch[1].to(device)
        optimizer.zero_grad()
        loss = criterion(model(input), target)
        epoch_loss += loss.item()
        loss.backward()
        optimizer.step()
    print("===> Epoch {} Complete: Avg. Loss: {:.6f}".format(
        epoch, epoch_loss / len(training_data_loader)))


def test():
    avg_psnr = 0
    with torch.no_grad():
        for batch in testing_data_loader:
            input, target = batch[0].to(device), batch[1].to(device)
            prediction = model(input)
            mse = criterion(prediction, target)
            psnr = 10 * log10(1 / mse.item())
            avg_psnr += psnr
    print("===> Avg. PSNR: {:.4f} dB".format(avg_psnr / len(testing_data_loader)))


for epoch in range(1, opt.nEpochs + 1):
    train(epoch)
test()

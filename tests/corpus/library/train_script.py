"""Trains the tiny GPT to sort short sequences of digits, with the library's Trainer.

Each example is a random sequence of `length` digits followed by the same digits sorted;
the model reads the concatenation and learns to predict the sorted half one token at a time.
"""

import sys

import torch
from torch.utils.data import Dataset

from tinygpt.model import GPT
from tinygpt.trainer import Trainer
from tinygpt.utils import CfgNode as CN
from tinygpt.utils import set_seed


class SortDataset(Dataset):
    """Sequences of `length` digits in [0, num_digits), each paired with its sorted copy."""

    def __init__(self, split, length=6, num_digits=3, size=2000):
        assert split in {'train', 'test'}
        self.split = split
        self.length = length
        self.num_digits = num_digits
        g = torch.Generator().manual_seed(0 if split == 'train' else 1)
        self.inputs = torch.randint(num_digits, size=(size, length), generator=g)

    def __len__(self):
        return self.inputs.shape[0]

    def get_vocab_size(self):
        return self.num_digits

    def get_block_size(self):
        return self.length * 2 - 1

    def __getitem__(self, idx):
        inp = self.inputs[idx]
        sol = torch.sort(inp)[0]
        cat = torch.cat((inp, sol), dim=0)
        x = cat[:-1].clone()
        y = cat[1:].clone()
        y[:self.length - 1] = -1
        return x, y


def get_config(max_iters):
    C = CN()
    C.system = CN()
    C.system.seed = 3407
    C.model = GPT.get_default_config()
    C.trainer = Trainer.get_default_config()
    C.trainer.learning_rate = 5e-3
    C.trainer.max_iters = max_iters
    return C


def batch_end_callback(trainer):
    if trainer.iter_num % 20 == 0:
        print(f"iter_dt {trainer.iter_dt * 1000:.2f}ms; iter {trainer.iter_num}: "
              f"train loss {trainer.loss.item():.5f}")


def evaluate(model, dataset, n):
    model.eval()
    correct = 0
    total = 0
    with torch.no_grad():
        x = torch.stack([dataset[i][0] for i in range(n)])
        y = torch.stack([dataset[i][1] for i in range(n)])
        logits, loss = model(x, y)
        pred = logits.argmax(dim=-1)
        mask = y != -1
        correct += (pred[mask] == y[mask]).sum().item()
        total += mask.sum().item()
    print(f"test loss {loss.item():.5f}; sorted-token accuracy {correct / total:.4f}")


if __name__ == '__main__':
    max_iters = int(sys.argv[1]) if len(sys.argv) > 1 else 120
    config = get_config(max_iters)
    set_seed(config.system.seed)

    train_dataset = SortDataset('train')
    test_dataset = SortDataset('test', size=500)
    config.model.vocab_size = train_dataset.get_vocab_size()
    config.model.block_size = train_dataset.get_block_size()

    model = GPT(config.model)
    trainer = Trainer(config.trainer, model, train_dataset)
    trainer.add_callback('on_batch_end', batch_end_callback)
    trainer.run()
    evaluate(model, test_dataset, 500)

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
    """Sequences of `length` digits in [0, num_digits), each paired with its sorted copy.

    Each item is a fresh draw from torch's global generator; a hash of the digits puts a
    sequence in the test split (one in four) or the train split, and a draw of the other split
    is drawn again."""

    def __init__(self, split, length=6, num_digits=3):
        assert split in {'train', 'test'}
        self.split = split
        self.length = length
        self.num_digits = num_digits

    def __len__(self):
        return 10000

    def get_vocab_size(self):
        return self.num_digits

    def get_block_size(self):
        return self.length * 2 - 1

    def __getitem__(self, idx):
        while True:
            inp = torch.randint(self.num_digits, size=(self.length,), dtype=torch.long)
            in_test = hash(tuple(inp.tolist())) % 4 == 0
            if in_test == (self.split == 'test'):
                break
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
        pairs = [dataset[i] for i in range(n)]
        x = torch.stack([x for x, _ in pairs])
        y = torch.stack([y for _, y in pairs])
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
    test_dataset = SortDataset('test')
    config.model.vocab_size = train_dataset.get_vocab_size()
    config.model.block_size = train_dataset.get_block_size()

    model = GPT(config.model)
    trainer = Trainer(config.trainer, model, train_dataset)
    trainer.add_callback('on_batch_end', batch_end_callback)
    trainer.run()
    evaluate(model, test_dataset, 500)

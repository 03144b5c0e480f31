"""A character-level name generator that picks its model by a flag, in the makemore shape.

No download: the "names" are made in the program from a few syllables. One file holds the
models (--type bigram | mlp | rnn), a dataset of words encoded as index tensors, an infinite
loader class over a replacement sampler, a training loop by step count with periodic
evaluation, a tensorboard SummaryWriter, sampling and a checkpoint of the best model.
Prints the train and test loss at each evaluation and a few samples at the end.
"""

import argparse
import os
import random

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset
try:
    from torch.utils.tensorboard import SummaryWriter
except ImportError:  # tensorboard is optional: no event files without it
    SummaryWriter = None


class ModelConfig:
    def __init__(self, block_size, vocab_size, n_embd=16, n_embd2=32):
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.n_embd = n_embd
        self.n_embd2 = n_embd2


class Bigram(nn.Module):
    def __init__(self, config):
        super().__init__()
        n = config.vocab_size
        self.logits = nn.Parameter(torch.zeros((n, n)))

    def get_block_size(self):
        return 1

    def forward(self, idx, targets=None):
        logits = self.logits[idx]
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                                   ignore_index=-1)
        return logits, loss


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.block_size = config.block_size
        self.vocab_size = config.vocab_size
        self.wte = nn.Embedding(config.vocab_size + 1, config.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(self.block_size * config.n_embd, config.n_embd2),
            nn.Tanh(),
            nn.Linear(config.n_embd2, self.vocab_size),
        )

    def get_block_size(self):
        return self.block_size

    def forward(self, idx, targets=None):
        embs = []
        for k in range(self.block_size):
            tok_emb = self.wte(idx)
            idx = torch.roll(idx, 1, 1)
            idx[:, 0] = self.vocab_size
            embs.append(tok_emb)
        x = torch.cat(embs, -1)
        logits = self.mlp(x)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                                   ignore_index=-1)
        return logits, loss


class RNNCell(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.xh_to_h = nn.Linear(config.n_embd + config.n_embd2, config.n_embd2)

    def forward(self, xt, hprev):
        xh = torch.cat([xt, hprev], dim=1)
        return F.tanh(self.xh_to_h(xh))


class RNN(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.block_size = config.block_size
        self.vocab_size = config.vocab_size
        self.start = nn.Parameter(torch.zeros(1, config.n_embd2))
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.cell = RNNCell(config)
        self.lm_head = nn.Linear(config.n_embd2, self.vocab_size)

    def get_block_size(self):
        return self.block_size

    def forward(self, idx, targets=None):
        b, t = idx.size()
        emb = self.wte(idx)
        hprev = self.start.expand((b, -1))
        hiddens = []
        for i in range(t):
            xt = emb[:, i, :]
            ht = self.cell(xt, hprev)
            hprev = ht
            hiddens.append(ht)
        hidden = torch.stack(hiddens, 1)
        logits = self.lm_head(hidden)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                                   ignore_index=-1)
        return logits, loss


@torch.no_grad()
def generate(model, idx, max_new_tokens, temperature=1.0, do_sample=False):
    block_size = model.get_block_size()
    for _ in range(max_new_tokens):
        idx_cond = idx if idx.size(1) <= block_size else idx[:, -block_size:]
        logits, _ = model(idx_cond)
        logits = logits[:, -1, :] / temperature
        probs = F.softmax(logits, dim=-1)
        if do_sample:
            idx_next = torch.multinomial(probs, num_samples=1)
        else:
            _, idx_next = torch.topk(probs, k=1, dim=-1)
        idx = torch.cat((idx, idx_next), dim=1)
    return idx


class CharDataset(Dataset):
    def __init__(self, words, chars, max_word_length):
        self.words = words
        self.chars = chars
        self.max_word_length = max_word_length
        self.stoi = {ch: i + 1 for i, ch in enumerate(chars)}
        self.itos = {i: s for s, i in self.stoi.items()}

    def __len__(self):
        return len(self.words)

    def get_vocab_size(self):
        return len(self.chars) + 1

    def get_output_length(self):
        return self.max_word_length + 1

    def encode(self, word):
        return torch.tensor([self.stoi[w] for w in word], dtype=torch.long)

    def decode(self, ix):
        return "".join(self.itos[i] for i in ix)

    def __getitem__(self, idx):
        word = self.words[idx]
        ix = self.encode(word)
        x = torch.zeros(self.max_word_length + 1, dtype=torch.long)
        y = torch.zeros(self.max_word_length + 1, dtype=torch.long)
        x[1:1 + len(ix)] = ix
        y[:len(ix)] = ix
        y[len(ix) + 1:] = -1
        return x, y


def create_datasets(seed):
    rng = random.Random(seed)
    syllables = ["ka", "ri", "to", "mel", "an", "su", "vo", "li"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 3)))
             for _ in range(600)]
    chars = sorted(set("".join(words)))
    max_word_length = max(len(w) for w in words)
    test_words, train_words = words[:100], words[100:]
    return (CharDataset(train_words, chars, max_word_length),
            CharDataset(test_words, chars, max_word_length))


class InfiniteDataLoader:
    def __init__(self, dataset, **kwargs):
        train_sampler = torch.utils.data.RandomSampler(dataset, replacement=True,
                                                       num_samples=int(1e10))
        self.train_loader = DataLoader(dataset, sampler=train_sampler, **kwargs)
        self.data_iter = iter(self.train_loader)

    def next(self):
        try:
            batch = next(self.data_iter)
        except StopIteration:
            self.data_iter = iter(self.train_loader)
            batch = next(self.data_iter)
        return batch


@torch.inference_mode()
def evaluate(model, dataset, batch_size=50, max_batches=None):
    model.eval()
    loader = DataLoader(dataset, shuffle=False, batch_size=batch_size)
    losses = []
    for i, batch in enumerate(loader):
        X, Y = batch
        logits, loss = model(X, Y)
        losses.append(loss.item())
        if max_batches is not None and i >= max_batches:
            break
    mean_loss = torch.tensor(losses).mean().item()
    model.train()
    return mean_loss


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="tiny makemore")
    parser.add_argument("--work-dir", "-o", type=str, default="out")
    parser.add_argument("--seed", type=int, default=3407)
    parser.add_argument("--type", type=str, default="mlp", help="bigram|mlp|rnn")
    parser.add_argument("--max-steps", type=int, default=300)
    parser.add_argument("--batch-size", "-b", type=int, default=32)
    parser.add_argument("--learning-rate", "-l", type=float, default=1e-2)
    parser.add_argument("--weight-decay", "-w", type=float, default=0.01)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    os.makedirs(args.work_dir, exist_ok=True)
    writer = SummaryWriter(log_dir=args.work_dir) if SummaryWriter is not None else None

    train_dataset, test_dataset = create_datasets(args.seed)
    vocab_size = train_dataset.get_vocab_size()
    block_size = train_dataset.get_output_length()

    config = ModelConfig(vocab_size=vocab_size, block_size=block_size)
    if args.type == "bigram":
        model = Bigram(config)
    elif args.type == "mlp":
        model = MLP(config)
    elif args.type == "rnn":
        model = RNN(config)
    else:
        raise ValueError(f"model type {args.type} is not recognized")

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate,
                                  weight_decay=args.weight_decay, betas=(0.9, 0.99), eps=1e-8)
    batch_loader = InfiniteDataLoader(train_dataset, batch_size=args.batch_size)

    best_loss = None
    step = 0
    while True:
        batch = batch_loader.next()
        X, Y = batch
        logits, loss = model(X, Y)
        model.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

        if step > 0 and step % 100 == 0:
            train_loss = evaluate(model, train_dataset, batch_size=100, max_batches=5)
            test_loss = evaluate(model, test_dataset, batch_size=100, max_batches=5)
            if writer is not None:
                writer.add_scalar("Loss/train", train_loss, step)
                writer.add_scalar("Loss/test", test_loss, step)
                writer.flush()
            print(f"step {step} train loss: {train_loss:.4f} test loss: {test_loss:.4f}")
            if best_loss is None or test_loss < best_loss:
                out_path = os.path.join(args.work_dir, "model.pt")
                torch.save(model.state_dict(), out_path)
                best_loss = test_loss

        step += 1
        if args.max_steps >= 0 and step >= args.max_steps:
            break

    X_init = torch.zeros(5, 1, dtype=torch.long)
    X_samp = generate(model, X_init, block_size - 1, do_sample=False)
    for i in range(X_samp.size(0)):
        row = X_samp[i, 1:].tolist()
        crop = row.index(0) if 0 in row else len(row)
        print("sample:", train_dataset.decode(row[:crop]))

"""A character-level recurrent model sampled one token at a time (issue 30's benchmark).

An embedding, a GRU and a linear head, built from the seed (no checkpoint). sample()
feeds one character at a time, carries the hidden state, draws the next character with
torch.multinomial over the softmax of the temperature-scaled logits and collects the
characters in a list, as char-rnn samplers do. It prints ``tokens_per_s=``.
"""

import os
import time

import torch
import torch.nn as nn
from torch.nn import functional as F

vocab_size = 65
n_embd = 64
hidden_size = 128
num_layers = 1
max_new_tokens = int(os.environ.get("GPT_NEW_TOKENS", "100")) * 2
temperature = 0.8
seed = 1337
device = os.environ.get("GPT_DEVICE", "cpu")  # the benchmark sets cuda on a GPU

torch.manual_seed(seed)


class CharRNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, n_embd)
        self.rnn = nn.GRU(n_embd, hidden_size, batch_first=True)
        self.head = nn.Linear(hidden_size, vocab_size)

    def forward(self, x, h):
        out, h = self.rnn(self.embed(x), h)
        return self.head(out), h


@torch.no_grad()
def sample(model, start, n, temperature=1.0):
    x = start
    h = torch.zeros(num_layers, start.size(0), hidden_size, device=start.device)
    chars = []
    for _ in range(n):
        logits, h = model(x, h)
        probs = F.softmax(logits[:, -1, :] / temperature, dim=-1)
        x = torch.multinomial(probs, num_samples=1)
        chars.append(x)
    return torch.cat(chars, dim=1)


model = CharRNN()
model.to(device)
model.eval()
start = torch.zeros((1, 1), dtype=torch.long, device=device)
sample(model, start, max_new_tokens, temperature)  # warm-up
t0 = time.perf_counter()
out = sample(model, start, max_new_tokens, temperature)
tokens = out[0].tolist()
elapsed = time.perf_counter() - t0
print("sample", " ".join(str(t) for t in tokens[:20]))
print(f"tokens_per_s={max_new_tokens / elapsed:.1f}")

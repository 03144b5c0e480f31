"""nanoGPT's optimizer set-up in one file: configure_optimizers builds two AdamW parameter
groups (tensors of rank >= 2 decay, the others do not) and returns the optimizer; a LambdaLR
built in another function than the optimizer sets its learning rate (an injected
hyperparameter), with no clipping. tests/test_optim_programs.py converts it and steps the converted optimizer."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, BLOCK, EMBD = 11, 6, 8
LEARNING_RATE, WARMUP, MAX_ITERS = 1e-2, 3, 10


class TinyGPT(nn.Module):
    def __init__(self, vocab, block, embd, dropout):
        super().__init__()
        self.wte = nn.Embedding(vocab, embd)
        self.wpe = nn.Embedding(block, embd)
        self.drop = nn.Dropout(dropout)
        self.ln = nn.LayerNorm(embd)
        self.fc = nn.Linear(embd, embd)
        self.head = nn.Linear(embd, vocab, bias=False)

    def forward(self, idx):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        x = x + F.gelu(self.fc(self.ln(x)))
        return self.head(x)

    def configure_optimizers(self, weight_decay, learning_rate, betas):
        param_dict = {pn: p for pn, p in self.named_parameters()}
        param_dict = {pn: p for pn, p in param_dict.items() if p.requires_grad}
        decay_params = [p for n, p in param_dict.items() if p.dim() >= 2]
        nodecay_params = [p for n, p in param_dict.items() if p.dim() < 2]
        optim_groups = [
            {'params': decay_params, 'weight_decay': weight_decay},
            {'params': nodecay_params, 'weight_decay': 0.0},
        ]
        num_decay_params = sum(p.numel() for p in decay_params)
        num_nodecay_params = sum(p.numel() for p in nodecay_params)
        print(f"num decayed parameter tensors: {len(decay_params)}, with {num_decay_params:,} parameters")
        print(f"num non-decayed parameter tensors: {len(nodecay_params)}, with {num_nodecay_params:,} parameters")
        return torch.optim.AdamW(optim_groups, lr=learning_rate, betas=betas)


def main():
    torch.manual_seed(0)
    model = TinyGPT(VOCAB, BLOCK, EMBD, 0.0)
    optimizer = model.configure_optimizers(0.1, LEARNING_RATE, (0.9, 0.95))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / WARMUP)
        * (0.55 + 0.45 * math.cos(math.pi * min(1.0, step / MAX_ITERS))))
    for it in range(MAX_ITERS):
        x = torch.randint(0, VOCAB, (4, BLOCK))
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, VOCAB), x.view(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        print(f"iter {it}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()

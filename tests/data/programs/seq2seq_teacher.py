"""A sequence-to-sequence GRU (reversing a random sequence) in the shape of PyTorch's seq2seq
tutorial: an encoder and a decoder, each with its own Adam, stepped together from one loss;
teacher forcing decided per batch by Python's random module; the data drawn by torch.randint."""

import random

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import optim

SOS, EOS = 0, 1
MAX_LEN = 6
VOCAB = 12
HIDDEN = 16
teacher_forcing_ratio = 0.5


class EncoderRNN(nn.Module):
    def __init__(self, input_size, hidden_size, dropout_p=0.1):
        super().__init__()
        self.hidden_size = hidden_size
        self.embedding = nn.Embedding(input_size, hidden_size)
        self.gru = nn.GRU(hidden_size, hidden_size, batch_first=True)
        self.dropout = nn.Dropout(dropout_p)

    def forward(self, input):
        embedded = self.dropout(self.embedding(input))
        output, hidden = self.gru(embedded)
        return output, hidden


class DecoderRNN(nn.Module):
    def __init__(self, hidden_size, output_size):
        super().__init__()
        self.embedding = nn.Embedding(output_size, hidden_size)
        self.gru = nn.GRU(hidden_size, hidden_size, batch_first=True)
        self.out = nn.Linear(hidden_size, output_size)

    def forward(self, encoder_outputs, encoder_hidden, target_tensor=None):
        batch_size = encoder_outputs.size(0)
        decoder_input = torch.empty(batch_size, 1, dtype=torch.long).fill_(SOS)
        decoder_hidden = encoder_hidden
        decoder_outputs = []

        for i in range(MAX_LEN):
            decoder_output, decoder_hidden = self.forward_step(decoder_input, decoder_hidden)
            decoder_outputs.append(decoder_output)

            if target_tensor is not None:
                # Teacher forcing: Feed the target as the next input
                decoder_input = target_tensor[:, i].unsqueeze(1)
            else:
                _, topi = decoder_output.topk(1)
                decoder_input = topi.squeeze(-1).detach()

        decoder_outputs = torch.cat(decoder_outputs, dim=1)
        decoder_outputs = F.log_softmax(decoder_outputs, dim=-1)
        return decoder_outputs, decoder_hidden, None

    def forward_step(self, input, hidden):
        output = self.embedding(input)
        output = F.relu(output)
        output, hidden = self.gru(output, hidden)
        output = self.out(output)
        return output, hidden


def make_pairs(n):
    xs = torch.randint(2, VOCAB, (n, MAX_LEN))
    ys = torch.flip(xs, dims=[1])
    return xs, ys


def train_epoch(xs, ys, encoder, decoder, encoder_optimizer, decoder_optimizer, criterion, batch_size=8):
    total_loss = 0
    for start in range(0, xs.size(0), batch_size):
        input_tensor = xs[start:start + batch_size]
        target_tensor = ys[start:start + batch_size]

        encoder_optimizer.zero_grad()
        decoder_optimizer.zero_grad()

        use_teacher_forcing = random.random() < teacher_forcing_ratio
        encoder_outputs, encoder_hidden = encoder(input_tensor)
        if use_teacher_forcing:
            decoder_outputs, _, _ = decoder(encoder_outputs, encoder_hidden, target_tensor)
        else:
            decoder_outputs, _, _ = decoder(encoder_outputs, encoder_hidden)

        loss = criterion(
            decoder_outputs.view(-1, decoder_outputs.size(-1)),
            target_tensor.view(-1)
        )
        loss.backward()

        encoder_optimizer.step()
        decoder_optimizer.step()

        total_loss += loss.item()
    return total_loss / (xs.size(0) // batch_size)


def evaluate(encoder, decoder, xs):
    with torch.no_grad():
        encoder_outputs, encoder_hidden = encoder(xs)
        decoder_outputs, decoder_hidden, _ = decoder(encoder_outputs, encoder_hidden)
        _, topi = decoder_outputs.topk(1)
        return topi.squeeze(-1)


def main():
    torch.manual_seed(0)
    random.seed(0)
    xs, ys = make_pairs(32)
    encoder = EncoderRNN(VOCAB, HIDDEN)
    decoder = DecoderRNN(HIDDEN, VOCAB)
    encoder_optimizer = optim.Adam(encoder.parameters(), lr=0.01)
    decoder_optimizer = optim.Adam(decoder.parameters(), lr=0.01)
    criterion = nn.NLLLoss()
    for epoch in range(1, 4):
        loss = train_epoch(xs, ys, encoder, decoder, encoder_optimizer, decoder_optimizer, criterion)
        print(f"epoch {epoch} loss {loss:.4f}")
    encoder.eval()
    decoder.eval()
    pred = evaluate(encoder, decoder, xs[:2])
    print("pred", pred.tolist())
    print("acc", (evaluate(encoder, decoder, xs) == ys).float().mean().item())


if __name__ == "__main__":
    main()
